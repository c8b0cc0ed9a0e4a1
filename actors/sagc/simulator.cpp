#include "actors/sagc/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <stdexcept>

namespace sorl::sagc {

namespace {

constexpr double pi = 3.14159265358979323846;

/// splitmix64's finaliser: a counter-based generator, so a draw depends only on its key.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// Uniform in (0, 1), never 0 or 1 (logs and negative powers stay finite).
double unit(uint64_t h) {
  return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53;
}

[[noreturn]] void bad_option(const std::string& field, const std::string& what) {
  throw std::invalid_argument("sim_options." + field + ": " + what);
}

void validate(const sim_options& o) {
  const auto& d = o.durations;
  for (size_t i = 0; i < d.trace_s.size(); ++i)
    if (!std::isfinite(d.trace_s[i]) || d.trace_s[i] < 0)
      bad_option("durations.trace_s", "entry " + std::to_string(i) + " is not finite and >= 0");
  if (d.trace_s.empty()) {
    if (!(d.median_s > 0) || !std::isfinite(d.median_s))
      bad_option("durations.median_s", "must be finite and > 0");
    if (!(d.sigma >= 0) || !std::isfinite(d.sigma))
      bad_option("durations.sigma", "must be finite and >= 0");
    if (!(d.tail_fraction >= 0 && d.tail_fraction <= 1))
      bad_option("durations.tail_fraction", "must be in [0, 1]");
    if (!(d.tail_xm_s > 0) || !std::isfinite(d.tail_xm_s))
      bad_option("durations.tail_xm_s", "must be finite and > 0");
    if (!(d.tail_alpha > 0) || !std::isfinite(d.tail_alpha))
      bad_option("durations.tail_alpha", "must be finite and > 0");
    if (!(d.tail_cap_s > 0) || !std::isfinite(d.tail_cap_s))
      bad_option("durations.tail_cap_s", "must be finite and > 0");
    for (size_t i = 0; i < d.tail_schedule.size(); ++i) {
      const auto& k = d.tail_schedule[i];
      if (!(k.fraction >= 0 && k.fraction <= 1))
        bad_option("durations.tail_schedule",
                   "knot " + std::to_string(i) + ": fraction must be in [0, 1]");
      if (i > 0 && k.step <= d.tail_schedule[i - 1].step)
        bad_option("durations.tail_schedule",
                   "knot " + std::to_string(i) + ": steps must be strictly increasing");
    }
  }
  if (o.prompts_per_step < 1)
    bad_option("prompts_per_step", "must be >= 1");
  if (o.workers < 1)
    bad_option("workers", "must be >= 1");
  if (o.batch_limit < 1)
    bad_option("batch_limit", "must be >= 1");
  if (!(o.load_slowdown >= 0) || !std::isfinite(o.load_slowdown))
    bad_option("load_slowdown", "must be finite and >= 0");
  if (!(o.decode_tokens_per_s > 0) || !std::isfinite(o.decode_tokens_per_s))
    bad_option("decode_tokens_per_s", "must be finite and > 0");
  if (!(o.learner_tokens_per_s > 0) || !std::isfinite(o.learner_tokens_per_s))
    bad_option("learner_tokens_per_s", "must be finite and > 0");
  if (!(o.overhead_s >= 0) || !std::isfinite(o.overhead_s))
    bad_option("overhead_s", "must be finite and >= 0");
  if (o.steps < 0)
    bad_option("steps", "must be >= 0");
}

/// One rollout of the simulated step.
struct rollout {
  int64_t prompt = 0;
  int64_t worker = 0;
  double work = 0;    ///< base duration, s
  double start = 0;   ///< s from the step's start
  double finish = 0;  ///< s from the step's start, had it run to the end
};

/// Processor-shared decoding on one worker (header comment): fills start and finish of the
/// rollouts `ids`, in order, `limit` at a time.
void run_worker(std::vector<rollout>& all, const std::vector<size_t>& ids, size_t limit,
                double slowdown) {
  std::vector<size_t> active;
  std::vector<double> remaining(ids.size());
  std::vector<size_t> slot_of(all.size());
  size_t next = 0;
  double t = 0;
  while (next < ids.size() || !active.empty()) {
    while (active.size() < limit && next < ids.size()) {
      const size_t r = ids[next];
      all[r].start = t;
      remaining[next] = all[r].work;
      slot_of[r] = next;
      active.push_back(r);
      ++next;
    }
    const double rate = 1.0 / (1.0 + slowdown * static_cast<double>(active.size() - 1));
    double least = remaining[slot_of[active.front()]];
    for (size_t r : active)
      least = std::min(least, remaining[slot_of[r]]);
    t += least / rate;
    size_t kept = 0;
    for (size_t r : active) {
      double& left = remaining[slot_of[r]];
      left -= least;
      if (left <= 1e-9) // 1 ns of base work: done
        all[r].finish = t;
      else
        active[kept++] = r;
    }
    active.resize(kept);
  }
}

int64_t to_ns(double s) {
  return std::llround(s * 1e9);
}

} // namespace

double sim_tail_fraction(const sim_durations& d, int64_t step) {
  const auto& ks = d.tail_schedule;
  if (ks.empty())
    return d.tail_fraction;
  if (step <= ks.front().step)
    return ks.front().fraction;
  for (size_t i = 1; i < ks.size(); ++i)
    if (step <= ks[i].step) {
      const double w = static_cast<double>(step - ks[i - 1].step)
                       / static_cast<double>(ks[i].step - ks[i - 1].step);
      return ks[i - 1].fraction + w * (ks[i].fraction - ks[i - 1].fraction);
    }
  return ks.back().fraction;
}

double sim_base_duration(const sim_options& o, int64_t step, int64_t prompt, int64_t k) {
  const uint64_t key = mix(mix(mix(mix(o.seed) ^ static_cast<uint64_t>(step))
                               ^ static_cast<uint64_t>(prompt))
                           ^ static_cast<uint64_t>(k));
  const double u0 = unit(mix(key + 1));
  const auto& d = o.durations;
  if (!d.trace_s.empty()) {
    auto i = static_cast<size_t>(u0 * static_cast<double>(d.trace_s.size()));
    return d.trace_s[std::min(i, d.trace_s.size() - 1)];
  }
  const double u1 = unit(mix(key + 2));
  if (u0 < sim_tail_fraction(d, step))
    return std::min(d.tail_cap_s, d.tail_xm_s * std::pow(u1, -1.0 / d.tail_alpha));
  const double u2 = unit(mix(key + 3));
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * pi * u2); // Box-Muller
  return d.median_s * std::exp(d.sigma * z);
}

sim_result simulate(group_policy& policy, const sim_options& o, std::string label) {
  validate(o);
  sim_result out;
  rollout_timing timing(o.rule);
  uint64_t next_id = 1;
  double clock_s = 0; // global simulated time at the step's start
  const auto limit = static_cast<size_t>(o.batch_limit);
  for (int64_t t = 0; t < o.steps; ++t) {
    sim_step s;
    s.decision = policy.decide(t);
    const int64_t g = std::clamp<int64_t>(s.decision.group_size, 1, int64_t{1} << 16);
    const int64_t b = o.prompts_per_step;

    std::vector<rollout> rs;
    rs.reserve(static_cast<size_t>(b * g));
    std::vector<std::vector<size_t>> per_worker(static_cast<size_t>(o.workers));
    for (int64_t j = 0; j < b; ++j)
      for (int64_t k = 0; k < g; ++k) {
        rollout r;
        r.prompt = j;
        r.worker = static_cast<int64_t>(rs.size()) % o.workers;
        r.work = sim_base_duration(o, t, j, k);
        per_worker[static_cast<size_t>(r.worker)].push_back(rs.size());
        rs.push_back(r);
      }
    for (const auto& ids : per_worker)
      run_worker(rs, ids, limit, o.load_slowdown);

    double all_done = 0;
    for (const auto& r : rs)
      all_done = std::max(all_done, r.finish);
    double phase = all_done;
    if (s.decision.deadline_ns) {
      // Every group needs min_finished finished rollouts (all of them when it has fewer).
      double groups_ready = 0;
      for (int64_t j = 0; j < b; ++j) {
        std::vector<double> f;
        for (int64_t k = 0; k < g; ++k)
          f.push_back(rs[static_cast<size_t>(j * g + k)].finish);
        std::sort(f.begin(), f.end());
        const auto need = static_cast<size_t>(
          std::clamp<int64_t>(s.decision.min_finished, 1, static_cast<int64_t>(f.size())));
        groups_ready = std::max(groups_ready, f[need - 1]);
      }
      const double deadline = static_cast<double>(*s.decision.deadline_ns) / 1e9;
      phase = std::min(all_done, std::max(deadline, groups_ready));
    }

    // The timing messages the workers would send; each worker stamps its own clock.
    const int64_t origin_ns = to_ns(clock_s);
    std::vector<int64_t> finished_per_prompt(static_cast<size_t>(b), 0);
    for (const auto& r : rs) {
      const double tokens = r.work * o.decode_tokens_per_s;
      s.sampled_tokens += tokens;
      const bool done = r.finish <= phase;
      if (done) {
        ++s.finished;
        ++finished_per_prompt[static_cast<size_t>(r.prompt)];
        s.trained_tokens += tokens;
      } else {
        ++s.aborted;
      }
      if (r.start > phase)
        continue; // never got a slot before the cut: no events
      timing_event e;
      e.request_id = next_id;
      e.step = t;
      e.group_id = static_cast<uint64_t>(t * b + r.prompt);
      e.worker = "w" + std::to_string(r.worker);
      const int64_t clock_offset_ns = (r.worker + 1) * 1'000'003'000LL;
      e.kind = timing_kind::start;
      e.worker_ns = clock_offset_ns + origin_ns + to_ns(r.start);
      timing.observe(e);
      const double end = done ? r.finish : phase;
      e.kind = done ? timing_kind::finish : timing_kind::abort;
      e.worker_ns = clock_offset_ns + origin_ns + to_ns(end);
      const double frac = r.finish > r.start ? (end - r.start) / (r.finish - r.start) : 1.0;
      e.tokens = std::llround(tokens * std::clamp(frac, 0.0, 1.0));
      timing.observe(e);
      ++next_id;
    }
    s.rollouts = static_cast<int64_t>(rs.size());
    const step_timing st = timing.close_step(t);
    policy.observe(st, timing.rule());
    s.straggler_event = st.straggler_event;
    s.event_share = timing.rule().options().kind == straggler_rule_kind::group_tokens
                      ? st.group_event_rate()
                      : (st.straggler_event ? 1.0 : 0.0);
    for (int64_t n : finished_per_prompt) {
      s.utility += group_utility(n) / static_cast<double>(b);
      s.weighted_rollouts += static_cast<double>(n) * group_utility(n);
    }
    s.rollout_phase_s = phase;
    s.step_s = phase + s.trained_tokens / o.learner_tokens_per_s + o.overhead_s;
    clock_s += s.step_s;
    out.steps.push_back(std::move(s));
  }
  out.summary = summarize(out.steps, std::move(label));
  return out;
}

sim_summary summarize(const std::vector<sim_step>& steps, std::string label) {
  sim_summary m;
  m.label = std::move(label);
  m.steps = static_cast<int64_t>(steps.size());
  if (steps.empty())
    return m;
  double g = 0, events = 0, time = 0, utility = 0, finished = 0, rollouts = 0, aborted = 0;
  double trained_tokens = 0, sampled_tokens = 0, weighted = 0;
  std::vector<double> step_s;
  for (const auto& s : steps) {
    g += static_cast<double>(s.decision.group_size);
    events += s.event_share;
    time += s.step_s;
    utility += s.utility;
    weighted += s.weighted_rollouts;
    finished += static_cast<double>(s.finished);
    rollouts += static_cast<double>(s.rollouts);
    aborted += static_cast<double>(s.aborted);
    trained_tokens += s.trained_tokens;
    sampled_tokens += s.sampled_tokens;
    step_s.push_back(s.step_s);
  }
  const auto n = static_cast<double>(steps.size());
  m.mean_g = g / n;
  m.straggler_rate = events / n;
  m.mean_step_s = time / n;
  m.p99_step_s = nearest_rank_percentile(step_s, 99);
  m.rollouts_per_s = time > 0 ? finished / time : 0;
  m.mean_utility = utility / n;
  m.weighted_rollouts_per_s = time > 0 ? weighted / time : 0;
  m.cut_fraction = rollouts > 0 ? aborted / rollouts : 0;
  if (finished > 0 && sampled_tokens > 0)
    m.length_ratio = (trained_tokens / finished) / (sampled_tokens / rollouts);
  return m;
}

bool meets_straggler_target(double rate, double target_rate, int64_t steps) {
  const double slack = std::sqrt(target_rate * (1 - target_rate)
                                 / static_cast<double>(std::max<int64_t>(1, steps)));
  return rate <= target_rate + slack;
}

best_static_choice best_static(const std::vector<sim_summary>& statics, double target_rate,
                               int64_t steps) {
  if (statics.empty())
    throw std::invalid_argument("best_static: no static runs");
  std::optional<size_t> best;
  for (size_t i = 0; i < statics.size(); ++i)
    if (meets_straggler_target(statics[i].straggler_rate, target_rate, steps)
        && (!best || statics[i].mean_g > statics[*best].mean_g))
      best = i;
  if (best)
    return {*best, true};
  size_t lowest = 0;
  for (size_t i = 1; i < statics.size(); ++i) {
    const auto& a = statics[i];
    const auto& b = statics[lowest];
    if (a.straggler_rate < b.straggler_rate
        || (a.straggler_rate == b.straggler_rate && a.mean_g > b.mean_g))
      lowest = i;
  }
  return {lowest, false};
}

std::optional<size_t> best_static_on_objective(const std::vector<sim_summary>& statics,
                                               bool constrained, double target_rate,
                                               int64_t steps) {
  std::optional<size_t> best;
  for (size_t i = 0; i < statics.size(); ++i) {
    const auto& a = statics[i];
    if (constrained && !meets_straggler_target(a.straggler_rate, target_rate, steps))
      continue;
    if (!best) {
      best = i;
      continue;
    }
    const auto& b = statics[*best];
    if (a.weighted_rollouts_per_s != b.weighted_rollouts_per_s) {
      if (a.weighted_rollouts_per_s > b.weighted_rollouts_per_s)
        best = i;
    } else if (a.straggler_rate != b.straggler_rate) {
      if (a.straggler_rate < b.straggler_rate)
        best = i;
    } else if (a.mean_g < b.mean_g) {
      best = i;
    }
  }
  return best;
}

std::vector<double> read_duration_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw std::runtime_error("read_duration_trace: cannot open " + path);
  std::vector<double> out;
  std::string line;
  size_t line_no = 0;
  bool seen_data_line = false;
  while (std::getline(in, line)) {
    ++line_no;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#')
      continue;
    const size_t end = line.find_first_of(", \t\r;", first);
    const std::string field = line.substr(first, end == std::string::npos ? end : end - first);
    const char* begin = field.c_str();
    char* stop = nullptr;
    const double v = std::strtod(begin, &stop);
    const bool numeric = stop != begin && *stop == '\0';
    if (!numeric && !seen_data_line) { // a header line
      seen_data_line = true;
      continue;
    }
    seen_data_line = true;
    if (!numeric || !std::isfinite(v) || v < 0)
      throw std::runtime_error(path + ":" + std::to_string(line_no) + ": '" + field
                               + "' is not a duration in seconds (a finite number >= 0)");
    out.push_back(v);
  }
  if (out.empty())
    throw std::runtime_error("read_duration_trace: " + path + " holds no durations");
  return out;
}

} // namespace sorl::sagc
