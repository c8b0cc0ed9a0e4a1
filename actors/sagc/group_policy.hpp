#pragma once

// Group-size policies of the sagc_controller (DESIGN.md §6 SAGC; issue 4 "static policy",
// issue 5 "keep static ... selectable by config, so all three run on the same code path").
//
// The trainer asks for G_t once per step (DESIGN.md §3 step 1); the controller's shell calls
// `decide(step)` on the configured policy, logs the returned decision, and feeds each closed
// step's timing back through `observe`. Today only the static policy exists; the adaptive
// drift-plus-penalty controller and the deadline baseline of issue 5 implement the same
// interface.

#include <cstdint>
#include <string>

#include "actors/sagc/timing.hpp"

namespace sorl::sagc {

/// One group-size decision, logged with its reason (DESIGN.md §6: "every decision is logged
/// with its inputs").
struct group_decision {
  int64_t step = 0;       ///< the step this G is for
  int64_t group_size = 0; ///< G_t, rollouts per prompt, ≥ 1
  std::string policy;     ///< "static", later "sagc" | "deadline"
  std::string reason;     ///< human-readable: the inputs and why this G
};

/// Chooses the group size G_t for each synchronous step.
///
/// Called on the controller actor's thread only.
class group_policy {
public:
  virtual ~group_policy() = default;

  /// G for `step` (≥ 0), with its reason.
  virtual group_decision decide(int64_t step) = 0;

  /// Feeds back a closed step's timing (from rollout_timing::close_step). Adaptive policies
  /// update their estimates here; the static policy ignores it.
  virtual void observe(const step_timing& /*timing*/) {
  }
};

/// A fixed G from `[sagc].group_size`: the baseline SAGC is compared against (issue 5).
class static_group_policy final : public group_policy {
public:
  /// Raises std::invalid_argument when group_size < 1.
  explicit static_group_policy(int64_t group_size);

  /// Always the configured G. Raises std::invalid_argument for step < 0.
  group_decision decide(int64_t step) override;

  int64_t group_size() const {
    return group_size_;
  }

private:
  int64_t group_size_;
};

} // namespace sorl::sagc
