// The learner service's batch assembly without an actor: the trajectories the trainer forwards
// are kept by request id until the TrainBatch of their step, which takes them in its own order;
// a missing, repeated, malformed or left-over trajectory is a clear error that loses no later
// step's trajectories. The service answers such a batch with ok = false and keeps its weights.

#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "actors/learner/learner_service.hpp"
#include "runtime/config.hpp"
#include "runtime/ml/formats/hf_model.hpp"
#include "tests/support/scratch_dir.hpp"

using namespace sorl;
using namespace sorl::learner;

namespace {

/// A Trajectory of request `id` of 0-based `step` as rollout::from_msg reads it: group id / 2,
/// prompt {256, id}, response {50, 51}, both tokens sampled, log-probs {-0.5, -0.25}, `reward`,
/// finished by EOS.
rollout::trajectory_record trajectory(uint64_t id, uint64_t step, float reward = 1.0f) {
  rollout::trajectory_record t;
  auto& r = t.result;
  r.request.request_id = id;
  r.request.step = step;
  r.request.group_id = id / 2;
  r.prompt = {256, static_cast<int32_t>(id)};
  r.response = {50, 51};
  r.logprobs = {-0.5f, -0.25f};
  r.loss_mask = {1, 1};
  r.reward = reward;
  r.finish = ml::finish_reason::eos;
  r.status = rollout::rollout_status::ok;
  return t;
}

void keep(trajectory_buffer& buf, uint64_t id, uint64_t step, float reward = 1.0f) {
  buf.keep(trajectory(id, step, reward));
}

/// The second prompt token of each sample: the request id it was built from.
std::vector<int32_t> ids_of(const std::vector<rollout_sample>& samples) {
  std::vector<int32_t> out;
  for (const auto& s : samples)
    out.push_back(s.prompt.at(1));
  return out;
}

std::string take_error(trajectory_buffer& buf, uint64_t step, const std::vector<uint64_t>& ids) {
  try {
    buf.take(step, ids);
  } catch (const std::invalid_argument& ex) {
    return ex.what();
  }
  FAIL("the batch was assembled");
  return {};
}

} // namespace

TEST_CASE("a trajectory decodes into the learner's sample field by field") {
  auto t = trajectory(5, 0, 0.75f);
  t.result.finish = ml::finish_reason::length;
  auto s = sample_from(t);
  CHECK(s.group_id == 2);
  CHECK(s.prompt == std::vector<int32_t>{256, 5});
  CHECK(s.response == std::vector<int32_t>{50, 51});
  CHECK(s.loss_mask == std::vector<uint8_t>{1, 1});
  CHECK(s.sampling_logprobs == std::vector<float>{-0.5f, -0.25f});
  CHECK(s.reward == 0.75f);
  CHECK(s.truncated);
  CHECK_FALSE(s.reward_failed);

  SECTION("a rollout whose reward failed, or is not finite, is masked and its reward is 0") {
    t.result.status = rollout::rollout_status::reward_failed;
    auto failed = sample_from(t);
    CHECK(failed.reward_failed);
    CHECK(failed.reward == 0.0f);
    t.result.status = rollout::rollout_status::ok;
    t.result.reward = std::nan("");
    auto nan = sample_from(t);
    CHECK(nan.reward_failed);
    CHECK(nan.reward == 0.0f);
  }
  SECTION("a log-prob list of the wrong length names the request") {
    t.result.logprobs.resize(1);
    CHECK_THROWS_WITH(sample_from(t),
                      "trajectory 5: 2 response tokens, 2 mask bytes, 1 log-probs");
  }
}

TEST_CASE("the batch's samples come in the batch's order, not in arrival order") {
  trajectory_buffer buf;
  for (uint64_t id : {0, 1, 2, 3})
    keep(buf, id, 4);
  auto samples = buf.take(4, {3, 0, 2, 1});
  CHECK(ids_of(samples) == std::vector<int32_t>{3, 0, 2, 1});
  CHECK(buf.size() == 0);
}

TEST_CASE("trajectories of a later step stay kept when an earlier batch is taken") {
  trajectory_buffer buf;
  keep(buf, 0, 0);
  keep(buf, 2, 1); // step 1's, ahead of step 0's second one
  keep(buf, 1, 0);
  keep(buf, 3, 1);
  CHECK(ids_of(buf.take(0, {0, 1})) == std::vector<int32_t>{0, 1});
  CHECK(buf.size() == 2);
  CHECK(ids_of(buf.take(1, {3, 2})) == std::vector<int32_t>{3, 2});
  CHECK(buf.size() == 0);
}

TEST_CASE("a batch that cannot be assembled names the requests and keeps later steps") {
  trajectory_buffer buf;
  keep(buf, 0, 0);
  keep(buf, 1, 0);
  keep(buf, 9, 1);
  SECTION("a named trajectory that never arrived") {
    CHECK(take_error(buf, 0, {0, 7, 1, 8}) ==
          "the batch of 4 rollouts names requests 7, 8 whose trajectory never arrived");
  }
  SECTION("a request named twice") {
    CHECK(take_error(buf, 0, {0, 1, 0}) == "the batch names request 0 more than once");
  }
  SECTION("a trajectory of the batch's step that the batch does not name") {
    CHECK(take_error(buf, 0, {1}) ==
          "trajectories of step 1 arrived that the batch does not name: request 0");
  }
  SECTION("a trajectory that arrived twice") {
    keep(buf, 1, 0);
    CHECK(take_error(buf, 0, {0, 1}) == "two trajectories of request 1 arrived");
  }
  SECTION("a malformed trajectory, with sample_from's reason") {
    auto t = trajectory(4, 0);
    t.result.loss_mask.clear();
    buf.keep(t);
    CHECK(take_error(buf, 0, {0, 1, 4}) ==
          "trajectory 4: 2 response tokens, 0 mask bytes, 2 log-probs");
  }
  // Step 0's trajectories are gone with the failed batch; step 1's is still there.
  CHECK(buf.size() == 1);
  CHECK(ids_of(buf.take(1, {9})) == std::vector<int32_t>{9});
}

TEST_CASE("more than ten missing requests are named ten at a time") {
  trajectory_buffer buf;
  std::vector<uint64_t> ids;
  for (uint64_t id = 0; id < 12; ++id)
    ids.push_back(id);
  CHECK(take_error(buf, 0, ids) == "the batch of 12 rollouts names requests 0, 1, 2, 3, 4, 5, "
                                   "6, 7, 8, 9 and 2 more whose trajectory never arrived");
}

TEST_CASE("the service answers a batch it cannot assemble with ok = false and keeps its version") {
  sorl::test::scratch_dir scratch{"learner_service"};
  experiment_config exp;
  exp.run.output_dir = scratch.path.string();
  exp.run.name = "run";
  learner_service svc{exp, "learner"};
  // Before the policy is loaded nothing can be trained.
  auto early = svc.train(0, {});
  CHECK_FALSE(early.ok);
  CHECK(early.reason == "the policy is not loaded yet");

  auto loaded = svc.load_policy();
  CHECK_FALSE(loaded.resumed);
  CHECK(loaded.source == "fresh " + exp.model.preset + " init (seed " +
                           std::to_string(exp.run.seed) + ")");
  CHECK(loaded.trainer_state.empty());
  svc.keep(trajectory(0, 0, 1.0f));
  auto r = svc.train(0, {0, 1});
  CHECK_FALSE(r.ok);
  CHECK(r.step == 0);
  CHECK(r.version == 0);
  CHECK(r.metrics.empty());
  CHECK(r.reason == "the batch of 2 rollouts names request 1 whose trajectory never arrived");
  CHECK(svc.kept() == 0);
  CHECK(svc.version() == 0);
}

TEST_CASE("a learner started from a model directory holds its weights and evaluates in its format") {
  sorl::test::scratch_dir scratch{"learner_service_hf"};
  const auto dir = scratch.path / "model";
  ml::model_dims dims = ml::preset("tiny");
  const ml::policy_model source{dims, 21};
  ml::save_hf_byte_model(source, dir, ml::sorl_prompt_format::chat, at::kFloat);
  experiment_config exp;
  exp.run.output_dir = scratch.path.string();
  exp.run.name = "run";
  exp.model.hf_dir = dir.string();
  exp.model.max_seq = 128;
  learner_service svc{exp, "learner"};
  auto loaded = svc.load_policy();
  CHECK(loaded.source == dir.string());
  CHECK(svc.model().dims().max_seq == 128);
  const auto& got = svc.model().parameters();
  const auto& want = source.parameters();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(want[i].first);
    CHECK(got[i].first == want[i].first);
    CHECK(at::equal(got[i].second, want[i].second));
  }
  // Held-out prompts go through the directory's chat template (sorl's turn format here).
  auto report = svc.evaluate(3);
  CHECK(report.count == 3);
  auto saved = svc.save_checkpoint("{}");
  CHECK(saved.error.empty());
}

TEST_CASE("a held-out reward the scorer fails is counted under on_reward_failure = mask and ends "
          "the evaluation, naming the prompt, under fail") {
  sorl::test::scratch_dir scratch{"learner_service_eval_failures"};
  const auto data = scratch.path / "data.jsonl";
  std::ofstream{data} << "{\"prompt\": \"p0\", \"answer\": \"a0\"}\n{\"prompt\": \"p1\", \"answer\": \"a1\"}\n"
                         "{\"prompt\": \"p2\", \"answer\": \"a2\"}\n{\"prompt\": \"p3\", \"answer\": \"a3\"}\n";
  // A scorer that ignores the completion: a0 and a3 score 1, a2 scores 0, and a1 gets the null
  // with a reason reasoning-gym's scorer sends when its score_answer raises.
  const auto scorer = scratch.path / "scorer.py";
  std::ofstream{scorer}
    << "import json, sys\n"
       "for line in sys.stdin:\n"
       "    req = json.loads(line)\n"
       "    table = {'a0': 1.0, 'a1': None, 'a2': 0.0, 'a3': 1.0}\n"
       "    rewards = [table[it['answer']] for it in req['items']]\n"
       "    errors = ['no integer answer' if r is None else None for r in rewards]\n"
       "    print(json.dumps({'id': req['id'], 'rewards': rewards, 'errors': errors}), flush=True)\n";
  experiment_config exp;
  exp.run.output_dir = scratch.path.string();
  exp.run.name = "run";
  exp.task.name = "jsonl";
  exp.task.path = data.string();
  exp.task.eval_path = data.string();
  exp.task.reward_command = {"python3", scorer.string()};
  exp.task.max_new_tokens = 2;

  SECTION("mask: the scored three give accuracy and mean reward 2/3") {
    learner_service svc{exp, "learner"};
    svc.load_policy();
    const auto report = svc.evaluate(4);
    CHECK(report.count == 4);
    CHECK(report.reward_failures == 1);
    CHECK(report.correct == 2);
    CHECK(report.accuracy == Approx(2.0 / 3.0));
    CHECK(report.mean_reward == Approx(2.0 / 3.0));
  }
  SECTION("fail: the evaluation ends at prompt 1") {
    exp.algorithm.on_reward_failure = reward_failure_kind::fail;
    learner_service svc{exp, "learner"};
    svc.load_policy();
    CHECK_THROWS_WITH(svc.evaluate(4), "evaluate: the reward of prompt 1 of split eval failed: "
                                       "scorer: no integer answer");
  }
}
