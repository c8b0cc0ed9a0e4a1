#pragma once

// Per-step metrics: one JSON object per line in RUN_DIR/metrics.jsonl, and the terminal
// progress line (ARCHITECTURE.md §3 step 7, §7; README.md "What a run writes").
//
// Free of CAF and of JSON headers: the trainer fills a plain `metrics_record`; JSON lives in
// metrics.cpp only.
//
// ## Record schema (one JSONL line per synchronous step)
//
// Keys are written in this order; a field that is not set is omitted from the line (never
// written as 0), so `scripts/plot` and other readers must treat every key but `step` as
// optional. Non-finite numbers are written as `null` (JSON has no NaN) and read as missing.
//
// | key              | member              | type         | unit / meaning                          |
// |------------------|---------------------|--------------|-----------------------------------------|
// | step             | step                | int ≥ 1      | 1-based; = steps completed so far       |
// | wall_s           | wall_s              | number       | s, wall time of the whole step          |
// | rollout_s        | rollout_s           | number       | s, generation until every group is done |
// | learn_s          | learn_s             | number       | s, learner (advantages, loss, optimizer)|
// | sync_s           | sync_s              | number       | s, weight sync until every worker acked |
// | G                | group_size          | int          | G_t, rollouts per prompt this step      |
// | reward_mean      | reward_mean         | number       | mean reward over the step's rollouts    |
// | reward_per_group | reward_per_group    | [number]     | mean reward of each group, group order  |
// | resp_len_p50     | resp_len_p50        | int          | tokens, nearest-rank p50 of responses   |
// | resp_len_p99     | resp_len_p99        | int          | tokens, nearest-rank p99                |
// | resp_len_max     | resp_len_max        | int          | tokens, longest response                |
// | tokens_per_s     | tokens_per_s        | number       | generated tokens / rollout_s            |
// | stragglers       | stragglers          | int          | straggler rollouts (ARCHITECTURE.md §6) |
// | (any other)      | extra / extra_text  | number / str | fields not yet members, in key order    |
//
// wall_s ≥ rollout_s + learn_s + sync_s; the remainder is the trainer's own bookkeeping.
//
// `extra` keys the trainer writes for weight sync (ARCHITECTURE.md §6 SparseRL-Sync) and group
// control (ARCHITECTURE.md §6 SAGC), in addition to the loss terms of the learner (among them
// skipped_updates, minibatches without an update, and nonfinite_updates, those of them dropped
// for a non-finite loss or gradient norm; actors/learner/learner_core.hpp):
//
// | key                   | unit / meaning                                                  |
// |-----------------------|-----------------------------------------------------------------|
// | sync_bytes            | bytes, payload per worker (averaged over workers)               |
// | sync_dense_bytes      | bytes, one dense bf16 copy of the model                         |
// | sync_sparse_bytes     | bytes, the sparse delta (steps with a delta only)               |
// | sync_changed_fraction | bf16 elements whose bits changed / all elements (sparse steps)  |
// | sync_encode_s         | s, publisher encode time (delta and any full payload)           |
// | sync_apply_s          | s, slowest worker's receive + apply + hash                      |
// | sync_full_workers     | workers sent the full version (first version, anchors, resyncs) |
// | sync_sparse_workers   | workers sent the delta                                          |
// | sync_resyncs          | workers that failed the delta and got a full sync instead       |
// | sync_verified_workers | live workers whose acknowledgement carried the published hash   |
// | virtual_queue         | Q_t of the drift-plus-penalty controller (policy "sagc")        |
// | p_straggler           | P̂(straggler event | G_t), when estimated                        |
// | utility               | U(G_t) = 1 − 1/G_t                                              |
// | straggler_event       | 1 when a rollout of the step passed the straggler threshold     |
// | flagged_in_flight     | rollouts flagged from chunk messages while still running        |
// | deadline_s            | s, deadline mode's rollout budget for the step                  |
// | deadline_cut          | 1 when the step was cut at the deadline                         |
// | aborted               | rollouts aborted by the cut (never trained on)                  |
// | trained_rollouts      | rollouts in the learner's batch                                 |
// | failed_rollouts       | rollouts a worker could not serve (prompt does not fit, weights |
// |                       | of another version, decoding error); never trained on           |
// | reward_failures       | rollouts whose scorer / environment threw or gave NaN / inf:    |
// |                       | out of their group's statistics and masked out of the loss      |
// | replaced_requests     | rollouts of the step the scheduler placed again on another      |
// |                       | worker because theirs was lost (peer_down, ARCHITECTURE.md §5)  |
// | overlong_penalty_mean | mean DAPO overlong shaping term over the batch's scored samples |
// |                       | (per turn, learner_core.hpp; 0 unless algorithm.overlong=shape) |
// | overlong_shaped       | samples of the batch whose overlong shaping term is < 0         |
//
// `extra_text` keys: model_hash (hex, the published hash), checksum ("ok" or "ok after
// resync" when sync_verified_workers is every live worker, else "unverified: V of W workers
// acknowledged HASH"), group_policy, group_reason.
// New fields (speculative acceptance, cache hit rate, SALT cancellation, ...) go through
// `extra` first, and are promoted to members when their names settle; names never change
// meaning once written.

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sorl {

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
  /// Further numeric fields, written after the schema fields in key order. A key may not
  /// repeat a schema key.
  std::map<std::string, double> extra;
  /// Further text fields (e.g. "checksum": "ok"), written after `extra`.
  std::map<std::string, std::string> extra_text;
};

/// The record as one line of compact JSON, without the newline. Raises
/// std::invalid_argument when an extra key is empty or repeats a schema key.
std::string to_json_line(const metrics_record& record);

/// Parses one line written by `to_json_line` (unknown numeric keys go to `extra`, unknown
/// string keys to `extra_text`, other unknown values are skipped; `null` means missing).
/// Raises std::invalid_argument naming the problem when the line is not a JSON object, has
/// no integer "step", or a schema key has the wrong type.
metrics_record parse_metrics_line(std::string_view line);

/// The terminal progress line of a step, e.g.
///   "step 12/100  reward 0.43  G 8  step 3.1s (rollout 2.2 | learn 0.7 | sync 0.2)  412 tok/s"
/// Parts whose fields are missing are left out; "stragglers N" is appended when N > 0.
/// `total_steps` ≤ 0 prints "step 12" alone. Rewards show 2 decimals, seconds 1, tokens/s
/// none. A pure function of its arguments, so the exact text is testable.
std::string progress_line(const metrics_record& record, int64_t total_steps);

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
