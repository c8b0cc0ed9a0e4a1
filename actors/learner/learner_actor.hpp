#pragma once

#include <caf/fwd.hpp>

#include "runtime/topology.hpp"

namespace sorl {

/// Spawns the learner on its own thread (training blocks). It loads the policy (the run's
/// latest checkpoint with --resume, else the warm-start checkpoint, else a fresh init),
/// publishes it as the first weight version, then serves TrainBatch (→ TrainResult and a new
/// WeightSnapshot to the sync publisher), EvalRequest (→ EvalResult) and CheckpointRequest
/// (→ CheckpointDone) from the trainer.
caf::actor spawn_learner(caf::actor_system& sys, const role_context& ctx);

} // namespace sorl
