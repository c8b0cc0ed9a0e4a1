#pragma once

// The names of the built-in roles, as a topology's `[[node]] actors` and the roster spell
// them. Code finds its peers through these constants, never through string literals; the
// role table that spawns them is actors/roles.cpp.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace sorl::role {

inline constexpr const char trainer[] = "trainer";
inline constexpr const char learner[] = "learner";
inline constexpr const char sync_publisher[] = "sync_publisher";
inline constexpr const char sagc_controller[] = "sagc_controller";
inline constexpr const char scheduler[] = "scheduler";
inline constexpr const char rollout_worker[] = "rollout_worker";
/// Optional: shares finished responses between the workers' suffix trees (actors/suffix_index).
inline constexpr const char suffix_index_keeper[] = "suffix_index_keeper";
inline constexpr const char ping[] = "ping"; ///< smoke test (actors/smoke)
inline constexpr const char pong[] = "pong"; ///< smoke test (actors/smoke)

/// The roles a topology with a trainer needs besides the trainer, at least one actor each,
/// in the order `missing_for_training` names them.
inline constexpr const char* training_roles[] = {learner, sync_publisher, sagc_controller,
                                                 scheduler, rollout_worker};

/// What a topology that runs a trainer lacks, given the number of actors of each role
/// (`count(role)`): the training roles with none, joined by ", ", then "exactly one trainer"
/// (after "; ") when there is more than one trainer. Empty when the topology is complete or
/// has no trainer. The one check behind `sorl check` / `train` and the trainer's roster.
std::string missing_for_training(const std::function<int64_t(std::string_view role)>& count);

} // namespace sorl::role
