#pragma once

// Multi-turn environments.

#include "runtime/ml/tasks/tasks.hpp"

#include <cstdint>
#include <memory>

namespace sorl::ml {

/// Guess a hidden integer in [lo, hi] with higher/lower feedback, within a turn budget.
///
/// Episode (observations are user turns, actions assistant turns):
///   reset  → "guess <lo>..<hi>"                       e.g. "guess 1..100"
///   action → a guess in `parse_integer_answer` format  e.g. "50"
///   step   → "higher" (the hidden number is larger), "lower", "invalid" (the action
///            wasn't an integer; the turn still counts), or, when done, "" with
///            reason "found in N turns" / "turn budget of N exhausted".
/// Reward 1 on the step that finds the number, 0 on every other step. Guesses outside
/// [lo, hi] are legal and get truthful feedback.
///
/// Episode length depends on the policy: 1 turn with a lucky guess, about
/// log2(hi - lo + 1) for bisection, up to max_turns for a poor policy, which gives the
/// naturally long-tailed rollout lengths straggler handling is built for.
class number_guess_environment final : public environment {
public:
  /// Throws std::invalid_argument naming the bad option.
  explicit number_guess_environment(const number_guess_options& options);

  /// Hidden number: uniform in [lo, hi] from `seed`.
  std::string reset(std::uint64_t seed) override;
  env_step step(std::string_view action) override;
  int turns() const override;

  /// Starts an episode with a chosen hidden number (tests, demonstrations). Throws
  /// std::invalid_argument when `target` is outside [lo, hi].
  std::string start(std::int64_t target);

  /// The hidden number of the current episode (for tests and demonstrations).
  std::int64_t target() const noexcept { return target_; }

  /// Whether an episode is running (reset/start called, not yet done).
  bool running() const noexcept { return running_; }

  const number_guess_options& options() const noexcept { return options_; }

private:
  number_guess_options options_;
  std::int64_t target_ = 0;
  int turns_ = 0;
  bool running_ = false;
};

/// The reset seed of episode `index` of `split` for a task seeded with `task_seed`: the two
/// splits are disjoint streams (a bijective mix of (index, split), index < 2^63).
std::uint64_t split_episode_seed(std::uint64_t task_seed, task_split split, std::uint64_t index);

/// What the built-in environment tasks share: their options, a fresh `Env(options)` per
/// episode, episode seeds from `split_episode_seed`, and the turn budget
/// `options.max_turns`. The derived task validates the options in its constructor.
template <class Env, class Options>
class seeded_environment_task : public multi_turn_task {
public:
  std::unique_ptr<environment> make_environment() const override {
    return std::make_unique<Env>(options_);
  }
  std::uint64_t episode_seed(task_split split, std::uint64_t index) const override {
    return split_episode_seed(seed_, split, index);
  }
  int max_turns() const override { return options_.max_turns; }

protected:
  seeded_environment_task(const Options& options, std::uint64_t seed)
    : options_(options), seed_(seed) {}

  Options options_;
  std::uint64_t seed_;
};

/// The "number_guess" multi-turn task. Held out: episode seeds of the eval split are
/// disjoint from train's. Hidden numbers themselves do overlap between splits: the
/// range is small and the first observation is the same for all episodes, so what eval
/// measures is the policy on fresh episodes rather than on unseen prompts.
///
/// Demonstrations: the expert bisects (guesses lo' + (hi' - lo') / 2 of the interval still
/// possible) and so finds any number in at most ceil(log2(hi - lo + 2)) turns; the wrong
/// policy guesses uniformly in [lo, hi], ignoring feedback.
class number_guess_task final
  : public seeded_environment_task<number_guess_environment, number_guess_options> {
public:
  /// Throws std::invalid_argument naming the bad option.
  number_guess_task(const number_guess_options& options, std::uint64_t seed);

  std::string_view name() const override;
  std::vector<chat_message> demonstrate(std::uint64_t seed, bool correct) const override;
};

} // namespace sorl::ml
