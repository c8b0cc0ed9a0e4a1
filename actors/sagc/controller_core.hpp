#pragma once

// The sagc_controller's logic (ARCHITECTURE.md §3 steps 1 and 4, §6 SAGC), free of CAF: the
// rollout timing, the group-size policy and the rollouts flagged as stragglers in flight. The
// shell (actors/sagc/controller_actor.cpp) decodes each message, calls one method here and
// encodes what it returns.
//
// Closing a step. A step is closed once: its durations enter the straggler window
// (rollout_timing::close_step) and the policy learns its timing (group_policy::observe).
// Steps close in order, each one on the first of
//   - step_timing(s), which closes s,
//   - decide(s'), which closes every step before s',
// so the policy has learned step s − 1 before it chooses G for step s whether or not the
// trainer asked for the timing of s − 1. Closing a step also closes every earlier step still
// open, oldest first. A step is open from its first event or decision until it closes.

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "actors/sagc/group_policy.hpp"
#include "actors/sagc/timing.hpp"

namespace sorl::sagc {

/// A closed step's timing as the controller reports it (the StepTiming message).
struct step_report {
  /// rollout_timing::close_step's statistics of the step.
  sagc::step_timing timing;
  /// Rollouts of the step flagged as stragglers from their chunk events while running.
  int64_t flagged_in_flight = 0;
  /// "" or why the step could not be closed: it is not after the last closed step and its
  /// report is not kept (closed too long ago, or never seen), or it is negative. `timing`
  /// is then rollout_timing::summary's, empty for a step not after the last closed one.
  std::string warning;
};

/// The controller: timing events in, group-size decisions and step reports out (header
/// comment). Not thread-safe: the controller actor is its one owner.
class controller_core {
public:
  /// Closed steps whose reports step_timing still returns unchanged; older ones are dropped.
  static constexpr size_t kept_reports = 16;

  /// Raises std::invalid_argument naming the bad field for invalid rule or policy options
  /// (rollout_timing, make_group_policy).
  controller_core(straggler_rule_options rule, const group_policy_options& policy);

  /// Records one rollout timing event. Returns the rollouts of its step that this event
  /// newly shows to be stragglers while still running (chunk events only; each rollout is
  /// returned once), for the shell to log. Never throws on odd events: they are counted
  /// (rollout_timing::issues).
  std::vector<straggler_flag> observe(const timing_event& event);

  /// G for `step` (≥ 0), after closing every open step before it. Asking twice for the same
  /// step gives the same decision. Raises std::invalid_argument for step < 0.
  group_decision decide(int64_t step);

  /// The report of `step`, closing it (and the open steps before it) when it is still open.
  /// Asking again returns the same report while it is among the last kept_reports closed.
  sagc::step_report step_timing(int64_t step);

  /// The state later decisions depend on, as JSON (actors/sagc/controller_state.hpp).
  std::string save() const;

  /// Restores a state written by save (or save_controller_state); open steps and flags are
  /// dropped. Returns "" or a warning (the saved policy differs from this one's). Raises
  /// controller_state_error, changing nothing, for a state that cannot be restored.
  std::string restore(std::string_view text);

  const rollout_timing& timing() const {
    return timing_;
  }
  const group_policy& policy() const {
    return *policy_;
  }

private:
  bool closed(int64_t step) const;
  /// Closes every open step before `step`, oldest first.
  void close_before(int64_t step);
  /// Closes `step` (after the last closed one) and keeps its report.
  const sagc::step_report& close(int64_t step);

  rollout_timing timing_;
  std::unique_ptr<group_policy> policy_;
  std::set<int64_t> open_;                        ///< steps with an event or a decision
  std::map<int64_t, std::set<uint64_t>> flagged_; ///< in-flight stragglers of open steps
  std::map<int64_t, sagc::step_report> reports_;  ///< the last kept_reports closed steps
};

} // namespace sorl::sagc
