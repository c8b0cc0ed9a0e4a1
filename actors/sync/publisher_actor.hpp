#pragma once

#include <caf/fwd.hpp>

#include "runtime/topology.hpp"

namespace sorl {

/// Spawns the sync publisher (ARCHITECTURE.md §6 SparseRL-Sync): takes WeightSnapshot envelopes
/// from the learner and, following actors/sync/sync_protocol.hpp, sends each live worker
/// either the sparse delta against the version it acknowledged last or the full version, in
/// bounded buckets (in process every worker shares the same bytes). A worker that fails the
/// delta or reports another hash gets the version in full; a failed full sync stops the job
/// loudly (shutdown with ok = false). When every live worker acknowledged the published hash
/// the new snapshot becomes the delta base and the trainer gets VersionReady. With no rollout
/// worker left (all gone, during a version or between versions) it ends the job rather than
/// wait for acknowledgements that cannot come.
caf::actor spawn_sync_publisher(caf::actor_system& sys, const role_context& ctx);

} // namespace sorl
