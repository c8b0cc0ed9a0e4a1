// The trainer's mapping between the step driver's events and commands and the rollout
// protocol's plain structs (actors/trainer/rollout_mapping.hpp), with hand-set values in every
// field.

#include <catch2/catch.hpp>

#include "actors/trainer/rollout_mapping.hpp"
#include "actors/trainer/sync_mapping.hpp"

using namespace sorl;
using namespace sorl::trainer;

namespace {

rollout::trajectory_record a_trajectory() {
  rollout::trajectory_record t;
  auto& r = t.result;
  r.request.request_id = 41;
  r.request.step = 7;
  r.request.group_id = 12;
  r.request.sample_index = 3;
  r.prompt = {1, 2};
  r.response = {5, 6, 7, 8};
  r.loss_mask = {1, 0, 1, 1};
  r.logprobs = {-0.5f, 0.0f, -1.0f, -2.0f};
  r.reward = 0.75;
  r.status = rollout::rollout_status::ok;
  r.finish = ml::finish_reason::eos;
  t.worker = "rollout_worker#1@n0";
  t.weight_version = 6;
  return t;
}

} // namespace

TEST_CASE("a generate command becomes one request per spec with the command's sampling") {
  cmd::generate c;
  c.requests.push_back({41, 7, 12, 0, 4, 905, 0xDEADBEEFull});
  c.requests.push_back({42, 7, 12, 1, 4, 905, 0xDEADBEEFull});
  c.weight_version = 6;
  c.max_new_tokens = 96;
  c.temperature = 0.7;
  c.top_p = 0.8;
  c.top_k = 20;
  const auto reqs = requests_of(c);
  REQUIRE(reqs.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const auto& r = reqs[i];
    CHECK(r.request_id == 41 + i);
    CHECK(r.step == 7);
    CHECK(r.group_id == 12);
    CHECK(r.sample_index == i);
    CHECK(r.split == ml::task_split::train);
    CHECK(r.task_index == 905);
    CHECK(r.seed == 0xDEADBEEFull);
    CHECK(r.weight_version == 6);
    CHECK(r.max_new_tokens == 96);
    CHECK(r.temperature == 0.7);
    CHECK(r.top_p == 0.8);
    CHECK(r.top_k == 20);
    CHECK(r.replaced_from.empty());
  }
  CHECK(requests_of(cmd::generate{}).empty());
}

TEST_CASE("a trajectory becomes the driver's finished event with its policy tokens") {
  const auto x = finished_of(a_trajectory());
  CHECK(x.request_id == 41);
  CHECK(x.step == 7);
  CHECK(x.group_id == 12);
  CHECK(x.sample_index == 3);
  CHECK(x.reward == 0.75);
  CHECK(x.outcome == rollout_outcome::ok);
  CHECK(x.failure.empty());
  CHECK(x.worker == "rollout_worker#1@n0");
  CHECK(x.policy_tokens == 3); // the mask's ones; the environment's token is not the policy's
  CHECK(x.finish == ev::finish_reason::eos);
  CHECK_FALSE(x.replaced);
}

TEST_CASE("a trajectory's status, finish reason and re-placement map one to one") {
  auto t = a_trajectory();
  t.result.status = rollout::rollout_status::failed;
  t.result.failure = "the worker holds no weights yet";
  t.result.finish = ml::finish_reason::length;
  t.result.request.replaced_from = "rollout_worker#0@n0";
  auto x = finished_of(t);
  CHECK(x.outcome == rollout_outcome::failed);
  CHECK(x.failure == "the worker holds no weights yet");
  CHECK(x.finish == ev::finish_reason::length);
  CHECK(x.replaced);

  t.result.status = rollout::rollout_status::reward_failed;
  t.result.finish = ml::finish_reason::stop;
  x = finished_of(t);
  CHECK(x.outcome == rollout_outcome::reward_failed);
  CHECK(x.finish == ev::finish_reason::other);
  t.result.finish = ml::finish_reason::abort;
  CHECK(finished_of(t).finish == ev::finish_reason::other);
}

TEST_CASE("a trajectory's speculation counts reach the driver's event field by field") {
  auto t = a_trajectory();
  CHECK(finished_of(t).spec.verify_steps == 0); // decoded without drafts
  t.result.speculation = {3, 1, 12, 9, 4, 8000, 14, 900, 2, 700};
  const auto x = finished_of(t).spec;
  CHECK(x.verify_steps == 3);
  CHECK(x.plain_steps == 1);
  CHECK(x.drafted_tokens == 12);
  CHECK(x.accepted_tokens == 9);
  CHECK(x.draft_calls == 4);
  CHECK(x.draft_ns == 8000);
  CHECK(x.verify_tokens == 14);
  CHECK(x.verify_ns == 900);
  CHECK(x.plain_tokens == 2);
  CHECK(x.plain_ns == 700);
}

TEST_CASE("only a start event tells the driver where a rollout runs") {
  rollout::event_record e;
  e.event.request_id = 41;
  e.event.kind = rollout::event_kind::start;
  e.worker = "rollout_worker#2@n1";
  auto started = started_of(e);
  REQUIRE(started);
  CHECK(started->request_id == 41);
  CHECK(started->worker == "rollout_worker#2@n1");
  e.event.kind = rollout::event_kind::chunk;
  CHECK_FALSE(started_of(e));
  e.event.kind = rollout::event_kind::finish;
  CHECK_FALSE(started_of(e));
}

TEST_CASE("a VersionReady becomes the driver's event with every field it reads") {
  sync::version_ready v;
  v.version = 7;
  v.model_hash = 0x0123456789abcdefULL;
  v.workers = 3;
  v.verified_workers = 2;
  v.bytes_sent = 1000;
  v.dense_bytes = 4000;
  v.sparse_bytes = 300;
  v.elements = 2000;
  v.changed_elements = 17;
  v.recurring_elements = 9;
  v.bound_bits = 80.5;
  v.encode_ns = 21;
  v.apply_ns_max = 34;
  v.full_workers = 1;
  v.sparse_workers = 2;
  v.resyncs = 5;
  v.publish_ns = 55;
  const auto x = sorl::trainer::version_ready_of(v);
  CHECK(x.version == 7);
  CHECK(x.model_hash == 0x0123456789abcdefULL);
  CHECK(x.workers == 3);
  CHECK(x.verified_workers == 2);
  CHECK(x.bytes_sent == 1000);
  CHECK(x.dense_bytes == 4000);
  CHECK(x.sparse_bytes == 300);
  CHECK(x.elements == 2000);
  CHECK(x.changed_elements == 17);
  CHECK(x.recurring_elements == 9);
  CHECK(x.bound_bits == 80.5);
  CHECK(x.encode_ns == 21);
  CHECK(x.apply_ns_max == 34);
  CHECK(x.full_workers == 1);
  CHECK(x.sparse_workers == 2);
  CHECK(x.resyncs == 5);
}
