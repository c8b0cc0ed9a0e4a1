#pragma once

#include <caf/fwd.hpp>

#include "runtime/topology.hpp"

namespace sorl {

/// Spawns the trainer, which runs the synchronous step loop (ARCHITECTURE.md §3): group size from
/// the SAGC controller, B·G GenerateRequests to the scheduler, every group complete (DAPO
/// refills when configured), the batch to the learner, the new version acknowledged by every
/// rollout worker, one JSONL record and progress line per step, checkpoints every
/// run.checkpoint_every steps, greedy held-out accuracy before and after (and every
/// run.eval_every steps, into that step's record). A failed train step, checkpoint or metrics
/// write ends the job (shutdown with ok = false) with the reason and the run's last complete
/// checkpoint, from which --resume continues.
caf::actor spawn_trainer(caf::actor_system& sys, const role_context& ctx);

} // namespace sorl
