// The rollout worker shell answers every request: one it cannot serve comes back to the
// trainer as a failed trajectory with the reason, and its finish event frees the scheduler's
// slot, so no step waits for it.

#include <catch2/catch.hpp>

#include <caf/all.hpp>

#include "actors/rollout/worker_actor.hpp"
#include "messages/rollout.capnp.h"
#include "runtime/actor_types.hpp"
#include "runtime/config.hpp"
#include "runtime/envelope.hpp"
#include "tests/support/actor_system.hpp"

using namespace sorl;
using sorl::test::expect;
using sorl::test::test_context;
using sorl::test::test_system_config;

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
