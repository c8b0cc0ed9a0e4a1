#include "runtime/ml/tasks/environments.hpp"

#include "runtime/ml/tasks/tasks_random.hpp"

#include <stdexcept>
#include <string>

namespace sorl::ml {

namespace {

void validate(const number_guess_options& o) {
  if (o.hi < o.lo)
    throw std::invalid_argument("number_guess: hi (" + std::to_string(o.hi)
                                + ") must be >= lo (" + std::to_string(o.lo) + ")");
  // The span must fit comfortably in int64 (bisection computes hi - lo). Checked in uint64:
  // with lo = -2^62 and hi = 2^62, hi - lo itself would overflow int64.
  constexpr std::int64_t limit = std::int64_t{1} << 62;
  if (o.lo < -limit || o.hi > limit
      || static_cast<std::uint64_t>(o.hi) - static_cast<std::uint64_t>(o.lo)
           >= static_cast<std::uint64_t>(limit))
    throw std::invalid_argument("number_guess: [lo, hi] must satisfy -2^62 <= lo, hi <= 2^62, "
                                "hi - lo < 2^62");
  if (o.max_turns < 1)
    throw std::invalid_argument("number_guess: max_turns must be >= 1, got "
                                + std::to_string(o.max_turns));
}

} // namespace

number_guess_environment::number_guess_environment(const number_guess_options& options)
  : options_(options) {
  validate(options);
}

std::string number_guess_environment::reset(std::uint64_t seed) {
  detail::split_mix rng(seed);
  return start(rng.between(options_.lo, options_.hi));
}

std::string number_guess_environment::start(std::int64_t target) {
  if (target < options_.lo || target > options_.hi)
    throw std::invalid_argument("number_guess: target " + std::to_string(target)
                                + " outside [" + std::to_string(options_.lo) + ", "
                                + std::to_string(options_.hi) + "]");
  target_ = target;
  turns_ = 0;
  running_ = true;
  return "guess " + std::to_string(options_.lo) + ".." + std::to_string(options_.hi);
}

env_step number_guess_environment::step(std::string_view action) {
  if (!running_)
    throw std::logic_error("number_guess: step() without a running episode (call reset first; "
                           "the last episode is done)");
  ++turns_;
  const integer_answer guess = parse_integer_answer(action);
  env_step out;
  if (guess.value && *guess.value == target_) {
    running_ = false;
    out.done = true;
    out.reward = 1.0;
    out.reason = "found in " + std::to_string(turns_) + " turns";
    return out;
  }
  if (!guess.value) {
    out.observation = "invalid";
    out.reason = guess.error;
  } else {
    out.observation = *guess.value < target_ ? "higher" : "lower";
    out.reason = std::to_string(*guess.value) + " is " + (*guess.value < target_ ? "below" : "above")
                 + " the hidden number";
  }
  if (turns_ >= options_.max_turns) {
    running_ = false;
    out.done = true;
    out.observation.clear();
    out.reason = "turn budget of " + std::to_string(options_.max_turns) + " exhausted (last: "
                 + out.reason + ")";
  }
  return out;
}

int number_guess_environment::turns() const {
  return turns_;
}

std::uint64_t split_episode_seed(std::uint64_t task_seed, task_split split, std::uint64_t index) {
  return detail::stream_seed(task_seed, split, index);
}

number_guess_task::number_guess_task(const number_guess_options& options, std::uint64_t seed)
  : seeded_environment_task(options, seed) {
  validate(options);
}

std::string_view number_guess_task::name() const {
  return "number_guess";
}

std::vector<chat_message> number_guess_task::demonstrate(std::uint64_t seed, bool correct) const {
  number_guess_environment env(options_);
  std::vector<chat_message> chat;
  chat.push_back({chat_role::user, env.reset(seed)});
  // The policies' own randomness is a separate stream from the hidden number's.
  detail::split_mix rng(detail::mix64(seed ^ 0xD1B54A32D192ED03ULL));
  std::int64_t lo = options_.lo, hi = options_.hi; // interval still possible
  while (true) {
    const std::int64_t guess = correct ? lo + (hi - lo) / 2 : rng.between(options_.lo, options_.hi);
    chat.push_back({chat_role::assistant, std::to_string(guess)});
    const env_step s = env.step(chat.back().content);
    if (s.done)
      break;
    if (s.observation == "higher")
      lo = guess + 1;
    else
      hi = guess - 1;
    chat.push_back({chat_role::user, s.observation});
  }
  return chat;
}

} // namespace sorl::ml
