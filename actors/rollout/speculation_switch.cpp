#include "actors/rollout/speculation_switch.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace sorl::rollout {

speculation_switch::speculation_switch(int warmup, int explore_every, double smoothing)
    : warmup_(warmup), explore_every_(explore_every), smoothing_(smoothing) {
  if (warmup < 1 || explore_every < 2 || !(smoothing > 0 && smoothing <= 1))
    throw std::invalid_argument(fmt::format(
        "speculation_switch: warmup {} must be >= 1, explore_every {} >= 2, smoothing {} in (0, 1]", warmup,
        explore_every, smoothing));
}

int speculation_switch::bucket(std::int64_t batch) noexcept {
  int b = 0;
  while (batch > 1) {
    batch >>= 1;
    ++b;
  }
  return b;
}

speculation_switch::stats& speculation_switch::at(int b) {
  if (static_cast<std::size_t>(b) >= buckets_.size()) buckets_.resize(static_cast<std::size_t>(b) + 1);
  return buckets_[static_cast<std::size_t>(b)];
}

double speculation_switch::rate(int b, bool speculated) const noexcept {
  if (b < 0 || static_cast<std::size_t>(b) >= buckets_.size()) return 0;
  return buckets_[static_cast<std::size_t>(b)].rate[speculated ? 1 : 0];
}

bool speculation_switch::decide(std::int64_t batch) {
  const int b = bucket(batch);
  stats& s = at(b);
  // Measure both modes first: speculation first, as the cheaper one to be wrong about at low
  // load, where rollouts start.
  if (s.measured[1] < warmup_) return true;
  if (s.measured[0] < warmup_) return false;
  const int best = s.rate[1] > s.rate[0] ? 1 : 0;
  if (best != s.chosen) {
    log_.push_back(fmt::format(
        "speculation {} at batch {}-{}: {:.1f} tokens/s with drafts, {:.1f} without ({} and {} steps measured)",
        best == 1 ? "on" : "off", std::int64_t{1} << b, (std::int64_t{2} << b) - 1, s.rate[1], s.rate[0],
        s.measured[1], s.measured[0]));
    s.chosen = best;
  }
  ++s.decisions;
  if (s.decisions % explore_every_ == 0) return best == 0;  // re-try the other mode
  return best == 1;
}

void speculation_switch::observe(std::int64_t batch, bool speculated, std::int64_t tokens, std::int64_t ns) {
  if (ns <= 0 || tokens <= 0 || batch < 1) return;
  stats& s = at(bucket(batch));
  const int m = speculated ? 1 : 0;
  const double r = static_cast<double>(tokens) * 1e9 / static_cast<double>(ns);
  s.rate[m] = s.measured[m] == 0 ? r : (1 - smoothing_) * s.rate[m] + smoothing_ * r;
  ++s.measured[m];
}

std::vector<std::string> speculation_switch::take_log() {
  std::vector<std::string> out;
  out.swap(log_);
  return out;
}

}  // namespace sorl::rollout
