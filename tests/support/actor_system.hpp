#pragma once

// An in-process CAF actor system for actor tests, and the role context a role's spawn
// function expects, so each test spawns the real actor shell without a topology.

#include <memory>
#include <string>

#include <caf/actor_system_config.hpp>
#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include "runtime/actor_types.hpp"
#include "runtime/config.hpp"
#include "runtime/envelope.hpp"
#include "runtime/topology.hpp"

namespace sorl::test {

/// sorl's message types registered; two scheduler threads (tests run side by side).
struct test_system_config : caf::actor_system_config {
  test_system_config() {
    add_sorl_message_types(*this);
    set("scheduler.max-threads", size_t{2});
  }
};

/// Context of actor `role`#0 on node "test"; `config` must outlive the actor.
inline role_context test_context(const experiment_config& config, std::string role,
                                 caf::actor directory = {}) {
  role_context ctx;
  ctx.config = &config;
  ctx.role = std::move(role);
  ctx.node = "test";
  ctx.directory = std::move(directory);
  ctx.outcome = std::make_shared<run_outcome>();
  return ctx;
}

/// Waits (up to 20 s) for the next envelope of schema `Schema` that `self` receives, skipping
/// envelopes of other schemas, and reads it with `read`. A job shutdown meanwhile fails the test.
template <class Schema, class Read>
void expect(caf::scoped_actor& self, Read read) {
  using namespace std::chrono_literals;
  for (bool found = false; !found;)
    self->receive(
      [&](const envelope& e) {
        if (e.schema_id() != capnp::typeId<Schema>())
          return;
        found = true;
        CHECK_FALSE(with_envelope<Schema>(e, read));
      },
      [&](shutdown_atom, bool, const std::string& why) { FAIL("the job ended: " << why); },
      caf::after(20s) >> [&] { FAIL("no message arrived"); });
}

} // namespace sorl::test
