#pragma once

#include <caf/fwd.hpp>

#include "runtime/topology.hpp"

namespace sorl {

/// Spawns the sync publisher: takes WeightSnapshot envelopes from the learner, broadcasts each
/// as a full version (header + bounded buckets; in process every worker shares the same
/// bytes), collects a WeightAck from every live worker and then tells the trainer with
/// VersionReady. A worker that fails to apply, or reports another hash, stops the job
/// loudly (shutdown with ok = false).
caf::actor spawn_sync_publisher(caf::actor_system& sys, const role_context& ctx);

} // namespace sorl
