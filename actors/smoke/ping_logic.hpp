#pragma once

// Bookkeeping of the smoke pinger, free of CAF: which pongers must still answer the current
// round, when the run is complete, and round-trip statistics.

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace sorl::smoke {

/// Outcome of feeding one answer to ping_logic::on_pong.
enum class pong_verdict {
  counted,   ///< expected and new
  stale,     ///< for a round other than the current one
  duplicate, ///< this ponger already answered the current round
  unknown,   ///< not a live ponger (gone, or never in the roster)
};

/// Rounds of ping → all live pongers → every answer. A ponger that goes down stops being
/// waited for; a round is complete when every ponger still alive has answered it.
class ping_logic {
public:
  /// `rounds` ≥ 1 rounds to run; raises std::invalid_argument otherwise.
  explicit ping_logic(int64_t rounds);

  /// Sets the live pongers (names "role#index@node") before the first round.
  void set_pongers(const std::vector<std::string>& names);

  /// Starts the next round and returns its number (0-based). Requires !finished() and no
  /// round in progress; raises std::logic_error otherwise.
  uint64_t begin_round();

  /// Records an answer. `rtt_ns` is the round-trip time measured on the pinger's clock.
  pong_verdict on_pong(uint64_t round, const std::string& ponger, int64_t rtt_ns);

  /// Forgets a ponger; returns true if it was live.
  bool on_ponger_down(const std::string& name);

  /// True when a round is in progress and every live ponger has answered it.
  bool round_complete() const;
  /// True once `rounds` rounds are complete.
  bool finished() const;
  /// Completes the current round if it is complete; returns true if it did.
  bool close_round_if_complete();

  bool in_round() const {
    return in_round_;
  }
  size_t live_pongers() const {
    return live_.size();
  }
  const std::set<std::string>& pongers() const {
    return live_;
  }
  int64_t rounds_done() const {
    return rounds_done_;
  }
  int64_t answers() const {
    return answers_;
  }
  /// Mean and max round-trip time over all counted answers, nanoseconds (0 when none).
  double mean_rtt_ns() const;
  int64_t max_rtt_ns() const {
    return max_rtt_ns_;
  }

private:
  int64_t rounds_;
  int64_t rounds_done_ = 0;
  uint64_t current_ = 0;
  bool in_round_ = false;
  std::set<std::string> live_;
  std::set<std::string> answered_;
  int64_t answers_ = 0;
  double rtt_sum_ns_ = 0;
  int64_t max_rtt_ns_ = 0;
};

} // namespace sorl::smoke
