#pragma once

#include <caf/fwd.hpp>

#include "runtime/topology.hpp"

namespace sorl {

/// Spawns the SAGC controller. For now it keeps G fixed ([sagc].group_size, policy
/// "static") while it observes every RolloutEvent and answers StepTimingQuery with the
/// step's duration statistics and straggler verdict (DESIGN.md §6).
caf::actor spawn_sagc_controller(caf::actor_system& sys, const role_context& ctx);

} // namespace sorl
