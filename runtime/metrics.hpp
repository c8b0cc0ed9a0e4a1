#pragma once

// Per-step metrics: one JSON object per line in RUN_DIR/metrics.jsonl, and the terminal
// progress line (ARCHITECTURE.md §3 step 7, §7; docs/run-directory.md).
//
// Free of CAF and of JSON headers: the trainer fills a plain `metrics_record`; JSON lives in
// metrics.cpp only.
//
// ## Record schema
//
// The schema is the table SORL_METRICS below: every key a record may hold, with its group,
// type, unit and meaning. `sorl metrics` prints it as markdown, and docs/run-directory.md
// holds that output (a test keeps the two equal). Writers name keys through the
// constants it generates (`metric::sync_bytes`), never through string literals, and
// `to_json_line` refuses a key that has no row, so the schema and the writers cannot drift.
//
// Keys are written in this order: the member fields (kind member_*) in table order, then the
// numeric fields (`extra`) in key order, then the text fields (`extra_text`) in key order. A
// field that is not set is omitted from the line (never written as 0), so `scripts/plot` and
// other readers must treat every key but `step` as optional. Non-finite numbers are written as
// `null` (JSON has no NaN) and read as missing. wall_s ≥ rollout_s + learn_s + sync_s; the
// remainder is the trainer's own bookkeeping. A held-out evaluation during the run (eval_s)
// follows the step and is not part of its wall_s. Names never change meaning once written.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace sorl {

// The metric schema, one X(...) row per key:
//   X(constant, "key", group, kind, "unit", "meaning")
// group: step, group_control, rollout, speculation, groups, timing, learner, sync, heldout
// (metric::group).
// kind: member_int / member_number / member_numbers are fields of metrics_record; number,
// count (a whole number written as a JSON number, e.g. 2.0) and flag (1.0 or 0.0) live in
// `extra`; text lives in `extra_text`. A new field goes through `extra` first and is
// promoted to a member when its name settles.
// clang-format off
#define SORL_METRICS(X) \
  X(step,          "step",          step, member_int,    "",  "1-based step number; = steps completed so far") \
  X(wall_s,        "wall_s",        step, member_number, "s", "wall time of the whole step") \
  X(rollout_s,     "rollout_s",     step, member_number, "s", "generation until every group is done") \
  X(learn_s,       "learn_s",       step, member_number, "s", "learner: advantages, loss, optimizer") \
  X(sync_s,        "sync_s",        step, member_number, "s", "weight sync until every worker acknowledged") \
  X(rss_peak_rollout_mib, "rss_peak_rollout_mib", step, number, "MiB", "peak resident memory of the trainer's process during rollout_s (every role's when the topology runs in one process); absent where the kernel cannot reset the peak (/proc/self/clear_refs)") \
  X(rss_peak_learn_mib, "rss_peak_learn_mib", step, number, "MiB", "the same during learn_s") \
  X(rss_peak_sync_mib, "rss_peak_sync_mib", step, number, "MiB", "the same during sync_s") \
  X(rss_peak_process_mib, "rss_peak_process_mib", step, number, "MiB", "peak resident memory of the trainer's process from its start to the end of the step; measuring the phases resets what getrusage and /usr/bin/time report as the maximum RSS, so this is the process's peak") \
  X(group_size,    "G",             group_control, member_int, "", "G_t, rollouts per prompt this step") \
  X(group_policy,  "group_policy",  group_control, text,   "", "group-size policy: static, sagc or deadline") \
  X(group_reason,  "group_reason",  group_control, text,   "", "why the policy chose this G") \
  X(virtual_queue, "virtual_queue", group_control, number, "", "Q_t of the drift-plus-penalty controller (policy sagc)") \
  X(p_straggler,   "p_straggler",   group_control, number, "", "estimated P(straggler event given G_t), when estimated") \
  X(utility,       "utility",       group_control, number, "", "U(G_t) = 1 - 1/G_t") \
  X(deadline_s,    "deadline_s",    group_control, number, "s", "deadline mode's rollout budget for the step (deadline mode only)") \
  X(reward_mean,   "reward_mean",   rollout, member_number,  "", "mean reward over the step's rollouts") \
  X(reward_per_group, "reward_per_group", rollout, member_numbers, "", "mean reward of each group, in group order") \
  X(resp_len_p50,  "resp_len_p50",  rollout, member_int,    "tokens", "nearest-rank p50 of response lengths") \
  X(resp_len_p99,  "resp_len_p99",  rollout, member_int,    "tokens", "nearest-rank p99 of response lengths") \
  X(resp_len_max,  "resp_len_max",  rollout, member_int,    "tokens", "longest response") \
  X(tokens_per_s,  "tokens_per_s",  rollout, member_number, "tokens/s", "generated tokens / rollout_s") \
  X(prompts,       "prompts",       rollout, count, "", "prompts drawn per step") \
  X(rollouts,      "rollouts",      rollout, count, "", "rollouts generated, refills included") \
  X(finish_eos,    "finish_eos",    rollout, count, "", "rollouts that ended with end-of-sequence") \
  X(finish_length, "finish_length", rollout, count, "", "rollouts cut at the length budget") \
  X(aborted,       "aborted",       rollout, count, "", "rollouts aborted by a deadline cut (never trained on)") \
  X(deadline_cut,  "deadline_cut",  rollout, flag,  "", "1 when the step was cut at the deadline") \
  X(failed_rollouts, "failed_rollouts", rollout, count, "", "rollouts a worker could not serve (prompt does not fit, weights of another version, decoding error); never trained on") \
  X(reward_failures, "reward_failures", rollout, count, "", "rollouts whose scorer or environment threw or gave NaN / inf: out of their group's statistics and masked out of the loss") \
  X(replaced_requests, "replaced_requests", rollout, count, "", "rollouts the scheduler placed again on another worker because theirs was lost (peer_down, ARCHITECTURE.md §5)") \
  X(spec_verify_steps, "spec_verify_steps", speculation, count, "", "decode steps that verified a draft, summed over the step's rollouts (every spec_ key: steps decoded with rollout.speculative on or auto only)") \
  X(spec_plain_steps, "spec_plain_steps", speculation, count, "", "decode steps without a draft, summed over the step's rollouts") \
  X(spec_drafted_tokens, "spec_drafted_tokens", speculation, count, "tokens", "draft tokens verified") \
  X(spec_accepted_tokens, "spec_accepted_tokens", speculation, count, "tokens", "of them, those the verification accepted") \
  X(spec_draft_calls, "spec_draft_calls", speculation, count, "", "drafter calls") \
  X(spec_acceptance, "spec_acceptance", speculation, number, "", "spec_accepted_tokens / spec_drafted_tokens (absent when nothing was drafted)") \
  X(spec_mean_accepted, "spec_mean_accepted", speculation, number, "tokens", "accepted draft tokens per verifying step: spec_accepted_tokens / spec_verify_steps (absent without a verifying step)") \
  X(spec_draft_us, "spec_draft_us", speculation, number, "µs", "mean time of a drafter call: the rollouts' drafter time / spec_draft_calls (absent without a call)") \
  X(spec_share, "spec_share", speculation, number, "", "share of decode steps that verified a draft: spec_verify_steps / (spec_verify_steps + spec_plain_steps)") \
  X(spec_rate_with, "spec_rate_with", speculation, number, "tokens/s", "a rollout's own decoding speed in steps that verified a draft for it: the tokens the step's rollouts emitted in such steps / the wall time of those steps summed over the rollouts (absent without such a step)") \
  X(spec_rate_without, "spec_rate_without", speculation, number, "tokens/s", "the same in decode steps without a draft (absent without such a step)") \
  X(prefix_hit_rate, "prefix_hit_rate", kv_cache, number, "", "prompt tokens served from cached KV (parked KV of a previous turn, prefix-cache hits, a group prompt a sibling prefilled) / prompt tokens, over the step's rollouts and their turns") \
  X(prefill_tokens, "prefill_tokens", kv_cache, count, "tokens", "prompt tokens the workers computed: prompt tokens - cached ones") \
  X(prefix_evictions, "prefix_evictions", kv_cache, count, "blocks", "prefix-cache blocks the workers evicted to stay within rollout.prefix_cache_bytes, as reported with the step's rollouts") \
  X(episode_p50_s, "episode_p50_s", kv_cache, number, "s", "nearest-rank p50 of episode latency: a rollout's arrival at its worker to its last turn's end (queueing included), on the worker's clock") \
  X(episode_p99_s, "episode_p99_s", kv_cache, number, "s", "nearest-rank p99 of the same") \
  X(worker_load_max, "worker_load_max", kv_cache, number, "tokens", "the busiest worker's computed tokens in the step (prefill computed + sampled)") \
  X(load_imbalance, "load_imbalance", kv_cache, number, "", "worker_load_max / the mean over the workers that ran rollouts of the step (1 = balanced)") \
  X(refill_rounds, "refill_rounds", groups, count, "", "DAPO dynamic-sampling rounds that drew more prompts to replace zero-signal groups") \
  X(zero_signal_groups_rollout, "zero_signal_groups_rollout", groups, count, "", "generated groups whose rewards are all equal (no advantage signal)") \
  X(trained_groups,   "trained_groups",   groups, count, "", "groups in the learner's batch") \
  X(trained_rollouts, "trained_rollouts", groups, count, "", "rollouts in the learner's batch") \
  X(stragglers,    "stragglers",    timing, member_int, "", "straggler rollouts (ARCHITECTURE.md §6)") \
  X(duration_p50_s, "duration_p50_s", timing, number, "s", "nearest-rank p50 of rollout durations") \
  X(duration_p90_s, "duration_p90_s", timing, number, "s", "nearest-rank p90 of rollout durations") \
  X(duration_max_s, "duration_max_s", timing, number, "s", "longest rollout duration") \
  X(straggler_event, "straggler_event", timing, flag, "", "1 when a rollout of the step was a straggler under [sagc].straggler_rule") \
  X(groups_judged, "groups_judged", timing, count, "", "groups with at least 2 finished rollouts, judged by the group_tokens rule") \
  X(group_events, "group_events", timing, count, "", "of groups_judged, those with a rollout over kappa x the group's median tokens") \
  X(straggler_threshold_s, "straggler_threshold_s", timing, number, "s", "duration above which a rollout is a straggler under the wall_clock rule (0 before enough history)") \
  X(flagged_in_flight, "flagged_in_flight", timing, count, "", "rollouts flagged from chunk messages while still running") \
  X(rollouts_aborted_timing, "rollouts_aborted_timing", timing, count, "", "aborted rollouts as the timing statistics counted them") \
  X(loss,          "loss",          learner, number, "", "pg_loss + kl_coef * kl, mean over updates") \
  X(pg_loss,       "pg_loss",       learner, number, "", "clipped surrogate loss, mean over updates") \
  X(kl,            "kl",            learner, number, "nats", "k3 KL to the reference, mean over updates (0 without one)") \
  X(clip_frac_low, "clip_frac_low", learner, number, "", "fraction of trained tokens clipped at 1 - eps_low, mean over updates") \
  X(clip_frac_high, "clip_frac_high", learner, number, "", "fraction of trained tokens clipped at 1 + eps_high, mean over updates") \
  X(ratio_max,     "ratio_max",     learner, number, "", "largest importance ratio of any update") \
  X(grad_norm,     "grad_norm",     learner, number, "", "global L2 gradient norm before clipping, mean over updates") \
  X(mismatch_mean, "mismatch_mean", learner, number, "nats", "mean over mismatch_tokens of |learner log-prob - rollout sampling log-prob| at the weights the rollouts sampled with (every mismatch_ key: actors/learner/learner_core.hpp step_metrics)") \
  X(mismatch_max,  "mismatch_max",  learner, number, "nats", "max over the same tokens of the same gap") \
  X(mismatch_k3,   "mismatch_k3",   learner, number, "nats", "mean k3 = exp(d) - d - 1, d = learner - rollout log-prob: KL(rollout || learner) estimated from the rollout's samples") \
  X(token_mult_prob_error, "token_mult_prob_error", learner, number, "", "mean of exp|d| over the same tokens (NeMo-RL's figure; 1 = none)") \
  X(mismatch_bitwise, "mismatch_bitwise", learner, number, "", "share of the same tokens whose learner and rollout log-probs are bitwise equal") \
  X(mismatch_tokens, "mismatch_tokens", learner, count, "tokens", "trained tokens the mismatch figures cover: all with algorithm.old_logprobs = recompute or one minibatch, else the first minibatch's") \
  X(mismatch_alarms, "mismatch_alarms", learner, count, "", "steps so far (since the job started or resumed) whose mismatch_mean exceeded algorithm.mismatch_warn") \
  X(tis_weight_mean, "tis_weight_mean", learner, number, "", "mean truncated-IS weight min(pi_old / pi_rollout, algorithm.tis_cap) over trained tokens (tis_cap > 0 only)") \
  X(tis_capped_frac, "tis_capped_frac", learner, number, "", "share of trained tokens whose pi_old / pi_rollout exceeded algorithm.tis_cap (tis_cap > 0 only)") \
  X(learner_forwards, "learner_forwards", learner, count, "", "forward passes the learner ran this step, a micro-batch counting one: recompute, reference, updates and SALT's own") \
  X(entropy,       "entropy",       learner, number, "nats", "mean token entropy of the pre-update policy over mismatch_tokens") \
  X(advantage_abs_mean, "advantage_abs_mean", learner, number, "", "mean |A_i| over the batch's samples") \
  X(zero_signal_groups, "zero_signal_groups", learner, count, "", "batch groups whose (shaped) rewards are all equal, or G = 1") \
  X(tokens_trained, "tokens_trained", learner, count, "tokens", "trained tokens in the batch (counted once, not per epoch)") \
  X(overlong_filtered, "overlong_filtered", learner, count, "", "samples masked out by overlong filtering") \
  X(overlong_penalty_mean, "overlong_penalty_mean", learner, number, "", "mean DAPO overlong shaping term over the batch's scored samples (per turn, learner_core.hpp; 0 unless algorithm.overlong = shape)") \
  X(overlong_shaped, "overlong_shaped", learner, count, "", "samples of the batch whose overlong shaping term is < 0") \
  X(updates,       "updates",       learner, count, "", "optimizer updates applied") \
  X(skipped_updates, "skipped_updates", learner, count, "", "minibatches without an update: no trained token, or a non-finite loss or gradient norm") \
  X(nonfinite_updates, "nonfinite_updates", learner, count, "", "of skipped_updates, those dropped for a non-finite loss or gradient norm") \
  X(zero_signal_updates, "zero_signal_updates", learner, count, "", "of updates, those whose minibatch had every advantage 0 and no KL term: the backward pass was skipped, AdamW stepped with the exact zero gradient") \
  X(salt_cancellation, "salt_cancellation", learner, number, "", "SALT's signed cancellation c = a^T K a / sum a_i^2 K_ii of the advantages, mean over its minibatches (every salt_ key: salt.enabled only; actors/learner/salt.hpp)") \
  X(salt_rank,     "salt_rank",     learner, number, "", "dominant rank r of the minibatch Gram matrix K, mean over minibatches") \
  X(salt_gamma,    "salt_gamma",    learner, number, "", "amplification of the residual channel, mean over minibatches (1 = unchanged)") \
  X(salt_norm_before, "salt_norm_before", learner, number, "", "||sum a_i g_i|| with the advantages, over the weights in K, mean over minibatches") \
  X(salt_norm_after, "salt_norm_after", learner, number, "", "the same with SALT's coefficients") \
  X(salt_noops,    "salt_noops",    learner, count, "", "minibatches SALT left unchanged: fewer than two rollouts with a gradient, no signal, or a non-finite K") \
  X(salt_s,        "salt_s",        learner, number, "s", "learner time spent on SALT, summed over minibatches: output gradients, K, eigh, and the recorded forward of a minibatch of several micro-batches (one of a single micro-batch is the update's own)") \
  X(salt_share,    "salt_share",    learner, number, "", "salt_s / the learner's train_step time") \
  X(version,       "version",       sync, count, "", "weight version published after the step") \
  X(sync_bytes,    "sync_bytes",    sync, number, "bytes", "payload per worker (averaged over workers)") \
  X(sync_dense_bytes, "sync_dense_bytes", sync, number, "bytes", "one dense bf16 copy of the model") \
  X(sync_sparse_bytes, "sync_sparse_bytes", sync, number, "bytes", "the sparse delta (steps with a delta only)") \
  X(sync_changed_fraction, "sync_changed_fraction", sync, number, "", "bf16 elements whose bits changed / all elements (steps with a delta only)") \
  X(sync_bound_bytes, "sync_bound_bytes", sync, number, "bytes", "the order-0 entropy bound of the sparse delta: log2 C(elements, changed) + log2(changed! / the product of each step value's count!), over 8; no code that treats positions and steps as independent draws averages less (steps with a delta only)") \
  X(sync_recurring_fraction, "sync_recurring_fraction", sync, number, "", "of the changed elements, the share that changed in an earlier step's delta: temporal locality (steps with a changed element only)") \
  X(sync_encode_s, "sync_encode_s", sync, number, "s", "publisher encode time (delta and any full payload)") \
  X(sync_apply_s,  "sync_apply_s",  sync, number, "s", "slowest worker's receive + apply + hash") \
  X(sync_full_workers, "sync_full_workers", sync, count, "", "workers sent the full version (first version, anchors, resyncs)") \
  X(sync_sparse_workers, "sync_sparse_workers", sync, count, "", "workers sent the delta") \
  X(sync_resyncs,  "sync_resyncs",  sync, count, "", "workers that failed the delta and got a full sync instead") \
  X(sync_verified_workers, "sync_verified_workers", sync, count, "", "live workers whose acknowledgement carried the published hash") \
  X(model_hash,    "model_hash",    sync, text, "hex", "hash of the published weights") \
  X(checksum,      "checksum",      sync, text, "", "ok, or ok after resync, when every live worker acknowledged the hash; else unverified: V of W workers acknowledged HASH") \
  X(heldout_accuracy, "heldout_accuracy", heldout, number, "", "greedy held-out accuracy (share of task.eval_prompts prompts with reward 1) of the weights published after the step; steps that are a multiple of run.eval_every, before the last, only") \
  X(heldout_reward, "heldout_reward", heldout, number, "", "mean reward of the same greedy held-out evaluation") \
  X(heldout_len,   "heldout_len",   heldout, number, "tokens", "mean response length of the same greedy held-out evaluation") \
  X(heldout_reward_failures, "heldout_reward_failures", heldout, count, "", "prompts of the same evaluation whose reward failed (algorithm.on_reward_failure = \"mask\"), left out of heldout_accuracy and heldout_reward") \
  X(eval_s,        "eval_s",        heldout, number, "s", "wall time of that evaluation, from its request to its result; not part of wall_s")
// clang-format on

namespace metric {

/// Where a key's value lives in metrics_record and how it is written; see SORL_METRICS.
enum class kind { member_int, member_number, member_numbers, number, count, flag, text };

/// The schema's groups, in the order the generated table lists them.
enum class group {
  step,
  group_control,
  rollout,
  speculation,
  kv_cache,
  groups,
  timing,
  learner,
  sync,
  heldout
};

/// A key of the schema whose kind is fixed at compile time, so that
/// metrics_record::set accepts only values of the right type.
template <kind K>
struct name {
  const char* key;
};

#define SORL_METRIC_CONSTANT(id, key, grp, knd, unit, meaning) \
  inline constexpr name<kind::knd> id{key};
SORL_METRICS(SORL_METRIC_CONSTANT)
#undef SORL_METRIC_CONSTANT

/// One row of the schema.
struct row {
  const char* key;
  metric::group group;
  metric::kind kind;
  const char* unit;    ///< "" when the value has no unit (counts, ratios, text)
  const char* meaning;
};

/// Every row of SORL_METRICS, in table order.
const std::vector<row>& schema();

/// The row of `key`, or nullptr when the schema has none.
const row* find(std::string_view key);

/// The schema as a markdown table (header, one line per key, trailing newline): what
/// `sorl metrics` prints and docs/run-directory.md holds.
std::string markdown();

/// The same schema as JSON, what `sorl metrics --json` prints: {"metrics": [{"key", "group",
/// "type", "unit", "meaning"}, ...]} in table order, the strings of markdown()'s columns
/// ("unit" is "" for a value without one), two-space indented, with a trailing newline.
std::string schema_json();

} // namespace metric

/// One step's metrics; see the record schema above for keys and units.
struct metrics_record {
  int64_t step = 0; ///< 1-based step number, ≥ 1
  std::optional<double> wall_s;
  std::optional<double> rollout_s;
  std::optional<double> learn_s;
  std::optional<double> sync_s;
  std::optional<int64_t> group_size; ///< key "G"
  std::optional<double> reward_mean;
  std::vector<double> reward_per_group; ///< empty: not written
  std::optional<int64_t> resp_len_p50;
  std::optional<int64_t> resp_len_p99;
  std::optional<int64_t> resp_len_max;
  std::optional<double> tokens_per_s;
  std::optional<int64_t> stragglers;
  /// Numeric fields of kind number / count / flag, written after the members in key order.
  /// Writers fill them through `set`; readers get every numeric key of a parsed line here.
  std::map<std::string, double> extra;
  /// Text fields of kind text (e.g. "checksum": "ok"), written after `extra`.
  std::map<std::string, std::string> extra_text;

  void set(metric::name<metric::kind::number> k, double v) {
    extra[k.key] = v;
  }
  /// A count from any arithmetic type, stored as a double.
  template <class T>
  void set(metric::name<metric::kind::count> k, T n) {
    static_assert(std::is_arithmetic_v<T>, "a count is a number");
    extra[k.key] = static_cast<double>(n);
  }
  void set(metric::name<metric::kind::flag> k, bool on) {
    extra[k.key] = on ? 1.0 : 0.0;
  }
  void set(metric::name<metric::kind::text> k, std::string v) {
    extra_text[k.key] = std::move(v);
  }
  /// Sets a numeric field named at run time (the learner's loss terms arrive as name/value
  /// lists). Raises std::invalid_argument naming `key` when the schema has no numeric
  /// (number / count / flag) row for it.
  void set_numeric(std::string_view key, double v);
};

/// The record as one line of compact JSON, without the newline. Raises
/// std::invalid_argument naming the key when an `extra` key is not a numeric row of the
/// schema (a member's key: "set the member instead") or an `extra_text` key not a text row.
std::string to_json_line(const metrics_record& record);

/// Parses one line written by `to_json_line` (unknown numeric keys go to `extra`, unknown
/// string keys to `extra_text`, other unknown values are skipped; `null` means missing).
/// Raises std::invalid_argument naming the problem when the line is not a JSON object, has
/// no integer "step", or a schema key has the wrong type.
metrics_record parse_metrics_line(std::string_view line);

/// Steps in the trailing reward mean of the progress line (`reward_trailing_mean`).
inline constexpr std::size_t reward_mean_window = 10;

/// Mean of the last min(`window`, values.size()) entries of `values` (per-step mean rewards,
/// oldest first): a trailing moving average, so that a trend shows through the step-to-step
/// noise of a batch's sampled reward. nullopt when `values` is empty or `window` is 0.
std::optional<double> reward_trailing_mean(const std::vector<double>& values,
                                           std::size_t window = reward_mean_window);

/// The terminal progress line of a step, e.g.
///   "step 12/100  reward 0.43 (mean10 0.38)  G 8  step 3.1s (rollout 2.2 | learn 0.7 |
///   sync 0.2)  412 tok/s"
/// where "mean10" is `reward_smoothed` (the trailing mean over the last 10 steps, fewer in the
/// first 9), shown only with the step's reward and when given. Parts whose fields are missing
/// are left out; "stragglers N" is appended when N > 0. `total_steps` ≤ 0 prints "step 12"
/// alone. Rewards show 2 decimals, seconds 1, tokens/s none. A pure function of its
/// arguments, so the exact text is testable.
std::string progress_line(const metrics_record& record, int64_t total_steps,
                          std::optional<double> reward_smoothed = std::nullopt);

/// How `metrics_sink` opens RUN_DIR/metrics.jsonl.
enum class metrics_open_mode {
  /// A new run: creates RUN_DIR (and parents) and starts an empty file, replacing any old
  /// one. Choosing a run directory that does not hold a run worth keeping is the caller's job.
  fresh,
  /// `--resume`: keeps the existing records and appends after them (creating the file when
  /// absent). A torn last line (a crash mid-write left it without its newline) is dropped.
  resume,
};

/// Appends per-step records to RUN_DIR/metrics.jsonl, one JSON object per line.
///
/// Each record is written with one fwrite and flushed before `write` returns, so a crash of
/// the process loses at most the record being written (the OS has everything flushed; a
/// power loss may lose more, since nothing is fsync'ed per step: not worth a disk sync on
/// every step). Not thread-safe: owned by the trainer and called on its thread only.
class metrics_sink {
public:
  /// Opens RUN_DIR/metrics.jsonl. With `resume`, `keep_through_step` (when given) drops the
  /// records with step > keep_through_step, so that a run resumed from the checkpoint of
  /// step N continues at N + 1 without duplicate steps; the file is rewritten through a
  /// temporary file and a rename, so a crash during the rewrite leaves the old file whole.
  /// Raises std::runtime_error naming the path (and the line, 1-based) when the file cannot
  /// be opened, read or rewritten, or when a complete line of an existing file is not a
  /// valid record or steps do not increase: resuming over a damaged record would hide it.
  explicit metrics_sink(const std::filesystem::path& run_dir,
                        metrics_open_mode mode = metrics_open_mode::fresh,
                        std::optional<int64_t> keep_through_step = std::nullopt);
  ~metrics_sink();
  metrics_sink(metrics_sink&&) noexcept;
  metrics_sink& operator=(metrics_sink&&) noexcept;
  metrics_sink(const metrics_sink&) = delete;
  metrics_sink& operator=(const metrics_sink&) = delete;

  /// Appends `record` as one line and flushes. Raises std::invalid_argument when
  /// record.step < 1 or is not after the last step in the file (one record per step), and
  /// std::runtime_error naming the path when the write fails (e.g. disk full).
  void write(const metrics_record& record);

  /// RUN_DIR/metrics.jsonl.
  const std::filesystem::path& path() const {
    return path_;
  }
  /// Step of the last record in the file (kept on resume or written since), if any.
  std::optional<int64_t> last_step() const {
    return last_step_;
  }
  /// Records in the file now.
  int64_t records() const {
    return records_;
  }
  /// Lines removed when opening for resume (records after keep_through_step, a torn last
  /// line, blank lines); the trainer logs it.
  int64_t dropped_on_open() const {
    return dropped_on_open_;
  }

private:
  struct file_closer {
    void operator()(std::FILE* f) const;
  };
  void open_resume(std::optional<int64_t> keep_through_step);

  std::filesystem::path path_;
  std::unique_ptr<std::FILE, file_closer> file_;
  std::optional<int64_t> last_step_;
  int64_t records_ = 0;
  int64_t dropped_on_open_ = 0;
};

} // namespace sorl
