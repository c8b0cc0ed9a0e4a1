#pragma once

// The trainer's synchronous step (ARCHITECTURE.md §3) as a state machine: decoded events in,
// commands out, no CAF, no Cap'n Proto, no clock. Its one reach outside is the optional
// peak-RSS probe of `driver_options::peak_rss`, which tests script. The actor shell
// (actors/trainer/trainer_actor.cpp) decodes each message into an `ev::` struct, calls
// `step_driver::handle` with its own steady-clock time, and carries out the returned
// `cmd::` commands in order (encoding, sending, scheduling, printing, logging).
//
// Phases: starting → [eval_before] → per step: rollout → learn → sync → [eval_mid] →
// [checkpoint] → ... → [eval_after] → done. A step's rollout phase asks the group-size
// controller for G_t, requests B·G_t rollouts (step_plan.hpp: DAPO refills, deadline cuts),
// guards itself with a watchdog, then trains, waits for every worker to hold the new version,
// writes one metrics record (runtime/metrics.hpp) and its progress line, and checkpoints
// every `checkpoint_every` steps together with the state of each role in `stateful_roles()`
// (trainer_checkpoint.hpp). Every `eval_every` steps (before the last, which the final
// evaluation covers) a greedy held-out evaluation of the new weights comes between the sync
// and the record, and its results (heldout_accuracy, heldout_reward, heldout_len, eval_s)
// go into that step's record; the step's own times (wall_s ...) stop before it.
//
// Two commands are barriers: after `cmd::open_metrics` and `cmd::write_metrics` the driver
// waits for `ev::metrics_opened` / `ev::metrics_written` (the outcome of the file operation)
// before it goes on, so the shell must feed that event back before any other one.
//
// A failed train step, checkpoint or metrics write ends the job with a reason that names the
// run's last complete checkpoint (written or resumed from), which --resume continues from.
//
// Time enters only as the `now_ns` argument (the shell's steady clock, ns); delays in
// commands are relative to that `now_ns`.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "actors/trainer/step_plan.hpp"
#include "runtime/metrics.hpp"
#include "runtime/process_memory.hpp"

namespace sorl {
struct experiment_config;
}

namespace sorl::trainer {

/// What a reward that failed (scorer threw, NaN / inf) does to the job
/// (`algorithm.on_reward_failure`, docs/run-directory.md, "When a rollout, a reward or a step fails").
enum class reward_failure_policy {
  mask, ///< out of its group's statistics, masked out of the loss; the step goes on
  fail, ///< the job fails at that rollout
};

/// The settings the step driver reads, built from the experiment by `driver_options_from`.
struct driver_options {
  int64_t steps = 100;                ///< run.steps: synchronous RL steps of the run
  uint32_t eval_prompts = 200;        ///< task.eval_prompts: 0 = no held-out evaluation
  uint32_t prompts_per_step = 8;      ///< algorithm.prompts_per_step: B
  uint64_t seed = 0;                  ///< run.seed: fixes prompts' sampler seeds
  bool dynamic_sampling = false;      ///< algorithm.dynamic_sampling (DAPO refills)
  uint32_t max_refill_rounds = 3;     ///< algorithm.max_refill_rounds
  reward_failure_policy on_reward_failure = reward_failure_policy::mask;
  /// rollout.watchdog_s, s: the longest the rollout phase may go without a finished rollout;
  /// kept in seconds because the watchdog's message quotes the configured value.
  double watchdog_s = 600.0;
  int64_t checkpoint_every = 10;      ///< run.checkpoint_every: 0 = only after the last step
  /// run.eval_every, steps: a held-out evaluation after every eval_every-th step (not after
  /// the last: the final evaluation covers it); 0 = only before and after the run. Needs
  /// eval_prompts > 0.
  int64_t eval_every = 0;
  /// run.stop_at_accuracy: the run ends after the first evaluation every eval_every steps
  /// whose greedy accuracy is ≥ it (checkpoint, then done, that evaluation standing as the
  /// final one); 0 = never.
  double stop_at_accuracy = 0.0;
  std::string run_dir;                ///< run.run_dir(): where checkpoints go
  uint32_t max_new_tokens = 16;       ///< task.max_new_tokens, tokens per turn
  double temperature = 1.0;           ///< algorithm.temperature, at the precision written
  double top_p = 1.0;                 ///< algorithm.top_p
  uint32_t top_k = 0;                 ///< algorithm.top_k, 0 = off
  std::optional<uint64_t> task_size;  ///< training prompts (single-turn tasks); nullopt = unbounded
  /// algorithm.mismatch_warn, nats: a step whose learner metric mismatch_mean exceeds it is
  /// counted (metric mismatch_alarms) and the first such step logs a warning.
  double mismatch_warn = 1e-3;
  /// The process's peak RSS since the previous call and since its start, each call starting a
  /// new window (`peak_rss_windows::take`, runtime/process_memory.hpp). Called when a step
  /// starts and when its rollout, learn and sync phases end, for the record's rss_peak_*_mib;
  /// empty, or returning nullopt, leaves those keys out.
  std::function<std::optional<rss_peaks>()> peak_rss;

  /// The watchdog period in ns, rounded toward zero as the shell's timer is.
  int64_t watchdog_ns() const {
    return static_cast<int64_t>(watchdog_s * 1e9);
  }
};

/// The driver's settings from a loaded (validated) experiment; `task_size` is the training
/// split's size of a single-turn task, nullopt for environments.
driver_options driver_options_from(const experiment_config& cfg,
                                   std::optional<uint64_t> task_size);

/// Events: one per message (or timer) the trainer handles, carrying the decoded fields the
/// step logic reads (messages/*.capnp names in brackets).
namespace ev {

/// [LearnerReady] the learner loaded its model; `trainer_state` is the checkpoint's JSON
/// sidecar (trainer_checkpoint.hpp) when `resumed`.
struct learner_ready {
  uint64_t version = 0;
  bool resumed = false;
  std::string source;
  std::string trainer_state;
};

/// [VersionReady] every live worker holds `version`; the sync statistics of the record.
struct version_ready {
  uint64_t version = 0;
  uint64_t model_hash = 0;
  uint32_t workers = 0;          ///< live workers
  uint32_t verified_workers = 0; ///< of them, those that acknowledged model_hash
  uint64_t bytes_sent = 0;       ///< bytes per worker, averaged
  uint64_t dense_bytes = 0;      ///< bytes of one dense bf16 copy
  uint64_t sparse_bytes = 0;     ///< bytes of the sparse delta, 0 if none
  uint64_t elements = 0;         ///< bf16 elements of the model
  uint64_t changed_elements = 0; ///< of them, those whose bits changed
  /// of those, the ones that changed in an earlier version the publisher sent as a delta
  uint64_t recurring_elements = 0;
  double bound_bits = 0.0;       ///< the delta's order-0 bound in bits, 0 if none
  int64_t encode_ns = 0;
  int64_t apply_ns_max = 0;      ///< slowest worker's apply + hash
  uint32_t full_workers = 0;
  uint32_t sparse_workers = 0;
  uint32_t resyncs = 0;
};

/// [EvalResult] greedy held-out evaluation for `tag` ("before" | "step N" | "after").
struct eval_result {
  std::string tag;
  uint32_t count = 0;       ///< prompts
  double accuracy = 0;      ///< fraction with reward 1 of the prompts with a reward
  double mean_reward = 0;   ///< over the prompts with a reward
  double mean_length = 0;   ///< tokens
  double seconds = 0;
  /// Of `count`, prompts whose reward failed (algorithm.on_reward_failure = "mask").
  uint32_t reward_failures = 0;
};

/// [GroupSizeDecision] G_t for `step` (0-based) and what the record says about it.
struct group_size_decision {
  uint64_t step = 0;
  uint32_t group_size = 0;
  std::string reason;
  std::string policy;       ///< "static" | "sagc" | "deadline"
  int64_t deadline_ns = 0;  ///< rollout budget from the step's start, ns; 0 = none
  uint32_t min_finished = 0;
  double virtual_queue = 0;
  double p_straggler = 0;   ///< NaN when not estimated (then not recorded)
  double utility = 0;
};

/// [RolloutEvent, kind start] a worker began request `request_id`.
struct rollout_started {
  uint64_t request_id = 0;
  std::string worker;
};

/// How a rollout's generation ended ([FinishReason]; stop and abort count as other).
enum class finish_reason { eos, length, other };

/// [SpeculationCounts] what speculative decoding did for one rollout; all 0 without it.
struct speculation {
  uint64_t verify_steps = 0;    ///< decode steps that verified a draft
  uint64_t plain_steps = 0;     ///< decode steps without a draft
  uint64_t drafted_tokens = 0;  ///< draft tokens verified
  uint64_t accepted_tokens = 0; ///< of them, accepted; ≤ drafted_tokens
  uint64_t draft_calls = 0;     ///< drafter calls
  uint64_t draft_ns = 0;        ///< time in those calls, ns
  uint64_t verify_tokens = 0;   ///< tokens emitted in verifying steps
  uint64_t verify_ns = 0;       ///< those steps' wall time, summed per rollout, ns
  uint64_t plain_tokens = 0;    ///< tokens emitted in decode steps without a draft
  uint64_t plain_ns = 0;        ///< those steps' wall time, summed per rollout, ns
};

/// [PrefillCounts] where a rollout's prompt tokens came from, over its turns.
struct prefill {
  uint64_t prompt_tokens = 0;   ///< prompt tokens of its turns
  uint64_t cached_tokens = 0;   ///< of them, served from cached KV; ≤ prompt_tokens
  uint64_t evicted_blocks = 0;  ///< prefix-cache evictions its worker reported with it
};

/// [Trajectory] a finished rollout.
struct rollout_finished {
  uint64_t request_id = 0;
  uint64_t step = 0;
  uint64_t group_id = 0;
  uint32_t sample_index = 0;
  double reward = 0;  ///< the worker's fp32 reward, widened exactly
  rollout_outcome outcome = rollout_outcome::ok;
  std::string failure; ///< why, when outcome is not ok
  std::string worker;
  double policy_tokens = 0; ///< tokens sampled by the policy: the sum of the loss mask
  finish_reason finish = finish_reason::eos;
  /// [replacedFrom] non-empty: the scheduler placed the request again on another worker
  /// because its first one was lost; counted in the record's replaced_requests.
  bool replaced = false;
  /// Summed over the step into the record's spec_* keys.
  speculation spec{};
  /// Summed over the step into prefix_hit_rate, prefill_tokens and prefix_evictions.
  prefill kv{};
  /// end - start on the worker's clock [startNs, endNs]; 0 when the stamps are unusable.
  int64_t duration_ns = 0;
};

/// [StepTiming] the controller's timing summary of the step.
struct step_timing {
  int64_t duration_p50_ns = 0;
  int64_t duration_p90_ns = 0;
  int64_t duration_max_ns = 0;
  uint32_t stragglers = 0;
  bool straggler_event = false;
  int64_t threshold_ns = 0;
  uint32_t flagged_in_flight = 0;
  uint32_t aborted = 0;
  uint64_t step{}; ///< the step (0-based) these timings are of; another step's are ignored
  /// The group_tokens verdict (actors/sagc/timing.hpp), whatever rule is selected: groups
  /// with ≥ 2 finished rollouts, and of those the ones with a token straggler.
  uint32_t groups_judged = 0;
  uint32_t group_events = 0;
};

/// [TrainResult] the learner's update produced `version`; its loss metrics by name. With
/// `ok` false the learner could not take the step (a malformed batch, every update
/// non-finite) and says why in `reason`; the job then ends.
struct train_result {
  uint64_t version = 0;
  std::vector<std::string> metric_names;
  std::vector<double> metric_values;
  bool ok = true;
  std::string reason{}; ///< initialised so that {version, names, values} stays warning-free
};

/// [CheckpointDone]
struct checkpoint_done {
  uint64_t step = 0;
  std::string path;
  bool ok = true;
  std::string reason;
};

/// [RoleState] a stateful role's saved state for the checkpoint after `step` steps.
struct role_state {
  uint64_t step = 0;
  std::string role;
  std::string state;
  bool ok = true;
  std::string reason;
};

/// [RoleStateRestored] a role took (ok) or refused its saved state; a non-empty reason with
/// ok is a warning.
struct role_state_restored {
  std::string role;
  bool ok = true;
  std::string reason;
};

/// The watchdog timer of step `step` (0-based) fired.
struct watchdog_tick {
  int64_t step = 0;
};

/// The deadline timer of step `step` (0-based) fired.
struct deadline_tick {
  int64_t step = 0;
};

/// A signal asked the job to stop: `signal` is "SIGINT", "SIGTERM" or "signal N".
struct interrupt {
  std::string signal;
  std::string node;
};

/// A peer's process is gone; `name` is "role#index@node".
struct peer_down {
  std::string role;
  std::string name;
  std::string why;
};

/// Outcome of `cmd::open_metrics`: nullopt = opened, else the error's text.
struct metrics_opened {
  std::optional<std::string> error;
};

/// Outcome of `cmd::write_metrics`: nullopt = written, else the error's text.
struct metrics_written {
  std::optional<std::string> error;
};

} // namespace ev

/// Any event the driver handles.
using event =
  std::variant<ev::learner_ready, ev::version_ready, ev::eval_result, ev::group_size_decision,
               ev::rollout_started, ev::rollout_finished, ev::step_timing, ev::train_result,
               ev::checkpoint_done, ev::role_state, ev::role_state_restored, ev::watchdog_tick,
               ev::deadline_tick, ev::interrupt, ev::peer_down, ev::metrics_opened,
               ev::metrics_written>;

/// Commands: what the shell sends, schedules, prints or logs, in the order returned.
namespace cmd {

/// [GroupSizeQuery] to the sagc_controller.
struct query_group_size {
  uint64_t step = 0;
};

/// One [GenerateRequest] per spec to the scheduler (split train).
struct generate {
  std::vector<rollout_spec> requests;
  uint64_t weight_version = 0; ///< the version the workers must hold
  uint32_t max_new_tokens = 0;
  double temperature = 1.0;
  double top_p = 1.0;
  uint32_t top_k = 0;
};

/// [AbortRollouts] to the scheduler.
struct abort_rollouts {
  uint64_t step = 0;
  std::vector<uint64_t> request_ids;
  std::string reason;
};

/// [StepTimingQuery] to the sagc_controller.
struct query_step_timing {
  uint64_t step = 0;
};

/// Keep the trajectory just handled (request `request_id`): a later `train` may name it.
/// The shell may drop every kept trajectory once it has carried out a `train`.
struct keep_trajectory {
  uint64_t request_id = 0;
};

/// [TrainBatch] to the learner: the kept trajectories of `request_ids`, in this order.
struct train {
  uint64_t step = 0;
  std::vector<uint64_t> request_ids;
};

/// [EvalRequest] to the learner.
struct request_eval {
  std::string tag; ///< "before" | "step N" (after step N, 1-based) | "after"
  uint32_t count = 0;
};

/// [RoleStateQuery] to `role` (one of stateful_roles()).
struct query_role_state {
  std::string role;
  uint64_t step = 0;
};

/// [RoleStateRestore] to `role`.
struct restore_role_state {
  std::string role;
  std::string state;
  std::string source;
};

/// [CheckpointRequest] to the learner.
struct request_checkpoint {
  uint64_t step = 0;
  std::string dir;
  std::string trainer_state; ///< JSON, trainer_checkpoint.hpp
};

/// Open RUN_DIR/metrics.jsonl (metrics_sink); answer with ev::metrics_opened.
struct open_metrics {
  metrics_open_mode mode = metrics_open_mode::fresh;
  std::optional<int64_t> keep_through_step;
};

/// Append `record` to the metrics file; answer with ev::metrics_written.
struct write_metrics {
  metrics_record record;
};

/// Print `text` and a newline on stdout, then flush.
struct print_line {
  std::string text;
};

/// Severity of a `log` command (spdlog's levels of the same names).
enum class log_level { debug, info, warn };

/// Log `text`, prefixed by the trainer's name and ": ".
struct log {
  log_level level = log_level::info;
  std::string text;
};

/// Deliver ev::watchdog_tick{step} after `delay_ns`.
struct schedule_watchdog {
  int64_t delay_ns = 0;
  int64_t step = 0;
};

/// Deliver ev::deadline_tick{step} after `delay_ns`.
struct schedule_deadline {
  int64_t delay_ns = 0;
  int64_t step = 0;
};

/// End the job as failed (exit 1) with `why`.
struct fail_job {
  std::string why;
};

/// End the job as finished with `summary`.
struct finish_job {
  std::string summary;
};

} // namespace cmd

/// Any command the driver returns.
using command =
  std::variant<cmd::query_group_size, cmd::generate, cmd::abort_rollouts, cmd::query_step_timing,
               cmd::keep_trajectory, cmd::train, cmd::request_eval, cmd::query_role_state,
               cmd::restore_role_state, cmd::request_checkpoint, cmd::open_metrics,
               cmd::write_metrics, cmd::print_line, cmd::log, cmd::schedule_watchdog,
               cmd::schedule_deadline, cmd::fail_job, cmd::finish_job>;

/// Where the trainer is in the run.
/// eval_mid: the held-out evaluation after a step whose number is a multiple of eval_every; the
/// step is complete (step() counts it) but its record is not written yet.
enum class phase {
  starting,
  eval_before,
  rollout,
  learn,
  sync,
  eval_mid,
  checkpoint,
  eval_after,
  done
};

/// The trainer's step logic. Not thread-safe: one owner (the actor) calls it.
class step_driver {
public:
  /// A driver in phase `starting`, waiting for the learner and the first weights.
  explicit step_driver(driver_options opts);
  ~step_driver();
  step_driver(const step_driver&) = delete;
  step_driver& operator=(const step_driver&) = delete;

  /// Handles one event at the shell's steady-clock time `now_ns` (ns) and returns what to do,
  /// in order. Events the current phase does not expect are ignored or logged; none throws.
  std::vector<command> handle(int64_t now_ns, const event& e);

  phase now() const {
    return phase_;
  }
  /// Steps completed (0-based index of the step in progress).
  int64_t step() const {
    return step_;
  }
  const driver_options& options() const {
    return opts_;
  }

private:
  using out = std::vector<command>;
  struct kept_rollout {
    uint64_t group_id = 0;
    double reward = 0;
    rollout_outcome outcome = rollout_outcome::ok;
    double policy_tokens = 0;
    ev::finish_reason finish = ev::finish_reason::eos;
    bool replaced = false;
    ev::speculation spec{};
    ev::prefill kv{};
    int64_t duration_ns = 0;
    std::string worker;
  };
  enum class awaiting { nothing, open, write };

  void on(out& o, const ev::learner_ready& e);
  void on(out& o, const ev::version_ready& e);
  void on(out& o, const ev::eval_result& e);
  void on(out& o, const ev::group_size_decision& e);
  void on(out& o, const ev::rollout_started& e);
  void on(out& o, const ev::rollout_finished& e);
  void on(out& o, const ev::step_timing& e);
  void on(out& o, const ev::train_result& e);
  void on(out& o, const ev::checkpoint_done& e);
  void on(out& o, const ev::role_state& e);
  void on(out& o, const ev::role_state_restored& e);
  void on(out& o, const ev::watchdog_tick& e);
  void on(out& o, const ev::deadline_tick& e);
  void on(out& o, const ev::interrupt& e);
  void on(out& o, const ev::peer_down& e);
  void on(out& o, const ev::metrics_opened& e);
  void on(out& o, const ev::metrics_written& e);

  void fail(out& o, std::string why);
  void maybe_start(out& o);
  void begin_step(out& o);
  void request_eval(out& o, phase p, std::string tag);
  void write_record(out& o);
  std::optional<rss_peaks> take_peak_rss();
  void send_requests(out& o);
  void try_cut(out& o);
  void end_rollouts(out& o);
  void end_step(out& o, const ev::version_ready& ready);
  /// Reads the learner's mismatch figures off record_: the summary's sums, the alarm count
  /// (metric mismatch_alarms) and the one warning.
  void note_mismatch(out& o);
  void start_checkpoint(out& o);
  void send_checkpoint(out& o);
  void stop_on_request(out& o, const std::string& where);
  std::string resume_hint() const;
  void finish(out& o);
  std::string missing_rollouts() const;

  driver_options opts_;
  int64_t now_ns_ = 0; ///< the shell's time of the event being handled, ns
  phase phase_ = phase::starting;
  awaiting awaiting_ = awaiting::nothing;
  bool learner_ready_ = false;
  bool weights_ready_ = false;
  bool resumed_ = false;
  uint64_t version_ = 0;
  trainer_counters counters_;
  int64_t step_ = 0;
  uint32_t group_size_ = 0;
  std::string group_reason_;
  int64_t deadline_ns_ = 0; ///< this step's rollout budget (0 = none)
  uint32_t min_finished_ = 0;
  bool deadline_passed_ = false;
  std::unique_ptr<step_plan> plan_;
  /// The step's first failed or unrewarded rollout as its warning said it, "" when none: the
  /// error of a step left with nothing to train on repeats it, so the cause is not only in
  /// warnings scrolled away.
  std::string first_failure_;
  std::map<uint64_t, kept_rollout> rollouts_;     ///< accepted this step, by request id
  std::map<uint64_t, std::string> started_on_;    ///< request id → worker (start events)
  int64_t progress_ns_ = 0; ///< last progress of the rollout phase (decision, finished rollout)
  int64_t step_start_ns_ = 0;
  int64_t rollout_end_ns_ = 0;
  int64_t learn_end_ns_ = 0;
  metrics_record record_;
  std::vector<double> reward_history_;
  /// Train/inference mismatch over the steps since the job started (or resumed): the sum of
  /// the steps' mismatch_mean, how many steps reported one, the largest mismatch_max, and
  /// the steps whose mean passed opts_.mismatch_warn.
  double mismatch_mean_sum_ = 0.0;
  int64_t mismatch_steps_ = 0;
  double mismatch_max_ = 0.0;
  int64_t mismatch_alarms_ = 0;
  std::optional<double> acc_before_;
  std::optional<double> acc_after_;
  /// Step whose evaluation reached opts_.stop_at_accuracy: the run ends after its checkpoint.
  std::optional<int64_t> reached_at_;
  std::string eval_tag_;      ///< the tag of the evaluation awaited; "" while none
  int64_t eval_start_ns_ = 0; ///< when it was requested
  int64_t run_start_ns_ = 0;
  /// A VersionReady that overtook the TrainResult of the same step (different senders).
  std::optional<ev::version_ready> early_ready_;
  std::map<std::string, std::string> role_states_; ///< checkpoint in progress, by role
  size_t restores_pending_ = 0;
  std::string resume_source_;
  std::string stop_request_; ///< "SIGINT on node main"; "" while no signal asked to stop
  /// The run's newest complete checkpoint (written or resumed from) and its step; "" while
  /// there is none. Named when a failed step ends the job, so the user knows what --resume
  /// finds.
  std::string last_checkpoint_;
  int64_t last_checkpoint_step_ = 0;
};

} // namespace sorl::trainer
