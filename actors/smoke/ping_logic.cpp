#include "actors/smoke/ping_logic.hpp"

#include <stdexcept>

namespace sorl::smoke {

ping_logic::ping_logic(int64_t rounds) : rounds_(rounds) {
  if (rounds < 1)
    throw std::invalid_argument("ping_logic: rounds must be >= 1, got "
                                + std::to_string(rounds));
}

void ping_logic::set_pongers(const std::vector<std::string>& names) {
  live_ = std::set<std::string>(names.begin(), names.end());
}

uint64_t ping_logic::begin_round() {
  if (finished())
    throw std::logic_error("ping_logic: all rounds are done");
  if (in_round_)
    throw std::logic_error("ping_logic: round " + std::to_string(current_)
                           + " is still in progress");
  current_ = static_cast<uint64_t>(rounds_done_);
  in_round_ = true;
  answered_.clear();
  return current_;
}

pong_verdict ping_logic::on_pong(uint64_t round, const std::string& ponger, int64_t rtt_ns) {
  if (live_.count(ponger) == 0)
    return pong_verdict::unknown;
  if (!in_round_ || round != current_)
    return pong_verdict::stale;
  if (!answered_.insert(ponger).second)
    return pong_verdict::duplicate;
  ++answers_;
  rtt_sum_ns_ += static_cast<double>(rtt_ns);
  if (rtt_ns > max_rtt_ns_)
    max_rtt_ns_ = rtt_ns;
  return pong_verdict::counted;
}

bool ping_logic::on_ponger_down(const std::string& name) {
  answered_.erase(name);
  return live_.erase(name) > 0;
}

bool ping_logic::round_complete() const {
  if (!in_round_)
    return false;
  for (const auto& p : live_)
    if (answered_.count(p) == 0)
      return false;
  return true;
}

bool ping_logic::close_round_if_complete() {
  if (!round_complete())
    return false;
  in_round_ = false;
  ++rounds_done_;
  return true;
}

bool ping_logic::finished() const {
  return rounds_done_ >= rounds_;
}

double ping_logic::mean_rtt_ns() const {
  return answers_ == 0 ? 0.0 : rtt_sum_ns_ / static_cast<double>(answers_);
}

} // namespace sorl::smoke
