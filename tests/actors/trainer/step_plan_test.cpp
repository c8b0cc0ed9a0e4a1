#include <catch2/catch.hpp>

#include <cmath>

#include "actors/trainer/step_plan.hpp"

using namespace sorl::trainer;

TEST_CASE("a step requests B groups of G rollouts with stable ids and group seeds") {
  trainer_counters c;
  c.task_cursor = 9;
  step_options o;
  o.step = 4;
  o.prompts = 2;
  o.group_size = 3;
  o.run_seed = 11;
  o.task_size = 10;
  step_plan p{o, c};
  auto reqs = p.take_new_requests();
  REQUIRE(reqs.size() == 6);
  CHECK(reqs[0].group_id == 0);
  CHECK(reqs[3].group_id == 1);
  CHECK(reqs[2].sample_index == 2);
  CHECK(reqs[0].task_index == 9);
  CHECK(reqs[3].task_index == 0); // wrapped at the task size
  CHECK(reqs[5].request_id == 5);
  CHECK(reqs[0].seed == reqs[2].seed);
  CHECK(reqs[0].seed != reqs[3].seed);
  CHECK(reqs[0].seed == group_seed(11, 0));
  CHECK(c.next_group_id == 2);
  CHECK(c.next_request_id == 6);
  CHECK(c.task_cursor == 11);
  CHECK(p.take_new_requests().empty());
}

TEST_CASE("groups complete when every sample reported, and unknown or duplicate reports are flagged") {
  trainer_counters c;
  step_plan p{{0, 1, 2, 0, std::nullopt, false, 3}, c};
  CHECK(p.on_rollout(0, 1.0) == rollout_verdict::accepted);
  CHECK_FALSE(p.rollouts_complete());
  CHECK(p.on_rollout(0, 1.0) == rollout_verdict::duplicate);
  CHECK(p.on_rollout(7, 1.0) == rollout_verdict::unknown_request);
  CHECK(p.on_rollout(1, std::nan("")) == rollout_verdict::accepted);
  CHECK(p.rollouts_complete());
  CHECK(p.mean_reward() == 1.0); // a NaN reward is a failed reward, not a 0
  CHECK(p.reward_failures() == 1);
  CHECK(p.training_groups() == std::vector<uint64_t>{0});
  CHECK(p.zero_signal_groups() == std::vector<uint64_t>{0}); // one reward left: no signal
}

TEST_CASE("a rollout the worker could not serve finishes its request and is never trained on") {
  trainer_counters c;
  step_plan p{{0, 2, 3, 0, std::nullopt, false, 3}, c};
  // Group 0: 0.0 / (prompt did not fit) / 1.0; group 1: 1.0 / 0.0 / 1.0.
  CHECK(p.on_rollout(0, 0.0) == rollout_verdict::accepted);
  CHECK(p.on_rollout(1, 0.0, rollout_outcome::failed) == rollout_verdict::accepted);
  CHECK(p.on_rollout(1, 0.0) == rollout_verdict::duplicate);
  CHECK(p.on_rollout(3, 1.0) == rollout_verdict::accepted);
  CHECK(p.on_rollout(4, 0.0) == rollout_verdict::accepted);
  CHECK(p.outstanding().size() == 2);
  CHECK(p.outstanding()[0].request_id == 2);
  CHECK(p.outstanding()[1].request_id == 5);
  CHECK_FALSE(p.rollouts_complete());
  CHECK(p.on_rollout(2, 1.0) == rollout_verdict::accepted);
  CHECK(p.on_rollout(5, 1.0) == rollout_verdict::accepted);
  CHECK(p.rollouts_complete()); // the failed rollout does not keep the step waiting
  CHECK(p.outstanding().empty());
  CHECK(p.failed_rollouts() == 1);
  CHECK(p.reward_failures() == 0);
  CHECK(p.training_groups() == std::vector<uint64_t>{0, 1});
  CHECK(p.training_requests() == std::vector<uint64_t>{0, 2, 3, 4, 5});
  CHECK(p.mean_reward() == 3.0 / 5.0); // over the five rollouts with a reward
}

TEST_CASE("a failed reward stays out of its group's signal and mean but is sent to be masked") {
  trainer_counters c;
  step_plan p{{0, 1, 3, 0, std::nullopt, true, 3}, c};
  // 1.0 / (scorer threw) / 1.0: without the failure the group has no signal; a failure
  // counted as 0 would have given it a false one.
  p.on_rollout(0, 1.0);
  p.on_rollout(1, 0.0, rollout_outcome::reward_failed);
  p.on_rollout(2, 1.0);
  CHECK(p.rollouts_complete());
  CHECK(p.reward_failures() == 1);
  CHECK(p.zero_signal_groups() == std::vector<uint64_t>{0});
  CHECK(p.mean_reward() == 1.0);
  CHECK(p.refill(c)); // dynamic sampling replaces it
}

TEST_CASE("a group in which every rollout failed is complete but never trained on") {
  trainer_counters c;
  step_plan p{{0, 2, 2, 0, std::nullopt, false, 3}, c};
  p.on_rollout(0, 0.0, rollout_outcome::failed);
  p.on_rollout(1, 0.0, rollout_outcome::failed);
  p.on_rollout(2, 1.0);
  p.on_rollout(3, 0.0);
  CHECK(p.rollouts_complete());
  CHECK(p.training_groups() == std::vector<uint64_t>{1});
  CHECK(p.training_requests() == std::vector<uint64_t>{2, 3});
  CHECK(p.failed_rollouts() == 2);
}

TEST_CASE("without dynamic sampling zero-signal groups are still trained on") {
  trainer_counters c;
  step_plan p{{0, 2, 2, 0, std::nullopt, false, 3}, c};
  for (uint64_t r = 0; r < 4; ++r)
    p.on_rollout(r, r < 2 ? 1.0 : (r == 2 ? 0.0 : 1.0));
  CHECK(p.zero_signal_groups() == std::vector<uint64_t>{0});
  CHECK_FALSE(p.refill(c));
  CHECK(p.training_groups() == std::vector<uint64_t>{0, 1});
}

TEST_CASE("DAPO dynamic sampling replaces zero-signal groups, bounded by the refill rounds") {
  trainer_counters c;
  step_plan p{{0, 2, 2, 0, std::nullopt, true, 2}, c};
  p.take_new_requests();
  // group 0 all ones (no signal), group 1 mixed.
  p.on_rollout(0, 1.0);
  p.on_rollout(1, 1.0);
  p.on_rollout(2, 0.0);
  p.on_rollout(3, 1.0);
  REQUIRE(p.rollouts_complete());
  REQUIRE(p.refill(c));
  auto more = p.take_new_requests();
  REQUIRE(more.size() == 2); // one replacement group of G = 2
  CHECK(more[0].group_id == 2);
  CHECK_FALSE(p.rollouts_complete());
  p.on_rollout(4, 0.0);
  p.on_rollout(5, 0.0); // no signal again
  REQUIRE(p.refill(c));
  p.take_new_requests();
  p.on_rollout(6, 0.0);
  p.on_rollout(7, 0.0);
  CHECK_FALSE(p.refill(c)); // max_refill_rounds = 2 reached
  CHECK(p.refill_rounds() == 2);
  CHECK(p.training_groups() == std::vector<uint64_t>{1});
  CHECK(p.zero_signal_groups() == std::vector<uint64_t>{0, 2, 3});
}

TEST_CASE("when no group has signal after the refills every complete group is trained on") {
  trainer_counters c;
  step_plan p{{0, 2, 2, 0, std::nullopt, true, 1}, c};
  for (uint64_t r = 0; r < 4; ++r)
    p.on_rollout(r, 0.0);
  REQUIRE(p.refill(c));
  p.take_new_requests();
  for (uint64_t r = 4; r < 8; ++r)
    p.on_rollout(r, 0.0);
  CHECK_FALSE(p.refill(c));
  CHECK(p.training_groups() == std::vector<uint64_t>{0, 1, 2, 3});
}

TEST_CASE("bad step options raise") {
  trainer_counters c;
  CHECK_THROWS_AS((step_plan{{0, 0, 2, 0, std::nullopt, false, 1}, c}), std::invalid_argument);
  CHECK_THROWS_AS((step_plan{{0, 1, 2, 0, uint64_t{0}, false, 1}, c}), std::invalid_argument);
}

TEST_CASE("a deadline cut trains on groups with at least min_finished rollouts and aborts the rest") {
  trainer_counters c;
  step_options o;
  o.prompts = 2;
  o.group_size = 4;
  step_plan p{o, c}; // group 0: requests 0..3, group 1: requests 4..7
  CHECK_FALSE(p.can_cut(2));
  CHECK_THROWS_AS(p.cut(2), std::logic_error);
  p.on_rollout(0, 1.0);
  p.on_rollout(1, 0.0);
  p.on_rollout(4, 1.0);
  CHECK_FALSE(p.can_cut(2)); // group 1 has only one finished rollout
  CHECK(p.can_cut(1));
  p.on_rollout(6, 0.0);
  REQUIRE(p.can_cut(2));
  auto aborted = p.cut(2);
  CHECK(aborted == std::vector<uint64_t>{2, 3, 5, 7});
  CHECK(p.was_cut());
  CHECK(p.aborted() == 4);
  CHECK(p.rollouts_complete());
  CHECK_FALSE(p.can_cut(2));
  CHECK(p.training_groups() == std::vector<uint64_t>{0, 1});
  CHECK(p.training_requests() == std::vector<uint64_t>{0, 1, 4, 6});
  // A straggler that finishes after the cut is refused; a repeat stays a duplicate.
  CHECK(p.on_rollout(3, 1.0) == rollout_verdict::after_cut);
  CHECK(p.on_rollout(0, 1.0) == rollout_verdict::duplicate);
  CHECK(p.training_requests().size() == 4);
  CHECK_FALSE(p.refill(c));
  CHECK(p.mean_reward() == 0.5);
}

TEST_CASE("after a cut, groups below min_finished are never trained on") {
  trainer_counters c;
  step_options o;
  o.prompts = 2;
  o.group_size = 3;
  step_plan p{o, c};
  for (uint64_t id : {0, 1, 3, 4})
    p.on_rollout(id, id % 2 ? 1.0 : 0.0);
  REQUIRE(p.can_cut(2));
  p.cut(2);
  CHECK(p.training_requests() == std::vector<uint64_t>{0, 1, 3, 4});
  // With dynamic sampling, a cut group without signal is dropped, and no refill follows.
  trainer_counters d;
  o.dynamic_sampling = true;
  step_plan q{o, d};
  for (uint64_t id : {0, 1, 3, 4})
    q.on_rollout(id, id < 3 ? 1.0 : static_cast<double>(id % 2)); // group 0 all 1: no signal
  q.cut(2);
  CHECK(q.training_groups() == std::vector<uint64_t>{1});
  CHECK(q.training_requests() == std::vector<uint64_t>{3, 4});
  CHECK_FALSE(q.refill(d));
}
