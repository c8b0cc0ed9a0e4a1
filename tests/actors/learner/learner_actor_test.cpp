// The learner actor shell with its trainer, sync publisher and directory played by the test:
// a train step it cannot take (a malformed batch, every update non-finite) is answered with a
// failed TrainResult and its reason, never with new weights; a checkpoint it cannot write is
// answered with a failed CheckpointDone naming the path, and `latest` keeps naming the last
// complete checkpoint.

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
#include "runtime/ml/checkpoint.hpp"
#include "runtime/ml/model.hpp"
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
};

envelope train_batch(const std::vector<rollout>& rollouts) {
  return build_envelope<msg::TrainBatch>([&](msg::TrainBatch::Builder b) {
    b.setStep(0);
    auto list = b.initTrajectories(static_cast<unsigned>(rollouts.size()));
    for (unsigned i = 0; i < rollouts.size(); ++i) {
      auto t = list[i];
      t.setRequestId(rollouts[i].request_id);
      t.setGroupId(0);
      t.setSampleIndex(i);
      auto prompt = t.initPromptTokens(2);
      prompt.set(0, 256);
      prompt.set(1, '1');
      auto resp = t.initResponseTokens(2);
      resp.set(0, '2');
      resp.set(1, '3');
      auto lp = t.initSamplingLogprobs(2);
      lp.set(0, -1.0f);
      lp.set(1, -1.0f);
      std::vector<uint8_t> mask(rollouts[i].mask_bytes, 1);
      t.setLossMask(kj::arrayPtr(mask.data(), mask.size()));
      t.setReward(rollouts[i].reward);
      t.setFinishReason(msg::FinishReason::EOS);
      t.setStatus(msg::RolloutStatus::OK);
    }
  });
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
  h.self->send(h.learner, train_batch({{4, 1.0f}, {5, 0.0f, 1}}));
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
  h.self->send(h.learner, train_batch({{0, 1.0f}, {1, 0.0f}}));
  expect<msg::TrainResult>(h.self, [](msg::TrainResult::Reader r) {
    CHECK_FALSE(r.getOk());
    CHECK(r.getVersion() == 0);
    CHECK_THAT(r.getReason().cStr(),
               Catch::StartsWith("every update of the step (1 of them) had a non-finite loss "
                                 "or gradient norm and was dropped"));
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
