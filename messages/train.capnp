@0xfee48a409a211bb9;
# Trainer ↔ learner ↔ sync_publisher, trainer ↔ sagc_controller. Ids are stable; evolve by
# adding fields only.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("sorl::msg");

using Rollout = import "rollout.capnp";

# Trainer → SAGC controller: the group size for `step`, please.
struct GroupSizeQuery {
  step @0 :UInt64;
}

# Controller → trainer: the decision and its inputs, for the log.
struct GroupSizeDecision {
  step @0 :UInt64;
  groupSize @1 :UInt32;
  reason @2 :Text;
  policy @3 :Text;           # "static" | "sagc" | "deadline"
  virtualQueue @4 :Float64;  # Q_t of the drift-plus-penalty controller (sagc)
  pStraggler @5 :Float64;    # estimated P(straggler event | G_t); NaN when not estimated
  utility @6 :Float64;       # U(G_t)
  deadlineNs @7 :Int64;      # deadline mode: rollout-phase budget from the step's start, ns;
                             # 0 = wait for every rollout
  minFinished @8 :UInt32;    # deadline mode: finished rollouts per group before a cut
}

# Trainer → SAGC controller at the end of the rollout phase: the step's timing summary.
struct StepTimingQuery {
  step @0 :UInt64;
}

struct StepTiming {
  step @0 :UInt64;
  rollouts @1 :UInt32;
  durationP50Ns @2 :Int64;
  durationP90Ns @3 :Int64;
  durationMaxNs @4 :Int64;
  stragglers @5 :UInt32;     # rollouts over kappa × running median
  stragglerEvent @6 :Bool;
  thresholdNs @7 :Int64;     # 0 = not enough history yet
  flaggedInFlight @8 :UInt32; # rollouts flagged as stragglers from chunk messages while running
  aborted @9 :UInt32;        # rollouts that ended aborted (deadline cuts)
  rolloutsTimed @10 :UInt32; # finished rollouts with a valid duration
  groupsJudged @11 :UInt32;  # groups with >= 2 finished rollouts (group_tokens rule)
  groupEvents @12 :UInt32;   # of those, groups with a rollout over kappa x the group's median tokens
}

# Trainer → learner: one synchronous step's batch. The trainer first forwards each kept
# Trajectory to the learner as its own message, then this one; CAF keeps the order of one
# sender's messages to one receiver, so every trajectory is in when the batch arrives.
struct TrainBatch {
  step @0 :UInt64;             # 0-based
  trajectories @1 :List(Rollout.Trajectory); # no longer filled: the trajectories travel ahead
  requestIds @2 :List(UInt64); # the batch's trajectories, in training order
}

# Learner → trainer: the update is done; metrics as (name, value) pairs.
struct TrainResult {
  step @0 :UInt64;
  version @1 :UInt64;        # weight version the update produced
  metricNames @2 :List(Text);
  metricValues @3 :List(Float64);
  ok @4 :Bool;
  reason @5 :Text;
}

# Learner → sync_publisher: the new rollout weights (bf16 bit patterns), in model order.
struct WeightSnapshot {
  version @0 :UInt64;
  names @1 :List(Text);
  shapes @2 :List(List(Int64));
  dtype @3 :import "sync.capnp".WeightDtype;
  data @4 :List(Data);       # one blob per tensor
}

# Trainer → learner: save a checkpoint of weights, optimizer state and step at `step` (no RNG
# state: the learner's randomness derives from the seed and the step).
struct CheckpointRequest {
  step @0 :UInt64;
  dir @1 :Text;              # run directory
  trainerState @2 :Text;     # JSON: the trainer's counters, reward history and role states,
                             # stored in the sidecar
}

struct CheckpointDone {
  step @0 :UInt64;
  path @1 :Text;
  ok @2 :Bool;
  reason @3 :Text;
}

# Trainer → learner: greedy held-out accuracy of the current policy, please.
struct EvalRequest {
  tag @0 :Text;              # "before" | "after" | …, echoed back
  count @1 :UInt32;          # held-out prompts (or episodes)
}

struct EvalResult {
  tag @0 :Text;
  count @1 :UInt32;
  accuracy @2 :Float64;      # fraction with reward 1
  meanReward @3 :Float64;
  meanLength @4 :Float64;    # response tokens
  seconds @5 :Float64;
  rewardFailures @6 :UInt32; # of the count, prompts whose reward failed: out of accuracy, meanReward
}

# Learner → trainer once its model is loaded and version `version` is being published.
struct LearnerReady {
  version @0 :UInt64;        # = training steps already taken
  resumed @1 :Bool;          # loaded from the run's own checkpoint (--resume)
  trainerState @2 :Text;     # JSON the trainer stored with that checkpoint ("" if none)
  source @3 :Text;           # where the weights came from, for the log
}

# Trainer → each role whose state changes later decisions (sagc_controller, scheduler), before
# a checkpoint: your state after `step` steps, please. The trainer stores the replies with the
# checkpoint (CheckpointRequest.trainerState).
struct RoleStateQuery {
  step @0 :UInt64;
}

struct RoleState {
  step @0 :UInt64;
  role @1 :Text;             # "sagc_controller" | "scheduler"
  state @2 :Text;            # JSON in the role core's format (actors/sagc/controller_state.hpp,
                             # actors/scheduler/placement.hpp)
  ok @3 :Bool;
  reason @4 :Text;           # why not, when not ok
}

# Trainer → the same roles on --resume, before the first step: restore this saved state.
struct RoleStateRestore {
  state @0 :Text;            # what the role sent in RoleState.state
  source @1 :Text;           # the checkpoint it came from, for messages
}

struct RoleStateRestored {
  role @0 :Text;
  ok @1 :Bool;
  reason @2 :Text;           # not ok: why the state cannot be restored; ok: a warning or ""
}
