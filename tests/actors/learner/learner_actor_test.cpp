// The learner actor shell with its trainer, sync publisher and directory played by the test:
// the trajectories the trainer forwards, then the TrainBatch naming them, make one step, whose
// result carries the learner's metrics; trajectories of a later step wait for their batch. A
// train step it cannot take (a missing or malformed trajectory, every update non-finite) is
// answered with a failed TrainResult and its reason, never with new weights; a checkpoint it
// cannot write is answered with a failed CheckpointDone naming the path, and `latest` keeps
// naming the last complete checkpoint.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/common/train_setup.hpp"
#include "actors/learner/learner_actor.hpp"
#include "messages/rollout.capnp.h"
#include "messages/train.capnp.h"
#include "runtime/actor_types.hpp"
#include "runtime/config.hpp"
#include "runtime/envelope.hpp"
#include "runtime/ml/formats/checkpoint.hpp"
#include "runtime/ml/policy/model.hpp"
#include "tests/support/actor_system.hpp"
#include "tests/support/scratch_dir.hpp"

using namespace sorl;
using sorl::test::expect;
using sorl::test::test_context;
using sorl::test::test_system_config;
namespace fs = std::filesystem;

namespace {

/// The learner (tiny preset, fresh init unless `exp.model.checkpoint` is set) with the test's
/// scoped actor as trainer, sync publisher and directory, past its LearnerReady. Stopped at
/// the end of the test.
struct learner_harness {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  const experiment_config& exp;
  caf::actor learner;

  explicit learner_harness(const experiment_config& e) : exp(e) {
    auto me = caf::actor_cast<caf::actor>(self);
    learner = spawn_learner(sys, test_context(exp, "learner", me));
    std::vector<peer_info> roster{{"trainer", 0, "test", me},
                                  {"sync_publisher", 0, "test", me},
                                  {"learner", 0, "test", learner}};
    self->send(learner, roster_atom::value, roster);
    expect<msg::LearnerReady>(self, [](msg::LearnerReady::Reader r) { CHECK(r.getVersion() == 0); });
  }
  ~learner_harness() {
    self->send_exit(learner, caf::exit_reason::user_shutdown);
  }
};

/// One served rollout of group 0: prompt "<bos>1", response "23", both tokens trained.
struct rollout {
  uint64_t request_id = 0;
  float reward = 0.0f;
  uint32_t mask_bytes = 2; ///< the response has 2 tokens; anything else is malformed
  uint64_t step = 0;       ///< 0-based, as the trainer numbers the batch
};

/// The Trajectory of `r` as the trainer forwards it.
envelope trajectory(const rollout& r) {
  return build_envelope<msg::Trajectory>([&](msg::Trajectory::Builder t) {
    t.setRequestId(r.request_id);
    t.setStep(r.step);
    t.setGroupId(0);
    t.setSampleIndex(static_cast<uint32_t>(r.request_id));
    auto prompt = t.initPromptTokens(2);
    prompt.set(0, 256);
    prompt.set(1, '1');
    auto resp = t.initResponseTokens(2);
    resp.set(0, '2');
    resp.set(1, '3');
    auto lp = t.initSamplingLogprobs(2);
    lp.set(0, -1.0f);
    lp.set(1, -1.0f);
    std::vector<uint8_t> mask(r.mask_bytes, 1);
    t.setLossMask(kj::arrayPtr(mask.data(), mask.size()));
    t.setReward(r.reward);
    t.setFinishReason(msg::FinishReason::EOS);
    t.setStatus(msg::RolloutStatus::OK);
  });
}

/// The TrainBatch of 0-based `step` naming `request_ids` in training order.
envelope train_batch(uint64_t step, const std::vector<uint64_t>& request_ids) {
  return build_envelope<msg::TrainBatch>([&](msg::TrainBatch::Builder b) {
    b.setStep(step);
    auto ids = b.initRequestIds(static_cast<unsigned>(request_ids.size()));
    for (unsigned i = 0; i < request_ids.size(); ++i)
      ids.set(i, request_ids[i]);
  });
}

/// What the trainer sends for a step of `rollouts`: each trajectory, then the batch naming
/// them all in that order.
void send_step(learner_harness& h, uint64_t step, const std::vector<rollout>& rollouts) {
  std::vector<uint64_t> ids;
  for (const auto& r : rollouts) {
    h.self->send(h.learner, trajectory(r));
    ids.push_back(r.request_id);
  }
  h.self->send(h.learner, train_batch(step, ids));
}

/// Checkpoint request for the trainer's step 1 carrying `trainer_state`.
envelope checkpoint_request(const std::string& trainer_state) {
  return build_envelope<msg::CheckpointRequest>([&](msg::CheckpointRequest::Builder b) {
    b.setStep(1);
    b.setTrainerState(trainer_state);
  });
}

/// A run directory under `scratch` and no warm-start checkpoint (fresh init).
experiment_config run_in(const fs::path& scratch) {
  experiment_config exp;
  exp.run.output_dir = scratch.string();
  exp.run.name = "run";
  return exp;
}

} // namespace

TEST_CASE("a malformed train batch is answered with a failed result naming the trajectory") {
  sorl::test::scratch_dir scratch{"learner_malformed"};
  auto exp = run_in(scratch.path);
  learner_harness h{exp};
  send_step(h, 0, {{4, 1.0f}, {5, 0.0f, 1}});
  expect<msg::TrainResult>(h.self, [](msg::TrainResult::Reader r) {
    CHECK_FALSE(r.getOk());
    CHECK(r.getStep() == 0);
    CHECK(r.getVersion() == 0); // no update was applied
    CHECK(std::string{r.getReason().cStr()} ==
          "trajectory 5: 2 response tokens, 1 mask bytes, 2 log-probs");
  });
}

TEST_CASE("a train step whose every update is non-finite is answered with a failed result") {
  sorl::test::scratch_dir scratch{"learner_nonfinite"};
  auto exp = run_in(scratch.path);
  // A warm-start checkpoint whose weights are all NaN, as a diverged or corrupt one.
  exp.model.checkpoint = (scratch.path / "warm").string();
  {
    ml::policy_model model{model_dims_from(exp), exp.run.seed};
    for (const auto& [name, t] : model.parameters())
      t.detach().fill_(std::nanf(""));
    ml::save_checkpoint(exp.model.checkpoint, model.parameters(), {}, ml::checkpoint_state{});
  }
  learner_harness h{exp};
  send_step(h, 0, {{0, 1.0f}, {1, 0.0f}});
  expect<msg::TrainResult>(h.self, [](msg::TrainResult::Reader r) {
    CHECK_FALSE(r.getOk());
    CHECK(r.getVersion() == 0);
    CHECK_THAT(r.getReason().cStr(),
               Catch::StartsWith("every update of the step (1 of them) had a non-finite loss "
                                 "or gradient norm and was dropped"));
  });
}

TEST_CASE("trajectories then the batch naming them are trained on and answered with the metrics") {
  sorl::test::scratch_dir scratch{"learner_step"};
  auto exp = run_in(scratch.path);
  learner_harness h{exp};
  send_step(h, 0, {{0, 1.0f}, {1, 0.0f}});
  expect<msg::TrainResult>(h.self, [](msg::TrainResult::Reader r) {
    CHECK(r.getOk());
    CHECK(r.getStep() == 0);
    CHECK(r.getVersion() == 1);
    std::vector<std::string> names;
    for (auto n : r.getMetricNames())
      names.emplace_back(n.cStr());
    CHECK(names == std::vector<std::string>{
                     "loss", "pg_loss", "kl", "clip_frac_low", "clip_frac_high", "ratio_max",
                     "grad_norm", "mismatch_mean", "mismatch_max", "mismatch_k3",
                     "token_mult_prob_error", "mismatch_bitwise", "mismatch_tokens",
                     "learner_forwards", "entropy",
                     "advantage_abs_mean", "zero_signal_groups", "tokens_trained",
                     "overlong_filtered", "overlong_penalty_mean", "overlong_shaped", "updates",
                     "skipped_updates", "nonfinite_updates", "zero_signal_updates"});
    REQUIRE(r.getMetricValues().size() == names.size());
    auto value = [&](const std::string& key) {
      auto at = std::find(names.begin(), names.end(), key) - names.begin();
      return r.getMetricValues()[static_cast<unsigned>(at)];
    };
    CHECK(value("tokens_trained") == 4.0);     // 2 rollouts × 2 trained response tokens
    CHECK(value("zero_signal_groups") == 0.0); // rewards 1 and 0 differ
    CHECK(value("updates") == 1.0);            // one epoch, one minibatch by default
    CHECK(value("nonfinite_updates") == 0.0);
  });
  expect<msg::WeightSnapshot>(h.self, [](msg::WeightSnapshot::Reader w) {
    CHECK(w.getVersion() == 1);
  });
}

TEST_CASE("a batch naming a trajectory that never arrived is answered ok = false naming it") {
  sorl::test::scratch_dir scratch{"learner_missing"};
  auto exp = run_in(scratch.path);
  learner_harness h{exp};
  h.self->send(h.learner, trajectory({0, 1.0f}));
  h.self->send(h.learner, trajectory({1, 0.0f}));
  h.self->send(h.learner, train_batch(0, {0, 7, 1}));
  expect<msg::TrainResult>(h.self, [](msg::TrainResult::Reader r) {
    CHECK_FALSE(r.getOk());
    CHECK(r.getStep() == 0);
    CHECK(r.getVersion() == 0);
    CHECK(r.getMetricNames().size() == 0);
    CHECK(std::string{r.getReason().cStr()} ==
          "the batch of 3 rollouts names request 7 whose trajectory never arrived");
  });
  // The learner is still serving: the next complete step trains.
  send_step(h, 1, {{2, 1.0f, 2, 1}, {3, 0.0f, 2, 1}});
  expect<msg::TrainResult>(h.self, [](msg::TrainResult::Reader r) {
    CHECK(r.getOk());
    CHECK(r.getVersion() == 1);
  });
}

TEST_CASE("trajectories of the next step that arrive before this step's batch are kept") {
  sorl::test::scratch_dir scratch{"learner_early"};
  auto exp = run_in(scratch.path);
  learner_harness h{exp};
  for (const rollout& r : std::vector<rollout>{{0, 1.0f}, {1, 0.0f}, {2, 1.0f, 2, 1},
                                               {3, 0.0f, 2, 1}})
    h.self->send(h.learner, trajectory(r));
  h.self->send(h.learner, train_batch(0, {1, 0}));
  h.self->send(h.learner, train_batch(1, {2, 3}));
  for (uint64_t step : {0, 1})
    expect<msg::TrainResult>(h.self, [&](msg::TrainResult::Reader r) {
      INFO(r.getReason().cStr());
      CHECK(r.getOk());
      CHECK(r.getStep() == step);
      CHECK(r.getVersion() == step + 1);
    });
}

TEST_CASE("a checkpoint the learner cannot write is answered with the reason and latest kept") {
  sorl::test::scratch_dir scratch{"learner_checkpoint"};
  auto exp = run_in(scratch.path);
  const fs::path root = fs::path{exp.run.run_dir()} / "checkpoints";
  learner_harness h{exp};
  const auto good = root / "step-0000000000";
  h.self->send(h.learner, checkpoint_request("{\"step\": 1}"));
  expect<msg::CheckpointDone>(h.self, [&](msg::CheckpointDone::Reader d) {
    CHECK(d.getOk());
    CHECK(std::string{d.getPath().cStr()} == good.string());
  });
  REQUIRE(ml::latest_checkpoint(root) == good);

  SECTION("a save that fails after its files were written leaves latest on the last one") {
    // A sidecar that cannot be encoded fails the save after the weights were written.
    h.self->send(h.learner, checkpoint_request("\xff not UTF-8"));
    expect<msg::CheckpointDone>(h.self, [&](msg::CheckpointDone::Reader d) {
      CHECK_FALSE(d.getOk());
      CHECK(d.getStep() == 1);
      CHECK(std::string{d.getPath().cStr()}.empty());
      CHECK_THAT(d.getReason().cStr(), Catch::Contains("not valid UTF-8"));
    });
    CHECK(ml::latest_checkpoint(root) == good);
    ml::policy_model model{model_dims_from(exp), exp.run.seed + 1};
    auto loaded = ml::load_checkpoint(good, model.parameters()); // whole, checksums verified
    CHECK(loaded.state.metadata.at("sorl.trainer") == "{\"step\": 1}");
    std::vector<std::string> entries;
    for (const auto& e : fs::directory_iterator(root))
      entries.push_back(e.path().filename().string());
    std::sort(entries.begin(), entries.end());
    CHECK(entries == std::vector<std::string>{"latest", "step-0000000000"}); // no .tmp-* left
  }
  SECTION("a file where the checkpoint directory belongs is named in the reason") {
    fs::remove_all(root);
    { std::ofstream{root} << "not a directory"; }
    h.self->send(h.learner, checkpoint_request("{}"));
    expect<msg::CheckpointDone>(h.self, [&](msg::CheckpointDone::Reader d) {
      CHECK_FALSE(d.getOk());
      CHECK_THAT(d.getReason().cStr(),
                 Catch::StartsWith(root.string() + ": cannot create the checkpoint root: "));
    });
    CHECK(fs::is_regular_file(root)); // left as the user had it
  }
}
