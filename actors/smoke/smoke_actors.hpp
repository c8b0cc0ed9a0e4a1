#pragma once

// Actor shells of the smoke topology (configs/smoke.toml): `ping` sends rounds of Ping
// envelopes to every `pong`, which answer with Pong envelopes. They exercise envelopes,
// the roster, failure notices and shutdown without any ML.

#include <caf/fwd.hpp>

#include "runtime/topology.hpp"

namespace sorl::smoke {

/// Spawns the pinger. Publishes "smoke.rounds", "smoke.answers", "smoke.mean_rtt_us",
/// "smoke.pongers_lost" and "smoke.rejected" to the run outcome; ends the job with
/// shutdown(ok) after `smoke.rounds` rounds, or shutdown(!ok) when no ponger is left.
caf::actor spawn_ping(caf::actor_system& sys, const role_context& ctx);

/// Spawns a ponger. Answers each valid Ping with a Pong to its sender; logs and drops
/// malformed envelopes; logs every peer_down it hears ("peer down: NAME (REASON)").
caf::actor spawn_pong(caf::actor_system& sys, const role_context& ctx);

} // namespace sorl::smoke
