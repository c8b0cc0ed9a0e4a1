// The trainer actor shell with every peer played by the test: a rollout that a worker could not
// serve still lets the step complete and is counted; the step's checksum reports what the
// publisher verified; a reward failure can stop the job; the rollout-phase watchdog fails a
// stalled step with a message naming what is missing; and a failed train step, checkpoint or
// metrics write ends the job with the reason and what --resume would continue from.

#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <tuple>

#include <caf/all.hpp>

#include "actors/trainer/trainer_actor.hpp"
#include "actors/trainer/trainer_checkpoint.hpp"
#include "messages/rollout.capnp.h"
#include "messages/sync.capnp.h"
#include "messages/train.capnp.h"
#include "runtime/actor_types.hpp"
#include "runtime/config.hpp"
#include "runtime/envelope.hpp"
#include "runtime/metrics.hpp"
#include "tests/support/actor_system.hpp"

using namespace sorl;
using sorl::test::expect;
using sorl::test::test_context;
using sorl::test::test_system_config;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

/// One step of B = 2 prompts, static G = 3, no evaluation, its run directory emptied.
experiment_config one_step(const std::string& name) {
  experiment_config exp;
  exp.run.name = name;
  exp.run.steps = 1;
  exp.run.output_dir = (fs::temp_directory_path() / "sorl_trainer_actor_test").string();
  exp.task.eval_prompts = 0;
  exp.algorithm.prompts_per_step = 2;
  fs::remove_all(exp.run.run_dir());
  return exp;
}

/// Waits for the trainer's (shutdown_atom, ok, why) to the directory.
std::pair<bool, std::string> expect_shutdown(caf::scoped_actor& self) {
  std::pair<bool, std::string> out;
  for (bool found = false; !found;)
    self->receive([](const envelope&) {},
                  [&](shutdown_atom, bool ok, const std::string& why) {
                    found = true;
                    out = {ok, why};
                  },
                  caf::after(20s) >> [&] { FAIL("the trainer never ended the job"); });
  return out;
}

/// The trainer with the test's scoped actor in every other role and as the directory, taken
/// to its first rollout phase with G = 3: `ids` are its six requests. With `resumed`, the
/// learner reports a resume from checkpoint `source` carrying that trainer state, and both
/// stateful roles restore theirs. The trainer is stopped at the end of the test.
struct trainer_harness {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  experiment_config exp;
  caf::actor trainer;
  std::vector<uint64_t> ids;

  trainer_harness(const std::string& name, const std::function<void(experiment_config&)>& tweak,
                  const std::optional<trainer::trainer_snapshot>& resumed = std::nullopt,
                  const std::string& source = "")
    : exp(one_step(name)) {
    tweak(exp);
    auto me = caf::actor_cast<caf::actor>(self);
    trainer = spawn_trainer(sys, test_context(exp, "trainer", me));
    std::vector<peer_info> roster;
    for (auto role : {"trainer", "scheduler", "learner", "sagc_controller", "sync_publisher",
                      "rollout_worker"})
      roster.push_back({role, 0, "test", std::string{role} == "trainer" ? trainer : me});
    self->send(trainer, roster_atom::value, roster);
    auto step = static_cast<uint64_t>(resumed ? resumed->step : 0);
    self->send(trainer, build_envelope<msg::LearnerReady>([&](msg::LearnerReady::Builder b) {
                 b.setVersion(step);
                 b.setSource(resumed ? source : "test");
                 b.setResumed(resumed.has_value());
                 b.setTrainerState(resumed ? trainer::to_json(*resumed) : "");
               }));
    self->send(trainer, build_envelope<msg::VersionReady>(
                          [&](msg::VersionReady::Builder b) { b.setVersion(step); }));
    for (size_t i = 0; resumed && i < trainer::stateful_roles().size(); ++i) {
      expect<msg::RoleStateRestore>(self, [&](msg::RoleStateRestore::Reader r) {
        CHECK(std::string{r.getSource().cStr()} == source);
      });
      self->send(trainer,
                 build_envelope<msg::RoleStateRestored>([](msg::RoleStateRestored::Builder b) {
                   b.setOk(true);
                 }));
    }
    ids = rollout_phase(step);
  }
  /// Answers the group-size query of 0-based `step` with G = 3; returns the step's six
  /// request ids.
  std::vector<uint64_t> rollout_phase(uint64_t step) {
    expect<msg::GroupSizeQuery>(self,
                                [&](msg::GroupSizeQuery::Reader q) { CHECK(q.getStep() == step); });
    self->send(trainer,
               build_envelope<msg::GroupSizeDecision>([&](msg::GroupSizeDecision::Builder b) {
                 b.setStep(step);
                 b.setGroupSize(3);
                 b.setPolicy("static");
               }));
    std::vector<uint64_t> out;
    for (int i = 0; i < 6; ++i)
      expect<msg::GenerateRequest>(self, [&](msg::GenerateRequest::Reader r) {
        out.push_back(r.getRequestId());
      });
    return out;
  }
  ~trainer_harness() {
    self->send_exit(trainer, caf::exit_reason::user_shutdown);
  }
};

/// Trajectory of request `id` (group id / 3, sample id % 3) as a worker sends it.
envelope trajectory(uint64_t id, float reward,
                    msg::RolloutStatus status = msg::RolloutStatus::OK,
                    const std::string& failure = "") {
  return build_envelope<msg::Trajectory>([&](msg::Trajectory::Builder b) {
    b.setRequestId(id);
    b.setGroupId(id / 3);
    b.setSampleIndex(static_cast<uint32_t>(id % 3));
    auto prompt = b.initPromptTokens(2);
    prompt.set(0, 256);
    prompt.set(1, 49);
    bool served = status != msg::RolloutStatus::FAILED;
    auto resp = b.initResponseTokens(served ? 2 : 0);
    auto lp = b.initSamplingLogprobs(served ? 2 : 0);
    std::vector<uint8_t> mask(served ? 2 : 0, 1);
    for (unsigned i = 0; served && i < 2; ++i) {
      resp.set(i, 50 + static_cast<int32_t>(i));
      lp.set(i, -1.0f);
    }
    b.setLossMask(kj::arrayPtr(mask.data(), mask.size()));
    b.setReward(reward);
    b.setFinishReason(served ? msg::FinishReason::EOS : msg::FinishReason::ABORT);
    b.setWorker("rollout_worker#0@test");
    b.setStatus(status);
    b.setFailure(failure);
  });
}

/// The learner's answer to the batch of 0-based `step` when it could not take the step.
envelope failed_result(uint64_t step, const std::string& reason) {
  return build_envelope<msg::TrainResult>([&](msg::TrainResult::Builder b) {
    b.setStep(step);
    b.setVersion(step);
    b.setOk(false);
    b.setReason(reason);
  });
}

/// Every rollout of `ids` arrives, rewards alternating 1 / 0; the batch goes to the learner.
void finish_rollouts(trainer_harness& h, const std::vector<uint64_t>& ids) {
  for (auto id : ids)
    h.self->send(h.trainer, trajectory(id, id % 2 == 0 ? 1.0f : 0.0f));
  expect<msg::TrainBatch>(h.self, [](msg::TrainBatch::Reader) {});
}

/// Takes 1-based step `step` from the learner's result to the checkpoint request: version
/// `step` is ready as `ready` describes it and every stateful role answers.
void learn_to_checkpoint(trainer_harness& h, uint64_t step,
                         const std::function<void(msg::VersionReady::Builder)>& ready) {
  auto& self = h.self;
  self->send(h.trainer, build_envelope<msg::TrainResult>([&](msg::TrainResult::Builder b) {
               b.setStep(step - 1);
               b.setVersion(step);
               b.setOk(true);
             }));
  self->send(h.trainer, build_envelope<msg::VersionReady>([&](msg::VersionReady::Builder b) {
               b.setVersion(step);
               ready(b);
             }));
  // Before its checkpoint the trainer asks each role whose state it saves (both played here).
  for (auto role : {"sagc_controller", "scheduler"}) {
    expect<msg::RoleStateQuery>(self, [&](msg::RoleStateQuery::Reader q) {
      CHECK(q.getStep() == step);
    });
    self->send(h.trainer, build_envelope<msg::RoleState>([&](msg::RoleState::Builder b) {
                 b.setStep(step);
                 b.setRole(role);
                 b.setState("{}");
                 b.setOk(true);
               }));
  }
  expect<msg::CheckpointRequest>(self, [&](msg::CheckpointRequest::Reader r) {
    CHECK(r.getStep() == step);
  });
}

/// The learner's answer to the checkpoint request of `step`.
envelope checkpoint_done(uint64_t step, bool ok, const std::string& path_or_reason) {
  return build_envelope<msg::CheckpointDone>([&](msg::CheckpointDone::Builder b) {
    b.setStep(step);
    b.setOk(ok);
    if (ok)
      b.setPath(path_or_reason);
    else
      b.setReason(path_or_reason);
  });
}

/// The steps of RUN_DIR/metrics.jsonl's records, in file order.
std::vector<int64_t> recorded_steps(const experiment_config& exp) {
  std::vector<int64_t> steps;
  std::ifstream in{fs::path{exp.run.run_dir()} / "metrics.jsonl"};
  for (std::string line; std::getline(in, line);)
    steps.push_back(parse_metrics_line(line).step);
  return steps;
}

/// Takes the harness's step from the learner's result to the end of the job: version 1 is
/// ready as `ready` describes it, every stateful role answers, the checkpoint succeeds.
/// Returns the step's metrics record, the only one written.
metrics_record finish_step(trainer_harness& h,
                           const std::function<void(msg::VersionReady::Builder)>& ready) {
  auto& self = h.self;
  learn_to_checkpoint(h, 1, ready);
  self->send(h.trainer, checkpoint_done(1, true, ""));
  auto [ok, why] = expect_shutdown(self);
  INFO(why);
  CHECK(ok);
  std::ifstream in{fs::path{h.exp.run.run_dir()} / "metrics.jsonl"};
  std::string line;
  REQUIRE(std::getline(in, line));
  auto rec = parse_metrics_line(line);
  CHECK_FALSE(std::getline(in, line));
  return rec;
}

} // namespace

TEST_CASE("a rollout no worker can serve is counted as failed and the step completes without it") {
  trainer_harness h{"failed_rollout", [](experiment_config&) {}};
  auto [self, trainer, ids] = std::tie(h.self, h.trainer, h.ids);
  REQUIRE(ids == std::vector<uint64_t>{0, 1, 2, 3, 4, 5});
  // Request 1's prompt does not fit the context: the worker answers with a failed rollout.
  for (auto id : ids)
    self->send(trainer, id == 1 ? trajectory(1, 0.0f, msg::RolloutStatus::FAILED,
                                             "prompt of 601 tokens does not fit the context of "
                                             "512 tokens")
                                : trajectory(id, id % 2 == 0 ? 1.0f : 0.0f));
  // The learner (played here) gets the kept trajectories themselves, then the batch naming
  // them in the same order.
  std::vector<uint64_t> forwarded;
  std::vector<uint64_t> trained;
  for (bool batch = false; !batch;)
    self->receive(
      [&](const envelope& e) {
        if (e.schema_id() == capnp::typeId<msg::Trajectory>())
          CHECK_FALSE(with_envelope<msg::Trajectory>(e, [&](msg::Trajectory::Reader t) {
            forwarded.push_back(t.getRequestId());
          }));
        if (e.schema_id() == capnp::typeId<msg::TrainBatch>())
          CHECK_FALSE(with_envelope<msg::TrainBatch>(e, [&](msg::TrainBatch::Reader b) {
            batch = true;
            CHECK(b.getStep() == 0);
            for (auto id : b.getRequestIds())
              trained.push_back(id);
          }));
      },
      caf::after(20s) >> [&] { FAIL("no TrainBatch arrived"); });
  CHECK(trained == std::vector<uint64_t>{0, 2, 3, 4, 5}); // 1 is never trained on
  CHECK(forwarded == trained);
  auto rec = finish_step(h, [](msg::VersionReady::Builder b) {
    b.setWorkers(2);
    b.setVerifiedWorkers(2);
  });
  CHECK(rec.step == 1);
  CHECK(rec.extra.at("failed_rollouts") == 1.0);
  CHECK(rec.extra.at("reward_failures") == 0.0);
  CHECK(rec.extra.at("rollouts") == 6.0);
  CHECK(rec.extra.at("trained_rollouts") == 5.0);
  CHECK(*rec.reward_mean == Approx(3.0 / 5.0)); // rewards 1, 1, 0, 1, 0 of the served ones
  CHECK(rec.extra.at("sync_verified_workers") == 2.0);
  CHECK(rec.extra_text.at("checksum") == "ok");
}

TEST_CASE("the step's checksum says ok only when the publisher verified every live worker's hash") {
  trainer_harness h{"checksum", [](experiment_config&) {}};
  for (auto id : h.ids)
    h.self->send(h.trainer, trajectory(id, id % 2 == 0 ? 1.0f : 0.0f));
  expect<msg::TrainBatch>(h.self, [](msg::TrainBatch::Reader) {});
  auto rec = finish_step(h, [](msg::VersionReady::Builder b) {
    b.setModelHash(0xabcdef);
    b.setWorkers(2);
    b.setVerifiedWorkers(1);
  });
  CHECK(rec.extra.at("sync_verified_workers") == 1.0);
  CHECK(rec.extra_text.at("model_hash") == "0000000000abcdef");
  CHECK(rec.extra_text.at("checksum") == "unverified: 1 of 2 workers acknowledged "
                                          "0000000000abcdef");
}

TEST_CASE("with on_reward_failure = fail a failed reward stops the job naming the rollout") {
  trainer_harness h{"reward_fail", [](experiment_config& e) {
                      e.algorithm.on_reward_failure = reward_failure_kind::fail;
                    }};
  auto [self, trainer] = std::tie(h.self, h.trainer);
  self->send(trainer, trajectory(0, 1.0f));
  self->send(trainer, trajectory(2, 0.0f, msg::RolloutStatus::REWARD_FAILED,
                                 "task error: scorer exploded"));
  auto [ok, why] = expect_shutdown(self);
  CHECK_FALSE(ok);
  CHECK(why == "step 1: rollout 2 (group 0, sample 2) from rollout_worker#0@test has no reward: "
               "task error: scorer exploded (algorithm.on_reward_failure = \"fail\")");
}

TEST_CASE("the rollout-phase watchdog fails a stalled step naming the rollouts it waits for") {
  trainer_harness h{"watchdog", [](experiment_config& e) { e.rollout.watchdog_s = 0.2; }};
  auto [self, exp, trainer] = std::tie(h.self, h.exp, h.trainer);
  // Requests 0–3 finish; request 4 started on a worker that then went silent; request 5 was
  // lost before any worker started it.
  self->send(trainer, build_envelope<msg::RolloutEvent>([](msg::RolloutEvent::Builder b) {
               b.setRequestId(4);
               b.setGroupId(1);
               b.setKind(msg::EventKind::START);
               b.setWorker("rollout_worker#1@test");
             }));
  for (uint64_t id = 0; id < 4; ++id)
    self->send(trainer, trajectory(id, 1.0f));
  auto [ok, why] = expect_shutdown(self);
  INFO(why);
  CHECK_FALSE(ok);
  CHECK_THAT(why, Catch::StartsWith("step 1: nothing finished for "));
  CHECK_THAT(why, Catch::Contains("(rollout.watchdog_s = 0.2); still waiting for 2 of 6 "
                                  "rollouts: request 4 (group 1, sample 1, started on "
                                  "rollout_worker#1@test); request 5 (group 1, sample 2, not "
                                  "started on any worker)"));
  auto metrics = fs::path{exp.run.run_dir()} / "metrics.jsonl"; // no step was written
  CHECK((!fs::exists(metrics) || fs::file_size(metrics) == 0));
}

TEST_CASE("a train step the learner could not take ends the job with the learner's reason") {
  trainer_harness h{"learner_failed", [](experiment_config&) {}};
  finish_rollouts(h, h.ids);
  const std::string reason = "every update of the step (1 of them) had a non-finite loss or "
                             "gradient norm and was dropped";
  h.self->send(h.trainer, failed_result(0, reason));
  // A failed result is not a step: the trainer must not wait for version 0 to be "synced".
  auto [ok, why] = expect_shutdown(h.self);
  CHECK_FALSE(ok);
  CHECK(why == "step 1: the learner failed: " + reason + "; no checkpoint of this run was "
               "written, so --resume has nothing to continue from");
  CHECK(recorded_steps(h.exp).empty());
}

TEST_CASE("a failed checkpoint write ends the job naming the path and the last good checkpoint") {
  trainer_harness h{"checkpoint_failed", [](experiment_config& e) {
                      e.run.steps = 2;
                      e.run.checkpoint_every = 1;
                    }};
  auto ok_ready = [](msg::VersionReady::Builder b) {
    b.setWorkers(1);
    b.setVerifiedWorkers(1);
  };
  const std::string step1 = h.exp.run.run_dir() + "/checkpoints/step-0000000001";
  finish_rollouts(h, h.ids);
  learn_to_checkpoint(h, 1, ok_ready);
  h.self->send(h.trainer, checkpoint_done(1, true, step1));
  finish_rollouts(h, h.rollout_phase(1));
  learn_to_checkpoint(h, 2, ok_ready);
  // What the learner answers when the disk is full (its reason names the path).
  const std::string reason = h.exp.run.run_dir() + "/checkpoints/.tmp-step-0000000002-1/"
                             "model.safetensors: write failed: No space left on device";
  h.self->send(h.trainer, checkpoint_done(2, false, reason));
  auto [ok, why] = expect_shutdown(h.self);
  CHECK_FALSE(ok);
  CHECK(why == "checkpoint at step 2 failed: " + reason + "; the last complete checkpoint is " +
               step1 + " (step 1); continue the run with --resume once the cause is fixed");
  CHECK(recorded_steps(h.exp) == std::vector<int64_t>{1, 2}); // resume drops step 2's
}

TEST_CASE("a metrics write on a full disk ends the job naming the file") {
  // /dev/full accepts the open and fails every write with ENOSPC, as a full disk does.
  const std::string dev_full = "/dev/full";
  std::string metrics;
  trainer_harness h{"metrics_full", [&](experiment_config& e) {
                      fs::create_directories(e.run.run_dir());
                      metrics = e.run.run_dir() + "/metrics.jsonl";
                      if (fs::exists(dev_full))
                        fs::create_symlink(dev_full, metrics);
                    }};
  if (!fs::is_symlink(metrics)) {
    WARN("no /dev/full on this system: the full-disk case is not tested");
    return;
  }
  finish_rollouts(h, h.ids);
  h.self->send(h.trainer, build_envelope<msg::TrainResult>([](msg::TrainResult::Builder b) {
                 b.setStep(0);
                 b.setVersion(1);
                 b.setOk(true);
               }));
  h.self->send(h.trainer, build_envelope<msg::VersionReady>([](msg::VersionReady::Builder b) {
                 b.setVersion(1);
               }));
  auto [ok, why] = expect_shutdown(h.self);
  CHECK_FALSE(ok);
  CHECK(why == "step 1: metrics: cannot write " + metrics + ": No space left on device; no "
               "checkpoint of this run was written, so --resume has nothing to continue from");
}

TEST_CASE("after a resume a failed step names the checkpoint the run was resumed from") {
  trainer::trainer_snapshot saved; // three steps of two groups of G = 3 taken
  saved.step = 3;
  saved.counters = {6, 18, 6};
  saved.reward_history = {0.5, 0.5, 0.5};
  saved.roles = std::map<std::string, std::string>{{"sagc_controller", "{}"}, {"scheduler", "{}"}};
  const std::string source = "/runs/resumed/checkpoints/step-0000000003";
  trainer_harness h{"resumed_learner_failed", [](experiment_config& e) { e.run.steps = 5; },
                    saved, source};
  CHECK(h.ids == std::vector<uint64_t>{18, 19, 20, 21, 22, 23});
  finish_rollouts(h, h.ids);
  h.self->send(h.trainer, failed_result(3, "trajectory 18: 2 response tokens, 1 mask bytes, 2 "
                                           "log-probs"));
  auto [ok, why] = expect_shutdown(h.self);
  CHECK_FALSE(ok);
  CHECK(why == "step 4: the learner failed: trajectory 18: 2 response tokens, 1 mask bytes, 2 "
               "log-probs; the last complete checkpoint is " + source + " (step 3); continue "
               "the run with --resume once the cause is fixed");
}
