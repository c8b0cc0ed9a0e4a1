#pragma once

// Bookkeeping of one synchronous step on the trainer (ARCHITECTURE.md §3 steps 1–4), free of CAF:
// which rollouts were requested, which groups are complete, which groups carry a learning
// signal, and (DAPO dynamic sampling, Yu et al. 2025 §3.2) which replacement groups to
// request when zero-signal groups are dropped.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace sorl::trainer {

/// Counters that make prompt choice and seeds reproducible across restarts (checkpointed).
struct trainer_counters {
  uint64_t next_group_id = 0;
  uint64_t next_request_id = 0;
  uint64_t task_cursor = 0;   ///< next training prompt index (wraps at the task size)
};

/// One rollout to request. `seed` is the group's sampler seed: sample i uses stream i, so a
/// rollout's tokens depend only on (run seed, group id, sample index), never on placement.
struct rollout_spec {
  uint64_t request_id = 0;
  uint64_t step = 0;
  uint64_t group_id = 0;
  uint32_t sample_index = 0;
  uint32_t group_size = 0;
  uint64_t task_index = 0;
  uint64_t seed = 0;
};

/// How a finished rollout came back from its worker (mirrors msg::RolloutStatus).
enum class rollout_outcome {
  ok,            ///< served and scored
  failed,        ///< the worker could not serve it: finished, but never trained on
  reward_failed, ///< generated, reward unknown: out of its group's statistics, masked out
};

/// What on_rollout() made of a finished rollout.
enum class rollout_verdict { accepted, unknown_request, duplicate, after_cut };

/// Options of a step.
struct step_options {
  uint64_t step = 0;
  uint32_t prompts = 1;          ///< B: groups to train on
  uint32_t group_size = 1;       ///< G
  uint64_t run_seed = 0;
  std::optional<uint64_t> task_size; ///< training prompts available; nullopt = unbounded
  bool dynamic_sampling = false; ///< DAPO: replace zero-signal groups
  uint32_t max_refill_rounds = 3; ///< then train on what has signal
};

/// The rollouts of one step and their rewards.
class step_plan {
public:
  /// Requests B groups of G rollouts, drawing prompts and ids from `counters` (advanced).
  /// Raises std::invalid_argument for B = 0, G = 0 or an empty task.
  step_plan(const step_options& opts, trainer_counters& counters);

  /// Every rollout requested so far (initial and refills), in request order.
  const std::vector<rollout_spec>& requested() const {
    return requested_;
  }
  /// Rollouts requested by the last call to the constructor or refill().
  std::vector<rollout_spec> take_new_requests();

  /// Records a finished rollout. A failed rollout finishes its request (so the step never
  /// waits for it) but adds no reward to its group; so does a reward_failed one, and an ok
  /// one whose reward is NaN or infinite counts as reward_failed. Group statistics (signal,
  /// mean reward) only ever see the finite rewards of ok rollouts.
  rollout_verdict on_rollout(uint64_t request_id, double reward,
                             rollout_outcome outcome = rollout_outcome::ok);

  /// True when every requested group is complete.
  bool rollouts_complete() const;

  /// After rollouts_complete(): with dynamic sampling, requests replacement groups for the
  /// zero-signal ones (at most max_refill_rounds times) and returns true if it did.
  bool refill(trainer_counters& counters);

  /// Groups to train on, in request order: with dynamic sampling the complete groups with
  /// signal, up to B (or, when none has any after the refills, every complete group); without
  /// it every complete group (zero-signal ones get zero advantages). A group counts as
  /// complete when all G rollouts finished (after a cut: min_finished of them with a reward)
  /// and at least one has a reward, so a group whose rollouts all failed is never trained.
  std::vector<uint64_t> training_groups() const;
  /// Groups whose rewards are all equal (no signal), among those requested.
  std::vector<uint64_t> zero_signal_groups() const;

  /// Deadline mode (ARCHITECTURE.md §6 SAGC, the timeout baseline): true when every group requested
  /// so far has at least `min_finished` finished rollouts, so the step may end without the
  /// rest. Always false after a cut or when nothing is outstanding.
  bool can_cut(uint32_t min_finished) const;

  /// Ends the rollout phase without the unfinished rollouts: returns their request ids (to
  /// abort), and from now on a group counts as complete with its finished rollouts, later
  /// rollouts are refused (after_cut), and refill() requests nothing. Groups with fewer than
  /// `min_finished` finished rollouts are never trained on. Raises std::logic_error when
  /// can_cut(min_finished) is false.
  ///
  /// The bias this introduces: the rollouts cut are the slowest, which are mostly the
  /// longest, so the trained batch under-represents long responses; with group-relative
  /// advantages the shorter survivors of a group are what gets reinforced, which pushes
  /// response lengths down whether or not length is what earns reward.
  std::vector<uint64_t> cut(uint32_t min_finished);

  bool was_cut() const {
    return cut_;
  }
  /// Rollouts dropped by cut().
  uint64_t aborted() const {
    return aborted_;
  }

  /// Request ids to train on: the finished rollouts of training_groups(), in request order,
  /// without failed ones (reward_failed ones stay: the learner masks them out of the loss).
  std::vector<uint64_t> training_requests() const;

  /// Rollouts that came back failed (not served), and those whose reward failed.
  uint64_t failed_rollouts() const {
    return failed_;
  }
  uint64_t reward_failures() const {
    return reward_failures_;
  }
  /// Requested rollouts not finished yet, in request order (what the step still waits for).
  std::vector<rollout_spec> outstanding() const;

  uint32_t refill_rounds() const {
    return refills_;
  }
  /// Mean reward over every ok rollout of the step (0 when there is none).
  double mean_reward() const;

private:
  void request_groups(uint32_t count, trainer_counters& counters);
  bool group_has_signal(uint64_t group) const;
  bool group_complete(uint64_t group) const;

  step_options opts_;
  std::vector<rollout_spec> requested_;
  size_t new_from_ = 0;
  std::vector<uint64_t> groups_;                     ///< in request order
  std::map<uint64_t, size_t> by_request_;            ///< request id → index in requested_
  std::map<uint64_t, std::vector<double>> rewards_;  ///< group → rewards of ok rollouts
  std::map<uint64_t, uint32_t> finished_;            ///< group → rollouts finished, any outcome
  std::map<uint64_t, rollout_outcome> done_;         ///< request ids finished → outcome
  uint64_t failed_ = 0;
  uint64_t reward_failures_ = 0;
  uint32_t refills_ = 0;
  bool cut_ = false;
  uint32_t cut_min_ = 0;
  uint64_t aborted_ = 0;
};

/// Sampler seed of a group: splitmix64 of (run seed, group id).
uint64_t group_seed(uint64_t run_seed, uint64_t group_id);

} // namespace sorl::trainer
