#pragma once

// The sagc_controller's messages in terms of its core (actors/sagc/controller_core.hpp): a
// RolloutEvent, as actors/rollout/rollout_wire.hpp decodes it, becomes a timing event; a
// decision and a step report become the train protocol's structs, which
// actors/trainer/train_wire.hpp encodes. The bytes the controller sends are pinned in
// tests/actors/sagc/sagc_wire_test.cpp.

#include "actors/rollout/rollout_wire.hpp"
#include "actors/sagc/controller_core.hpp"
#include "actors/trainer/train_wire.hpp"

namespace sorl::sagc {

/// The timing event of a decoded RolloutEvent. A finish with the abort reason is an abort
/// (deadline cuts, shutdown); the step is read as a signed step, so one beyond int64's range
/// reads negative and the timing refuses it as bad_step (actors/sagc/timing.hpp).
timing_event timing_event_of(const rollout::event_record& r);

/// The GroupSizeDecision of `d`: the reason is sent as "policy: reason", no deadline as 0,
/// G and g_min as UInt32.
trainer::ev::group_size_decision decision_message(const group_decision& d);

/// The StepTiming of `r`: rollouts = finished, the threshold truncated to whole ns (0 while
/// there is none), the counts as UInt32.
trainer::step_timing_reply step_timing_message(const step_report& r);

} // namespace sorl::sagc
