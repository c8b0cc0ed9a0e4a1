@0xbfdd645e29be1c94;
# Rollout protocol: trainer → scheduler → rollout_worker requests, worker timing events,
# finished trajectories. Times are the worker's steady_clock in nanoseconds; durations are
# only ever computed on one clock. Ids are stable; evolve by adding fields only.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("sorl::msg");

enum TaskSplit {
  train @0;
  eval @1;
}

enum FinishReason {
  eos @0;      # the policy ended its answer (EOS or end of turn)
  length @1;   # max_new_tokens or the context limit reached
  stop @2;     # a stop string
  abort @3;    # cancelled (deadline, worker shutdown, step abandoned)
}

# One rollout to generate: sample `sampleIndex` of group `groupId` in step `step`.
struct GenerateRequest {
  requestId @0 :UInt64;      # unique within the run
  step @1 :UInt64;
  groupId @2 :UInt64;        # unique within the run; siblings share it
  sampleIndex @3 :UInt32;    # 0 ≤ sampleIndex < G: the rollout's sampler stream
  # No longer filled (always 0): no reader needs G (a worker needs only sampleIndex, and G
  # stays with the trainer and the sagc_controller). Kept because fields are never removed.
  groupSize @4 :UInt32;
  split @5 :TaskSplit;       # which split of the task the prompt comes from
  taskIndex @6 :UInt64;      # prompt (or environment episode) index within the split
  seed @7 :UInt64;           # sampler seed of this rollout
  weightVersion @8 :UInt64;  # the version the worker must hold
  maxNewTokens @9 :UInt32;   # per turn, tokens
  # No longer filled (0): temperature64 and topP64 carry the values. Still read when
  # those are NaN, for a sender that predates them.
  temperature @10 :Float32;  # 0 = greedy
  topP @11 :Float32;
  topK @12 :UInt32;          # 0 = off
  # The sampling parameters as the user wrote them: top_p = 0.8 must reach the sampler as
  # 0.8, not as its fp32 neighbour 0.800000011920929. NaN (the default) = not set by the
  # sender; readers then fall back to the Float32 fields.
  temperature64 @13 :Float64 = nan;
  topP64 @14 :Float64 = nan;
  # Set by the scheduler when it places the request again because the worker it was on was
  # lost (the name of that worker); empty on the first placement.
  replacedFrom @15 :Text;
}

enum EventKind {
  start @0;
  chunk @1;
  finish @2;
}

# Timing of one rollout, sent by the worker to the SAGC controller and the scheduler; start
# events also to the trainer (its rollout watchdog names the worker of each missing rollout).
struct RolloutEvent {
  requestId @0 :UInt64;
  step @1 :UInt64;
  groupId @2 :UInt64;
  kind @3 :EventKind;
  workerNs @4 :Int64;        # worker's steady_clock, ns
  tokens @5 :UInt32;         # tokens generated so far (all turns)
  worker @6 :Text;           # "rollout_worker#i@node"
  finishReason @7 :FinishReason;   # meaningful for kind = finish
  inFlight @8 :UInt32;       # requests the worker holds after this event (its load)
}

# Whether a finished rollout carries a trainable result.
enum RolloutStatus {
  ok @0;            # served and scored
  failed @1;        # the worker could not serve the request (see `failure`); never trained on
  rewardFailed @2;  # generated, but the scorer or environment threw or gave a non-finite
                    # reward; out of its group's statistics, masked out of the loss
}

# What speculative decoding did for one rollout, over all its turns: the trainer sums these
# over a step for its metrics. All 0 (the struct left unset) with speculative decoding off.
struct SpeculationCounts {
  verifySteps @0 :UInt32;     # decode steps that verified a draft for this rollout
  plainSteps @1 :UInt32;      # decode steps without a draft
  draftedTokens @2 :UInt32;   # draft tokens verified
  acceptedTokens @3 :UInt32;  # of them, those the verification accepted (≤ draftedTokens)
  draftCalls @4 :UInt32;      # drafter calls made for this rollout
  draftNs @5 :UInt64;         # time in those calls, ns
  verifyTokens @6 :UInt32;    # tokens emitted in the steps that verified a draft for it
  verifyNs @7 :UInt64;        # those steps' wall time, summed, ns
  plainTokens @8 :UInt32;     # tokens emitted in decode steps without a draft
  plainNs @9 :UInt64;         # those steps' wall time, summed, ns
}

# Where one rollout's prompt tokens came from, over all its turns (a turn's prompt is the
# chat so far): the trainer sums these over a step for its prefix-cache metrics.
struct PrefillCounts {
  promptTokens @0 :UInt32;   # prompt tokens of its turns
  cachedTokens @1 :UInt32;   # of them, not prefilled for it: parked KV of its previous turn,
                             # prefix-cache hits, a group prompt a sibling prefilled
  evictedBlocks @2 :UInt32;  # prefix-cache blocks the worker evicted since the previous
                             # rollout it finished
}

# A finished rollout: everything the learner needs, plus the facts that metrics report.
struct Trajectory {
  requestId @0 :UInt64;
  step @1 :UInt64;
  groupId @2 :UInt64;
  sampleIndex @3 :UInt32;
  promptTokens @4 :List(Int32);
  responseTokens @5 :List(Int32);   # all tokens after the prompt, every turn
  lossMask @6 :Data;                # one byte per response token: 1 = sampled by the policy
  samplingLogprobs @7 :List(Float32); # per response token; 0 where lossMask = 0
  reward @8 :Float32;               # in [0, 1]; 0 for malformed output; 0 and meaningless
                                    # when status is not ok
  rewardReason @9 :Text;
  finishReason @10 :FinishReason;
  turns @11 :UInt32;
  startNs @12 :Int64;               # worker clock
  endNs @13 :Int64;
  weightVersion @14 :UInt64;
  worker @15 :Text;
  status @16 :RolloutStatus;        # ok unless the request could not be served or scored
  failure @17 :Text;                # why, when status is not ok
  replacedFrom @18 :Text;           # the request's replacedFrom: the lost worker it was
                                    # placed on before this one; empty if it was not re-placed
  speculation @19 :SpeculationCounts; # unset (all 0) with speculative decoding off
  prefill @20 :PrefillCounts;       # unset (all 0) from a sender that predates it
}

# Trainer → scheduler → rollout workers: stop these rollouts now and free their KV cache
# (deadline mode: the step goes on with the rollouts that finished). Workers answer with
# finish events (finishReason = abort) and send no trajectories for them.
struct AbortRollouts {
  step @0 :UInt64;
  requestIds @1 :List(UInt64);
  reason @2 :Text;
}
