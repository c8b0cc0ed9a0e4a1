#pragma once

// The load-aware switch of speculative decoding (rollout.speculative = "auto"; ARCHITECTURE.md
// §6 WAR). Speculation pays while decoding is memory-bound: a pass over k + 1 positions per
// sample costs little more than a pass over one, so accepted drafts are nearly free tokens.
// As the batch grows the pass becomes compute-bound, verification rows cost as much as
// decode rows, and rejected drafts are pure loss; long drafts cost more rows than they
// return once acceptance falls along the draft. Where these trade-offs balance depends on the
// model, the machine and the text, so the switch measures instead of assuming: its arms are
// "off" and a few draft caps (the configured longest draft, a half and a quarter of it), and
// per batch-size bucket (1, 2-3, 4-7, ...: powers of two) it keeps a running mean of decoded
// tokens per second for each arm, tries each a few times, then uses the fastest (a new choice
// must beat the current one by 5 %, so noise does not flip it), and re-tries the others in
// turn every `explore_every` decisions in the bucket so that a changing workload (acceptance
// falls as text changes) moves the choice. Pure logic: the clock and the counts
// come from the caller.

#include <cstdint>
#include <string>
#include <vector>

namespace sorl::rollout {

class speculation_switch {
 public:
  /// max_draft: the longest draft, tokens (>= 1); the arms are 0 (off), max_draft and, when
  /// distinct and >= 1, max_draft / 2 and max_draft / 4. warmup: steps measured per arm and
  /// bucket before choosing (>= 1); explore_every: decisions between re-tries of another arm
  /// (>= 2); smoothing: weight of a new measurement in the running mean, (0, 1]. Throws
  /// std::invalid_argument outside these.
  explicit speculation_switch(std::int32_t max_draft = 16, int warmup = 3, int explore_every = 32,
                              double smoothing = 0.25);

  /// The draft cap for the next decode step with `batch` live samples (>= 1): 0 = do not
  /// speculate.
  std::int32_t decide(std::int64_t batch);
  /// A finished decode step: `batch` live samples, decoded with draft cap `cap` (one of the
  /// arms), `tokens` emitted by them in `ns` nanoseconds. Steps with ns <= 0, no tokens or a
  /// cap that is not an arm are ignored.
  void observe(std::int64_t batch, std::int32_t cap, std::int64_t tokens, std::int64_t ns);

  /// Lines describing choices that changed since the last call (bucket, each arm's rate in
  /// tokens/s and steps measured, the new choice), for the worker's log.
  std::vector<std::string> take_log();

  /// The arms, off (0) first, then the caps in increasing order.
  const std::vector<std::int32_t>& arms() const noexcept { return arms_; }
  /// Bucket of a batch size: floor(log2(batch)).
  static int bucket(std::int64_t batch) noexcept;
  /// Running tokens/s of a bucket and arm (a cap); 0 before any measurement.
  double rate(int bucket, std::int32_t cap) const noexcept;

 private:
  struct stats {
    std::vector<double> rate;
    std::vector<int> measured;
    int decisions = 0;
    int explored = 0;   // arms re-tried so far, to take them in turn
    int chosen = -1;    // arm index of the last choice after warm-up, for the log
  };
  stats& at(int bucket);
  int arm_of(std::int32_t cap) const noexcept;

  std::vector<std::int32_t> arms_;
  int warmup_, explore_every_;
  double smoothing_;
  std::vector<stats> buckets_;
  std::vector<std::string> log_;
};

}  // namespace sorl::rollout
