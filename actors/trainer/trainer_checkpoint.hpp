#pragma once

// The trainer's part of a checkpoint, stored as the sidecar's "sorl.trainer" metadata
// (runtime/ml/formats/checkpoint.hpp): its counters and history, and the saved state of every role
// whose state changes later decisions (ARCHITECTURE.md §3; the roles in `stateful_roles`), so
// that `--resume` continues exactly where the checkpoint was taken.
//
// JSON text:
//
//   {"step": 3, "next_group_id": 12, "next_request_id": 48, "task_cursor": 12,
//    "reward_history": [0.25, ...], "accuracy_before": 0.5 | null,
//    "roles": {"sagc_controller": {...}, "scheduler": {...}}}
//
// "roles" holds each role's own format (actors/sagc/controller_state.hpp,
// actors/scheduler/placement.hpp). Checkpoints written before roles' state was saved have
// no "roles" key and no "accuracy_before"; they still load (see parse_trainer_snapshot).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/trainer/step_plan.hpp"

namespace sorl::trainer {

/// Roles whose state a checkpoint carries, in the order the trainer asks them.
const std::vector<std::string>& stateful_roles();

/// What the trainer saves with a checkpoint.
struct trainer_snapshot {
  int64_t step = 0;                      ///< steps taken, ≥ 0
  trainer_counters counters;             ///< prompt cursor and id counters
  std::vector<double> reward_history;    ///< mean reward of each step taken
  std::optional<double> accuracy_before; ///< held-out accuracy before the first step
  /// Each stateful role's saved state (JSON text), by role; nullopt in a checkpoint written
  /// before roles' state was saved.
  std::optional<std::map<std::string, std::string>> roles;
};

/// The snapshot as JSON text (format above). Raises std::invalid_argument when a role's
/// state is not JSON text.
std::string to_json(const trainer_snapshot& snapshot);

/// Parses what to_json wrote. Raises std::invalid_argument naming the key for text that is
/// not a JSON object, a missing key or one of the wrong type, a negative step, and a "roles"
/// object that lacks one of `stateful_roles()`.
trainer_snapshot parse_trainer_snapshot(std::string_view text);

} // namespace sorl::trainer
