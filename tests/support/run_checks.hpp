#pragma once

// Checks on the metrics.jsonl of an end-to-end training run (Catch2; runtime/metrics.hpp keys).

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/metrics.hpp"
#include "tests/support/warm_start.hpp"

namespace sorl::test {

/// Requires the warm start under the test data directory `data` (warm_start.hpp).
inline void require_warm_start(const std::filesystem::path& data) {
  INFO("the warm start is made by the ctest fixture e2e_warm_start: ctest -R "
       "train_run_test/warm_start, or train_run_test \"[warm_start]\"");
  REQUIRE(std::filesystem::exists(warm_start_dir(data) / "latest"));
}

/// Every record of RUN_DIR/metrics.jsonl, parsed.
inline std::vector<metrics_record> read_metrics(const std::filesystem::path& run_dir) {
  std::ifstream in{run_dir / "metrics.jsonl"};
  std::vector<metrics_record> records;
  for (std::string line; std::getline(in, line);)
    records.push_back(parse_metrics_line(line));
  return records;
}

/// Checks that every step of a run trained on signal and that what it learned reached the
/// rollout workers: mixed rewards, non-zero advantages, at least one group with signal in
/// the learner's batch, a finite non-zero gradient applied, bf16 weights (model_hash) that
/// differ from the previous step's, and every live worker acknowledging exactly that hash
/// ("ok": no worker needed a resync); `workers` > 0: there were that many.
inline void check_learned_every_step(const std::vector<metrics_record>& steps, double workers) {
  std::string previous;
  for (const auto& r : steps) {
    INFO("step " << r.step);
    REQUIRE(r.reward_mean);
    CHECK(*r.reward_mean > 0.0);
    CHECK(*r.reward_mean < 1.0);
    CHECK(r.extra.at("advantage_abs_mean") > 0.0);
    CHECK(r.extra.at("zero_signal_groups") < r.extra.at("trained_groups"));
    CHECK(r.extra.at("grad_norm") > 0.0);
    CHECK(r.extra.at("updates") >= 1.0);
    CHECK(r.extra.at("nonfinite_updates") == 0.0);
    const auto& hash = r.extra_text.at("model_hash");
    if (!previous.empty())
      CHECK(hash != previous);
    previous = hash;
    CHECK(r.extra_text.at("checksum") == "ok");
    if (workers > 0)
      CHECK(r.extra.at("sync_verified_workers") == workers);
  }
}

} // namespace sorl::test
