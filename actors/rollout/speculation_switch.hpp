#pragma once

// The load-aware switch of speculative decoding (rollout.speculative = "auto"; ARCHITECTURE.md
// §6 WAR). Speculation pays while decoding is memory-bound: a pass over k + 1 positions per
// sample costs little more than a pass over one, so accepted drafts are nearly free tokens.
// As the batch grows the pass becomes compute-bound, verification rows cost as much as
// decode rows, and rejected drafts are pure loss. Where the crossover lies depends on the
// model, the machine and the text, so the switch measures it instead of assuming it: per
// batch-size bucket (1, 2-3, 4-7, ...: powers of two) it keeps a running mean of decoded
// tokens per second with speculation on and off, tries each mode a few times, then uses the
// faster one, and re-tries the other every `explore_every` decisions in the bucket so that a
// changing workload (acceptance falls as text changes) moves the choice. Pure logic: the
// clock and the counts come from the caller.

#include <cstdint>
#include <string>
#include <vector>

namespace sorl::rollout {

class speculation_switch {
 public:
  /// warmup: steps measured per mode and bucket before choosing (>= 1); explore_every:
  /// decisions between re-tries of the mode not chosen (>= 2); smoothing: weight of a new
  /// measurement in the running mean, (0, 1]. Throws std::invalid_argument outside these.
  explicit speculation_switch(int warmup = 3, int explore_every = 32, double smoothing = 0.25);

  /// Whether the next decode step, with `batch` live samples (>= 1), speculates.
  bool decide(std::int64_t batch);
  /// A finished decode step: `batch` live samples, speculating or not, `tokens` emitted by
  /// them in `ns` nanoseconds. Steps with ns <= 0 or no tokens are ignored.
  void observe(std::int64_t batch, bool speculated, std::int64_t tokens, std::int64_t ns);

  /// Lines describing choices that changed since the last call (bucket, the two rates in
  /// tokens/s, steps measured, the new choice), for the worker's log.
  std::vector<std::string> take_log();

  /// Bucket of a batch size: floor(log2(batch)).
  static int bucket(std::int64_t batch) noexcept;
  /// Running tokens/s of a bucket and mode; 0 before any measurement.
  double rate(int bucket, bool speculated) const noexcept;

 private:
  struct stats {
    double rate[2] = {0, 0};  // [off, on], tokens/s
    int measured[2] = {0, 0};
    int decisions = 0;
    int chosen = -1;          // last choice after warm-up, for the log
  };
  stats& at(int bucket);

  int warmup_, explore_every_;
  double smoothing_;
  std::vector<stats> buckets_;
  std::vector<std::string> log_;
};

}  // namespace sorl::rollout
