// The rollout worker shell answers every request: one it cannot serve comes back to the
// trainer as a failed trajectory with the reason, and its finish event frees the scheduler's
// slot, so no step waits for it. Weight versions reach it as the publisher's core builds
// them, also out of order, early or incomplete, and while a rollout is in flight; its
// acknowledgements go back to that core.

#include <catch2/catch.hpp>

#include <memory>

#include <ATen/ATen.h>
#include <caf/all.hpp>

#include "actors/common/train_setup.hpp"
#include "actors/rollout/worker_actor.hpp"
#include "actors/suffix_index/suffix_wire.hpp"
#include "actors/sync/publisher_core.hpp"
#include "actors/sync/sync_wire.hpp"
#include "messages/rollout.capnp.h"
#include "messages/suffix.capnp.h"
#include "messages/sync.capnp.h"
#include "runtime/actor_types.hpp"
#include "runtime/config.hpp"
#include "runtime/envelope.hpp"
#include "runtime/ml/policy/model.hpp"
#include "tests/support/actor_system.hpp"

using namespace sorl;
using sorl::test::expect;
using sorl::test::test_context;
using sorl::test::test_system_config;
using namespace std::chrono_literals;

namespace {

/// The name role_context gives rollout_worker #0 on node "test".
const std::string worker_name = "rollout_worker#0@test";

envelope request(uint64_t id, uint64_t weight_version) {
  return build_envelope<msg::GenerateRequest>([&](msg::GenerateRequest::Builder b) {
    b.setRequestId(id);
    b.setGroupId(2);
    b.setSampleIndex(1);
    b.setGroupSize(4);
    b.setWeightVersion(weight_version);
    b.setMaxNewTokens(4);
    b.setTemperature(1.0f);
    b.setTopP(1.0f);
  });
}

/// A rollout worker on the tiny preset whose trainer, scheduler, controller and publisher are
/// all played by `self`; `with_keeper`: speculation on, and `self` is also the suffix-index
/// keeper.
struct worker_harness {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  experiment_config exp; // arithmetic on the tiny preset
  caf::actor worker;

  explicit worker_harness(bool with_keeper = false) {
    if (with_keeper)
      exp.rollout.speculative = "on";
    worker = spawn_rollout_worker(sys, test_context(exp, "rollout_worker"));
    auto me = caf::actor_cast<caf::actor>(self);
    std::vector<peer_info> roster;
    for (auto role : {"trainer", "scheduler", "sagc_controller", "sync_publisher"})
      roster.push_back({role, 0, "test", me});
    if (with_keeper)
      roster.push_back({"suffix_index_keeper", 0, "test", me});
    roster.push_back({"rollout_worker", 0, "test", worker});
    self->send(worker, roster_atom::value, roster);
  }
  ~worker_harness() {
    self->send_exit(worker, caf::exit_reason::user_shutdown);
  }
  /// Sends `msgs` to the worker in order.
  void send(const std::vector<envelope>& msgs) {
    for (const auto& e : msgs)
      self->send(worker, e);
  }

  /// The next Trajectory or WeightAck the worker sends (rollout events are skipped).
  envelope next() {
    envelope out;
    while (out.schema_id() == 0)
      self->receive(
        [&](const envelope& e) {
          if (e.schema_id() != capnp::typeId<msg::RolloutEvent>())
            out = e;
        },
        [&](shutdown_atom, bool, const std::string& why) { FAIL("the job ended: " << why); },
        caf::after(20s) >> [] { FAIL("no message arrived"); });
    return out;
  }
  /// The next message, which must be a WeightAck.
  sync::weight_ack next_ack() {
    auto e = next();
    sync::weight_ack a;
    REQUIRE(e.schema_id() == capnp::typeId<msg::WeightAck>());
    REQUIRE_FALSE(with_envelope<msg::WeightAck>(e, [&](msg::WeightAck::Reader r) {
      CHECK(std::string{r.getWorker().cStr()} == worker_name);
      a = sync::decode_ack(r);
    }));
    return a;
  }
  /// The next message, which must be the Trajectory of request `id`, served (status OK) with
  /// weight version `version`.
  void expect_served(uint64_t id, uint64_t version) {
    auto e = next();
    REQUIRE(e.schema_id() == capnp::typeId<msg::Trajectory>());
    REQUIRE_FALSE(with_envelope<msg::Trajectory>(e, [&](msg::Trajectory::Reader t) {
      CHECK(t.getRequestId() == id);
      CHECK(t.getStatus() == msg::RolloutStatus::OK);
      CHECK(t.getWeightVersion() == version);
    }));
  }
};

/// The worker model's bf16 bits, tensor by tensor in model order.
struct model_bits {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<uint16_t>> bits;

  /// The bits the worker starts from (the same model and seed as the rollout core).
  static model_bits initial(const experiment_config& exp) {
    model_bits m;
    auto model = ml::policy_model{model_dims_from(exp), 0}.clone(c10::kBFloat16);
    for (const auto& [name, t] : model.parameters()) {
      m.names.push_back(name);
      m.shapes.emplace_back(t.sizes().begin(), t.sizes().end());
      auto* p = static_cast<const uint16_t*>(t.data_ptr());
      m.bits.emplace_back(p, p + t.numel());
    }
    return m;
  }
  /// This model with every `every`-th element of each tensor moved up by one ULP.
  model_bits nudged(size_t every) const {
    auto out = *this;
    for (auto& t : out.bits)
      for (size_t j = 0; j < t.size(); j += every)
        ++t[j];
    return out;
  }
  /// A learner snapshot of version `v` owning a copy of these bits.
  sync::snapshot_view snapshot(uint64_t v) const {
    auto owned = std::make_shared<model_bits>(*this);
    sync::snapshot_view s;
    s.version = v;
    s.names = owned->names;
    s.shapes = owned->shapes;
    for (const auto& t : owned->bits)
      s.data.push_back({reinterpret_cast<const uint8_t*>(t.data()), t.size() * 2});
    s.keep_alive = owned;
    return s;
  }
};

/// Version 0 of these tests: the worker's initial bits with every 7th element moved, so that
/// a delta after it, checked against the model's memory, proves the full version was written.
model_bits version0(const experiment_config& exp) {
  return model_bits::initial(exp).nudged(7);
}

/// The publisher's core in sparse mode with 16 KiB buckets, serving the one worker.
struct publisher {
  sync::publisher_core core{"p", options(), [] { return int64_t{0}; }};

  publisher() {
    core.add_worker(worker_name);
  }
  static sync::publisher_options options() {
    sync::publisher_options o;
    o.protocol.sparse = true;
    o.bucket_bytes = 16 << 10;
    return o;
  }
  /// Starts version `v` of `m`; returns the payload the worker is to get, as messages
  /// (header, then buckets in index order).
  std::vector<envelope> publish(const model_bits& m, uint64_t v, sync::payload_kind want) {
    auto r = core.on_snapshot(m.snapshot(v));
    REQUIRE_FALSE(r.fail);
    REQUIRE(r.sends.size() == 1);
    REQUIRE(r.sends[0].kind == want);
    return messages(core.payload_of(want));
  }
  static std::vector<envelope> messages(const sync::payload& p) {
    std::vector<envelope> out{sync::encode_version_header(p.header)};
    for (const auto& b : p.buckets)
      out.push_back(sync::encode_bucket(b));
    return out;
  }
};

/// The worker's acknowledgement `a` of version `v`: ok, of the published hash, and it
/// completes the version at the publisher.
void check_applied(publisher& pub, const sync::weight_ack& a, uint64_t v, bool full) {
  CHECK(a.version == v);
  CHECK(a.ok);
  CHECK(a.reason.empty());
  CHECK(a.full == full);
  CHECK(a.model_hash == pub.core.model_hash());
  auto r = pub.core.on_ack(worker_name, a);
  CHECK(r.ready);
  CHECK_FALSE(r.fail);
}

} // namespace

TEST_CASE("a worker answers a request it cannot serve with a failed trajectory and a reason") {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  experiment_config exp; // arithmetic on the tiny preset
  auto worker = spawn_rollout_worker(sys, test_context(exp, "rollout_worker"));
  auto me = caf::actor_cast<caf::actor>(self);
  std::vector<peer_info> roster;
  for (auto role : {"trainer", "scheduler", "sagc_controller", "sync_publisher"})
    roster.push_back({role, 0, "test", me});
  roster.push_back({"rollout_worker", 0, "test", worker});
  self->send(worker, roster_atom::value, roster);
  // No weights have reached this worker yet: it cannot generate for version 0.
  self->send(worker, build_envelope<msg::GenerateRequest>([](msg::GenerateRequest::Builder b) {
               b.setRequestId(7);
               b.setGroupId(2);
               b.setSampleIndex(1);
               b.setGroupSize(4);
               b.setWeightVersion(0);
               b.setMaxNewTokens(4);
               b.setTemperature(1.0f);
               b.setTopP(1.0f);
             }));
  expect<msg::Trajectory>(self, [](msg::Trajectory::Reader t) {
    CHECK(t.getRequestId() == 7);
    CHECK(t.getGroupId() == 2);
    CHECK(t.getSampleIndex() == 1);
    CHECK(t.getStatus() == msg::RolloutStatus::FAILED);
    CHECK(std::string{t.getFailure().cStr()} ==
          "the worker holds no weights yet, the request wants version 0");
    CHECK(t.getResponseTokens().size() == 0);
    CHECK(t.getFinishReason() == msg::FinishReason::ABORT);
  });
  self->send_exit(worker, caf::exit_reason::user_shutdown);
}

TEST_CASE("a worker takes versions whose buckets come reordered, early or incomplete, and "
          "acknowledges each to the publisher's core") {
  worker_harness h;
  auto& self = h.self;
  publisher pub;
  auto v0 = version0(h.exp);
  auto v1 = v0.nudged(3);
  auto v2 = v1.nudged(5);

  // Version 0 in full; a bucket sent before its header is refused at once.
  auto msgs = pub.publish(v0, 0, sync::payload_kind::full);
  REQUIRE(msgs.size() >= 3); // the header and at least two buckets
  self->send(h.worker, msgs[1]);
  auto early = h.next_ack();
  CHECK(early.version == 0);
  CHECK_FALSE(early.ok);
  CHECK(early.full);
  CHECK(early.reason == "bucket 0 of version 0 without a version header");
  // The header, then the buckets in reverse order.
  self->send(h.worker, msgs[0]);
  for (size_t k = msgs.size() - 1; k >= 1; --k)
    self->send(h.worker, msgs[k]);
  check_applied(pub, h.next_ack(), 0, true);

  // Version 1 as a delta: a bucket before its header is dropped without an answer, the
  // whole version sent again after the header, buckets reversed, is applied.
  msgs = pub.publish(v1, 1, sync::payload_kind::sparse);
  REQUIRE(msgs.size() >= 3);
  self->send(h.worker, msgs.back());
  self->send(h.worker, msgs[0]);
  for (size_t k = msgs.size() - 1; k >= 1; --k)
    self->send(h.worker, msgs[k]);
  check_applied(pub, h.next_ack(), 1, false); // the first answer: the early bucket got none
  self->send(h.worker, request(8, 1));
  h.expect_served(8, 1);

  // Version 2 as a delta that loses its last bucket, then in full: the incomplete delta is
  // dropped without an answer, the full version is applied and acknowledged once.
  msgs = pub.publish(v2, 2, sync::payload_kind::sparse);
  REQUIRE(msgs.size() >= 3);
  for (size_t k = 0; k + 1 < msgs.size(); ++k)
    self->send(h.worker, msgs[k]);
  publisher fresh; // a publisher that never saw this worker sends everything in full
  h.send(fresh.publish(v2, 2, sync::payload_kind::full));
  auto a = h.next_ack();
  CHECK(a.full);
  check_applied(pub, a, 2, true);
  self->send(h.worker, request(9, 2));
  h.expect_served(9, 2);
}

TEST_CASE("a version completed while a rollout is in flight is applied after the rollout "
          "ends") {
  worker_harness h;
  publisher pub;
  auto v0 = version0(h.exp);
  h.send(pub.publish(v0, 0, sync::payload_kind::full));
  check_applied(pub, h.next_ack(), 0, true);
  // The request is taken before the version's messages arrive. Whether its rollout still
  // runs when the last bucket comes (it usually does: the buckets are sent right behind it)
  // or has ended, version 1 is written only once the worker is idle: the trajectory leaves
  // first and was generated with version 0.
  auto msgs = pub.publish(v0.nudged(3), 1, sync::payload_kind::sparse);
  h.self->send(h.worker, request(11, 0));
  h.send(msgs);
  h.expect_served(11, 0);
  check_applied(pub, h.next_ack(), 1, false);
  h.self->send(h.worker, request(12, 1));
  h.expect_served(12, 1);
}

TEST_CASE("a speculating worker sends its finished turns to the suffix-index keeper and takes "
          "the other workers' from it") {
  worker_harness h(true);
  publisher pub;
  h.send(pub.publish(version0(h.exp), 0, sync::payload_kind::full));
  check_applied(pub, h.next_ack(), 0, true);
  // Responses of another worker as the keeper forwards them; one holds a token id outside the
  // vocabulary and is skipped, and the worker goes on serving.
  h.self->send(h.worker,
               suffix_index::to_msg({"rollout_worker#1@test", {{5, 6, 7}, {1, 1 << 30}}}));
  h.self->send(h.worker, request(31, 0));
  std::vector<int32_t> response;
  auto e = h.next();
  REQUIRE(e.schema_id() == capnp::typeId<msg::Trajectory>());
  REQUIRE_FALSE(with_envelope<msg::Trajectory>(e, [&](msg::Trajectory::Reader t) {
    CHECK(t.getRequestId() == 31);
    CHECK(t.getStatus() == msg::RolloutStatus::OK);
    for (auto tok : t.getResponseTokens())
      response.push_back(tok);
  }));
  REQUIRE_FALSE(response.empty());
  // Right behind its trajectory: the rollout's one turn, for the keeper.
  e = h.next();
  REQUIRE(e.schema_id() == capnp::typeId<msg::SuffixResponses>());
  REQUIRE_FALSE(with_envelope<msg::SuffixResponses>(e, [&](msg::SuffixResponses::Reader r) {
    const auto m = suffix_index::from_msg(r);
    CHECK(m.origin == worker_name);
    CHECK(m.responses == std::vector<std::vector<int32_t>>{response});
  }));
}
