#pragma once

#include <caf/fwd.hpp>

#include "runtime/topology.hpp"

namespace sorl {

/// Spawns the suffix-index keeper (ARCHITECTURE.md §6 WAR), an optional role: it takes each
/// rollout worker's SuffixResponses envelopes (its finished turns) and forwards them to every
/// other rollout worker of the roster, so that each worker's global suffix tree also holds
/// the responses the others generated. A message keeper_core refuses (an unknown origin, a
/// bound broken, a negative token id) or one that does not decode is dropped with a log
/// line. Drafts stay in the workers; the keeper never sees a draft request.
caf::actor spawn_suffix_index_keeper(caf::actor_system& sys, const role_context& ctx);

} // namespace sorl
