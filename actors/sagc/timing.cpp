#include "actors/sagc/timing.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace sorl::sagc {

namespace {

template <class T>
T nearest_rank(std::vector<T> values, double p) {
  if (values.empty())
    throw std::invalid_argument("nearest_rank_percentile: no values");
  if (!(p >= 0.0 && p <= 100.0)) // also rejects NaN
    throw std::invalid_argument("nearest_rank_percentile: p = " + std::to_string(p)
                                + " is outside [0, 100]");
  std::sort(values.begin(), values.end());
  // p·n first, then /100: for integer p the product is exact, so an exact rank such as
  // 90 % of 10 = 9 is not pushed to 10 by the rounding of 0.9.
  const double n = static_cast<double>(values.size());
  auto k = static_cast<size_t>(std::ceil(p * n / 100.0));
  k = std::clamp<size_t>(k, 1, values.size());
  return values[k - 1];
}

size_t idx(timing_issue issue) {
  return static_cast<size_t>(issue);
}

} // namespace

int64_t nearest_rank_percentile(std::vector<int64_t> values, double p) {
  return nearest_rank(std::move(values), p);
}

double nearest_rank_percentile(std::vector<double> values, double p) {
  for (double v : values)
    if (!std::isfinite(v))
      throw std::invalid_argument("nearest_rank_percentile: non-finite value");
  return nearest_rank(std::move(values), p);
}

const char* to_string(timing_kind kind) {
  switch (kind) {
    case timing_kind::start:
      return "start";
    case timing_kind::chunk:
      return "chunk";
    case timing_kind::finish:
      return "finish";
    case timing_kind::abort:
      return "abort";
  }
  return "?";
}

const char* to_string(timing_issue issue) {
  switch (issue) {
    case timing_issue::bad_step:
      return "bad_step";
    case timing_issue::no_worker:
      return "no_worker";
    case timing_issue::negative_tokens:
      return "negative_tokens";
    case timing_issue::late_event:
      return "late_event";
    case timing_issue::skipped_step:
      return "skipped_step";
    case timing_issue::duplicate_start:
      return "duplicate_start";
    case timing_issue::duplicate_finish:
      return "duplicate_finish";
    case timing_issue::duplicate_abort:
      return "duplicate_abort";
    case timing_issue::event_after_end:
      return "event_after_end";
    case timing_issue::missing_start:
      return "missing_start";
    case timing_issue::clock_mismatch:
      return "clock_mismatch";
    case timing_issue::negative_duration:
      return "negative_duration";
    case timing_issue::non_finite_duration:
      return "non_finite_duration";
    case timing_issue::count_:
      break;
  }
  return "?";
}

std::map<std::string, int64_t> to_map(const timing_issue_counts& counts) {
  std::map<std::string, int64_t> out;
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] != 0)
      out[to_string(static_cast<timing_issue>(i))] = counts[i];
  return out;
}

group_verdict judge_group(const std::vector<int64_t>& tokens, double kappa) {
  if (!std::isfinite(kappa) || kappa <= 0)
    throw std::invalid_argument("judge_group: kappa must be finite and > 0, got "
                                + std::to_string(kappa));
  for (int64_t t : tokens)
    if (t < 0)
      throw std::invalid_argument("judge_group: negative token count " + std::to_string(t));
  group_verdict v;
  if (tokens.size() < 2)
    return v;
  v.judged = true;
  v.median_tokens = std::max<int64_t>(1, nearest_rank_percentile(tokens, 50));
  v.threshold_tokens = kappa * static_cast<double>(v.median_tokens);
  for (size_t i = 0; i < tokens.size(); ++i)
    if (static_cast<double>(tokens[i]) > v.threshold_tokens)
      v.stragglers.push_back(i);
  return v;
}

// -- straggler_rule -----------------------------------------------------------------------

straggler_rule::straggler_rule(straggler_rule_options options) : options_(options) {
  if (!std::isfinite(options_.kappa) || options_.kappa <= 0)
    throw std::invalid_argument("straggler_rule: kappa must be finite and > 0, got "
                                + std::to_string(options_.kappa));
  if (options_.window == 0)
    throw std::invalid_argument("straggler_rule: window must be >= 1");
  if (options_.min_samples == 0 || options_.min_samples > options_.window)
    throw std::invalid_argument("straggler_rule: min_samples must be in [1, window = "
                                + std::to_string(options_.window) + "], got "
                                + std::to_string(options_.min_samples));
}

bool straggler_rule::push(std::deque<double>& window, double value) {
  if (!std::isfinite(value)) {
    ++rejected_[idx(timing_issue::non_finite_duration)];
    return false;
  }
  if (value < 0) {
    ++rejected_[idx(timing_issue::negative_duration)];
    return false;
  }
  window.push_back(value);
  while (window.size() > options_.window)
    window.pop_front();
  return true;
}

bool straggler_rule::add(double duration_ns) {
  return push(window_, duration_ns);
}

bool straggler_rule::add_relative(double ratio) {
  return push(relative_, ratio);
}

std::optional<double> straggler_rule::median_ns() const {
  if (window_.empty())
    return std::nullopt;
  // A copy and a sort per call: the window is a few hundred values and the call comes once
  // per step or per in-flight check, far from any hot path.
  return nearest_rank_percentile(std::vector<double>(window_.begin(), window_.end()), 50.0);
}

std::optional<double> straggler_rule::threshold_ns() const {
  if (window_.size() < options_.min_samples)
    return std::nullopt;
  return options_.kappa * *median_ns();
}

bool straggler_rule::is_straggler(double duration_ns) const {
  auto t = threshold_ns();
  return t && duration_ns > *t; // NaN compares false
}

// -- rollout_timing -----------------------------------------------------------------------

rollout_timing::rollout_timing(straggler_rule_options options) : rule_(options) {
}

bool rollout_timing::reject(timing_issue issue, step_state* state) {
  ++issues_[idx(issue)];
  if (state != nullptr)
    ++state->issues[idx(issue)];
  return false;
}

bool rollout_timing::observe(const timing_event& e) {
  if (e.step < 0)
    return reject(timing_issue::bad_step, nullptr);
  if (last_closed_ && e.step <= *last_closed_)
    return reject(timing_issue::late_event, nullptr);
  step_state& st = steps_[e.step];
  if (e.worker.empty())
    return reject(timing_issue::no_worker, &st);
  if (e.tokens < 0)
    return reject(timing_issue::negative_tokens, &st);

  auto [it, fresh] = st.rollouts.try_emplace(e.request_id);
  rollout_state& r = it->second;
  if (fresh)
    r.group_id = e.group_id;
  const stamp s{e.worker, e.worker_ns, e.tokens};

  switch (e.kind) {
    case timing_kind::start:
      if (!r.start) {
        r.start = s;
      } else if (r.start->worker == e.worker) {
        // Same clock: keep the earliest, so a replayed start never shortens a duration
        // after the real one was already paired.
        r.start->ns = std::min(r.start->ns, e.worker_ns);
        return reject(timing_issue::duplicate_start, &st);
      } else {
        // Re-placed after its worker was lost: the clock restarts on the new worker. Ends
        // and chunks stamped by the old worker belong to the lost attempt.
        ++restarts_;
        r.start = s;
        if (r.progress && r.progress->worker != e.worker)
          r.progress.reset();
        if (r.finish && r.finish->worker != e.worker)
          r.finish.reset();
        if (r.abort && r.abort->worker != e.worker)
          r.abort.reset();
      }
      return true;
    case timing_kind::chunk:
      // Chunks only move progress forward; a late chunk from the same worker is harmless.
      if (!r.progress || r.progress->worker != e.worker || e.worker_ns > r.progress->ns)
        r.progress = s;
      return true;
    case timing_kind::finish:
      if (r.finish)
        return reject(timing_issue::duplicate_finish, &st);
      if (r.abort)
        return reject(timing_issue::event_after_end, &st);
      r.finish = s;
      return true;
    case timing_kind::abort:
      if (r.abort)
        return reject(timing_issue::duplicate_abort, &st);
      if (r.finish)
        return reject(timing_issue::event_after_end, &st);
      r.abort = s;
      return true;
  }
  return false;
}

step_timing rollout_timing::build(int64_t step, const step_state* state,
                                  std::vector<int64_t>* timed_durations,
                                  std::vector<double>* relative_lengths) const {
  step_timing out;
  out.step = step;
  out.threshold_ns = rule_.threshold_ns();
  out.window_samples = rule_.samples();
  if (state == nullptr)
    return out;
  out.issues = state->issues;

  std::vector<int64_t> durations;
  std::vector<int64_t> tokens;
  std::vector<straggler_flag> clock_stragglers;
  for (const auto& [id, r] : state->rollouts) {
    if (r.start)
      ++out.started;
    const std::optional<stamp>& end = r.finish ? r.finish : r.abort;
    if (!end) {
      if (r.start)
        ++out.running;
      else
        ++out.issues[idx(timing_issue::missing_start)]; // chunks only, so far
      continue;
    }
    if (r.finish) {
      ++out.finished;
      tokens.push_back(r.finish->tokens);
    } else {
      ++out.aborted;
    }
    if (!r.start) {
      ++out.issues[idx(timing_issue::missing_start)];
      continue;
    }
    if (r.start->worker != end->worker) {
      ++out.issues[idx(timing_issue::clock_mismatch)];
      continue;
    }
    const int64_t d = end->ns - r.start->ns;
    if (d < 0) {
      ++out.issues[idx(timing_issue::negative_duration)];
      continue;
    }
    if (r.finish)
      durations.push_back(d);
    if (out.threshold_ns && static_cast<double>(d) > *out.threshold_ns)
      clock_stragglers.push_back(
        {id, r.group_id, end->worker, d, end->tokens, /*ended=*/true, /*aborted=*/!r.finish});
  }

  out.timed = static_cast<int64_t>(durations.size());
  if (!durations.empty()) {
    out.duration_p50_ns = nearest_rank_percentile(durations, 50);
    out.duration_p90_ns = nearest_rank_percentile(durations, 90);
    out.duration_max_ns = nearest_rank_percentile(durations, 100);
  }
  if (!tokens.empty()) {
    out.tokens_p50 = nearest_rank_percentile(tokens, 50);
    out.tokens_p99 = nearest_rank_percentile(tokens, 99);
    out.tokens_max = nearest_rank_percentile(tokens, 100);
  }
  // The group_tokens verdict. Groups and their members in id order, so the relative window
  // never depends on message arrival order.
  struct member {
    uint64_t id;
    const rollout_state* r;
  };
  std::map<uint64_t, std::vector<member>> groups;
  for (const auto& [id, r] : state->rollouts)
    if (r.finish || r.abort)
      groups[r.group_id].push_back({id, &r});
  std::vector<straggler_flag> token_stragglers;
  const double kappa = rule_.options().kappa;
  for (const auto& [group, members] : groups) {
    std::vector<int64_t> finished_tokens;
    for (const member& m : members)
      if (m.r->finish)
        finished_tokens.push_back(m.r->finish->tokens);
    const group_verdict v = judge_group(finished_tokens, kappa);
    if (!v.judged)
      continue;
    ++out.groups_judged;
    bool event = false;
    for (const member& m : members) {
      const stamp& end = m.r->finish ? *m.r->finish : *m.r->abort;
      if (static_cast<double>(end.tokens) > v.threshold_tokens) {
        event = true;
        const bool timed = m.r->start && m.r->start->worker == end.worker;
        token_stragglers.push_back({m.id, group, end.worker,
                                    timed ? std::max<int64_t>(0, end.ns - m.r->start->ns) : 0,
                                    end.tokens, /*ended=*/true, /*aborted=*/!m.r->finish});
      }
      if (m.r->finish && relative_lengths != nullptr)
        relative_lengths->push_back(static_cast<double>(end.tokens)
                                    / static_cast<double>(v.median_tokens));
    }
    out.group_events += event ? 1 : 0;
  }
  std::sort(token_stragglers.begin(), token_stragglers.end(),
            [](const straggler_flag& a, const straggler_flag& b) {
              return a.request_id < b.request_id;
            });
  out.stragglers = rule_.options().kind == straggler_rule_kind::group_tokens
                     ? std::move(token_stragglers)
                     : std::move(clock_stragglers);
  out.straggler_event = !out.stragglers.empty();
  if (timed_durations != nullptr)
    *timed_durations = std::move(durations);
  return out;
}

step_timing rollout_timing::summary(int64_t step) const {
  auto it = steps_.find(step);
  return build(step, it == steps_.end() ? nullptr : &it->second, nullptr);
}

void rollout_timing::restore(const std::vector<double>& durations_ns,
                             std::optional<int64_t> last_closed,
                             const std::vector<double>& relative) {
  if (last_closed && *last_closed < 0)
    throw std::invalid_argument("rollout_timing::restore: last closed step "
                                + std::to_string(*last_closed) + " < 0");
  straggler_rule fresh(rule_.options());
  for (size_t i = 0; i < durations_ns.size(); ++i)
    if (!fresh.add(durations_ns[i]))
      throw std::invalid_argument("rollout_timing::restore: duration " + std::to_string(i)
                                  + " is negative or not finite");
  for (size_t i = 0; i < relative.size(); ++i)
    if (!fresh.add_relative(relative[i]))
      throw std::invalid_argument("rollout_timing::restore: relative length " + std::to_string(i)
                                  + " is negative or not finite");
  rule_ = std::move(fresh);
  last_closed_ = last_closed;
  steps_.clear();
}

step_timing rollout_timing::close_step(int64_t step) {
  if (last_closed_ && step <= *last_closed_)
    throw std::invalid_argument("rollout_timing::close_step: step " + std::to_string(step)
                                + " is not after the last closed step "
                                + std::to_string(*last_closed_));
  // Older steps left open can no longer be judged against the window they belong to.
  for (auto it = steps_.begin(); it != steps_.end() && it->first < step;) {
    issues_[idx(timing_issue::skipped_step)] += static_cast<int64_t>(it->second.rollouts.size());
    it = steps_.erase(it);
  }
  auto it = steps_.find(step);
  const step_state* state = it == steps_.end() ? nullptr : &it->second;
  std::vector<int64_t> durations;
  std::vector<double> relative;
  step_timing out = build(step, state, &durations, &relative);
  // Event-time issues were counted as they came; add the ones found only now.
  for (size_t i = 0; i < issues_.size(); ++i)
    issues_[i] += out.issues[i] - (state != nullptr ? state->issues[i] : 0);
  // Request-id order, so the window's contents never depend on message arrival order.
  for (int64_t d : durations)
    rule_.add(static_cast<double>(d));
  for (double r : relative)
    rule_.add_relative(r);
  if (it != steps_.end())
    steps_.erase(it);
  last_closed_ = step;
  return out;
}

std::vector<straggler_flag> rollout_timing::in_flight_stragglers(
  int64_t step, const std::map<std::string, int64_t>& now_ns) const {
  std::vector<straggler_flag> out;
  if (rule_.options().kind == straggler_rule_kind::group_tokens)
    return in_flight_token_stragglers(step);
  const auto threshold = rule_.threshold_ns();
  auto st = steps_.find(step);
  if (!threshold || st == steps_.end())
    return out;
  for (const auto& [id, r] : st->second.rollouts) {
    if (!r.start || r.finish || r.abort)
      continue;
    const stamp& start = *r.start;
    int64_t latest = start.ns;
    int64_t tokens = start.tokens;
    // Only timestamps on the start's clock can be subtracted from it.
    if (r.progress && r.progress->worker == start.worker) {
      latest = std::max(latest, r.progress->ns);
      tokens = r.progress->tokens;
    }
    if (auto now = now_ns.find(start.worker); now != now_ns.end())
      latest = std::max(latest, now->second);
    const int64_t elapsed = latest - start.ns;
    if (static_cast<double>(elapsed) > *threshold)
      out.push_back({id, r.group_id, start.worker, elapsed, tokens, false, false});
  }
  return out;
}

std::vector<straggler_flag> rollout_timing::in_flight_token_stragglers(int64_t step) const {
  std::vector<straggler_flag> out;
  auto st = steps_.find(step);
  if (st == steps_.end())
    return out;
  struct group_state {
    int64_t started = 0;
    std::vector<int64_t> finished;
    std::vector<std::pair<uint64_t, const rollout_state*>> running;
  };
  std::map<uint64_t, group_state> groups;
  for (const auto& [id, r] : st->second.rollouts) {
    if (!r.start)
      continue;
    group_state& g = groups[r.group_id];
    ++g.started;
    if (r.finish)
      g.finished.push_back(r.finish->tokens);
    else if (!r.abort)
      g.running.push_back({id, &r});
  }
  const double kappa = rule_.options().kappa;
  for (auto& [group, g] : groups) {
    const auto k = static_cast<size_t>((g.started + 1) / 2); // ⌈n/2⌉, the median's rank
    if (g.running.empty() || g.finished.size() < k || k == 0)
      continue;
    std::nth_element(g.finished.begin(), g.finished.begin() + static_cast<long>(k - 1),
                     g.finished.end());
    const double bound = kappa * static_cast<double>(std::max<int64_t>(1, g.finished[k - 1]));
    for (const auto& [id, r] : g.running) {
      const stamp& start = *r->start;
      const bool same_clock = r->progress && r->progress->worker == start.worker;
      const int64_t tokens = same_clock ? r->progress->tokens : start.tokens;
      if (static_cast<double>(tokens) > bound)
        out.push_back({id, group, start.worker, same_clock ? r->progress->ns - start.ns : 0,
                       tokens, false, false});
    }
  }
  std::sort(out.begin(), out.end(), [](const straggler_flag& a, const straggler_flag& b) {
    return a.request_id < b.request_id;
  });
  return out;
}

timing_issue_counts rollout_timing::issues() const {
  timing_issue_counts all = issues_;
  for (size_t i = 0; i < all.size(); ++i)
    all[i] += rule_.rejected()[i];
  return all;
}

} // namespace sorl::sagc
