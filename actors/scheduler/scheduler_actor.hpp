#pragma once

#include <caf/fwd.hpp>

#include "runtime/topology.hpp"

namespace sorl {

/// Spawns the scheduler: places each GenerateRequest on a rollout worker ([scheduler].policy
/// round_robin | least_loaded, siblings kept together unless the imbalance threshold is
/// passed), tracks each worker's load from its RolloutEvents, and re-places the in-flight
/// requests of a worker that goes down. With no worker left the job fails.
caf::actor spawn_scheduler(caf::actor_system& sys, const role_context& ctx);

} // namespace sorl
