#pragma once

#include <caf/fwd.hpp>

#include "runtime/topology.hpp"

namespace sorl {

/// Spawns a rollout worker on its own thread (decoding blocks). It takes GenerateRequest and
/// AbortRollouts envelopes (from the scheduler), WeightVersion / WeightBucket envelopes (from
/// the sync publisher); it sends RolloutEvent envelopes to the SAGC controller and the
/// scheduler (start events also to the trainer), Trajectory envelopes to the trainer and
/// WeightAck envelopes to the publisher. With speculation on and a suffix-index keeper in the
/// roster, it sends its finished turns to the keeper (SuffixResponses) after each decode
/// step and puts the other workers' that the keeper forwards into its global suffix tree.
caf::actor spawn_rollout_worker(caf::actor_system& sys, const role_context& ctx);

} // namespace sorl
