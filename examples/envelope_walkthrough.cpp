// Walkthrough: how sorl actors talk. Every protocol payload is a Cap'n Proto message wrapped
// in a `sorl::envelope` (bytes + schema id). This program builds one, hands it to two actors
// that share its bytes, opens it on the receiving side, and shows what happens to a corrupt
// one. Run it: build/examples/envelope_walkthrough
#include <chrono>
#include <cstdio>

#include <caf/all.hpp>

#include "messages/smoke.capnp.h"
#include "runtime/actor_types.hpp"
#include "runtime/envelope.hpp"

using namespace std::chrono_literals;

// 1. A receiving actor opens the envelope with the schema it expects. with_envelope()
//    validates size, schema id and framing first, and turns any capnp exception raised
//    while reading fields into an error value, so a hostile message cannot crash it.
caf::behavior reader(caf::event_based_actor* self) {
  return {
    [self](const sorl::envelope& e) -> std::string {
      std::string seen;
      auto err = sorl::with_envelope<sorl::msg::Ping>(e, [&](sorl::msg::Ping::Reader ping) {
        seen = "round " + std::to_string(ping.getRound()) + ", "
               + std::to_string(ping.getPayload().size()) + " payload bytes";
      });
      if (err)
        return "rejected: " + sorl::describe(err);
      return seen;
    },
  };
}

int main() {
  // 2. Every process registers sorl's message types, so envelopes can cross nodes.
  caf::actor_system_config cfg;
  sorl::add_sorl_message_types(cfg);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};

  // 3. Build: fill the root struct; the envelope owns an immutable copy of the bytes.
  auto ping = sorl::build_envelope<sorl::msg::Ping>([](sorl::msg::Ping::Builder b) {
    b.setRound(7);
    b.initPayload(1024);
  });
  std::printf("built a %zu-byte envelope, schema id %#llx\n", ping.size_bytes(),
              static_cast<unsigned long long>(ping.schema_id()));

  // 4. Fan out: both actors get the same bytes (in process, a reference count goes up).
  auto a = sys.spawn(reader);
  auto b = sys.spawn(reader);
  int failures = 0;
  for (auto& who : {a, b})
    self->request(who, 5s, ping).receive(
      [&](const std::string& what) { std::printf("actor answered: %s\n", what.c_str()); },
      [&](caf::error& err) {
        std::printf("no answer: %s\n", sys.render(err).c_str());
        ++failures;
      });

  // 5. A truncated copy is refused with a reason; the actor stays up.
  auto cut = sorl::envelope::from_bytes(ping.schema_id(), ping.data(), ping.size_bytes() - 8);
  self->request(a, 5s, *cut).receive(
    [&](const std::string& what) {
      std::printf("corrupt copy: %s\n", what.c_str());
      if (what.rfind("rejected: envelope malformed", 0) != 0)
        ++failures;
    },
    [&](caf::error&) { ++failures; });

  self->send_exit(a, caf::exit_reason::user_shutdown);
  self->send_exit(b, caf::exit_reason::user_shutdown);
  return failures == 0 ? 0 : 1;
}
