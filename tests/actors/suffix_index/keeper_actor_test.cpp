// The suffix-index keeper's actor shell with its rollout workers played by the test: a
// worker's responses reach every other worker and never come back to their origin, messages
// that are malformed or that the core refuses are dropped without stopping the keeper, a
// worker that goes down is sent nothing more, and the SuffixResponses codec keeps every field.
//
// Deterministic without sleeps: the test sends every message from one actor, which CAF
// delivers to the keeper in order, and the keeper sends to each worker in the order it handles
// them. So when a worker receives the answer to a later message, whatever the keeper sent it
// for an earlier one already sits before it in its mailbox.

#include <catch2/catch.hpp>

#include <capnp/any.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/suffix_index/keeper_actor.hpp"
#include "actors/suffix_index/suffix_wire.hpp"
#include "messages/smoke.capnp.h"
#include "messages/suffix.capnp.h"
#include "runtime/actor_types.hpp"
#include "runtime/config.hpp"
#include "runtime/envelope.hpp"
#include "tests/support/actor_system.hpp"

using namespace sorl;
using sorl::suffix_index::suffix_responses;
using sorl::suffix_index::token_responses;
using sorl::test::test_context;
using sorl::test::test_system_config;
using namespace std::chrono_literals;

namespace {

std::string name(int i) {
  return "rollout_worker#" + std::to_string(i) + "@test";
}

envelope responses(const std::string& origin, const token_responses& rs) {
  return suffix_index::to_msg(suffix_responses{origin, rs});
}

/// A keeper with `n` rollout workers "rollout_worker#i@test" played by scoped actors; `self`
/// sends on their behalf (the keeper reads the origin from the message).
struct keeper_harness {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::deque<caf::scoped_actor> workers;
  experiment_config exp;
  caf::actor keeper;
  std::vector<peer_info> roster;

  explicit keeper_harness(int n) {
    keeper = spawn_suffix_index_keeper(sys, test_context(exp, "suffix_index_keeper"));
    roster.push_back({"trainer", 0, "test", caf::actor_cast<caf::actor>(self)});
    roster.push_back({"suffix_index_keeper", 0, "test", keeper});
    for (int i = 0; i < n; ++i) {
      workers.emplace_back(sys);
      roster.push_back({"rollout_worker", i, "test", caf::actor_cast<caf::actor>(workers.back())});
    }
    self->send(keeper, roster_atom::value, roster);
  }
  ~keeper_harness() {
    self->send_exit(keeper, caf::exit_reason::user_shutdown);
  }
  void send(const envelope& e) {
    self->send(keeper, e);
  }
  /// The next message worker `i` receives, which must be a SuffixResponses (waits up to 20 s).
  suffix_responses next(int i) {
    suffix_responses out;
    workers.at(static_cast<size_t>(i))
      ->receive(
        [&](const envelope& e) {
          REQUIRE(e.schema_id() == capnp::typeId<msg::SuffixResponses>());
          REQUIRE_FALSE(with_envelope<msg::SuffixResponses>(
            e, [&](msg::SuffixResponses::Reader r) { out = suffix_index::from_msg(r); }));
        },
        caf::after(20s) >> [] { FAIL("no message arrived"); });
    return out;
  }
  /// Whether worker `i`'s mailbox is empty now, without waiting.
  bool empty(int i) {
    bool got = false;
    workers.at(static_cast<size_t>(i))
      ->receive([&](const envelope&) { got = true; }, caf::after(0s) >> [] {});
    return !got;
  }
};

/// A SuffixResponses envelope whose `responses` pointer holds a struct, not a list: it opens,
/// and reading the field fails.
envelope struct_for_list() {
  capnp::MallocMessageBuilder b;
  auto root = b.getRoot<capnp::AnyPointer>().initAsAnyStruct(0, 2);
  root.getPointerSection()[0].setAs<capnp::Text>(name(0));
  root.getPointerSection()[1].initAsAnyStruct(1, 0);
  return make_envelope<msg::SuffixResponses>(b);
}

} // namespace

TEST_CASE("the keeper forwards a worker's responses to every other worker and not back") {
  keeper_harness h(3);
  const token_responses rs{{5, 6, 7}, {8}};
  h.send(responses(name(0), rs));
  for (int i : {1, 2}) {
    const auto got = h.next(i);
    CHECK(got.origin == name(0));
    CHECK(got.responses == rs);
  }
  // Worker 0's first message is worker 1's responses: its own never came back.
  h.send(responses(name(1), {{9, 9}}));
  const auto got = h.next(0);
  CHECK(got.origin == name(1));
  CHECK(got.responses == token_responses{{9, 9}});
  CHECK(h.next(2).origin == name(1));
  CHECK(h.empty(0));
  CHECK(h.empty(1));
  CHECK(h.empty(2));
}

TEST_CASE("the keeper drops malformed and refused messages and keeps serving") {
  keeper_harness h(2);
  // Bytes that are no Cap'n Proto message at all.
  const uint32_t garbage[4] = {0, 0xffff, 1, 2};
  auto bad = envelope::from_bytes(capnp::typeId<msg::SuffixResponses>(), garbage, sizeof garbage);
  REQUIRE(bad);
  h.send(*bad);
  h.send(struct_for_list());
  // Well formed, refused by the core.
  h.send(responses("rollout_worker#7@test", {{1}}));
  h.send(responses(name(0), {}));
  h.send(responses(name(0), {{1, -2}}));
  h.send(responses(name(0), token_responses(257, {1})));
  h.send(responses(name(0), {std::vector<int32_t>(65537, 1)}));
  // Another protocol's message.
  h.send(build_envelope<msg::Ping>([](msg::Ping::Builder b) { b.setRound(1); }));
  // The first thing worker 1 receives is this one.
  h.send(responses(name(0), {{3, 4}}));
  const auto got = h.next(1);
  CHECK(got.origin == name(0));
  CHECK(got.responses == token_responses{{3, 4}});
  h.send(responses(name(1), {{2}}));
  CHECK(h.next(0).responses == token_responses{{2}});
  CHECK(h.empty(0));
  CHECK(h.empty(1));
}

TEST_CASE("a worker that goes down is sent nothing more and its messages are refused") {
  keeper_harness h(3);
  const peer_info& lost = h.roster.at(2 + 1);
  REQUIRE(lost.name() == name(1));
  h.self->send(h.keeper, peer_down_atom::value, lost, std::string{"connection closed"});
  h.send(responses(name(1), {{1}})); // refused: no longer a worker of the job
  h.send(responses(name(0), {{2}})); // to worker 2 only
  h.send(responses(name(2), {{3}})); // to worker 0 only
  CHECK(h.next(2).responses == token_responses{{2}});
  CHECK(h.next(0).responses == token_responses{{3}});
  CHECK(h.empty(0));
  CHECK(h.empty(1));
  CHECK(h.empty(2));
}

TEST_CASE("the SuffixResponses codec keeps every field and writes the schema's bytes") {
  const suffix_responses m{name(3), {{0, 1, 2147483647}, {}, {42}}};
  const envelope e = suffix_index::to_msg(m);
  CHECK(e.schema_id() == capnp::typeId<msg::SuffixResponses>());
  suffix_responses back;
  REQUIRE_FALSE(with_envelope<msg::SuffixResponses>(
    e, [&](msg::SuffixResponses::Reader r) { back = suffix_index::from_msg(r); }));
  CHECK(back.origin == m.origin);
  CHECK(back.responses == m.responses);
  // The same bytes as the schema's own builder, field by field.
  const envelope ref = build_envelope<msg::SuffixResponses>([&](msg::SuffixResponses::Builder b) {
    b.setOrigin(m.origin);
    auto outer = b.initResponses(3);
    auto r0 = outer.init(0, 3);
    r0.set(0, 0);
    r0.set(1, 1);
    r0.set(2, 2147483647);
    outer.init(1, 0);
    outer.init(2, 1).set(0, 42);
  });
  REQUIRE(e.size_bytes() == ref.size_bytes());
  CHECK(std::memcmp(e.data(), ref.data(), e.size_bytes()) == 0);
}
