#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <random>
#include <set>

#include <caf/all.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/stream_deserializer.hpp>
#include <caf/stream_serializer.hpp>
#include <caf/streambuf.hpp>

#include "actors/smoke/smoke_actors.hpp"
#include "messages/smoke.capnp.h"
#include "runtime/actor_types.hpp"
#include "runtime/envelope.hpp"
#include "tests/support/actor_system.hpp"

using namespace sorl;
using namespace std::chrono_literals;
using sorl::test::test_system_config;

// The largest single allocation made while `armed` is set (any thread): the tests of hostile
// lengths assert that no allocation follows the claimed length. Replacing the global
// operator new is the only hook that sees kj::heapArray's allocation.
namespace {
std::atomic<bool> armed{false};
std::atomic<size_t> largest_allocation{0};

void* counted_alloc(size_t n) {
  if (armed.load(std::memory_order_relaxed)) {
    size_t seen = largest_allocation.load(std::memory_order_relaxed);
    while (n > seen && !largest_allocation.compare_exchange_weak(seen, n)) {
    }
  }
  if (void* p = std::malloc(n == 0 ? 1 : n))
    return p;
  throw std::bad_alloc();
}

/// Runs `fn` and returns the largest allocation it made, bytes.
template <class Fn>
size_t largest_allocation_of(Fn&& fn) {
  largest_allocation = 0;
  armed = true;
  fn();
  armed = false;
  return largest_allocation.load();
}
} // namespace

void* operator new(size_t n) {
  return counted_alloc(n);
}
void* operator new[](size_t n) {
  return counted_alloc(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t) noexcept {
  std::free(p);
}

namespace {

envelope make_ping(uint64_t round, size_t payload = 16) {
  return build_envelope<msg::Ping>([&](msg::Ping::Builder b) {
    b.setRound(round);
    b.setSentNs(-42);
    auto data = b.initPayload(static_cast<unsigned>(payload));
    for (size_t i = 0; i < payload; ++i)
      data[i] = static_cast<uint8_t>(i * 7);
  });
}

envelope_errc code_of(const caf::error& err) {
  REQUIRE(err);
  REQUIRE(err.category() == caf::atom("envelope"));
  return static_cast<envelope_errc>(err.code());
}

template <class Schema>
envelope_errc open_code(const envelope& e, envelope_limits limits = {}) {
  auto r = open_envelope<Schema>(e, limits);
  REQUIRE_FALSE(r);
  return code_of(r.error());
}

} // namespace

TEST_CASE("an envelope round-trips every field") {
  auto e = make_ping(12345, 40);
  CHECK(e.schema_id() == capnp::typeId<msg::Ping>());
  CHECK(e.size_bytes() % 8 == 0);
  auto r = open_envelope<msg::Ping>(e);
  REQUIRE(r);
  auto root = r->root();
  CHECK(root.getRound() == 12345);
  CHECK(root.getSentNs() == -42);
  REQUIRE(root.getPayload().size() == 40);
  CHECK(root.getPayload()[39] == static_cast<uint8_t>(39 * 7));
}

TEST_CASE("a reader keeps the bytes alive after the envelope is gone") {
  caf::expected<envelope_reader<msg::Ping>> r{caf::error{}};
  {
    auto e = make_ping(9);
    r = open_envelope<msg::Ping>(e);
    REQUIRE(r);
  }
  CHECK(r->root().getRound() == 9);
}

TEST_CASE("copies of an envelope share one buffer") {
  auto e = make_ping(1);
  auto copy = e;
  CHECK(copy.data() == e.data());
  CHECK(e.use_count() == 2);
}

TEST_CASE("an envelope serializes for the wire and back bit for bit") {
  caf::actor_system_config cfg;
  add_sorl_message_types(cfg);
  caf::actor_system sys{cfg};
  auto e = make_ping(77, 1000);
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE_FALSE(inspect(static_cast<caf::serializer&>(sink), e));
  CHECK(buf.size() == 16 + e.size_bytes()); // schema id + length + bytes
  envelope back;
  caf::binary_deserializer source{sys, buf};
  REQUIRE_FALSE(inspect(static_cast<caf::deserializer&>(source), back));
  CHECK(back.schema_id() == e.schema_id());
  REQUIRE(back.size_bytes() == e.size_bytes());
  CHECK(std::memcmp(back.data(), e.data(), e.size_bytes()) == 0);
  CHECK(back.data() != e.data());
}

namespace {

/// The wire form of an envelope header alone: schema id of Ping, then `claimed_len`, no bytes.
std::vector<char> bare_wire_header(caf::actor_system& sys, uint64_t claimed_len) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  uint64_t id = capnp::typeId<msg::Ping>();
  REQUIRE_FALSE(sink(id, claimed_len));
  return buf;
}

caf::error decode_wire(caf::actor_system& sys, const std::vector<char>& buf) {
  envelope back;
  caf::binary_deserializer source{sys, buf};
  return inspect(static_cast<caf::deserializer&>(source), back);
}

} // namespace

TEST_CASE("the wire limit is the envelope's own size limit") {
  CHECK(envelope_wire_limit == envelope_limits{}.max_bytes);
  CHECK(envelope_wire_limit == size_t{1} << 30);
}

TEST_CASE("a 16-byte envelope claiming 2 GiB is refused without allocating it") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  const auto buf = bare_wire_header(sys, uint64_t{2} << 30);
  REQUIRE(buf.size() == 16);
  caf::error err;
  const size_t largest = largest_allocation_of([&] { err = decode_wire(sys, buf); });
  CHECK(largest < (size_t{1} << 20));
  CHECK(code_of(err) == envelope_errc::oversized);
}

TEST_CASE("a claimed length within the limit but beyond the bytes sent is refused before "
          "allocating") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  for (uint64_t claimed : {uint64_t{8}, uint64_t{1} << 20}) {
    CAPTURE(claimed);
    auto buf = bare_wire_header(sys, claimed);
    buf.resize(buf.size() + claimed - 8, 0); // one word short
    caf::error err;
    const size_t largest = largest_allocation_of([&] { err = decode_wire(sys, buf); });
    CHECK(largest < std::max<size_t>(4096, claimed / 2));
    CHECK(code_of(err) == envelope_errc::truncated);
  }
  // The exact 16-byte header with the largest accepted length.
  const auto bare = bare_wire_header(sys, envelope_wire_limit);
  caf::error err;
  const size_t largest = largest_allocation_of([&] { err = decode_wire(sys, bare); });
  CHECK(largest < (size_t{1} << 20));
  CHECK(code_of(err) == envelope_errc::truncated);
  CHECK(code_of(decode_wire(sys, bare_wire_header(sys, uint64_t{1} << 60)))
        == envelope_errc::oversized);
  CHECK(code_of(decode_wire(sys, bare_wire_header(sys, 13))) == envelope_errc::misaligned);
}

TEST_CASE("a deserializer that cannot count its bytes reads a hostile length in bounded "
          "chunks") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  std::vector<char> buf;
  {
    caf::stream_serializer<caf::vectorbuf> sink{sys, buf};
    uint64_t id = capnp::typeId<msg::Ping>();
    uint64_t claimed = envelope_wire_limit;
    REQUIRE_FALSE(sink(id, claimed));
  }
  caf::error err;
  const size_t largest = largest_allocation_of([&] {
    envelope back;
    caf::stream_deserializer<caf::charbuf> source{sys, buf.data(), buf.size()};
    err = inspect(static_cast<caf::deserializer&>(source), back);
  });
  CHECK(err); // the stream ends after the header
  CHECK(largest <= (size_t{1} << 20) + 4096);

  // And a real envelope still comes through a stream intact.
  auto e = make_ping(8, 3000);
  std::vector<char> wire;
  {
    caf::stream_serializer<caf::vectorbuf> sink{sys, wire};
    REQUIRE_FALSE(inspect(static_cast<caf::serializer&>(sink), e));
  }
  envelope back;
  caf::stream_deserializer<caf::charbuf> source{sys, wire.data(), wire.size()};
  REQUIRE_FALSE(inspect(static_cast<caf::deserializer&>(source), back));
  REQUIRE(back.size_bytes() == e.size_bytes());
  CHECK(std::memcmp(back.data(), e.data(), e.size_bytes()) == 0);
}

TEST_CASE("malformed envelopes are rejected with the right reason") {
  auto good = make_ping(3, 64);
  const auto* bytes = static_cast<const uint8_t*>(good.data());
  auto n = good.size_bytes();

  SECTION("empty") {
    CHECK(open_code<msg::Ping>(envelope{}) == envelope_errc::empty);
  }
  SECTION("truncated by one word") {
    auto cut = envelope::from_bytes(good.schema_id(), bytes, n - 8);
    REQUIRE(cut);
    CHECK(open_code<msg::Ping>(*cut) == envelope_errc::malformed);
  }
  SECTION("truncated to the segment table") {
    auto cut = envelope::from_bytes(good.schema_id(), bytes, 8);
    REQUIRE(cut);
    CHECK(open_code<msg::Ping>(*cut) == envelope_errc::malformed);
  }
  SECTION("trailing bytes after the last segment") {
    std::vector<uint8_t> longer(bytes, bytes + n);
    longer.resize(n + 16, 0);
    auto e = envelope::from_bytes(good.schema_id(), longer.data(), longer.size());
    REQUIRE(e);
    CHECK(open_code<msg::Ping>(*e) == envelope_errc::malformed);
  }
  SECTION("not a whole number of words") {
    auto e = envelope::from_bytes(good.schema_id(), bytes, n - 3);
    REQUIRE_FALSE(e);
    CHECK(code_of(e.error()) == envelope_errc::misaligned);
  }
  SECTION("oversized for the reader's limit") {
    envelope_limits lim;
    lim.max_bytes = n - 8;
    CHECK(open_code<msg::Ping>(good, lim) == envelope_errc::oversized);
  }
  SECTION("wrong schema") {
    CHECK(open_code<msg::Pong>(good) == envelope_errc::wrong_schema);
  }
  SECTION("traversal limit") {
    envelope_limits lim;
    lim.traversal_words = 2;
    auto err = with_envelope<msg::Ping>(
      good, [](msg::Ping::Reader p) { CHECK(p.getPayload().size() > 0); }, lim);
    CHECK(code_of(err) == envelope_errc::limit_exceeded);
  }
  SECTION("a pointer past the end of the segment") {
    // Root struct pointer (word 1 of the message): point its offset far beyond the data.
    std::vector<uint8_t> bad(bytes, bytes + n);
    uint32_t huge_offset = 0x00FFFFF0u << 2; // struct pointer: offset in bits 2..31
    std::memcpy(bad.data() + 8, &huge_offset, 4);
    auto e = envelope::from_bytes(good.schema_id(), bad.data(), bad.size());
    REQUIRE(e);
    auto err = with_envelope<msg::Ping>(*e, [](msg::Ping::Reader p) { (void) p.getRound(); });
    CHECK(code_of(err) == envelope_errc::malformed);
  }
}

TEST_CASE("random garbage never opens and never crashes") {
  std::mt19937_64 rng{1234};
  int rejected = 0;
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<uint64_t> words(1 + rng() % 64);
    for (auto& w : words)
      w = rng();
    auto e = envelope::from_bytes(capnp::typeId<msg::Ping>(), words.data(), words.size() * 8);
    REQUIRE(e);
    auto err = with_envelope<msg::Ping>(*e, [](msg::Ping::Reader p) {
      (void) p.getRound();
      (void) p.getPayload().size();
    });
    if (err)
      ++rejected;
  }
  // The segment count in the first word is random, so essentially all are framing errors.
  CHECK(rejected >= 495);
}

namespace {

struct recorder_state {
  std::vector<const void*> seen;
};

/// Replies with the address of the payload it received.
caf::behavior recorder(caf::event_based_actor* self) {
  return {
    [](const envelope& e) { return reinterpret_cast<uint64_t>(e.data()); },
  };
}

} // namespace

TEST_CASE("one envelope fanned out in process shares its bytes with every receiver") {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::vector<caf::actor> receivers;
  for (int i = 0; i < 8; ++i)
    receivers.push_back(sys.spawn(recorder));
  auto e = make_ping(5, 1 << 16);
  auto original = reinterpret_cast<uint64_t>(e.data());
  std::set<uint64_t> addresses;
  for (auto& r : receivers) {
    self->request(r, 5s, e).receive([&](uint64_t addr) { addresses.insert(addr); },
                                    [&](caf::error& err) { FAIL(sys.render(err)); });
  }
  REQUIRE(addresses.size() == 1);
  CHECK(*addresses.begin() == original);
  for (auto& r : receivers)
    self->send_exit(r, caf::exit_reason::user_shutdown);
}

TEST_CASE("an actor that receives garbage logs it and keeps answering") {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  experiment_config exp;
  auto ctx = test::test_context(exp, "pong");
  auto pong = smoke::spawn_pong(sys, ctx);
  std::vector<uint64_t> junk{0xdeadbeefdeadbeefull, 1, 2};
  auto garbage = envelope::from_bytes(capnp::typeId<msg::Ping>(), junk.data(), 24);
  REQUIRE(garbage);
  self->send(pong, *garbage);
  self->send(pong, make_ping(3, 8));
  self->send(pong, build_envelope<msg::Pong>([](msg::Pong::Builder b) { b.setRound(1); }));
  self->send(pong, make_ping(4, 8));
  std::vector<uint64_t> rounds;
  for (int i = 0; i < 2; ++i) {
    self->receive(
      [&](const envelope& e) {
        auto err = with_envelope<msg::Pong>(e, [&](msg::Pong::Reader p) {
          rounds.push_back(p.getRound());
          CHECK(p.getPayloadBytes() == 8);
          CHECK(std::string{p.getPonger().cStr()} == "pong#0@test");
        });
        CHECK_FALSE(err);
      },
      caf::after(5s) >> [&] { FAIL("no answer from the ponger"); });
  }
  CHECK(rounds == std::vector<uint64_t>{3, 4});
  CHECK(ctx.outcome->get("smoke.rejected") == 2.0); // the garbage and the wrong schema
  self->send_exit(pong, caf::exit_reason::user_shutdown);
}
