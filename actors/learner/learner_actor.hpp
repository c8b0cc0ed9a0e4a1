#pragma once

#include <caf/fwd.hpp>

#include "runtime/topology.hpp"

namespace sorl {

/// Spawns the learner on its own thread (training blocks). It loads the policy (the run's
/// latest checkpoint with --resume, else the warm-start checkpoint, else a fresh init),
/// publishes it as the first weight version, then keeps each Trajectory the trainer forwards
/// and serves TrainBatch, which names them (→ TrainResult and a new WeightSnapshot to the sync
/// publisher; a step it cannot take, such as a missing or malformed trajectory or every update
/// non-finite, → TrainResult with ok = false, the reason and the unchanged version, and no
/// snapshot), EvalRequest (→ EvalResult) and CheckpointRequest
/// (→ CheckpointDone; ok = false with the reason, which names the path for I/O errors, when
/// the checkpoint cannot be written) from the trainer.
caf::actor spawn_learner(caf::actor_system& sys, const role_context& ctx);

} // namespace sorl
