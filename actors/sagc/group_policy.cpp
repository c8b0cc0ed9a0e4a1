#include "actors/sagc/group_policy.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "runtime/config.hpp"

namespace sorl::sagc {

namespace {

/// %g with `digits` significant digits, for reasons.
std::string num(double v, int digits = 4) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string seconds(double ns) {
  return num(ns / 1e9) + "s";
}

void check_step(const char* who, int64_t step) {
  if (step < 0)
    throw std::invalid_argument(std::string(who) + "::decide: step " + std::to_string(step)
                                + " < 0");
}

[[noreturn]] void bad_option(const std::string& field, const std::string& what) {
  throw std::invalid_argument("group_policy_options." + field + ": " + what);
}

void validate(const group_policy_options& o) {
  if (o.group_size < 1)
    bad_option("group_size", "must be >= 1, got " + std::to_string(o.group_size));
  if (o.policy == group_policy_kind::fixed)
    return;
  if (o.g_min < 1)
    bad_option("g_min", "must be >= 1, got " + std::to_string(o.g_min));
  if (o.g_max < o.g_min)
    bad_option("g_max", std::to_string(o.g_max) + " is below g_min = " + std::to_string(o.g_min));
  if (o.group_size < o.g_min || o.group_size > o.g_max)
    bad_option("group_size", std::to_string(o.group_size) + " is outside [g_min, g_max] = ["
                               + std::to_string(o.g_min) + ", " + std::to_string(o.g_max) + "]");
  if (!(o.target_rate >= 0 && o.target_rate <= 1)) // also NaN
    bad_option("target_rate", "must be in [0, 1], got " + num(o.target_rate));
  if (o.prompts_per_step < 1)
    bad_option("prompts_per_step", "must be >= 1, got " + std::to_string(o.prompts_per_step));
  if (!std::isfinite(o.v) || o.v <= 0)
    bad_option("v", "must be finite and > 0, got " + num(o.v));
  if (!std::isfinite(o.tail_prior) || o.tail_prior < 0)
    bad_option("tail_prior", "must be finite and >= 0, got " + num(o.tail_prior));
  if (!std::isfinite(o.deadline_kappa) || o.deadline_kappa <= 0)
    bad_option("deadline_kappa", "must be finite and > 0, got " + num(o.deadline_kappa));
}

group_policy_options checked(group_policy_options o, group_policy_kind policy) {
  o.policy = policy;
  validate(o);
  return o;
}

/// Outcome of checking a fed-back step before it may move a policy's state.
struct step_check {
  bool counts = false; ///< the step is new and had ended rollouts
  std::string notes;   ///< what was odd about it, "" when nothing
};

/// Shared by the adaptive and deadline policies: odd steps are explained, never thrown on.
step_check check_observed(const step_timing& t, std::optional<int64_t>& last_observed) {
  step_check out;
  const std::string name = "step " + std::to_string(t.step);
  if (t.step < 0) {
    out.notes = name + " fed back: negative, ignored";
    return out;
  }
  if (last_observed && t.step <= *last_observed) {
    out.notes = name + " fed back after step " + std::to_string(*last_observed)
                + ": repeated or backwards, not counted again";
    return out;
  }
  last_observed = t.step;
  if (auto issues = to_map(t.issues); !issues.empty()) {
    out.notes = name + " timing issues:";
    for (const auto& [issue, n] : issues)
      out.notes += " " + issue + "=" + std::to_string(n);
    out.notes += "; ";
  }
  if (t.finished == 0 && t.aborted == 0) {
    out.notes += t.started == 0
                   ? name + " had no rollouts: not counted"
                   : name + ": " + std::to_string(t.started) + " started, none ended: not counted";
    return out;
  }
  if (t.finished == 0)
    out.notes += name + ": all " + std::to_string(t.aborted) + " rollouts aborted; ";
  out.counts = true;
  return out;
}

/// The memory both windowed policies keep: the last steps seen and the notes.
policy_memory step_memory(const char* policy, const std::optional<int64_t>& last_observed,
                          const std::optional<int64_t>& last_decided, const std::string& notes) {
  policy_memory m;
  m.policy = policy;
  m.last_observed = last_observed;
  m.last_decided = last_decided;
  m.notes = notes;
  return m;
}

/// Checks `m`, then restores the part step_memory saves and the window statistics.
void restore_steps(const policy_memory& m, const straggler_rule& rule,
                   std::optional<int64_t>& last_observed, std::optional<int64_t>& last_decided,
                   std::string& notes, window_tail& tail) {
  check_policy_memory(m);
  last_observed = m.last_observed;
  last_decided = m.last_decided;
  notes = m.notes;
  tail = window_tail_of(rule);
}

std::string join_notes(const std::string& reason, std::string notes) {
  while (!notes.empty() && (notes.back() == ' ' || notes.back() == ';'))
    notes.pop_back();
  return notes.empty() ? reason : reason + " [" + notes + "]";
}

} // namespace

void check_policy_memory(const policy_memory& m) {
  auto bad = [](const std::string& field, const std::string& what) {
    throw std::invalid_argument("policy memory: " + field + ": " + what);
  };
  if (!std::isfinite(m.virtual_queue) || m.virtual_queue < 0)
    bad("virtual_queue", "must be finite and >= 0, got " + num(m.virtual_queue));
  if (!std::isfinite(m.truncated) || m.truncated < 0)
    bad("truncated", "must be finite and >= 0, got " + num(m.truncated));
  if (m.steps_counted < 0)
    bad("steps_counted", "must be >= 0, got " + std::to_string(m.steps_counted));
  if (m.events_counted < 0 || m.events_counted > m.steps_counted)
    bad("events_counted", std::to_string(m.events_counted) + " is outside [0, steps_counted = "
                            + std::to_string(m.steps_counted) + "]");
  if (!std::isfinite(m.event_sum) || m.event_sum < 0
      || m.event_sum > static_cast<double>(m.steps_counted))
    bad("event_sum", num(m.event_sum) + " is outside [0, steps_counted = "
                       + std::to_string(m.steps_counted) + "]");
  if (m.last_observed && *m.last_observed < 0)
    bad("last_observed", "must be >= 0, got " + std::to_string(*m.last_observed));
  if (m.last_decided && *m.last_decided < 0)
    bad("last_decided", "must be >= 0, got " + std::to_string(*m.last_decided));
}

double group_utility(int64_t group_size) {
  return group_size < 1 ? 0.0 : 1.0 - 1.0 / static_cast<double>(group_size);
}

double straggler_event_probability(double p, int64_t rollouts) {
  if (rollouts <= 0)
    return 0.0;
  if (!(p < 1)) // NaN too
    return 1.0;
  if (p <= 0)
    return 0.0;
  // −expm1(n·log1p(−p)) keeps precision for the tiny p that matter here (p ≈ ε/(B·G)).
  return -std::expm1(static_cast<double>(rollouts) * std::log1p(-p));
}

window_tail window_tail_of(const straggler_rule& rule) {
  return window_tail_of(rule, rule.options().kind);
}

window_tail window_tail_of(const straggler_rule& rule, straggler_rule_kind kind) {
  window_tail t;
  t.kind = kind;
  if (kind == straggler_rule_kind::group_tokens) {
    const auto& values = rule.relative_lengths();
    t.samples = values.size();
    if (!values.empty())
      t.median = nearest_rank_percentile(std::vector<double>(values.begin(), values.end()), 50);
    if (t.samples >= rule.options().min_samples) {
      const double kappa = rule.options().kappa;
      t.threshold = kappa;
      t.over = static_cast<size_t>(
        std::count_if(values.begin(), values.end(), [&](double r) { return r > kappa; }));
    }
    return t;
  }
  t.samples = rule.samples();
  if (auto m = rule.median_ns(); m && std::isfinite(*m))
    t.median = *m;
  if (auto thr = rule.threshold_ns(); thr && std::isfinite(*thr)) {
    t.threshold = *thr;
    t.over = static_cast<size_t>(std::count_if(rule.durations().begin(), rule.durations().end(),
                                               [&](double d) { return d > *thr; }));
  }
  return t;
}

double tail_estimate(const window_tail& tail, double prior) {
  const double denom = static_cast<double>(tail.samples) + 2 * prior;
  if (!(denom > 0))
    return std::numeric_limits<double>::quiet_NaN();
  return (static_cast<double>(tail.over) + prior) / denom;
}

// -- static -------------------------------------------------------------------------------

static_group_policy::static_group_policy(int64_t group_size) : group_size_(group_size) {
  if (group_size < 1)
    throw std::invalid_argument("static_group_policy: group_size must be >= 1, got "
                                + std::to_string(group_size));
}

group_decision static_group_policy::decide(int64_t step) {
  check_step("static_group_policy", step);
  group_decision d;
  d.step = step;
  d.group_size = group_size_;
  d.policy = "static";
  d.reason = "fixed G = " + std::to_string(group_size_) + " from [sagc].group_size";
  d.utility = group_utility(group_size_);
  return d;
}

policy_memory static_group_policy::memory() const {
  policy_memory m;
  m.policy = "static";
  return m;
}

// -- sagc ---------------------------------------------------------------------------------

sagc_group_policy::sagc_group_policy(group_policy_options options)
  : options_(checked(std::move(options), group_policy_kind::sagc)) {
}

int64_t sagc_group_policy::event_rollouts(int64_t g) const {
  return tail_.kind == straggler_rule_kind::group_tokens ? g : options_.prompts_per_step * g;
}

double sagc_group_policy::score(int64_t g) const {
  const double u = options_.v * group_utility(g);
  if (!tail_.threshold)
    return u;
  const double p = tail_estimate(tail_, options_.tail_prior);
  return u - queue_ * straggler_event_probability(p, event_rollouts(g));
}

group_decision sagc_group_policy::decide(int64_t step) {
  check_step("sagc_group_policy", step);
  group_decision d;
  d.step = step;
  d.policy = "sagc";
  d.virtual_queue = queue_;
  std::string notes = notes_;
  if (last_decided_ && step < *last_decided_)
    notes += "step " + std::to_string(step) + " asked after step " + std::to_string(*last_decided_)
             + ": backwards; ";
  last_decided_ = std::max(step, last_decided_.value_or(step));

  d.target_rate = step_target();
  const bool groups = tail_.kind == straggler_rule_kind::group_tokens;
  if (!tail_.threshold) {
    d.group_size = options_.group_size;
    d.utility = group_utility(d.group_size);
    d.reason = join_notes("no straggler threshold yet (window " + std::to_string(tail_.samples)
                            + (groups ? " relative lengths" : " durations")
                            + "): initial G = " + std::to_string(d.group_size),
                          notes);
    return d;
  }

  const double p = tail_estimate(tail_, options_.tail_prior);
  int64_t best = options_.g_min;
  double best_score = score(best);
  for (int64_t g = options_.g_min + 1; g <= options_.g_max; ++g) {
    const double s = score(g);
    if (s > best_score) { // strict: ties go to the smaller G
      best = g;
      best_score = s;
    }
  }
  d.group_size = best;
  d.utility = group_utility(best);
  d.p_straggler = straggler_event_probability(p, event_rollouts(best));
  if (d.target_rate != options_.target_rate)
    notes += "eps=" + num(options_.target_rate) + " unreachable (G=" + std::to_string(options_.g_min)
             + " has events at " + num(unavoidable_rate(), 3) + "): bounding the excess, target "
             + num(d.target_rate, 3) + "; ";
  d.reason = join_notes("Q=" + num(queue_) + " window k=" + std::to_string(tail_.over) + "/"
                          + std::to_string(tail_.samples) + " > thr="
                          + (groups ? num(*tail_.threshold) + "x group median"
                                    : seconds(*tail_.threshold))
                          + " p=" + num(p, 3) + " -> G=" + std::to_string(best)
                          + ": V*U=" + num(options_.v * d.utility)
                          + " - Q*P=" + num(queue_ * d.p_straggler),
                        notes);
  return d;
}

double sagc_group_policy::unavoidable_rate() const {
  if (!tail_.threshold || tail_.samples == 0)
    return 0.0;
  const double k_over_n = static_cast<double>(tail_.over) / static_cast<double>(tail_.samples);
  return straggler_event_probability(k_over_n, event_rollouts(options_.g_min));
}

double sagc_group_policy::unavoidable_rate_lower() const {
  if (!tail_.threshold || tail_.samples == 0)
    return 0.0;
  // Wilson score interval's lower end at z = 2 (one-sided ~97.7%).
  constexpr double z = 2.0;
  const double n = static_cast<double>(tail_.samples), k = static_cast<double>(tail_.over);
  const double lower =
    (k + z * z / 2 - z * std::sqrt(k * (n - k) / n + z * z / 4)) / (n + z * z);
  return straggler_event_probability(std::max(0.0, lower), event_rollouts(options_.g_min));
}

double sagc_group_policy::step_target() const {
  if (unavoidable_rate_lower() <= options_.target_rate)
    return options_.target_rate;
  return unavoidable_rate() + options_.target_rate;
}

void sagc_group_policy::observe(const step_timing& timing, const straggler_rule& rule) {
  const double target = step_target(); // the one the decision for this step saw
  tail_ = window_tail_of(rule); // the window the next step is judged against, in any case
  step_check c = check_observed(timing, last_observed_);
  notes_ = std::move(c.notes);
  if (!c.counts)
    return;
  double s = timing.straggler_event ? 1.0 : 0.0;
  if (tail_.kind == straggler_rule_kind::group_tokens) {
    if (timing.groups_judged == 0) {
      notes_ += "step " + std::to_string(timing.step)
                + ": no group had 2 finished rollouts to judge: not counted";
      return;
    }
    s = timing.group_event_rate();
  }
  double next = queue_ + s - target;
  if (next < 0) {
    truncated_ -= next;
    next = 0;
  }
  queue_ = next;
  ++steps_counted_;
  events_counted_ += timing.straggler_event ? 1 : 0;
  event_sum_ += s;
}

policy_memory sagc_group_policy::memory() const {
  policy_memory m = step_memory("sagc", last_observed_, last_decided_, notes_);
  m.virtual_queue = queue_;
  m.truncated = truncated_;
  m.steps_counted = steps_counted_;
  m.events_counted = events_counted_;
  m.event_sum = event_sum_;
  return m;
}

void sagc_group_policy::restore(const policy_memory& m, const straggler_rule& rule) {
  restore_steps(m, rule, last_observed_, last_decided_, notes_, tail_); // checks all of m
  queue_ = m.virtual_queue;
  truncated_ = m.truncated;
  steps_counted_ = m.steps_counted;
  events_counted_ = m.events_counted;
  event_sum_ = m.event_sum;
}

// -- deadline -----------------------------------------------------------------------------

deadline_group_policy::deadline_group_policy(group_policy_options options)
  : options_(checked(std::move(options), group_policy_kind::deadline)) {
}

group_decision deadline_group_policy::decide(int64_t step) {
  check_step("deadline_group_policy", step);
  group_decision d;
  d.step = step;
  d.policy = "deadline";
  d.group_size = options_.group_size;
  d.utility = group_utility(d.group_size);
  d.min_finished = options_.g_min;
  std::string notes = notes_;
  if (last_decided_ && step < *last_decided_)
    notes += "step " + std::to_string(step) + " asked after step " + std::to_string(*last_decided_)
             + ": backwards; ";
  last_decided_ = std::max(step, last_decided_.value_or(step));

  const std::string fixed = "fixed G = " + std::to_string(d.group_size);
  if (!tail_.threshold || !tail_.median) {
    d.reason = join_notes(fixed + "; no straggler threshold yet (window "
                            + std::to_string(tail_.samples) + " durations): wait for all",
                          notes);
    return d;
  }
  const double budget = options_.deadline_kappa * *tail_.median;
  // A budget beyond int64 ns (292 years) is no deadline at all.
  if (budget < 9.0e18)
    d.deadline_ns = std::max<int64_t>(0, std::llround(budget));
  d.reason = join_notes(fixed + "; deadline " + num(options_.deadline_kappa) + " x median "
                          + seconds(*tail_.median) + " = " + seconds(budget)
                          + ", cut once every group has >= " + std::to_string(d.min_finished)
                          + " finished",
                        notes);
  return d;
}

void deadline_group_policy::observe(const step_timing& timing, const straggler_rule& rule) {
  // The budget is a time: the duration window whatever rule judges stragglers.
  tail_ = window_tail_of(rule, straggler_rule_kind::wall_clock);
  notes_ = check_observed(timing, last_observed_).notes;
}

policy_memory deadline_group_policy::memory() const {
  return step_memory("deadline", last_observed_, last_decided_, notes_);
}

void deadline_group_policy::restore(const policy_memory& m, const straggler_rule& rule) {
  restore_steps(m, rule, last_observed_, last_decided_, notes_, tail_);
  tail_ = window_tail_of(rule, straggler_rule_kind::wall_clock);
}

// -- factory ------------------------------------------------------------------------------

group_policy_options group_policy_options_from(const experiment_config& cfg) {
  const auto& c = cfg.sagc;
  group_policy_options o;
  o.policy = c.policy;
  o.group_size = c.group_size;
  o.g_min = c.g_min;
  o.g_max = c.g_max;
  o.target_rate = c.target_rate;
  o.prompts_per_step = cfg.algorithm.prompts_per_step;
  o.v = c.v;
  o.deadline_kappa = c.deadline_kappa;
  return o;
}

straggler_rule_options straggler_rule_from(const experiment_config& cfg) {
  straggler_rule_options o;
  o.kappa = cfg.sagc.kappa;
  o.window = static_cast<size_t>(cfg.sagc.window);
  o.min_samples = std::min<size_t>(o.min_samples, o.window);
  o.kind = cfg.sagc.straggler_rule;
  return o;
}

std::unique_ptr<group_policy> make_group_policy(const group_policy_options& options) {
  validate(options);
  switch (options.policy) {
    case group_policy_kind::sagc:
      return std::make_unique<sagc_group_policy>(options);
    case group_policy_kind::deadline:
      return std::make_unique<deadline_group_policy>(options);
    case group_policy_kind::fixed:
      break;
  }
  return std::make_unique<static_group_policy>(options.group_size);
}

} // namespace sorl::sagc
