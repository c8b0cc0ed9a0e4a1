#pragma once

// Everything the learner role does between its messages, without CAF: it owns the policy
// model, the learner_core, the task and the step counter, keeps the trajectories the trainer
// forwards until their TrainBatch names them, and answers each request with a plain value.
// The actor shell (learner_actor.cpp) only decodes messages (actors/trainer/train_wire.hpp,
// actors/rollout/rollout_wire.hpp), calls this and encodes what it returns (ARCHITECTURE.md §3,
// step 5).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "actors/learner/learner_core.hpp"
#include "actors/learner/rollout_sample.hpp"
#include "actors/rollout/rollout_types.hpp"
#include "actors/sync/publisher_core.hpp"
#include "runtime/config.hpp"
#include "runtime/ml/formats/prompt_format.hpp"
#include "runtime/ml/policy/model.hpp"
#include "runtime/ml/tasks/tasks.hpp"
#include "runtime/ml/train/evaluate.hpp"

namespace sorl::learner {

/// The learner's sample of one Trajectory (as rollout::from_msg reads it): group id, tokens,
/// mask, sampling log-probs, reward and truncation (finish reason length). A rollout whose
/// status is not ok, or whose reward is NaN / inf, is reward_failed with reward 0 (masked out,
/// never trained as a 0). Raises std::invalid_argument naming the request id when loss mask or
/// log-probs do not have one entry per response token.
rollout_sample sample_from(const rollout::trajectory_record& t);

/// The trajectories of the steps whose TrainBatch has not arrived yet, by request id, and the
/// assembly of a batch from them. No libtorch, no CAF.
class trajectory_buffer {
public:
  /// Keeps `t` until the TrainBatch of its step. One that cannot be decoded (see sample_from)
  /// or repeats a kept request id is kept as that error, which the batch naming it reports.
  void keep(const rollout::trajectory_record& t);

  /// The samples of `request_ids`, in that order, for the TrainBatch of 0-based `step`.
  /// Removes every kept trajectory of a step ≤ `step`, also when it raises; those of later
  /// steps stay. Raises std::invalid_argument when an id was never kept (or twice in the
  /// batch), names a trajectory that could not be decoded, or a trajectory of a step ≤
  /// `step` is left over; the message names the request ids (up to ten, then how many more).
  std::vector<rollout_sample> take(uint64_t step, const std::vector<uint64_t>& request_ids);

  /// Trajectories kept, of every step.
  size_t size() const noexcept {
    return kept_.size();
  }

private:
  struct entry {
    uint64_t step = 0;
    std::variant<rollout_sample, std::string> sample; ///< or why it cannot be trained on
  };
  std::map<uint64_t, entry> kept_; ///< by request id
};

/// Where the policy came from, as the learner reports it in LearnerReady.
struct loaded_policy {
  std::string source;        ///< checkpoint directory, or "fresh PRESET init (seed N)"
  std::string trainer_state; ///< JSON the trainer stored with a resumed checkpoint, else ""
  bool resumed = false;      ///< loaded from the run's own checkpoint (--resume)
};

/// One TrainBatch's answer.
struct train_outcome {
  uint64_t step = 0;    ///< the batch's 0-based step, echoed
  uint64_t version = 0; ///< weight version after the step (unchanged when !ok)
  bool ok = true;
  std::string reason;   ///< why the step could not be taken, when !ok
  /// The step's learner metrics (runtime/metrics.hpp keys of group learner) in schema order;
  /// empty when !ok.
  std::vector<std::pair<const char*, double>> metrics;
};

/// A checkpoint's outcome: the directory written, or why not.
struct saved_checkpoint {
  std::string path;  ///< the step directory; empty when it failed
  std::string error; ///< empty when it succeeded; names the path for I/O errors
};

/// The learner's model, optimizer, task and step counter, and what it does with them.
class learner_service {
public:
  /// Nothing is built until load_policy; `me` prefixes the log lines.
  learner_service(const experiment_config& cfg, std::string me);
  ~learner_service();
  learner_service(const learner_service&) = delete;
  learner_service& operator=(const learner_service&) = delete;

  /// Builds the task and the model and loads the weights: with run.resume the run's `latest`
  /// checkpoint (else its newest complete step directory, with a warning) plus optimizer state
  /// and step, else model.checkpoint's latest, else model.hf_dir's weights, else a fresh init. Logs the source and, on
  /// resume, the weights' and optimizer's fingerprints (the line a checkpoint's save wrote).
  /// Raises std::runtime_error when a checkpoint is asked for but absent, and whatever the task
  /// or checkpoint loading raise.
  loaded_policy load_policy();

  /// Training steps taken = the current weight version.
  uint64_t version() const noexcept {
    return static_cast<uint64_t>(step_);
  }

  /// The current weights as the sync publisher reads them: version(), bf16 bit patterns of
  /// every parameter in model order, with names and shapes; the view owns its bf16 copies
  /// (`keep_alive`). Encoded by sync::encode_snapshot (actors/sync/sync_wire.hpp). Requires
  /// load_policy.
  sync::snapshot_view snapshot() const;

  /// Keeps a trajectory the trainer forwarded until its TrainBatch (trajectory_buffer::keep).
  void keep(const rollout::trajectory_record& t) {
    trajectories_.keep(t);
  }

  /// Trajectories kept for a TrainBatch not yet arrived.
  size_t kept() const noexcept {
    return trajectories_.size();
  }

  /// One update on the kept trajectories `request_ids` (in that order) of 0-based `step`. A
  /// batch that cannot be assembled or trained (a missing or malformed trajectory, every update
  /// non-finite, training stalled) is ok = false with the reason and leaves the weights and
  /// version as they were. Requires load_policy.
  train_outcome train(uint64_t step, const std::vector<uint64_t>& request_ids);

  /// Greedy accuracy of the current policy on `count` held-out prompts (or episodes), at most
  /// task.max_new_tokens tokens each. A reward that cannot be computed follows
  /// algorithm.on_reward_failure, as in rollouts: counted in the report's reward_failures and
  /// left out of accuracy and mean reward ("mask"), or ml::eval_reward_failed naming the
  /// prompt ("fail"). Raises what ml::evaluate raises.
  ml::eval_report evaluate(uint32_t count) const;

  /// Saves weights, optimizer state and step under RUN_DIR/checkpoints with `trainer_state`
  /// (JSON) in the sidecar, and logs the fingerprints of what was saved.
  saved_checkpoint save_checkpoint(const std::string& trainer_state) const;

  /// The model; requires load_policy.
  const ml::policy_model& model() const {
    return *model_;
  }

private:
  /// Raises std::logic_error before load_policy: a request that came too early.
  void require_loaded() const;

  const experiment_config& cfg_;
  std::string me_;
  ml::any_task task_;
  std::unique_ptr<ml::prompt_format> format_; ///< how evaluate() encodes prompts
  std::unique_ptr<ml::policy_model> model_;
  std::unique_ptr<learner_core> core_;
  int64_t step_ = 0;
  trajectory_buffer trajectories_;
};

} // namespace sorl::learner
