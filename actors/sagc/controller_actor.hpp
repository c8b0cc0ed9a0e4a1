#pragma once

#include <caf/fwd.hpp>

#include "runtime/topology.hpp"

namespace sorl {

/// Spawns the SAGC controller (ARCHITECTURE.md §6 SAGC). It observes every RolloutEvent, flags
/// rollouts whose chunk messages already pass the straggler threshold while they run,
/// answers GroupSizeQuery with the configured policy's decision ([sagc].policy: "static",
/// "sagc" drift-plus-penalty, or "deadline"; see actors/sagc/group_policy.hpp) and
/// StepTimingQuery with the step's duration statistics and straggler verdict. The policy
/// learns each step's timing once, by the next GroupSizeQuery at the latest
/// (actors/sagc/controller_core.hpp).
caf::actor spawn_sagc_controller(caf::actor_system& sys, const role_context& ctx);

} // namespace sorl
