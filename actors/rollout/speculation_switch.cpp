#include "actors/rollout/speculation_switch.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace sorl::rollout {

namespace {
// Relative margin by which another arm must beat the current choice to replace it.
constexpr double hysteresis = 0.05;
} // namespace

speculation_switch::speculation_switch(std::int32_t max_draft, int warmup, int explore_every, double smoothing)
    : warmup_(warmup), explore_every_(explore_every), smoothing_(smoothing) {
  if (max_draft < 1 || warmup < 1 || explore_every < 2 || !(smoothing > 0 && smoothing <= 1))
    throw std::invalid_argument(fmt::format(
        "speculation_switch: max_draft {} must be >= 1, warmup {} >= 1, explore_every {} >= 2, smoothing {} in "
        "(0, 1]",
        max_draft, warmup, explore_every, smoothing));
  arms_ = {0};
  for (const std::int32_t cap : {max_draft / 4, max_draft / 2, max_draft})
    if (cap >= 1 && std::find(arms_.begin(), arms_.end(), cap) == arms_.end()) arms_.push_back(cap);
}

int speculation_switch::bucket(std::int64_t batch) noexcept {
  int b = 0;
  while (batch > 1) {
    batch >>= 1;
    ++b;
  }
  return b;
}

int speculation_switch::arm_of(std::int32_t cap) const noexcept {
  const auto it = std::find(arms_.begin(), arms_.end(), cap);
  return it == arms_.end() ? -1 : static_cast<int>(it - arms_.begin());
}

speculation_switch::stats& speculation_switch::at(int b) {
  if (static_cast<std::size_t>(b) >= buckets_.size()) buckets_.resize(static_cast<std::size_t>(b) + 1);
  stats& s = buckets_[static_cast<std::size_t>(b)];
  if (s.rate.empty()) {
    s.rate.assign(arms_.size(), 0.0);
    s.measured.assign(arms_.size(), 0);
  }
  return s;
}

double speculation_switch::rate(int b, std::int32_t cap) const noexcept {
  const int a = arm_of(cap);
  if (a < 0 || b < 0 || static_cast<std::size_t>(b) >= buckets_.size()) return 0;
  const stats& s = buckets_[static_cast<std::size_t>(b)];
  return s.rate.empty() ? 0 : s.rate[static_cast<std::size_t>(a)];
}

std::int32_t speculation_switch::decide(std::int64_t batch) {
  const int b = bucket(batch);
  stats& s = at(b);
  // Measure every arm first, the longest draft first: at low load, where rollouts start,
  // speculation is the cheaper one to be wrong about.
  for (std::size_t a = arms_.size(); a-- > 0;)
    if (s.measured[a] < warmup_) return arms_[a];
  int best = 0;
  for (std::size_t a = 1; a < arms_.size(); ++a)
    if (s.rate[a] > s.rate[static_cast<std::size_t>(best)]) best = static_cast<int>(a);
  // Keep the current choice unless another arm is clearly faster: per-step rates are noisy,
  // and flapping between near-equal arms only fills the log.
  if (s.chosen >= 0 && best != s.chosen &&
      s.rate[static_cast<std::size_t>(best)] < (1 + hysteresis) * s.rate[static_cast<std::size_t>(s.chosen)])
    best = s.chosen;
  if (best != s.chosen) {
    std::string rates;
    for (std::size_t a = arms_.size(); a-- > 0;)
      rates += fmt::format("{}{}: {:.1f} ({} steps)", rates.empty() ? "" : ", ",
                           arms_[a] == 0 ? std::string{"off"} : fmt::format("up to {}", arms_[a]), s.rate[a],
                           s.measured[a]);
    log_.push_back(fmt::format("speculation at batch {}-{}: {}; tokens/s {}",
                               std::int64_t{1} << b, (std::int64_t{2} << b) - 1,
                               arms_[static_cast<std::size_t>(best)] == 0
                                   ? std::string{"off"}
                                   : fmt::format("drafts of up to {} tokens", arms_[static_cast<std::size_t>(best)]),
                               rates));
    s.chosen = best;
  }
  ++s.decisions;
  if (s.decisions % explore_every_ == 0) {
    // Re-try the other arms in turn.
    const int others = static_cast<int>(arms_.size()) - 1;
    int a = s.explored++ % others;
    if (a >= best) ++a;
    return arms_[static_cast<std::size_t>(a)];
  }
  return arms_[static_cast<std::size_t>(best)];
}

void speculation_switch::observe(std::int64_t batch, std::int32_t cap, std::int64_t tokens, std::int64_t ns) {
  const int a = arm_of(cap);
  if (ns <= 0 || tokens <= 0 || batch < 1 || a < 0) return;
  stats& s = at(bucket(batch));
  const auto i = static_cast<std::size_t>(a);
  const double r = static_cast<double>(tokens) * 1e9 / static_cast<double>(ns);
  s.rate[i] = s.measured[i] == 0 ? r : (1 - smoothing_) * s.rate[i] + smoothing_ * r;
  ++s.measured[i];
}

std::vector<std::string> speculation_switch::take_log() {
  std::vector<std::string> out;
  out.swap(log_);
  return out;
}

}  // namespace sorl::rollout
