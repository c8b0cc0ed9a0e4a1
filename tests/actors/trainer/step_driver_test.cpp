// The trainer's step driver on a manual clock: the commands of every phase in order, the
// metrics record's fields, DAPO refills, deadline cuts, the watchdog, interrupts, checkpoints
// with role states, resume, failed rollouts and peers going down. Expected values are worked
// out by hand from the events each test feeds.

#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "actors/trainer/step_driver.hpp"
#include "runtime/config.hpp"

using namespace sorl;
using namespace sorl::trainer;

namespace {

constexpr int64_t sec = 1'000'000'000; // ns

/// One line per command, enough to check a sequence by eye.
struct describer {
  static std::string ids(const std::vector<uint64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i)
      s += (i ? " " : "") + std::to_string(v[i]);
    return s + "]";
  }
  std::string operator()(const cmd::query_group_size& c) const {
    return "query_group_size step " + std::to_string(c.step);
  }
  std::string operator()(const cmd::generate& c) const {
    std::vector<uint64_t> v;
    for (const auto& r : c.requests)
      v.push_back(r.request_id);
    return "generate version " + std::to_string(c.weight_version) + " " + ids(v);
  }
  std::string operator()(const cmd::abort_rollouts& c) const {
    return "abort step " + std::to_string(c.step) + " " + ids(c.request_ids) + " " + c.reason;
  }
  std::string operator()(const cmd::query_step_timing& c) const {
    return "query_step_timing step " + std::to_string(c.step);
  }
  std::string operator()(const cmd::keep_trajectory& c) const {
    return "keep " + std::to_string(c.request_id);
  }
  std::string operator()(const cmd::train& c) const {
    return "train step " + std::to_string(c.step) + " " + ids(c.request_ids);
  }
  std::string operator()(const cmd::request_eval& c) const {
    return "eval " + c.tag + " " + std::to_string(c.count);
  }
  std::string operator()(const cmd::query_role_state& c) const {
    return "query_role_state " + c.role + " step " + std::to_string(c.step);
  }
  std::string operator()(const cmd::restore_role_state& c) const {
    return "restore " + c.role + " " + c.state + " from " + c.source;
  }
  std::string operator()(const cmd::request_checkpoint& c) const {
    return "checkpoint step " + std::to_string(c.step) + " in " + c.dir + ": " + c.trainer_state;
  }
  std::string operator()(const cmd::open_metrics& c) const {
    return std::string{"open_metrics "}
           + (c.mode == metrics_open_mode::fresh ? "fresh" : "resume")
           + (c.keep_through_step ? " through " + std::to_string(*c.keep_through_step) : "");
  }
  std::string operator()(const cmd::write_metrics& c) const {
    return "write_metrics step " + std::to_string(c.record.step);
  }
  std::string operator()(const cmd::print_line& c) const {
    return "print: " + c.text;
  }
  std::string operator()(const cmd::log& c) const {
    const char* level[] = {"debug", "info", "warn"};
    return std::string{"log "} + level[static_cast<int>(c.level)] + ": " + c.text;
  }
  std::string operator()(const cmd::schedule_watchdog& c) const {
    return "watchdog in " + std::to_string(c.delay_ns) + " ns for step " + std::to_string(c.step);
  }
  std::string operator()(const cmd::schedule_deadline& c) const {
    return "deadline in " + std::to_string(c.delay_ns) + " ns for step " + std::to_string(c.step);
  }
  std::string operator()(const cmd::fail_job& c) const {
    return "fail: " + c.why;
  }
  std::string operator()(const cmd::finish_job& c) const {
    return "finish: " + c.summary;
  }
};

using lines = std::vector<std::string>;

/// B = 2 prompts of a 10-prompt task, run seed 7, 2 steps, watchdog 10 s, no evaluation, a
/// checkpoint after the last step only.
driver_options two_steps() {
  driver_options o;
  o.steps = 2;
  o.eval_prompts = 0;
  o.prompts_per_step = 2;
  o.seed = 7;
  o.watchdog_s = 10;
  o.checkpoint_every = 0;
  o.run_dir = "runs/t";
  o.max_new_tokens = 16;
  o.temperature = 0.7;
  o.top_p = 0.9;
  o.top_k = 5;
  o.task_size = 10;
  return o;
}

/// The driver and the commands of its last event.
struct harness {
  step_driver d;
  std::vector<command> last;
  std::vector<metrics_record> written; ///< every record of a write_metrics, in order
  lines evals;                         ///< every request_eval, described, in order

  explicit harness(driver_options o) : d(std::move(o)) {}

  lines at(int64_t t, const event& e) {
    last = d.handle(t, e);
    lines out;
    for (const auto& c : last) {
      out.push_back(std::visit(describer{}, c));
      if (auto w = std::get_if<cmd::write_metrics>(&c))
        written.push_back(w->record);
      if (std::holds_alternative<cmd::request_eval>(c))
        evals.push_back(out.back());
    }
    return out;
  }
  template <class C>
  const C& cmd(size_t i) const {
    return std::get<C>(last.at(i));
  }
  /// The record of the write_metrics among the last commands.
  const metrics_record& record() const {
    for (const auto& c : last)
      if (auto w = std::get_if<cmd::write_metrics>(&c))
        return w->record;
    FAIL("no write_metrics among the last commands");
    throw std::logic_error("unreachable");
  }
};

/// A fresh start (weights version 0) at t = 1 s; the first step's rollout phase begins then.
void start(harness& h) {
  REQUIRE(h.at(0, ev::learner_ready{0, false, "warm-start", ""}) == lines{"open_metrics fresh"});
  REQUIRE(h.at(0, ev::metrics_opened{}).empty());
  REQUIRE(h.at(sec, ev::version_ready{0}) ==
          lines{"watchdog in 10000000000 ns for step 0", "query_group_size step 0"});
}

ev::group_size_decision static_g(uint64_t step, uint32_t g) {
  ev::group_size_decision d;
  d.step = step;
  d.group_size = g;
  d.reason = "static G";
  d.policy = "static";
  d.virtual_queue = 0;
  d.p_straggler = std::numeric_limits<double>::quiet_NaN();
  d.utility = 0.5;
  return d;
}

ev::rollout_finished rollout(uint64_t id, uint64_t group, uint32_t sample, double reward,
                             double tokens = 2,
                             ev::finish_reason finish = ev::finish_reason::eos) {
  ev::rollout_finished r;
  r.request_id = id;
  r.group_id = group;
  r.sample_index = sample;
  r.reward = reward;
  r.worker = "rollout_worker#0@n";
  r.policy_tokens = tokens;
  r.finish = finish;
  return r;
}

ev::rollout_finished failed(uint64_t id, uint64_t group, uint32_t sample, rollout_outcome o,
                            const std::string& why) {
  auto r = rollout(id, group, sample, 0.0);
  r.outcome = o;
  r.failure = why;
  return r;
}

ev::version_ready ready(uint64_t version, uint32_t workers = 2, uint32_t verified = 2) {
  ev::version_ready r;
  r.version = version;
  r.model_hash = 0xabc;
  r.workers = workers;
  r.verified_workers = verified;
  return r;
}

/// The four rollouts of the first step (G = 2), reward 1 and 2 tokens each, at `t`.
void all_rollouts(harness& h, int64_t t) {
  for (uint64_t i = 0; i < 4; ++i)
    h.at(t, rollout(i, i / 2, static_cast<uint32_t>(i % 2), 1.0));
}

/// start(), G = 2 at 2 s and every rollout at 3 s: the first step is learning.
void to_learn(harness& h) {
  start(h);
  h.at(2 * sec, static_g(0, 2));
  all_rollouts(h, 3 * sec);
  REQUIRE(h.d.now() == phase::learn);
}

/// From the rollout phase of step `step` (0-based, G = 2, requests 4·step .. 4·step + 3 with
/// `rewards`, by default 1 then 0 per group) through learning to the sync phase; every event
/// 1 s after the last, from `t`. Returns the time of the last event.
int64_t run_to_sync(harness& h, int64_t t, uint64_t step,
                    std::array<double, 4> rewards = {1.0, 0.0, 1.0, 0.0}) {
  REQUIRE(h.at(t += sec, static_g(step, 2)).size() == 1);
  for (uint64_t i = 0; i < 4; ++i)
    h.at(t += sec, rollout(4 * step + i, 2 * step + i / 2, static_cast<uint32_t>(i % 2),
                           rewards[i]));
  REQUIRE(std::holds_alternative<cmd::train>(h.last.back()));
  REQUIRE(h.at(t += sec, ev::train_result{step + 1, {}, {}}).empty());
  REQUIRE(h.d.now() == phase::sync);
  return t;
}

/// run_to_sync, then the new version on every worker 1 s later, which writes the step's
/// record. Returns the time of the last event.
int64_t run_step(harness& h, int64_t t, uint64_t step,
                 std::array<double, 4> rewards = {1.0, 0.0, 1.0, 0.0}) {
  t = run_to_sync(h, t, step, rewards);
  REQUIRE(h.at(t += sec, ready(step + 1)) == lines{"write_metrics step " + std::to_string(step + 1)});
  return t;
}

/// After start(): the first step with G = 2, each of its four rollouts carrying `spec`,
/// through learning and sync to the write of its record.
void first_step_with_spec(harness& h, ev::speculation spec) {
  h.at(2 * sec, static_g(0, 2));
  for (uint64_t i = 0; i < 4; ++i) {
    auto r = rollout(i, i / 2, static_cast<uint32_t>(i % 2), i % 2 == 0 ? 1.0 : 0.0);
    r.spec = spec;
    h.at(3 * sec, r);
  }
  h.at(4 * sec, ev::train_result{1, {}, {}});
  REQUIRE(h.at(5 * sec, ready(1)) == lines{"write_metrics step 1"});
}

} // namespace

TEST_CASE("a full step goes from evaluation through rollouts, learning, sync, record and "
          "checkpoint to the final evaluation") {
  auto o = two_steps();
  o.steps = 1;
  o.eval_prompts = 3;
  harness h{o};
  CHECK(h.at(0, ev::learner_ready{0, false, "warm-start", ""}) == lines{"open_metrics fresh"});
  CHECK(h.d.now() == phase::starting);
  CHECK(h.at(0, ev::metrics_opened{}).empty()); // the weights are not on the workers yet
  CHECK(h.at(sec, ev::version_ready{0}) == lines{"eval before 3"});
  CHECK(h.d.now() == phase::eval_before);
  CHECK(h.at(2 * sec, ev::eval_result{"before", 3, 0.25, 0.25, 4, 0.5}) ==
        lines{"print: held-out accuracy (before, greedy, 3 prompts): 0.250  mean reward 0.250  "
              "mean length 4.0 tokens  (0.5 s)",
              "watchdog in 10000000000 ns for step 0", "query_group_size step 0"});
  CHECK(h.d.now() == phase::rollout);

  // G = 2 for B = 2 prompts: groups 0 and 1 on prompts 0 and 1, requests 0..3.
  CHECK(h.at(2 * sec + sec / 2, static_g(0, 2)) == lines{"generate version 0 [0 1 2 3]"});
  const auto& gen = h.cmd<cmd::generate>(0);
  CHECK(gen.max_new_tokens == 16);
  CHECK(gen.temperature == 0.7);
  CHECK(gen.top_p == 0.9);
  CHECK(gen.top_k == 5);
  struct want {
    uint64_t id, group;
    uint32_t sample;
    uint64_t task, seed;
  };
  // Seeds: splitmix64 of (run seed 7, group id), worked out separately.
  std::vector<want> wants{{0, 0, 0, 0, 0x5c3b502db824e19ull},
                          {1, 0, 1, 0, 0x5c3b502db824e19ull},
                          {2, 1, 0, 1, 0xdf4dee81692f7455ull},
                          {3, 1, 1, 1, 0xdf4dee81692f7455ull}};
  REQUIRE(gen.requests.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    const auto& r = gen.requests[i];
    CHECK(r.request_id == wants[i].id);
    CHECK(r.step == 0);
    CHECK(r.group_id == wants[i].group);
    CHECK(r.sample_index == wants[i].sample);
    CHECK(r.group_size == 2);
    CHECK(r.task_index == wants[i].task);
    CHECK(r.seed == wants[i].seed);
  }

  // Prefill counts (prompt, cached, evicted), durations and workers: sample 0 of each group
  // prefilled its prompt of 10 tokens (3 of group 1 from the prefix cache), sample 1 forked
  // it. Worker #0 ran group 0: (10 + 0) + (3 + 5) = 18 tokens; #1 ran group 1: (7 + 0) +
  // (4 + 6) = 17 tokens; mean 17.5, so imbalance 18 / 17.5.
  auto with = [](ev::rollout_finished r, ev::prefill kv, int64_t ns, const char* worker) {
    r.kv = kv;
    r.duration_ns = ns;
    r.worker = worker;
    return r;
  };
  CHECK(h.at(3 * sec, with(rollout(0, 0, 0, 1.0, 3), {10, 0, 2}, 4 * sec, "w0")) == lines{"keep 0"});
  CHECK(h.at(3 * sec, with(rollout(1, 0, 1, 0.0, 5, ev::finish_reason::length), {10, 10, 0}, 1 * sec,
                           "w0")) == lines{"keep 1"});
  CHECK(h.at(3 * sec, with(rollout(2, 1, 0, 1.0, 4), {10, 3, 1}, 3 * sec, "w1")) == lines{"keep 2"});
  // The last rollout 2 s after the step began ends the rollout phase.
  CHECK(h.at(4 * sec, with(rollout(3, 1, 1, 1.0, 6), {10, 10, 0}, 2 * sec, "w1")) ==
        lines{"keep 3", "query_step_timing step 0", "train step 0 [0 1 2 3]"});
  CHECK(h.d.now() == phase::learn);
  CHECK(h.at(4 * sec, ev::step_timing{1500000000, 1800000000, 2000000000, 1, true, 1700000000,
                                      2, 0, 0, 3, 1})
          .empty());
  CHECK(h.at(5 * sec, ev::train_result{1, {"loss", "kl", "unpaired"}, {0.5, 0.01}}).empty());
  CHECK(h.d.now() == phase::sync);

  ev::version_ready r = ready(1);
  r.bytes_sent = 1000;
  r.dense_bytes = 4000;
  r.sparse_bytes = 800;
  r.elements = 2000;
  r.changed_elements = 500;
  r.recurring_elements = 125;
  r.bound_bits = 4000;
  r.encode_ns = 2000000;
  r.apply_ns_max = 3000000;
  r.sparse_workers = 2;
  CHECK(h.at(5 * sec + sec / 2, r) == lines{"write_metrics step 1"});
  const auto rec = h.record();
  CHECK(rec.step == 1);
  CHECK(rec.wall_s == 3.5);
  CHECK(rec.rollout_s == 2.0);
  CHECK(rec.learn_s == 1.0);
  CHECK(rec.sync_s == 0.5);
  CHECK(rec.group_size == 2);
  CHECK(rec.reward_mean == 0.75);
  CHECK(rec.reward_per_group == std::vector<double>{0.5, 1.0});
  // Lengths 3, 5, 4, 6: nearest rank p50 = 2nd of 4 = 4, p99 = 4th = 6.
  CHECK(rec.resp_len_p50 == 4);
  CHECK(rec.resp_len_p99 == 6);
  CHECK(rec.resp_len_max == 6);
  CHECK(rec.tokens_per_s == 9.0); // 18 tokens in 2 s
  CHECK(rec.stragglers == 1);
  std::map<std::string, double> extra{
    {"prompts", 2},
    {"rollouts", 4},
    {"finish_eos", 3},
    {"finish_length", 1},
    {"refill_rounds", 0},
    {"zero_signal_groups_rollout", 1},
    {"trained_groups", 2},
    {"trained_rollouts", 4},
    {"aborted", 0},
    {"deadline_cut", 0},
    {"failed_rollouts", 0},
    {"reward_failures", 0},
    {"replaced_requests", 0},
    {"prefix_hit_rate", 23.0 / 40.0},
    {"prefill_tokens", 17},
    {"prefix_evictions", 3},
    // Latencies 4, 1, 3, 2 s: nearest rank p50 = 2nd of 4 = 2 s, p99 = 4th = 4 s.
    {"episode_p50_s", 2.0},
    {"episode_p99_s", 4.0},
    {"worker_load_max", 18},
    {"load_imbalance", 18.0 / 17.5},
    {"virtual_queue", 0},
    {"utility", 0.5},
    {"duration_p50_s", 1.5},
    {"duration_p90_s", 1.8},
    {"duration_max_s", 2.0},
    {"straggler_event", 1},
    {"straggler_threshold_s", 1.7},
    {"flagged_in_flight", 2},
    {"groups_judged", 3},
    {"group_events", 1},
    {"rollouts_aborted_timing", 0},
    {"loss", 0.5},
    {"kl", 0.01},
    {"version", 1},
    {"sync_bytes", 1000},
    {"sync_dense_bytes", 4000},
    {"sync_changed_fraction", 0.25},
    {"sync_recurring_fraction", 0.25}, // 125 of the 500 changed
    {"sync_sparse_bytes", 800},
    {"sync_bound_bytes", 500}, // 4000 bits
    {"sync_encode_s", 0.002},
    {"sync_apply_s", 0.003},
    {"sync_full_workers", 0},
    {"sync_sparse_workers", 2},
    {"sync_resyncs", 0},
    {"sync_verified_workers", 2},
  };
  CHECK(rec.extra == extra);
  std::map<std::string, std::string> text{{"group_policy", "static"},
                                          {"group_reason", "static G"},
                                          {"model_hash", "0000000000000abc"},
                                          {"checksum", "ok"}};
  CHECK(rec.extra_text == text);
  // Every key the driver wrote has a row in the metric schema: to_json_line refuses others.
  CHECK_NOTHROW(sorl::to_json_line(rec));

  // The last step: a checkpoint, for which both stateful roles are asked first.
  CHECK(h.at(6 * sec, ev::metrics_written{}) ==
        lines{"print: step 1/1  reward 0.75 (mean10 0.75)  G 2  step 3.5s (rollout 2.0 | learn 1.0 | sync 0.5)  "
              "9 tok/s  stragglers 1",
              "query_role_state sagc_controller step 1", "query_role_state scheduler step 1"});
  CHECK(h.d.now() == phase::checkpoint);
  CHECK(h.d.step() == 1);
  CHECK(h.at(6 * sec, ev::role_state{1, "scheduler", R"({"rr":3})", true, ""}).empty());
  CHECK(h.at(6 * sec, ev::role_state{1, "sagc_controller", R"({"q":1})", true, ""}) ==
        lines{"checkpoint step 1 in runs/t: "
              R"({"accuracy_before":0.25,"next_group_id":2,"next_request_id":4,)"
              R"("reward_history":[0.75],"roles":{"sagc_controller":{"q":1},)"
              R"("scheduler":{"rr":3}},"step":1,"task_cursor":2})"});
  CHECK(h.at(7 * sec, ev::checkpoint_done{1, "runs/t/checkpoints/step-1", true, ""}) ==
        lines{"log info: checkpoint runs/t/checkpoints/step-1", "eval after 3"});
  CHECK(h.d.now() == phase::eval_after);
  CHECK(h.at(8 * sec, ev::eval_result{"after", 3, 0.5, 0.5, 3.5, 0.3}) ==
        lines{"print: held-out accuracy (after, greedy, 3 prompts): 0.500  mean reward 0.500  "
              "mean length 3.5 tokens  (0.3 s)",
              "finish: 1 steps; mean reward first 1 steps 0.750, last 1 steps 0.750; held-out "
              "accuracy 0.250 → 0.500; 7.0 s"});
  CHECK(h.d.now() == phase::done);
}

TEST_CASE("steps follow one another without a checkpoint until the last and the run finishes "
          "with its reward summary") {
  harness h{two_steps()};
  start(h);
  auto t = run_step(h, sec, 0);
  CHECK(h.at(t, ev::metrics_written{}) ==
        lines{"print: step 1/2  reward 0.50 (mean10 0.50)  G 2  step 7.0s (rollout 5.0 | learn 1.0 | sync 1.0)  "
              "2 tok/s",
              "watchdog in 10000000000 ns for step 1", "query_group_size step 1"});
  t = run_step(h, t, 1);
  CHECK(h.at(t, ev::metrics_written{}).size() == 3); // progress line, two role-state queries
  h.at(t, ev::role_state{2, "sagc_controller", "{}", true, ""});
  h.at(t, ev::role_state{2, "scheduler", "{}", true, ""});
  CHECK(h.at(t + sec, ev::checkpoint_done{2, "p", true, ""}) ==
        lines{"log info: checkpoint p",
              "finish: 2 steps; mean reward first 2 steps 0.500, last 2 steps 0.500; 15.0 s"});
}

TEST_CASE("the progress line shows the mean reward of the last 10 steps beside the step's") {
  // Steps 1-5 reward 0, steps 6-12 reward 1: the trailing mean is 0 through step 5, then
  // 1/6 at step 6, 5/10 at step 10, and once the window slides past step 1, 6/10 at step 11
  // and 7/10 at step 12 (a mean over all steps would read 7/12 = 0.58 there).
  auto o = two_steps();
  o.steps = 12;
  harness h{o};
  start(h);
  int64_t t = sec;
  std::map<int, std::string> printed;
  for (uint64_t s = 0; s < 12; ++s) {
    double r = s < 5 ? 0.0 : 1.0;
    t = run_step(h, t, s, {r, r, r, r});
    auto out = h.at(t, ev::metrics_written{});
    REQUIRE(!out.empty());
    printed[static_cast<int>(s) + 1] = out.front().substr(0, out.front().find("  G 2"));
  }
  CHECK(printed[1] == "print: step 1/12  reward 0.00 (mean10 0.00)");
  CHECK(printed[5] == "print: step 5/12  reward 0.00 (mean10 0.00)");
  CHECK(printed[6] == "print: step 6/12  reward 1.00 (mean10 0.17)");
  CHECK(printed[10] == "print: step 10/12  reward 1.00 (mean10 0.50)");
  CHECK(printed[11] == "print: step 11/12  reward 1.00 (mean10 0.60)");
  CHECK(printed[12] == "print: step 12/12  reward 1.00 (mean10 0.70)");
}

TEST_CASE("a failed metrics write or metrics file fails the job") {
  harness h{two_steps()};
  SECTION("open") {
    h.at(0, ev::learner_ready{0, false, "warm-start", ""});
    CHECK(h.at(0, ev::metrics_opened{"runs/t/metrics.jsonl: permission denied"}) ==
          lines{"fail: cannot open the metrics file: runs/t/metrics.jsonl: permission denied"});
  }
  SECTION("write") {
    start(h);
    auto t = run_step(h, sec, 0);
    CHECK(h.at(t, ev::metrics_written{"disk full"}) ==
          lines{"fail: step 1: disk full; no checkpoint of this run was written, so --resume "
                "has nothing to continue from"});
  }
  CHECK(h.d.now() == phase::done);
  CHECK(h.at(100 * sec, ev::metrics_written{}).empty());
}

TEST_CASE("DAPO dynamic sampling requests a replacement for a zero-signal group and trains on "
          "the groups with signal") {
  auto o = two_steps();
  o.dynamic_sampling = true;
  harness h{o};
  start(h);
  h.at(2 * sec, static_g(0, 2));
  CHECK(h.at(3 * sec, rollout(0, 0, 0, 1.0)) == lines{"keep 0"});
  CHECK(h.at(3 * sec, rollout(1, 0, 1, 0.0)) == lines{"keep 1"});
  CHECK(h.at(3 * sec, rollout(2, 1, 0, 1.0)) == lines{"keep 2"});
  // Group 1 answered 1, 1: no signal, so one group more (group 2, prompt 2, requests 4, 5).
  CHECK(h.at(3 * sec, rollout(3, 1, 1, 1.0)) == lines{"keep 3", "generate version 0 [4 5]"});
  const auto& refill = h.cmd<cmd::generate>(1);
  REQUIRE(refill.requests.size() == 2);
  CHECK(refill.requests[0].group_id == 2);
  CHECK(refill.requests[0].task_index == 2);
  CHECK(refill.requests[0].seed == 0x604fc2bd55323e12ull);
  CHECK(refill.requests[1].sample_index == 1);
  CHECK(h.at(4 * sec, rollout(4, 2, 0, 0.0)) == lines{"keep 4"});
  CHECK(h.at(5 * sec, rollout(5, 2, 1, 1.0)) ==
        lines{"keep 5", "query_step_timing step 0", "train step 0 [0 1 4 5]"});
  h.at(6 * sec, ev::train_result{1, {}, {}});
  h.at(7 * sec, ready(1));
  const auto& rec = h.record();
  CHECK(rec.reward_mean == 4.0 / 6.0);
  CHECK(rec.reward_per_group == std::vector<double>{0.5, 1.0, 0.5});
  CHECK(rec.extra.at("rollouts") == 6);
  CHECK(rec.extra.at("refill_rounds") == 1);
  CHECK(rec.extra.at("zero_signal_groups_rollout") == 1);
  CHECK(rec.extra.at("trained_groups") == 2);
  CHECK(rec.extra.at("trained_rollouts") == 4);
}

TEST_CASE("deadline mode aborts the rest once the budget is spent and every group has "
          "min_finished rollouts") {
  harness h{two_steps()};
  start(h); // the step began at 1 s
  auto d = static_g(0, 2);
  d.policy = "deadline";
  d.deadline_ns = 3 * sec;
  d.min_finished = 1;
  // G arrives 1 s into the step: 2 s of the budget are left.
  CHECK(h.at(2 * sec, d) ==
        lines{"generate version 0 [0 1 2 3]", "deadline in 2000000000 ns for step 0"});
  CHECK(h.at(3 * sec, rollout(0, 0, 0, 1.0)) == lines{"keep 0"});
  CHECK(h.at(4 * sec, ev::deadline_tick{5}).empty()); // another step's timer
  // Budget spent, but group 1 has nothing yet: no cut.
  CHECK(h.at(4 * sec, ev::deadline_tick{0}).empty());
  CHECK(h.d.now() == phase::rollout);
  CHECK(h.at(5 * sec, rollout(2, 1, 0, 0.0)) ==
        lines{"keep 2", "log debug: step 0: deadline passed, aborting 2 rollout(s)",
              "abort step 0 [1 3] deadline", "query_step_timing step 0", "train step 0 [0 2]"});
  // A straggler whose abort was on the way is dropped without a word.
  CHECK(h.at(5 * sec, rollout(1, 0, 1, 1.0)).empty());
  h.at(6 * sec, ev::train_result{1, {}, {}});
  h.at(7 * sec, ready(1));
  const auto& rec = h.record();
  CHECK(rec.extra.at("deadline_s") == 3.0);
  CHECK(rec.extra.at("aborted") == 2);
  CHECK(rec.extra.at("deadline_cut") == 1);
  CHECK(rec.extra.at("rollouts") == 2);
  CHECK(rec.extra.at("trained_groups") == 2);
  CHECK(rec.extra.at("trained_rollouts") == 2);
  CHECK(rec.extra_text.at("group_policy") == "deadline");
  CHECK(rec.reward_per_group == std::vector<double>{1.0, 0.0});
}

TEST_CASE("a deadline already spent when G arrives is scheduled at once") {
  harness h{two_steps()};
  start(h);
  auto d = static_g(0, 2);
  d.deadline_ns = 3 * sec;
  d.min_finished = 1;
  CHECK(h.at(5 * sec, d) ==
        lines{"generate version 0 [0 1 2 3]", "deadline in 0 ns for step 0"});
}

TEST_CASE("a VersionReady that overtakes its TrainResult ends the step when the TrainResult "
          "comes") {
  harness h{two_steps()};
  to_learn(h);
  SECTION("same version") {
    CHECK(h.at(4 * sec, ready(1)).empty());
    CHECK(h.at(5 * sec, ev::train_result{1, {"loss"}, {0.25}}) == lines{"write_metrics step 1"});
    const auto& rec = h.record();
    CHECK(rec.learn_s == 2.0);
    CHECK(rec.sync_s == 0.0); // ready before the learner answered
    CHECK(rec.extra.at("loss") == 0.25);
    CHECK(rec.extra.at("version") == 1);
  }
  SECTION("another version") {
    CHECK(h.at(4 * sec, ready(7)).empty());
    CHECK(h.at(5 * sec, ev::train_result{1, {}, {}}) ==
          lines{"log warn: unexpected version 7 ready"});
    CHECK(h.d.now() == phase::sync);
    CHECK(h.at(6 * sec, ready(1)) == lines{"write_metrics step 1"});
    CHECK(h.record().sync_s == 1.0);
  }
}

TEST_CASE("a step whose log-prob mismatch passes mismatch_warn warns once, every such step is "
          "counted, and the summary gives the run's mismatch") {
  auto o = two_steps();
  o.mismatch_warn = 1e-3;
  harness h{o};
  to_learn(h);
  // Step 1 above the threshold: one warning, counted.
  auto out = h.at(4 * sec, ev::train_result{1, {"mismatch_mean", "mismatch_max"}, {2e-3, 0.5}});
  REQUIRE(out.size() == 1);
  CHECK_THAT(out[0], Catch::StartsWith("log warn: step 1: the learner's log-probs differ from the "
                                       "rollouts' by 0.002 nats per token on average (max 0.5), "
                                       "above algorithm.mismatch_warn = 0.001"));
  CHECK(h.at(5 * sec, ready(1)) == lines{"write_metrics step 1"});
  CHECK(h.record().extra.at("mismatch_alarms") == 1.0);
  int64_t t = 5 * sec;
  REQUIRE(h.at(t, ev::metrics_written{}).size() == 3); // progress line, watchdog, next G
  // Step 2 above it too: counted, not repeated.
  REQUIRE(h.at(t += sec, static_g(1, 2)).size() == 1);
  for (uint64_t i = 0; i < 4; ++i)
    h.at(t += sec, rollout(4 + i, 2 + i / 2, static_cast<uint32_t>(i % 2), i % 2 == 0 ? 1.0 : 0.0));
  CHECK(h.at(t += sec, ev::train_result{2, {"mismatch_mean", "mismatch_max"}, {5e-3, 0.1}}).empty());
  CHECK(h.at(t += sec, ready(2)) == lines{"write_metrics step 2"});
  CHECK(h.record().extra.at("mismatch_alarms") == 2.0);
  REQUIRE(h.at(t, ev::metrics_written{}).size() == 3); // progress line, two role-state queries
  h.at(t, ev::role_state{2, "sagc_controller", "{}", true, ""});
  h.at(t, ev::role_state{2, "scheduler", "{}", true, ""});
  const auto done = h.at(t + sec, ev::checkpoint_done{2, "p", true, ""});
  REQUIRE(done.size() == 2);
  // The mean of the steps' means, (2e-3 + 5e-3) / 2, and the largest max.
  CHECK_THAT(done[1], Catch::Contains("; log-prob mismatch mean 0.0035 nats, max 0.5 (2 steps above 0.001); "));
}

TEST_CASE("a step below mismatch_warn neither warns nor counts") {
  harness h{two_steps()};
  to_learn(h);
  CHECK(h.at(4 * sec, ev::train_result{1, {"mismatch_mean", "mismatch_max"}, {4e-6, 2.5e-5}}).empty());
  CHECK(h.at(5 * sec, ready(1)) == lines{"write_metrics step 1"});
  CHECK(h.record().extra.at("mismatch_alarms") == 0.0);
}

TEST_CASE("the step's checksum says what the publisher verified") {
  harness h{two_steps()};
  to_learn(h);
  h.at(4 * sec, ev::train_result{1, {}, {}});
  auto r = ready(1, 2, 1);
  r.model_hash = 0xdeadbeef;
  std::string want = "unverified: 1 of 2 workers acknowledged 00000000deadbeef";
  SECTION("one worker of two") {}
  SECTION("after a resync") {
    r.verified_workers = 2;
    r.resyncs = 1;
    want = "ok after resync";
  }
  SECTION("no live worker") {
    r.workers = 0;
    r.verified_workers = 0;
    want = "unverified: 0 of 0 workers acknowledged 00000000deadbeef";
  }
  h.at(5 * sec, r);
  const auto& rec = h.record();
  CHECK(rec.extra_text.at("checksum") == want);
  CHECK(rec.extra_text.at("model_hash") == "00000000deadbeef");
  // Nobody got a delta: no changed fraction, no sparse bytes.
  CHECK(rec.extra.count("sync_changed_fraction") == 0);
  CHECK(rec.extra.count("sync_recurring_fraction") == 0);
  CHECK(rec.extra.count("sync_sparse_bytes") == 0);
}

TEST_CASE("the watchdog fails a stalled step naming every missing request and where it "
          "started") {
  harness h{two_steps()};
  start(h); // step began at 1 s, watchdog due at 11 s
  SECTION("before the group-size decision") {
    CHECK(h.at(11 * sec, ev::watchdog_tick{0}) ==
          lines{"fail: step 1: nothing finished for 10.0 s (rollout.watchdog_s = 10); still "
                "waiting for the group-size decision of the sagc_controller"});
  }
  SECTION("rollouts missing") {
    h.at(sec, static_g(0, 2));
    h.at(2 * sec, ev::rollout_started{1, "rollout_worker#1@b"});
    h.at(2 * sec, ev::rollout_started{0, "rollout_worker#0@a"});
    CHECK(h.at(2 * sec, rollout(0, 0, 0, 1.0)) == lines{"keep 0"});
    CHECK(h.at(12 * sec + sec / 2, ev::watchdog_tick{0}) ==
          lines{"fail: step 1: nothing finished for 10.5 s (rollout.watchdog_s = 10); still "
                "waiting for 3 of 4 rollouts: request 1 (group 0, sample 1, started on "
                "rollout_worker#1@b); request 2 (group 1, sample 0, not started on any worker); "
                "request 3 (group 1, sample 1, not started on any worker)"});
  }
  CHECK(h.d.now() == phase::done);
}

TEST_CASE("the watchdog lists ten missing requests and counts the rest") {
  auto o = two_steps();
  o.prompts_per_step = 3;
  o.watchdog_s = 2.5;
  harness h{o};
  h.at(0, ev::learner_ready{0, false, "w", ""});
  h.at(0, ev::metrics_opened{});
  CHECK(h.at(0, ev::version_ready{0}) ==
        lines{"watchdog in 2500000000 ns for step 0", "query_group_size step 0"});
  h.at(0, static_g(0, 4));
  std::string want = "fail: step 1: nothing finished for 2.5 s (rollout.watchdog_s = 2.5); "
                     "still waiting for 12 of 12 rollouts:";
  for (int i = 0; i < 10; ++i)
    want += std::string{i == 0 ? "" : ";"} + " request " + std::to_string(i) + " (group "
            + std::to_string(i / 4) + ", sample " + std::to_string(i % 4)
            + ", not started on any worker)";
  want += "; and 2 more";
  CHECK(h.at(2500000000, ev::watchdog_tick{0}) == lines{want});
}

TEST_CASE("the watchdog is re-armed for the rest of its period when a rollout finished "
          "meanwhile") {
  harness h{two_steps()};
  start(h); // step began at 1 s
  h.at(sec, static_g(0, 2));
  CHECK(h.at(5 * sec, rollout(0, 0, 0, 1.0)) == lines{"keep 0"});
  CHECK(h.at(11 * sec, ev::watchdog_tick{0}) == lines{"watchdog in 4000000000 ns for step 0"});
  CHECK(h.at(12 * sec, ev::watchdog_tick{3}).empty()); // another step's timer
  CHECK(h.at(15 * sec, ev::watchdog_tick{0}).size() == 1);
  CHECK(h.cmd<cmd::fail_job>(0).why.rfind("step 1: nothing finished for 10.0 s", 0) == 0);
}

TEST_CASE("an interrupt before the first step or during an evaluation stops at once") {
  auto o = two_steps();
  o.eval_prompts = 3;
  harness h{o};
  std::string why = "no step of this run finished, nothing new to save";
  SECTION("starting") {
    h.at(0, ev::learner_ready{0, false, "w", ""});
  }
  SECTION("evaluating before the first step") {
    h.at(0, ev::learner_ready{0, false, "w", ""});
    h.at(0, ev::metrics_opened{});
    REQUIRE(h.at(0, ev::version_ready{0}) == lines{"eval before 3"});
  }
  CHECK(h.at(sec, ev::interrupt{"SIGINT", "main"}) ==
        lines{"fail: stopped by SIGINT on node main after step 0/2; " + why});
  CHECK(h.d.now() == phase::done);
  CHECK(h.at(sec, ev::interrupt{"SIGTERM", "main"}).empty());
}

TEST_CASE("an interrupt during a step finishes it, writes its checkpoint and stops") {
  harness h{two_steps()};
  start(h);
  const lines warn{"log warn: SIGTERM on node rollout-a: finishing step 1/2, then writing a "
                   "checkpoint and stopping"};
  SECTION("rollout") {
    CHECK(h.at(sec, ev::interrupt{"SIGTERM", "rollout-a"}) == warn);
    h.at(2 * sec, static_g(0, 2));
    all_rollouts(h, 3 * sec);
    h.at(4 * sec, ev::train_result{1, {}, {}});
  }
  SECTION("learn") {
    h.at(2 * sec, static_g(0, 2));
    all_rollouts(h, 3 * sec);
    CHECK(h.at(3 * sec, ev::interrupt{"SIGTERM", "rollout-a"}) == warn);
    h.at(4 * sec, ev::train_result{1, {}, {}});
  }
  SECTION("sync") {
    h.at(2 * sec, static_g(0, 2));
    all_rollouts(h, 3 * sec);
    h.at(4 * sec, ev::train_result{1, {}, {}});
    CHECK(h.at(4 * sec, ev::interrupt{"SIGTERM", "rollout-a"}) == warn);
  }
  CHECK(h.at(5 * sec, ready(1)) == lines{"write_metrics step 1"});
  // Not the last step and checkpoint_every = 0, yet the stop asks for a checkpoint.
  CHECK(h.at(5 * sec, ev::metrics_written{}) ==
        lines{"print: step 1/2  reward 1.00 (mean10 1.00)  G 2  step 4.0s (rollout 2.0 | learn 1.0 | sync "
              "1.0)  4 tok/s",
              "query_role_state sagc_controller step 1", "query_role_state scheduler step 1"});
  h.at(5 * sec, ev::role_state{1, "sagc_controller", "{}", true, ""});
  CHECK(h.at(5 * sec, ev::role_state{1, "scheduler", "{}", true, ""}).size() == 1);
  CHECK(h.at(6 * sec, ev::checkpoint_done{1, "runs/t/checkpoints/step-1", true, ""}) ==
        lines{"log info: checkpoint runs/t/checkpoints/step-1",
              "fail: stopped by SIGTERM on node rollout-a after step 1/2; checkpoint "
              "runs/t/checkpoints/step-1"});
}

TEST_CASE("an interrupt during a checkpoint or the final evaluation names the step that is "
          "saved") {
  auto o = two_steps();
  o.steps = 1;
  o.eval_prompts = 3;
  harness h{o};
  h.at(0, ev::learner_ready{0, false, "w", ""});
  h.at(0, ev::metrics_opened{});
  h.at(0, ev::version_ready{0});
  h.at(0, ev::eval_result{"before", 3, 0, 0, 0, 0});
  auto t = run_step(h, 0, 0);
  h.at(t, ev::metrics_written{});
  REQUIRE(h.d.now() == phase::checkpoint);
  SECTION("checkpoint") {
    CHECK(h.at(t, ev::interrupt{"SIGINT", "main"}) ==
          lines{"log warn: SIGINT on node main: finishing step 1/1, then writing a checkpoint "
                "and stopping"});
    h.at(t, ev::role_state{1, "sagc_controller", "{}", true, ""});
    h.at(t, ev::role_state{1, "scheduler", "{}", true, ""});
    CHECK(h.at(t, ev::checkpoint_done{1, "c1", true, ""}) ==
          lines{"log info: checkpoint c1", "fail: stopped by SIGINT on node main after step "
                                           "1/1; checkpoint c1"});
  }
  SECTION("final evaluation") {
    h.at(t, ev::role_state{1, "sagc_controller", "{}", true, ""});
    h.at(t, ev::role_state{1, "scheduler", "{}", true, ""});
    CHECK(h.at(t, ev::checkpoint_done{1, "c1", true, ""}) ==
          lines{"log info: checkpoint c1", "eval after 3"});
    CHECK(h.at(t, ev::interrupt{"SIGINT", "main"}) ==
          lines{"fail: stopped by SIGINT on node main after step 1/1; the last step's "
                "checkpoint is complete"});
  }
}

TEST_CASE("a checkpoint waits for every stateful role and fails when one cannot save") {
  auto o = two_steps();
  o.checkpoint_every = 1;
  harness h{o};
  start(h);
  auto t = run_step(h, sec, 0);
  CHECK(h.at(t, ev::metrics_written{}).size() == 3);
  REQUIRE(h.d.now() == phase::checkpoint);
  CHECK(h.at(t, ev::role_state{0, "scheduler", "{}", true, ""}).empty()); // for another step
  SECTION("both answer") {
    CHECK(h.at(t, ev::role_state{1, "scheduler", R"({"rr":1})", true, ""}).empty());
    CHECK(h.at(t, ev::role_state{1, "sagc_controller", R"({"q":0.5})", true, ""}) ==
          lines{"checkpoint step 1 in runs/t: "
                R"({"accuracy_before":null,"next_group_id":2,"next_request_id":4,)"
                R"("reward_history":[0.5],"roles":{"sagc_controller":{"q":0.5},)"
                R"("scheduler":{"rr":1}},"step":1,"task_cursor":2})"});
    // Checkpoint every step: the next step begins once it is written.
    CHECK(h.at(t, ev::checkpoint_done{1, "c1", true, ""}) ==
          lines{"log info: checkpoint c1", "watchdog in 10000000000 ns for step 1",
                "query_group_size step 1"});
  }
  SECTION("a role cannot save") {
    CHECK(h.at(t, ev::role_state{1, "scheduler", "", false, "busy"}) ==
          lines{"fail: checkpoint at step 1: the scheduler cannot save its state: busy"});
  }
  SECTION("a role's state is not JSON") {
    h.at(t, ev::role_state{1, "scheduler", "{", true, ""});
    CHECK(h.at(t, ev::role_state{1, "sagc_controller", "{}", true, ""}) ==
          lines{"fail: checkpoint at step 1: trainer state: the scheduler's state is not JSON"});
  }
  SECTION("the learner cannot write it") {
    h.at(t, ev::role_state{1, "scheduler", "{}", true, ""});
    h.at(t, ev::role_state{1, "sagc_controller", "{}", true, ""});
    CHECK(h.at(t, ev::checkpoint_done{1, "", false, "disk full"}) ==
          lines{"fail: checkpoint at step 1 failed: disk full; no checkpoint of this run was "
                "written, so --resume has nothing to continue from"});
  }
}

TEST_CASE("a resumed run restores every role's saved state before its first step") {
  auto o = two_steps();
  o.eval_prompts = 3; // not repeated on resume
  harness h{o};
  const std::string src = "runs/t/checkpoints/step-1";
  const std::string state =
    R"({"step":1,"next_group_id":2,"next_request_id":4,"task_cursor":2,"reward_history":[0.5],)"
    R"("accuracy_before":0.25,"roles":{"sagc_controller":{"q":1},"scheduler":{"rr":3}}})";
  CHECK(h.at(0, ev::learner_ready{1, true, src, state}) ==
        lines{"log info: resuming after step 1 from " + src,
              "restore sagc_controller {\"q\":1} from " + src,
              "restore scheduler {\"rr\":3} from " + src, "open_metrics resume through 1"});
  CHECK(h.d.step() == 1);
  CHECK(h.at(0, ev::metrics_opened{}).empty());
  CHECK(h.at(0, ev::version_ready{1}).empty()); // two restores pending
  SECTION("both roles restored") {
    CHECK(h.at(0, ev::role_state_restored{"sagc_controller", true, "window shorter"}) ==
          lines{"log warn: resuming the sagc_controller: window shorter"});
    CHECK(h.at(sec, ev::role_state_restored{"scheduler", true, ""}) ==
          lines{"watchdog in 10000000000 ns for step 1", "query_group_size step 1"});
    // The counters continue: groups 2 and 3, prompts 2 and 3, requests 4..7, on version 1.
    CHECK(h.at(sec, static_g(1, 2)) == lines{"generate version 1 [4 5 6 7]"});
    const auto& gen = h.cmd<cmd::generate>(0);
    CHECK(gen.requests[0].group_id == 2);
    CHECK(gen.requests[0].task_index == 2);
    CHECK(gen.requests[3].group_id == 3);
    CHECK(gen.requests[3].task_index == 3);
    CHECK(gen.requests[3].seed == 0x499840389dedee1ull);
    CHECK(gen.requests[3].step == 1);
    CHECK(h.at(sec, ev::role_state_restored{"scheduler", true, ""}).empty()); // none pending
  }
  SECTION("a role refuses its state") {
    CHECK(h.at(0, ev::role_state_restored{"sagc_controller", false,
                                          "sagc_controller state: key 'q': expected a number"}) ==
          lines{"fail: cannot resume from " + src +
                ": sagc_controller state: key 'q': expected a number"});
    CHECK(h.d.now() == phase::done);
  }
}

TEST_CASE("a resumed run of an older checkpoint warns that the roles start afresh and its "
          "summary counts every step") {
  auto o = two_steps();
  o.steps = 12;
  harness h{o};
  std::string history;
  for (int i = 0; i < 11; ++i)
    history += (i ? "," : "") + std::string{i < 5 ? "0" : "1"};
  const std::string state = R"({"step":11,"next_group_id":22,"next_request_id":44,)"
                            R"("task_cursor":22,"accuracy_before":0.25,"reward_history":[)" + history + "]}";
  CHECK(h.at(0, ev::learner_ready{11, true, "old", state}) ==
        lines{"log info: resuming after step 11 from old",
              "log warn: old was written before the group-size controller and the scheduler "
              "saved their state: they start afresh (the first steps' G may differ from an "
              "uninterrupted run)",
              "open_metrics resume through 11"});
  h.at(0, ev::metrics_opened{});
  CHECK(h.at(sec, ev::version_ready{11}) ==
        lines{"watchdog in 10000000000 ns for step 11", "query_group_size step 11"});
  CHECK(h.at(sec, static_g(11, 2)) == lines{"generate version 11 [44 45 46 47]"});
  for (uint64_t i = 0; i < 4; ++i)
    h.at(2 * sec, rollout(44 + i, 22 + i / 2, static_cast<uint32_t>(i % 2), i == 0 ? 1.0 : 0.0));
  h.at(3 * sec, ev::train_result{12, {}, {}});
  h.at(4 * sec, ready(12));
  CHECK(h.record().step == 12);
  h.at(4 * sec, ev::metrics_written{});
  h.at(4 * sec, ev::role_state{12, "sagc_controller", "{}", true, ""});
  h.at(4 * sec, ev::role_state{12, "scheduler", "{}", true, ""});
  // History 0 ×5, 1 ×6, 0.25: first ten 5/10, last ten (1 ×6, 0.25 and 0 ×3) 6.25/10.
  CHECK(h.at(5 * sec, ev::checkpoint_done{12, "c", true, ""}) ==
        lines{"log info: checkpoint c",
              "finish: 12 steps; mean reward first 10 steps 0.500, last 10 steps 0.625; held-out "
              "accuracy 0.250 → n/a; 4.0 s"});
}

TEST_CASE("a learner metric the schema does not know ends the job naming it") {
  harness h{two_steps()};
  to_learn(h);
  CHECK(h.at(4 * sec, ev::train_result{1, {"loss", "los"}, {0.25, 1.0}}) ==
        lines{"fail: step 1: the learner's result: metrics record: \"los\" is not a numeric "
              "key of the metric schema (SORL_METRICS in runtime/metrics.hpp)"});
  CHECK(h.d.now() == phase::done);
}

TEST_CASE("a train step the learner could not take ends the job with its reason") {
  harness h{two_steps()};
  to_learn(h);
  ev::train_result failed_step{0, {}, {}, false, "every update had a non-finite loss"};
  // Not a step: no version to wait for, no record.
  CHECK(h.at(4 * sec, failed_step) ==
        lines{"fail: step 1: the learner failed: every update had a non-finite loss; no "
              "checkpoint of this run was written, so --resume has nothing to continue from"});
  CHECK(h.d.now() == phase::done);
  CHECK(h.at(5 * sec, ready(1)).size() == 1); // only the "unexpected version" warning
}

TEST_CASE("a failed step, checkpoint or metrics write names the last complete checkpoint") {
  auto o = two_steps();
  o.steps = 3;
  o.checkpoint_every = 1;
  harness h{o};
  start(h);
  auto t = run_step(h, sec, 0);
  h.at(t, ev::metrics_written{});
  h.at(t, ev::role_state{1, "sagc_controller", "{}", true, ""});
  h.at(t, ev::role_state{1, "scheduler", "{}", true, ""});
  REQUIRE(h.at(t, ev::checkpoint_done{1, "runs/t/checkpoints/step-1", true, ""}).size() == 3);
  const std::string hint = "; the last complete checkpoint is runs/t/checkpoints/step-1 (step "
                           "1); continue the run with --resume once the cause is fixed";
  SECTION("the learner fails step 2") {
    h.at(t += sec, static_g(1, 2));
    for (uint64_t i = 4; i < 8; ++i)
      h.at(t, rollout(i, i / 2, static_cast<uint32_t>(i % 2), i % 2 == 0 ? 1.0 : 0.0));
    REQUIRE(h.d.now() == phase::learn);
    CHECK(h.at(t, ev::train_result{1, {}, {}, false, "bad batch"}) ==
          lines{"fail: step 2: the learner failed: bad batch" + hint});
  }
  SECTION("step 2's record cannot be written") {
    t = run_step(h, t, 1);
    CHECK(h.at(t, ev::metrics_written{"metrics: cannot write m: No space left on device"}) ==
          lines{"fail: step 2: metrics: cannot write m: No space left on device" + hint});
  }
  SECTION("step 2's checkpoint fails, then the newest one is still step 1's") {
    t = run_step(h, t, 1);
    h.at(t, ev::metrics_written{});
    h.at(t, ev::role_state{2, "sagc_controller", "{}", true, ""});
    h.at(t, ev::role_state{2, "scheduler", "{}", true, ""});
    CHECK(h.at(t, ev::checkpoint_done{2, "", false, "disk full"}) ==
          lines{"fail: checkpoint at step 2 failed: disk full" + hint});
  }
  CHECK(h.d.now() == phase::done);
}

TEST_CASE("after a resume a failed step names the checkpoint the run was resumed from") {
  auto o = two_steps();
  o.steps = 3;
  harness h{o};
  const std::string src = "runs/t/checkpoints/step-1";
  const std::string state =
    R"({"step":1,"next_group_id":2,"next_request_id":4,"task_cursor":2,"reward_history":[0.5],)"
    R"("accuracy_before":null,"roles":{"sagc_controller":{},"scheduler":{}}})";
  REQUIRE(h.at(0, ev::learner_ready{1, true, src, state}).size() == 4); // log, 2 restores, open
  h.at(0, ev::metrics_opened{});
  h.at(0, ev::version_ready{1});
  h.at(sec, ev::role_state_restored{"sagc_controller", true, ""});
  REQUIRE(h.at(sec, ev::role_state_restored{"scheduler", true, ""}).size() == 2);
  h.at(2 * sec, static_g(1, 2));
  for (uint64_t i = 4; i < 8; ++i)
    h.at(3 * sec, rollout(i, i / 2, static_cast<uint32_t>(i % 2), i % 2 == 0 ? 1.0 : 0.0));
  CHECK(h.at(4 * sec, ev::train_result{1, {}, {}, false, "trajectory 4: 2 response tokens, 1 "
                                                         "mask bytes"}) ==
        lines{"fail: step 2: the learner failed: trajectory 4: 2 response tokens, 1 mask bytes; "
              "the last complete checkpoint is runs/t/checkpoints/step-1 (step 1); continue "
              "the run with --resume once the cause is fixed"});
}

TEST_CASE("replaced_requests counts the step's rollouts the scheduler placed again") {
  harness h{two_steps()};
  start(h);
  h.at(2 * sec, static_g(0, 2));
  auto r0 = rollout(0, 0, 0, 1.0);
  r0.replaced = true;
  auto r3 = failed(3, 1, 1, rollout_outcome::failed, "worker lost twice");
  r3.replaced = true; // counted although it failed
  h.at(3 * sec, r0);
  h.at(3 * sec, rollout(1, 0, 1, 0.0));
  h.at(3 * sec, rollout(2, 1, 0, 1.0));
  h.at(3 * sec, r3);
  h.at(4 * sec, ev::train_result{1, {}, {}});
  h.at(5 * sec, ready(1));
  CHECK(h.record().extra.at("replaced_requests") == 2);
  CHECK(h.record().extra.at("failed_rollouts") == 1);
}

TEST_CASE("each phase's peak RSS window ends where the phase does, and a step opens a new "
          "window that discards what came before it") {
  auto o = two_steps();
  // One call per window, in the order the driver ends them: before step 1, its rollout,
  // learn and sync; the same for step 2. The process peaks differ from every window's, so
  // that a key written from the wrong field shows.
  const std::vector<double> windows{111, 300, 900, 400, 222, 310, 950, 420};
  const std::vector<double> process{1000, 1000, 1100, 1150, 1150, 1150, 1200, 1250};
  size_t calls = 0;
  o.peak_rss = [&]() -> std::optional<rss_peaks> {
    ++calls;
    return rss_peaks{windows.at(calls - 1), process.at(calls - 1)};
  };
  harness h{o};
  start(h);
  CHECK(calls == 1); // the step began with version 0 and opened its rollout window
  auto t = run_step(h, sec, 0);
  CHECK(calls == 4);
  CHECK(h.record().extra.at("rss_peak_rollout_mib") == 300);
  CHECK(h.record().extra.at("rss_peak_learn_mib") == 900);
  CHECK(h.record().extra.at("rss_peak_sync_mib") == 400);
  CHECK(h.record().extra.at("rss_peak_process_mib") == 1150);
  h.at(t, ev::metrics_written{});
  run_step(h, t, 1);
  CHECK(calls == 8);
  CHECK(h.record().extra.at("rss_peak_rollout_mib") == 310);
  CHECK(h.record().extra.at("rss_peak_learn_mib") == 950);
  CHECK(h.record().extra.at("rss_peak_sync_mib") == 420);
  CHECK(h.record().extra.at("rss_peak_process_mib") == 1250);
}

TEST_CASE("without a peak RSS probe, or one that cannot measure, no rss_peak key is written") {
  auto o = two_steps();
  SECTION("no probe") {}
  SECTION("a probe that returns nothing") {
    o.peak_rss = []() -> std::optional<rss_peaks> { return std::nullopt; };
  }
  harness h{o};
  start(h);
  run_step(h, sec, 0);
  for (const char* k : {"rss_peak_rollout_mib", "rss_peak_learn_mib", "rss_peak_sync_mib",
                        "rss_peak_process_mib"})
    CHECK(h.record().extra.count(k) == 0);
}

TEST_CASE("the spec_ keys sum the speculation counts of the step's rollouts") {
  harness h{two_steps()};
  start(h);
  h.at(2 * sec, static_g(0, 2));
  auto r0 = rollout(0, 0, 0, 1.0);
  r0.spec = {3, 1, 12, 9, 4, 8000, 12, 3'000'000, 1, 1'000'000};
  auto r2 = rollout(2, 1, 0, 1.0);
  r2.spec = {1, 3, 4, 1, 4, 4000, 2, 1'000'000, 3, 2'000'000};
  h.at(3 * sec, r0);
  h.at(3 * sec, rollout(1, 0, 1, 0.0)); // decoded without drafts: adds nothing
  h.at(3 * sec, r2);
  h.at(3 * sec, rollout(3, 1, 1, 0.0));
  h.at(4 * sec, ev::train_result{1, {}, {}});
  h.at(5 * sec, ready(1));
  const auto& x = h.record().extra;
  CHECK(x.at("spec_verify_steps") == 4);
  CHECK(x.at("spec_plain_steps") == 4);
  CHECK(x.at("spec_drafted_tokens") == 16);
  CHECK(x.at("spec_accepted_tokens") == 10);
  CHECK(x.at("spec_draft_calls") == 8);
  CHECK(x.at("spec_acceptance") == 0.625);   // 10 / 16
  CHECK(x.at("spec_mean_accepted") == 2.5);  // 10 accepted over 4 verifying steps
  CHECK(x.at("spec_draft_us") == 1.5);       // 12000 ns over 8 calls
  CHECK(x.at("spec_share") == 0.5);          // 4 of 8 decode steps
  CHECK(x.at("spec_rate_with") == Approx(3500.0));    // 14 tokens in 4 ms of verifying steps
  CHECK(x.at("spec_rate_without") == Approx(1333.333333).epsilon(1e-9)); // 4 tokens in 3 ms
  CHECK_NOTHROW(sorl::to_json_line(h.record()));
}

TEST_CASE("a step without speculation writes no spec_ key and undefined ratios are left out") {
  harness h{two_steps()};
  start(h);
  SECTION("speculation off") {
    first_step_with_spec(h, {});
    const auto& x = h.record().extra;
    for (const auto& [key, value] : x)
      CHECK(key.rfind("spec_", 0) != 0);
  }
  SECTION("plain steps only: no draft, no verification, no drafter call") {
    first_step_with_spec(h, {0, 5, 0, 0, 0, 0});
    const auto& x = h.record().extra;
    CHECK(x.at("spec_verify_steps") == 0);
    CHECK(x.at("spec_plain_steps") == 20);
    CHECK(x.at("spec_drafted_tokens") == 0);
    CHECK(x.at("spec_draft_calls") == 0);
    CHECK(x.at("spec_share") == 0.0);
    CHECK(x.count("spec_acceptance") == 0);
    CHECK(x.count("spec_mean_accepted") == 0);
    CHECK(x.count("spec_draft_us") == 0);
    CHECK(x.count("spec_rate_with") == 0);
    CHECK(x.count("spec_rate_without") == 0);  // no time recorded
  }
  SECTION("drafter calls that found no draft") {
    first_step_with_spec(h, {0, 5, 0, 0, 2, 3000});
    const auto& x = h.record().extra;
    CHECK(x.at("spec_draft_calls") == 8);
    CHECK(x.at("spec_draft_us") == 1.5); // 12000 ns over 8 calls
    CHECK(x.count("spec_acceptance") == 0);
    CHECK(x.count("spec_mean_accepted") == 0);
  }
}

TEST_CASE("a rollout that reports more accepted than drafted tokens is left out of the spec_ "
          "sums with a warning") {
  harness h{two_steps()};
  start(h);
  h.at(2 * sec, static_g(0, 2));
  auto r0 = rollout(0, 0, 0, 1.0);
  r0.spec = {2, 2, 4, 3, 2, 2000};
  auto r1 = rollout(1, 0, 1, 0.0);
  r1.spec = {1, 0, 2, 5, 1, 1000};
  h.at(3 * sec, r0);
  CHECK(h.at(3 * sec, r1) ==
        lines{"log warn: step 1: rollout 1 from rollout_worker#0@n reports 5 accepted of 2 "
              "drafted tokens; its speculation counts are left out",
              "keep 1"});
  h.at(3 * sec, rollout(2, 1, 0, 1.0));
  h.at(3 * sec, rollout(3, 1, 1, 0.0));
  h.at(4 * sec, ev::train_result{1, {}, {}});
  h.at(5 * sec, ready(1));
  const auto& x = h.record().extra;
  CHECK(x.at("spec_verify_steps") == 2);
  CHECK(x.at("spec_drafted_tokens") == 4);
  CHECK(x.at("spec_accepted_tokens") == 3);
  CHECK(x.at("spec_acceptance") == 0.75);
  CHECK(x.at("rollouts") == 4); // the rollout itself still counts
}

TEST_CASE("a resume from a corrupt trainer state fails the job") {
  harness h{two_steps()};
  CHECK(h.at(0, ev::learner_ready{1, true, "c", "[1]"}) ==
        lines{"fail: cannot resume from c: trainer state: not a JSON object"});
  CHECK(h.d.now() == phase::done);
}

TEST_CASE("a rollout no worker can serve is never trained on and the step goes on") {
  harness h{two_steps()};
  start(h);
  h.at(2 * sec, static_g(0, 2));
  h.at(3 * sec, rollout(0, 0, 0, 1.0, 3));
  CHECK(h.at(3 * sec, failed(1, 0, 1, rollout_outcome::failed, "prompt does not fit")) ==
        lines{"keep 1", "log warn: step 1: rollout 1 (group 0, sample 1) from "
                        "rollout_worker#0@n failed: prompt does not fit; not trained on"});
  h.at(3 * sec, rollout(2, 1, 0, 1.0, 3));
  CHECK(h.at(3 * sec, rollout(3, 1, 1, 0.0, 5)) ==
        lines{"keep 3", "query_step_timing step 0", "train step 0 [0 2 3]"});
  h.at(4 * sec, ev::train_result{1, {}, {}});
  h.at(5 * sec, ready(1));
  const auto& rec = h.record();
  CHECK(rec.extra.at("failed_rollouts") == 1);
  CHECK(rec.extra.at("reward_failures") == 0);
  CHECK(rec.extra.at("rollouts") == 4);
  CHECK(rec.extra.at("trained_rollouts") == 3);
  CHECK(rec.reward_per_group == std::vector<double>{1.0, 0.5});
  CHECK(rec.reward_mean == 2.0 / 3.0);
  // The failed rollout generated nothing: lengths 3, 3, 5 only, and 11 tokens in 2 s.
  CHECK(rec.resp_len_p50 == 3);
  CHECK(rec.resp_len_max == 5);
  CHECK(rec.tokens_per_s == 5.5);
}

TEST_CASE("a failed reward is masked, or fails the job under on_reward_failure = fail") {
  auto o = two_steps();
  SECTION("mask") {
    harness h{o};
    start(h);
    h.at(2 * sec, static_g(0, 2));
    CHECK(h.at(3 * sec, failed(0, 0, 0, rollout_outcome::reward_failed, "scorer threw")) ==
          lines{"keep 0", "log warn: step 1: rollout 0 (group 0, sample 0) from "
                          "rollout_worker#0@n has no reward: scorer threw; not trained on"});
    CHECK(h.at(3 * sec, rollout(1, 0, 1, std::nan(""))) ==
          lines{"keep 1", "log warn: step 1: rollout 1 (group 0, sample 1) from "
                          "rollout_worker#0@n has no reward: reward nan is not finite; not "
                          "trained on"});
    h.at(3 * sec, rollout(2, 1, 0, 1.0));
    // Group 0 has no reward at all: never trained; group 1 is.
    CHECK(h.at(3 * sec, rollout(3, 1, 1, 0.0)) ==
          lines{"keep 3", "query_step_timing step 0", "train step 0 [2 3]"});
    h.at(4 * sec, ev::train_result{1, {}, {}});
    h.at(5 * sec, ready(1));
    const auto& rec = h.record();
    CHECK(rec.extra.at("reward_failures") == 2);
    CHECK(rec.extra.at("failed_rollouts") == 0);
    CHECK(rec.reward_per_group == std::vector<double>{0.5});
    CHECK(rec.extra.at("rollouts") == 4);
  }
  SECTION("mask keeps a reward-failed rollout of a trained group in the batch") {
    harness h{o};
    start(h);
    h.at(2 * sec, static_g(0, 2));
    h.at(3 * sec, rollout(0, 0, 0, 1.0));
    h.at(3 * sec, failed(1, 0, 1, rollout_outcome::reward_failed, "scorer threw"));
    h.at(3 * sec, rollout(2, 1, 0, 1.0));
    CHECK(h.at(3 * sec, rollout(3, 1, 1, 0.0)) ==
          lines{"keep 3", "query_step_timing step 0", "train step 0 [0 1 2 3]"});
  }
  SECTION("fail") {
    o.on_reward_failure = reward_failure_policy::fail;
    harness h{o};
    start(h);
    h.at(2 * sec, static_g(0, 2));
    // A rollout that could not be served is not a reward failure: the job goes on.
    CHECK(h.at(3 * sec, failed(0, 0, 0, rollout_outcome::failed, "weights of version 3")) ==
          lines{"keep 0", "log warn: step 1: rollout 0 (group 0, sample 0) from "
                          "rollout_worker#0@n failed: weights of version 3; not trained on"});
    CHECK(h.at(3 * sec, failed(2, 1, 0, rollout_outcome::reward_failed, "scorer threw")) ==
          lines{"keep 2", "fail: step 1: rollout 2 (group 1, sample 0) from rollout_worker#0@n "
                          "has no reward: scorer threw (algorithm.on_reward_failure = \"fail\")"});
    CHECK(h.d.now() == phase::done);
  }
}

TEST_CASE("a step whose every rollout failed fails the job") {
  harness h{two_steps()};
  start(h);
  h.at(2 * sec, static_g(0, 2));
  for (uint64_t i = 0; i < 3; ++i)
    h.at(3 * sec, failed(i, i / 2, static_cast<uint32_t>(i % 2), rollout_outcome::failed, "x"));
  CHECK(h.at(3 * sec, failed(3, 1, 1, rollout_outcome::failed, "x")) ==
        lines{"keep 3",
              "log warn: step 1: rollout 3 (group 1, sample 1) from rollout_worker#0@n failed: "
              "x; not trained on",
              "query_step_timing step 0",
              "fail: step 1: no group to train on: of 4 rollouts, 4 failed and 0 have no reward; "
              "the first: step 1: rollout 0 (group 0, sample 0) from rollout_worker#0@n failed: x"});
  CHECK(h.d.now() == phase::done);
}

TEST_CASE("stale, duplicate and out-of-phase events are ignored") {
  harness h{two_steps()};
  start(h);
  CHECK(h.at(sec, rollout(0, 0, 0, 1.0)).empty());           // before any request
  CHECK(h.at(sec, static_g(1, 2)).empty());                   // another step's decision
  CHECK(h.at(sec, ev::train_result{1, {}, {}}).empty());      // not learning
  CHECK(h.at(sec, ev::role_state{0, "scheduler", "{}", true, ""}).empty());
  CHECK(h.at(sec, ev::role_state_restored{"scheduler", true, ""}).empty());
  CHECK(h.at(sec, ev::metrics_written{}).empty());
  CHECK(h.at(sec, ev::metrics_opened{}).empty());
  CHECK(h.at(sec, ready(0)) == lines{"log warn: unexpected version 0 ready"});
  h.at(2 * sec, static_g(0, 2));
  CHECK(h.at(2 * sec, static_g(0, 3)).size() == 1); // a repeated decision plans again
  // The second plan drew new ids (groups 2, 3, requests 4..9); request 0 is unknown to it.
  CHECK(h.at(3 * sec, rollout(0, 0, 0, 1.0)) == lines{"log warn: ignored trajectory 0 (step 0)"});
  CHECK(h.at(3 * sec, rollout(4, 2, 0, 1.0)) == lines{"keep 4"});
  auto dup = rollout(4, 2, 0, 1.0);
  dup.step = 4;
  CHECK(h.at(3 * sec, dup) == lines{"log warn: ignored trajectory 4 (step 4)"});
  CHECK(h.d.now() == phase::rollout);
}

TEST_CASE("a step timing of another step leaves the step's record without timings") {
  harness h{two_steps()};
  to_learn(h);
  ev::step_timing late{1500000000, 1800000000, 2000000000, 1, true, 1700000000, 2, 0};
  late.step = 1; // not the step in progress (0)
  CHECK(h.at(4 * sec, late).empty());
  h.at(5 * sec, ev::train_result{1, {}, {}});
  CHECK(h.at(5 * sec, ready(1)) == lines{"write_metrics step 1"});
  const auto rec = h.record();
  CHECK_FALSE(rec.stragglers);
  CHECK(rec.extra.count("duration_p50_s") == 0);
  CHECK(rec.extra.count("straggler_event") == 0);
}

TEST_CASE("a stale version in the sync phase is logged and the right one ends the step") {
  harness h{two_steps()};
  to_learn(h);
  h.at(4 * sec, ev::train_result{1, {}, {}});
  CHECK(h.at(4 * sec, ready(0)) == lines{"log warn: unexpected version 0 ready"});
  CHECK(h.d.now() == phase::sync);
  CHECK(h.at(4 * sec, ready(1)) == lines{"write_metrics step 1"});
}

TEST_CASE("a rollout worker or the suffix-index keeper going down is logged and any other peer "
          "going down fails the job") {
  harness h{two_steps()};
  start(h);
  CHECK(h.at(sec, ev::peer_down{"rollout_worker", "rollout_worker#1@b", "connection closed"}) ==
        lines{"log warn: rollout_worker#1@b is gone (connection closed); the scheduler "
              "re-places its requests"});
  CHECK(h.d.now() == phase::rollout);
  CHECK(h.at(sec, ev::peer_down{"suffix_index_keeper", "suffix_index_keeper#0@b", "timeout"}) ==
        lines{"log warn: suffix_index_keeper#0@b is gone (timeout); each rollout worker drafts "
              "from its own responses from now on"});
  CHECK(h.d.now() == phase::rollout);
  CHECK(h.at(sec, ev::peer_down{"learner", "learner#0@main", "connection closed"}) ==
        lines{"fail: learner#0@main is gone (connection closed)"});
  CHECK(h.d.now() == phase::done);
  CHECK(h.at(sec, ev::peer_down{"scheduler", "scheduler#0@main", "timeout"}).empty());
}

TEST_CASE("a group size the plan refuses fails the job") {
  harness h{two_steps()};
  start(h);
  CHECK(h.at(sec, static_g(0, 0)) ==
        lines{"fail: step_plan: prompts and group_size must be >= 1"});
}

namespace {

/// two_steps() with 5 steps, a held-out evaluation on 3 prompts and one every `eval_every`.
driver_options five_steps(int64_t eval_every) {
  auto o = two_steps();
  o.steps = 5;
  o.eval_prompts = 3;
  o.eval_every = eval_every;
  return o;
}

/// A fresh start whose evaluation before the first step is answered at 1 s, when the first
/// step's rollout phase begins; returns that time.
int64_t start_with_eval(harness& h) {
  h.at(0, ev::learner_ready{0, false, "w", ""});
  h.at(0, ev::metrics_opened{});
  REQUIRE(h.at(0, ev::version_ready{0}) == lines{"eval before 3"});
  REQUIRE(h.at(sec, ev::eval_result{"before", 3, 0.125, 0.125, 4, 1.0}).size() == 3);
  return sec;
}

/// The held-out result after step `k`: accuracy k/8, mean reward k/16, mean length 4 + k
/// tokens, 3.0 s by the learner's clock, k / 4 prompts without a reward.
ev::eval_result result_after(uint64_t k) {
  auto x = static_cast<double>(k);
  return ev::eval_result{"step " + std::to_string(k), 3, x / 8, x / 16, 4 + x, 3.0,
                         static_cast<uint32_t>(k / 4)};
}

/// What a run printed after its steps: the held-out lines and the progress lines.
struct eval_run {
  lines held_out;
  lines progress;
};

/// Runs `h` (five_steps options) from its start to its end: every event 1 s after the last
/// (run_to_sync), except an evaluation's result after step k, result_after(k) 3.5 s after
/// its request. The harness keeps the records and evaluation requests.
eval_run run_five_steps(harness& h) {
  eval_run r;
  auto t = start_with_eval(h);
  for (uint64_t k = 1; k <= 5; ++k) {
    t = run_to_sync(h, t, k - 1);
    auto out = h.at(t += sec, ready(k));
    if (out == lines{"eval step " + std::to_string(k) + " 3"}) {
      REQUIRE(h.d.now() == phase::eval_mid);
      out = h.at(t += 3 * sec + sec / 2, result_after(k));
      REQUIRE(out.size() == 2);
      r.held_out.push_back(out[0]);
    }
    REQUIRE(out.back() == "write_metrics step " + std::to_string(k));
    out = h.at(t, ev::metrics_written{});
    REQUIRE(!out.empty());
    r.progress.push_back(out[0]);
  }
  h.at(t, ev::role_state{5, "sagc_controller", "{}", true, ""});
  h.at(t, ev::role_state{5, "scheduler", "{}", true, ""});
  REQUIRE(h.at(t, ev::checkpoint_done{5, "c5", true, ""}) ==
          lines{"log info: checkpoint c5", "eval after 3"});
  REQUIRE(h.at(t + sec, ev::eval_result{"after", 3, 0.75, 0.75, 5, 1.0}).size() == 2);
  REQUIRE(h.d.now() == phase::done);
  return r;
}

const std::array<std::string, 5> held_out_keys{"heldout_accuracy", "heldout_reward",
                                               "heldout_len", "heldout_reward_failures",
                                               "eval_s"};

} // namespace

TEST_CASE("a held-out evaluation every eval_every steps fills that step's record and is left "
          "out of the step's times") {
  harness h{five_steps(2)};
  auto r = run_five_steps(h);
  // Steps 2 and 4; step 5 is the last, which the evaluation after the run covers.
  CHECK(h.evals == lines{"eval before 3", "eval step 2 3", "eval step 4 3", "eval after 3"});
  CHECK(r.held_out ==
        lines{"print: held-out accuracy (step 2, greedy, 3 prompts): 0.250  mean reward 0.125  "
              "mean length 6.0 tokens  (3.0 s)",
              "print: held-out accuracy (step 4, greedy, 3 prompts, 1 without a reward): 0.500  "
              "mean reward 0.250  mean length 8.0 tokens  (3.0 s)"});
  // Exactly one record per step, written after its evaluation.
  REQUIRE(h.written.size() == 5);
  for (int64_t k = 1; k <= 5; ++k) {
    INFO("step " << k);
    const auto& rec = h.written[static_cast<size_t>(k - 1)];
    CHECK(rec.step == k);
    // Decision, four rollouts, learner, sync, 1 s apart: 7 s, without the 3.5 s evaluation.
    CHECK(rec.wall_s == 7.0);
    CHECK(rec.rollout_s == 5.0);
    CHECK(rec.learn_s == 1.0);
    CHECK(rec.sync_s == 1.0);
    if (k % 2 == 0) {
      auto x = static_cast<double>(k);
      CHECK(rec.extra.at("heldout_accuracy") == x / 8);
      CHECK(rec.extra.at("heldout_reward") == x / 16);
      CHECK(rec.extra.at("heldout_len") == 4 + x);
      CHECK(rec.extra.at("heldout_reward_failures") == (k == 4 ? 1 : 0));
      CHECK(rec.extra.at("eval_s") == 3.5); // the trainer's clock, request to result
      CHECK_NOTHROW(sorl::to_json_line(rec));
    } else {
      for (const auto& key : held_out_keys)
        CHECK(rec.extra.count(key) == 0);
    }
  }
  CHECK(r.progress[1] == "print: step 2/5  reward 0.50 (mean10 0.50)  G 2  step 7.0s (rollout 5.0 "
                         "| learn 1.0 | sync 1.0)  2 tok/s");
}

TEST_CASE("without eval_every, with an interval past the last step or without held-out "
          "prompts no evaluation is requested during the run") {
  for (int64_t every : {0, 5, 6}) {
    INFO("eval_every " << every);
    harness h{five_steps(every)};
    run_five_steps(h);
    CHECK(h.evals == lines{"eval before 3", "eval after 3"});
    REQUIRE(h.written.size() == 5);
    for (const auto& rec : h.written)
      for (const auto& key : held_out_keys)
        CHECK(rec.extra.count(key) == 0);
  }
  auto o = two_steps(); // eval_prompts = 0
  o.eval_every = 1;
  harness h{o};
  start(h);
  run_step(h, sec, 0); // its version's arrival writes the record at once
  CHECK(h.evals.empty());
}

TEST_CASE("a resumed run evaluates after the same steps as an uninterrupted one") {
  harness h{five_steps(2)};
  const std::string state =
    R"({"step":1,"next_group_id":2,"next_request_id":4,"task_cursor":2,"reward_history":[0.5],)"
    R"("accuracy_before":0.125,"roles":{"sagc_controller":{},"scheduler":{}}})";
  h.at(0, ev::learner_ready{1, true, "c1", state});
  h.at(0, ev::metrics_opened{});
  h.at(0, ev::version_ready{1});
  h.at(0, ev::role_state_restored{"sagc_controller", true, ""});
  // No evaluation before the first step of a resumed run.
  REQUIRE(h.at(sec, ev::role_state_restored{"scheduler", true, ""}) ==
          lines{"watchdog in 10000000000 ns for step 1", "query_group_size step 1"});
  auto t = run_to_sync(h, sec, 1);
  CHECK(h.at(t += sec, ready(2)) == lines{"eval step 2 3"});
  CHECK(h.at(t += sec, result_after(2)).back() == "write_metrics step 2");
  CHECK(h.written.back().extra.at("heldout_accuracy") == 0.25);
  h.at(t, ev::metrics_written{});
  run_step(h, t, 2); // step 3: its record at once
  CHECK(h.evals == lines{"eval step 2 3"});
}

TEST_CASE("run.stop_at_accuracy ends the run after the first evaluation that reaches it, "
          "which stands as the final evaluation") {
  auto o = five_steps(2);
  // result_after(k) has accuracy k/8: step 2 gives 0.25 (below), step 4 gives 0.5 (equal).
  o.stop_at_accuracy = 0.5;
  harness h{o};
  auto t = start_with_eval(h);
  for (uint64_t k = 1; k <= 3; ++k) {
    t = run_to_sync(h, t, k - 1);
    auto out = h.at(t += sec, ready(k));
    if (k == 2)
      out = h.at(t += sec, result_after(2));
    REQUIRE(out.back() == "write_metrics step " + std::to_string(k));
    h.at(t, ev::metrics_written{});
  }
  t = run_to_sync(h, t, 3);
  REQUIRE(h.at(t += sec, ready(4)) == lines{"eval step 4 3"});
  auto out = h.at(t += sec, result_after(4));
  REQUIRE(out.size() == 3);
  CHECK(out[1] == "print: held-out accuracy 0.500 ≥ run.stop_at_accuracy 0.5 after step 4/5: "
                  "the run ends here");
  CHECK(out[2] == "write_metrics step 4");
  CHECK(h.written.back().extra.at("heldout_accuracy") == 0.5);
  // Step 4 is no checkpoint step of its own (checkpoint_every 0): the stop makes it one.
  CHECK(h.at(t, ev::metrics_written{}).size() == 3); // progress line, two role queries
  REQUIRE(h.d.now() == phase::checkpoint);
  h.at(t, ev::role_state{4, "sagc_controller", "{}", true, ""});
  h.at(t, ev::role_state{4, "scheduler", "{}", true, ""});
  out = h.at(t, ev::checkpoint_done{4, "c4", true, ""});
  REQUIRE(out.size() == 2);
  CHECK(out[0] == "log info: checkpoint c4");
  CHECK(out[1].rfind("finish: 4 steps; mean reward first 4 steps 0.500, last 4 steps 0.500; "
                     "held-out accuracy 0.125 → 0.500",
                     0) == 0);
  CHECK(h.d.now() == phase::done);
  // No evaluation after the run: step 4's was the last.
  CHECK(h.evals == lines{"eval before 3", "eval step 2 3", "eval step 4 3"});
  CHECK(h.written.size() == 4);
}

TEST_CASE("events during a held-out evaluation after a step are handled as in the other "
          "evaluations") {
  harness h{five_steps(2)};
  auto t = start_with_eval(h);
  t = run_step(h, t, 0);
  h.at(t, ev::metrics_written{});
  t = run_to_sync(h, t, 1);
  REQUIRE(h.at(t += sec, ready(2)) == lines{"eval step 2 3"});
  SECTION("an interrupt lets it finish, then the step's record and checkpoint are written") {
    CHECK(h.at(t, ev::interrupt{"SIGINT", "main"}) ==
          lines{"log warn: SIGINT on node main: finishing the held-out evaluation after step "
                "2/5, then writing a checkpoint and stopping"});
    CHECK(h.at(t += sec, result_after(2)).back() == "write_metrics step 2");
    CHECK(h.written.back().extra.at("eval_s") == 1.0);
    CHECK(h.at(t, ev::metrics_written{}).size() == 3); // progress line, two role queries
    REQUIRE(h.d.now() == phase::checkpoint);
    h.at(t, ev::role_state{2, "sagc_controller", "{}", true, ""});
    h.at(t, ev::role_state{2, "scheduler", "{}", true, ""});
    CHECK(h.at(t, ev::checkpoint_done{2, "c2", true, ""}) ==
          lines{"log info: checkpoint c2",
                "fail: stopped by SIGINT on node main after step 2/5; checkpoint c2"});
  }
  SECTION("timers, a repeated version and a result for another tag change nothing") {
    CHECK(h.at(t + 20 * sec, ev::watchdog_tick{1}).empty());
    CHECK(h.at(t + 20 * sec, ev::watchdog_tick{2}).empty());
    CHECK(h.at(t + 20 * sec, ev::deadline_tick{1}).empty());
    CHECK(h.at(t + 20 * sec, ready(2)) == lines{"log warn: unexpected version 2 ready"});
    CHECK(h.at(t + 20 * sec, ev::eval_result{"before", 3, 1, 1, 1, 1}) ==
          lines{"log warn: ignored held-out evaluation \"before\""});
    CHECK(h.d.now() == phase::eval_mid);
    CHECK(h.written.size() == 1);
    // The awaited result goes on as before: record, then the next step.
    CHECK(h.at(t + 20 * sec, result_after(2)).back() == "write_metrics step 2");
    CHECK(h.at(t + 20 * sec, ev::metrics_written{}).size() == 3);
    CHECK(h.d.now() == phase::rollout);
    CHECK(h.d.step() == 2);
  }
  SECTION("the learner going down ends the job and its late result is ignored") {
    CHECK(h.at(t, ev::peer_down{"learner", "learner#0@main", "connection closed"}) ==
          lines{"fail: learner#0@main is gone (connection closed)"});
    CHECK(h.at(t + sec, result_after(2)) ==
          lines{"log warn: ignored held-out evaluation \"step 2\""});
    CHECK(h.d.now() == phase::done);
    CHECK(h.written.size() == 1);
  }
}

TEST_CASE("the driver's options come from the experiment's keys") {
  experiment_config cfg;
  cfg.run.steps = 60;
  cfg.run.seed = 3;
  cfg.run.checkpoint_every = 5;
  cfg.run.eval_every = 4;
  cfg.run.output_dir = "out";
  cfg.run.name = "r";
  cfg.task.eval_prompts = 200;
  cfg.task.max_new_tokens = 24;
  cfg.algorithm.prompts_per_step = 32;
  cfg.algorithm.dynamic_sampling = true;
  cfg.algorithm.max_refill_rounds = 2;
  cfg.algorithm.temperature = 0.8;
  cfg.algorithm.top_p = 0.95;
  cfg.algorithm.top_k = 40;
  cfg.rollout.watchdog_s = 0.5;
  auto o = driver_options_from(cfg, 1000);
  CHECK(o.steps == 60);
  CHECK(o.seed == 3);
  CHECK(o.checkpoint_every == 5);
  CHECK(o.eval_every == 4);
  CHECK(o.run_dir == "out/r");
  CHECK(o.eval_prompts == 200);
  CHECK(o.max_new_tokens == 24);
  CHECK(o.prompts_per_step == 32);
  CHECK(o.dynamic_sampling);
  CHECK(o.max_refill_rounds == 2);
  CHECK(o.temperature == 0.8);
  CHECK(o.top_p == 0.95);
  CHECK(o.top_k == 40);
  CHECK(o.watchdog_s == 0.5);
  CHECK(o.watchdog_ns() == 500000000);
  CHECK(o.task_size == std::optional<uint64_t>{1000});
  CHECK(o.on_reward_failure == reward_failure_policy::mask);
  cfg.algorithm.on_reward_failure = reward_failure_kind::fail;
  CHECK(driver_options_from(cfg, std::nullopt).on_reward_failure == reward_failure_policy::fail);
  CHECK_FALSE(driver_options_from(cfg, std::nullopt).task_size);
}

TEST_CASE("the driver's defaults are the config's") {
  const driver_options plain;
  const auto d = driver_options_from(experiment_config{}, std::nullopt);
  CHECK(d.steps == plain.steps);
  CHECK(d.eval_prompts == plain.eval_prompts);
  CHECK(d.prompts_per_step == plain.prompts_per_step);
  CHECK(d.seed == plain.seed);
  CHECK(d.dynamic_sampling == plain.dynamic_sampling);
  CHECK(d.max_refill_rounds == plain.max_refill_rounds);
  CHECK(d.on_reward_failure == plain.on_reward_failure);
  CHECK(d.watchdog_s == plain.watchdog_s);
  CHECK(d.checkpoint_every == plain.checkpoint_every);
  CHECK(d.eval_every == plain.eval_every);
  CHECK(d.max_new_tokens == plain.max_new_tokens);
  CHECK(d.temperature == plain.temperature);
  CHECK(d.top_p == plain.top_p);
  CHECK(d.top_k == plain.top_k);
  CHECK(d.mismatch_warn == plain.mismatch_warn);
}
