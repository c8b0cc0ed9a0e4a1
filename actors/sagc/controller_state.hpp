#pragma once

// The sagc_controller's checkpointed state: what its later group-size decisions depend on,
// saved by the trainer with every checkpoint and restored on --resume, so that a resumed run
// makes the same decision at its first step as the uninterrupted run given the same timings.
//
// JSON text, format_version 1:
//
//   {"format": "sorl.sagc_controller", "format_version": 1,
//    "policy": "sagc",                     the policy that wrote it
//    "last_closed_step": 2,                null before the first step closed
//    "window_ns": [1.0e9, ...],            the straggler window, oldest first, ns
//    "window_relative": [1.0, 2.5, ...],   lengths relative to their group's median, oldest
//                                          first (absent in older states: empty)
//    "virtual_queue": 0.9, "truncated": 0, "steps_counted": 3, "events_counted": 1,
//    "event_sum": 1.0,                     Σ s_t (absent in older states: events_counted)
//    "last_observed_step": 2, "last_decided_step": 2,   null when none
//    "notes": ""}
//
// The window statistics (median, threshold, tail count) are recomputed from the window
// under the resumed run's [sagc] kappa and window. Not saved: per-step events (a checkpoint
// is taken between steps, when no step is open) and issue counters (diagnostics).

#include <stdexcept>
#include <string>
#include <string_view>

#include "actors/sagc/group_policy.hpp"
#include "actors/sagc/timing.hpp"

namespace sorl::sagc {

/// A saved controller state that cannot be restored: not JSON, another format or version, a
/// missing key or one of the wrong type, or a value no run can reach. The message names the
/// key.
class controller_state_error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// The state of `timing` (window, last closed step) and `policy` (its memory) as JSON text
/// in the format above.
std::string save_controller_state(const rollout_timing& timing, const group_policy& policy);

/// Restores a state written by save_controller_state into `timing` and `policy`. Returns ""
/// or a warning: when the saved policy differs from `policy`'s (the configuration changed
/// between the runs), only the straggler window and last closed step are restored and the
/// policy starts from its initial memory. Raises controller_state_error, changing nothing,
/// for a state that cannot be restored (see the class).
std::string restore_controller_state(std::string_view text, rollout_timing& timing,
                                     group_policy& policy);

} // namespace sorl::sagc
