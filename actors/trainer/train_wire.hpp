#pragma once

// Translation between the train protocol's messages (messages/train.capnp, apart from
// WeightSnapshot) and the trainer step driver's events and commands
// (actors/trainer/step_driver.hpp), so the driver stays free of Cap'n Proto. The bytes on the
// wire are fixed: tests/actors/trainer/train_wire_test.cpp keeps reference encoders and
// compares every message byte for byte.

#include "actors/trainer/step_driver.hpp"
#include "messages/train.capnp.h"
#include "runtime/envelope.hpp"

namespace sorl::trainer {

/// msg::GroupSizeQuery of `c`.
envelope to_msg(const cmd::query_group_size& c);

/// msg::StepTimingQuery of `c`.
envelope to_msg(const cmd::query_step_timing& c);

/// msg::EvalRequest of `c`.
envelope to_msg(const cmd::request_eval& c);

/// msg::RoleStateQuery of `c` (the addressee, `c.role`, is the caller's).
envelope to_msg(const cmd::query_role_state& c);

/// msg::RoleStateRestore of `c` (the addressee, `c.role`, is the caller's).
envelope to_msg(const cmd::restore_role_state& c);

/// msg::CheckpointRequest of `c`.
envelope to_msg(const cmd::request_checkpoint& c);

/// msg::RoleState of `s`, the reply of a stateful role (sagc_controller, scheduler) to a
/// RoleStateQuery; an empty reason is left unset, as the roles sent it.
envelope to_msg(const ev::role_state& s);

/// msg::RoleStateRestored of `r`, a stateful role's reply to a RoleStateRestore.
envelope to_msg(const ev::role_state_restored& r);

/// msg::LearnerReady of `r`, the learner's word that its model is loaded.
envelope to_msg(const ev::learner_ready& r);

/// msg::EvalResult of `r`, the learner's answer to an EvalRequest.
envelope to_msg(const ev::eval_result& r);

/// msg::CheckpointDone of `d`, the learner's answer to a CheckpointRequest.
envelope to_msg(const ev::checkpoint_done& d);

/// A LearnerReady's fields.
ev::learner_ready from_msg(msg::LearnerReady::Reader r);

/// An EvalResult's fields.
ev::eval_result from_msg(msg::EvalResult::Reader r);

/// A GroupSizeDecision's fields.
ev::group_size_decision from_msg(msg::GroupSizeDecision::Reader d);

/// A StepTiming's fields.
ev::step_timing from_msg(msg::StepTiming::Reader t);

/// A TrainResult's fields; metric names and values copied in order.
ev::train_result from_msg(msg::TrainResult::Reader r);

/// A CheckpointDone's fields.
ev::checkpoint_done from_msg(msg::CheckpointDone::Reader d);

/// A RoleState's fields.
ev::role_state from_msg(msg::RoleState::Reader r);

/// A RoleStateRestored's fields.
ev::role_state_restored from_msg(msg::RoleStateRestored::Reader r);


// -- the sagc_controller's side: its queries decoded, its replies encoded -----------------

/// A StepTiming as the sagc_controller sends it: the driver's event plus the two counts that
/// travel in the message but that the driver does not read.
struct step_timing_reply {
  ev::step_timing timing;
  uint32_t rollouts = 0;       ///< finished rollouts of the step
  uint32_t rollouts_timed = 0; ///< of those, the ones with a valid duration
};

/// msg::GroupSizeDecision of `d`, every field as given (the reason is sent as it is).
envelope to_msg(const ev::group_size_decision& d);

/// msg::StepTiming of `t`.
envelope to_msg(const step_timing_reply& t);

/// A GroupSizeQuery's fields.
cmd::query_group_size from_msg(msg::GroupSizeQuery::Reader q);

/// A StepTimingQuery's fields.
cmd::query_step_timing from_msg(msg::StepTimingQuery::Reader q);

/// A RoleStateQuery's fields; `role` stays empty (the addressee is the reader itself).
cmd::query_role_state from_msg(msg::RoleStateQuery::Reader q);

/// A RoleStateRestore's fields; `role` stays empty (the addressee is the reader itself).
cmd::restore_role_state from_msg(msg::RoleStateRestore::Reader r);

// -- the learner's side: the batch it trains on, its result and the requests it answers -----

/// msg::TrainBatch of `c`: the 0-based step and the request ids in training order. The
/// trajectories themselves travel ahead as their own Trajectory envelopes (ARCHITECTURE.md §3);
/// the old `trajectories` list is left empty.
envelope to_msg(const cmd::train& c);

/// A TrainBatch's step and request ids (an old sender's `trajectories` list is not read).
cmd::train from_msg(msg::TrainBatch::Reader b);

/// msg::TrainResult of `r` for the TrainBatch of 0-based `step`: version and ok always; the
/// metric names and values when ok, the reason when not (the bytes the learner always sent).
envelope to_msg(const ev::train_result& r, uint64_t step);

/// An EvalRequest's fields.
cmd::request_eval from_msg(msg::EvalRequest::Reader r);

/// A CheckpointRequest's fields.
cmd::request_checkpoint from_msg(msg::CheckpointRequest::Reader r);

} // namespace sorl::trainer
