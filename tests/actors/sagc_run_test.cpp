// `sorl train` with `[sagc] policy = "sagc"`: the trainer asks the controller for G every step
// and runs each step at the G it gets, end to end in one process (real process, bounded wait).

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/metrics.hpp"
#include "tests/support/process.hpp"
#include "tests/support/run_checks.hpp"

using namespace std::chrono_literals;
namespace fs = std::filesystem;

TEST_CASE("a run with the sagc policy trains every step at the G the controller chose") {
  const fs::path dir{SORL_TEST_DATA_DIR};
  const fs::path run = dir / "runs" / "sagc-policy";
  fs::remove_all(run);
  // B = 4, G in [2, 4], first G = 3. A window of 8 durations is full after the first step
  // (12 rollouts), so every later step is decided from the straggler estimate and the queue.
  // From the warm start (made by the ctest fixture e2e_warm_start), so every step learns.
  // The wall-clock rule: responses of at most 4 tokens give the token rule nothing to judge.
  sorl::test::require_warm_start(dir);
  const std::string text = "[run]\nname = \"sagc-policy\"\nseed = 3\nsteps = 3\noutput_dir = \""
                           + (dir / "runs").string() + "\"\n"
                           + sorl::test::warm_start_tables(dir) + R"(max_new_tokens = 4
eval_prompts = 4
[algorithm]
prompts_per_step = 4
[sagc]
policy = "sagc"
g_min = 2
g_max = 4
group_size = 3
window = 8
straggler_rule = "wall_clock"
[rollout]
max_batch = 16
[[node]]
name = "main"
actors = ["trainer", "learner", "sync_publisher", "sagc_controller", "scheduler",
          { role = "rollout_worker", count = 2 }]
)";
  const auto cfg = sorl::test::write_test_file(dir.string(), "sagc-policy.toml", text);
  sorl::test::child_process p{{SORL_BIN, "train", cfg}};
  const auto rc = p.wait_exit(600s);
  INFO(p.output());
  REQUIRE(rc == 0);
  const auto records = sorl::test::read_metrics(run);
  REQUIRE(records.size() == 3);
  sorl::test::check_learned_every_step(records, 2);
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& r = records[i];
    INFO("step " << r.step);
    CHECK(r.extra_text.at("group_policy") == "sagc");
    REQUIRE(r.group_size);
    const double g = static_cast<double>(*r.group_size);
    CHECK(g >= 2);
    CHECK(g <= 4);
    if (i == 0)
      CHECK(g == 3); // no durations yet: the initial G
    // The first step had no threshold to be judged against, so Q = 0 after it and the second
    // step takes the G of the largest utility, g_max.
    if (i == 1)
      CHECK(g == 4);
    // Every group complete at the chosen G: B × G rollouts trained.
    CHECK(r.extra.at("rollouts") == 4 * g);
    CHECK(r.extra.at("utility") == Approx(1 - 1 / g));
    CHECK(r.extra.at("virtual_queue") >= 0);
  }
  // From the second step on the controller has a window, so P(straggler event | G) is
  // estimated and written.
  for (size_t i = 1; i < records.size(); ++i) {
    INFO("step " << records[i].step);
    const double p_event = records[i].extra.at("p_straggler");
    CHECK(p_event > 0);
    CHECK(p_event < 1);
  }
  CHECK(p.wait_for("job finished: 3 steps", 1s));
}
