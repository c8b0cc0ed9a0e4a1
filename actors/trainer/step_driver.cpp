#include "actors/trainer/step_driver.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

#include "actors/sagc/timing.hpp"
#include "actors/trainer/trainer_checkpoint.hpp"
#include "runtime/config.hpp"
#include "runtime/role_names.hpp"

namespace sorl::trainer {

driver_options driver_options_from(const experiment_config& cfg,
                                   std::optional<uint64_t> task_size) {
  driver_options o;
  o.steps = cfg.run.steps;
  o.eval_prompts = static_cast<uint32_t>(cfg.task.eval_prompts);
  o.prompts_per_step = static_cast<uint32_t>(cfg.algorithm.prompts_per_step);
  o.seed = cfg.run.seed;
  o.dynamic_sampling = cfg.algorithm.dynamic_sampling;
  o.max_refill_rounds = static_cast<uint32_t>(cfg.algorithm.max_refill_rounds);
  o.on_reward_failure = cfg.algorithm.on_reward_failure == reward_failure_kind::fail
                          ? reward_failure_policy::fail
                          : reward_failure_policy::mask;
  o.watchdog_s = cfg.rollout.watchdog_s;
  o.checkpoint_every = cfg.run.checkpoint_every;
  o.eval_every = cfg.run.eval_every;
  o.stop_at_accuracy = cfg.run.stop_at_accuracy;
  o.run_dir = cfg.run.run_dir();
  o.max_new_tokens = static_cast<uint32_t>(cfg.task.max_new_tokens);
  o.temperature = cfg.algorithm.temperature;
  o.top_p = cfg.algorithm.top_p;
  o.top_k = static_cast<uint32_t>(cfg.algorithm.top_k);
  o.task_size = task_size;
  o.mismatch_warn = cfg.algorithm.mismatch_warn;
  return o;
}

step_driver::step_driver(driver_options opts) : opts_(std::move(opts)) {}
step_driver::~step_driver() = default;

std::vector<command> step_driver::handle(int64_t now_ns, const event& e) {
  out o;
  now_ns_ = now_ns;
  std::visit([&](const auto& x) { on(o, x); }, e);
  return o;
}

std::optional<rss_peaks> step_driver::take_peak_rss() {
  return opts_.peak_rss ? opts_.peak_rss() : std::nullopt;
}

void step_driver::fail(out& o, std::string why) {
  phase_ = phase::done;
  o.push_back(cmd::fail_job{std::move(why)});
}

// -- start -----------------------------------------------------------------------------------

void step_driver::on(out& o, const ev::learner_ready& r) {
  learner_ready_ = true;
  version_ = r.version;
  resumed_ = r.resumed;
  std::optional<int64_t> resume_after;
  if (resumed_) {
    resume_source_ = r.source;
    trainer_snapshot saved;
    try {
      saved = parse_trainer_snapshot(r.trainer_state);
    } catch (const std::exception& ex) {
      fail(o, fmt::format("cannot resume from {}: {}", resume_source_, ex.what()));
      return;
    }
    step_ = saved.step;
    counters_ = saved.counters;
    reward_history_ = saved.reward_history;
    acc_before_ = saved.accuracy_before;
    last_checkpoint_ = resume_source_;
    last_checkpoint_step_ = step_;
    resume_after = step_;
    o.push_back(cmd::log{cmd::log_level::info,
                         fmt::format("resuming after step {} from {}", step_, resume_source_)});
    if (!saved.roles)
      o.push_back(cmd::log{cmd::log_level::warn,
                           fmt::format("{} was written before the group-size controller and "
                                       "the scheduler saved their state: they start afresh "
                                       "(the first steps' G may differ from an uninterrupted "
                                       "run)",
                                       resume_source_)});
    for (const auto& [role, state] : saved.roles.value_or(decltype(role_states_){})) {
      ++restores_pending_;
      o.push_back(cmd::restore_role_state{role, state, resume_source_});
    }
  }
  awaiting_ = awaiting::open;
  o.push_back(cmd::open_metrics{resumed_ ? metrics_open_mode::resume : metrics_open_mode::fresh,
                                resume_after});
}

void step_driver::on(out& o, const ev::metrics_opened& r) {
  if (awaiting_ != awaiting::open)
    return;
  awaiting_ = awaiting::nothing;
  if (r.error) {
    fail(o, fmt::format("cannot open the metrics file: {}", *r.error));
    return;
  }
  maybe_start(o);
}

void step_driver::on(out& o, const ev::role_state_restored& r) {
  if (phase_ != phase::starting || restores_pending_ == 0)
    return;
  if (!r.ok) {
    // The reason names the role and the key ("sagc_controller state: key ...").
    fail(o, fmt::format("cannot resume from {}: {}", resume_source_, r.reason));
    return;
  }
  if (!r.reason.empty())
    o.push_back(
      cmd::log{cmd::log_level::warn, fmt::format("resuming the {}: {}", r.role, r.reason)});
  --restores_pending_;
  maybe_start(o);
}

void step_driver::maybe_start(out& o) {
  if (phase_ != phase::starting || !learner_ready_ || !weights_ready_ || restores_pending_ > 0)
    return;
  run_start_ns_ = now_ns_;
  if (opts_.eval_prompts > 0 && !resumed_)
    request_eval(o, phase::eval_before, "before");
  else
    begin_step(o);
}

void step_driver::request_eval(out& o, phase p, std::string tag) {
  phase_ = p;
  eval_tag_ = tag;
  eval_start_ns_ = now_ns_;
  o.push_back(cmd::request_eval{std::move(tag), opts_.eval_prompts});
}

void step_driver::on(out& o, const ev::eval_result& r) {
  // Only the evaluation awaited moves the run on: a stray or repeated result must neither
  // start a step nor finish the run.
  bool evaluating =
    phase_ == phase::eval_before || phase_ == phase::eval_mid || phase_ == phase::eval_after;
  if (!evaluating || r.tag != eval_tag_) {
    o.push_back(
      cmd::log{cmd::log_level::warn, fmt::format("ignored held-out evaluation \"{}\"", r.tag)});
    return;
  }
  eval_tag_.clear();
  // Prompts whose reward failed are left out of accuracy and mean reward, as in training.
  const std::string failed =
    r.reward_failures == 0 ? "" : fmt::format(", {} without a reward", r.reward_failures);
  o.push_back(cmd::print_line{fmt::format("held-out accuracy ({}, greedy, {} prompts{}): {:.3f}  "
                                          "mean reward {:.3f}  mean length {:.1f} tokens  "
                                          "({:.1f} s)",
                                          r.tag, r.count, failed, r.accuracy, r.mean_reward,
                                          r.mean_length, r.seconds)});
  if (phase_ == phase::eval_before) {
    acc_before_ = r.accuracy;
    begin_step(o);
  } else if (phase_ == phase::eval_mid) {
    record_.set(metric::heldout_accuracy, r.accuracy);
    record_.set(metric::heldout_reward, r.mean_reward);
    record_.set(metric::heldout_len, r.mean_length);
    record_.set(metric::heldout_reward_failures, r.reward_failures);
    record_.set(metric::eval_s, static_cast<double>(now_ns_ - eval_start_ns_) / 1e9);
    if (opts_.stop_at_accuracy > 0 && r.accuracy >= opts_.stop_at_accuracy) {
      reached_at_ = step_;
      acc_after_ = r.accuracy;
      o.push_back(cmd::print_line{fmt::format("held-out accuracy {:.3f} ≥ run.stop_at_accuracy "
                                              "{:g} after step {}/{}: the run ends here",
                                              r.accuracy, opts_.stop_at_accuracy, step_,
                                              opts_.steps)});
    }
    write_record(o);
  } else {
    acc_after_ = r.accuracy;
    finish(o);
  }
}

// -- rollout phase ---------------------------------------------------------------------------

void step_driver::begin_step(out& o) {
  if (reached_at_) { // its evaluation was the final one
    finish(o);
    return;
  }
  if (step_ >= opts_.steps) {
    if (opts_.eval_prompts > 0)
      request_eval(o, phase::eval_after, "after");
    else
      finish(o);
    return;
  }
  phase_ = phase::rollout;
  step_start_ns_ = now_ns_;
  take_peak_rss(); // what came before the step (evaluation, checkpoint) is not its rollout's
  deadline_ns_ = 0;
  deadline_passed_ = false;
  rollouts_.clear();
  started_on_.clear();
  plan_.reset();
  record_ = metrics_record{};
  record_.step = step_ + 1;
  progress_ns_ = step_start_ns_;
  o.push_back(cmd::schedule_watchdog{opts_.watchdog_ns(), step_});
  o.push_back(cmd::query_group_size{static_cast<uint64_t>(step_)});
}

void step_driver::on(out& o, const ev::group_size_decision& d) {
  if (phase_ != phase::rollout || d.step != static_cast<uint64_t>(step_))
    return;
  progress_ns_ = now_ns_;
  group_size_ = d.group_size;
  group_reason_ = d.reason;
  deadline_ns_ = d.deadline_ns;
  min_finished_ = d.min_finished;
  record_.set(metric::group_policy, d.policy);
  record_.set(metric::virtual_queue, d.virtual_queue);
  if (std::isfinite(d.p_straggler))
    record_.set(metric::p_straggler, d.p_straggler);
  record_.set(metric::utility, d.utility);
  if (deadline_ns_ > 0)
    record_.set(metric::deadline_s, static_cast<double>(deadline_ns_) / 1e9);
  step_options so;
  so.step = static_cast<uint64_t>(step_);
  so.prompts = opts_.prompts_per_step;
  so.group_size = group_size_;
  so.run_seed = opts_.seed;
  so.task_size = opts_.task_size;
  so.dynamic_sampling = opts_.dynamic_sampling;
  so.max_refill_rounds = opts_.max_refill_rounds;
  try {
    plan_ = std::make_unique<step_plan>(so, counters_);
    first_failure_.clear();
  } catch (const std::exception& ex) {
    fail(o, ex.what());
    return;
  }
  send_requests(o);
  if (deadline_ns_ > 0) {
    auto left = deadline_ns_ - (now_ns_ - step_start_ns_);
    o.push_back(cmd::schedule_deadline{std::max<int64_t>(left, 0), step_});
  }
}

void step_driver::send_requests(out& o) {
  o.push_back(cmd::generate{plan_->take_new_requests(), version_, opts_.max_new_tokens,
                            opts_.temperature, opts_.top_p, opts_.top_k});
}

void step_driver::on(out&, const ev::rollout_started& r) {
  if (phase_ == phase::rollout)
    started_on_[r.request_id] = r.worker;
}

void step_driver::on(out& o, const ev::rollout_finished& t) {
  if (phase_ != phase::rollout || !plan_)
    return;
  auto verdict = plan_->on_rollout(t.request_id, t.reward, t.outcome);
  if (verdict == rollout_verdict::after_cut)
    return; // a straggler that finished while its abort was on the way
  if (verdict != rollout_verdict::accepted) {
    o.push_back(cmd::log{cmd::log_level::warn,
                         fmt::format("ignored trajectory {} (step {})", t.request_id, t.step)});
    return;
  }
  progress_ns_ = now_ns_;
  auto spec = t.spec;
  if (spec.accepted_tokens > spec.drafted_tokens) {
    // A worker that reports more accepted than drafted tokens miscounts: its numbers would
    // push the step's acceptance above 1, so they are left out rather than trusted.
    o.push_back(cmd::log{cmd::log_level::warn,
                         fmt::format("step {}: rollout {} from {} reports {} accepted of {} "
                                     "drafted tokens; its speculation counts are left out",
                                     step_ + 1, t.request_id, t.worker, spec.accepted_tokens,
                                     spec.drafted_tokens)});
    spec = {};
  }
  rollouts_.emplace(t.request_id,
                    kept_rollout{t.group_id, t.reward, t.outcome, t.policy_tokens, t.finish,
                                 t.replaced, spec, t.kv, t.duration_ns, t.worker});
  o.push_back(cmd::keep_trajectory{t.request_id});
  if (t.outcome != rollout_outcome::ok || !std::isfinite(t.reward)) {
    auto why = t.outcome == rollout_outcome::ok ? fmt::format("reward {} is not finite", t.reward)
                                                : t.failure;
    auto what = fmt::format("step {}: rollout {} (group {}, sample {}) from {} {}: {}",
                            step_ + 1, t.request_id, t.group_id, t.sample_index, t.worker,
                            t.outcome == rollout_outcome::failed ? "failed" : "has no reward",
                            why);
    if (t.outcome != rollout_outcome::failed &&
        opts_.on_reward_failure == reward_failure_policy::fail) {
      fail(o, what + " (algorithm.on_reward_failure = \"fail\")");
      return;
    }
    if (first_failure_.empty())
      first_failure_ = what;
    o.push_back(cmd::log{cmd::log_level::warn, what + "; not trained on"});
  }
  try_cut(o);
  if (phase_ != phase::rollout || !plan_->rollouts_complete())
    return;
  if (plan_->refill(counters_)) {
    send_requests(o);
    return;
  }
  end_rollouts(o);
}

void step_driver::on(out& o, const ev::deadline_tick& t) {
  if (phase_ != phase::rollout || t.step != step_)
    return;
  deadline_passed_ = true;
  try_cut(o);
}

/// Deadline mode: once the budget is spent and every group has min_finished rollouts, abort
/// the rest (the scheduler forwards the ids to the workers, which free their KV) and train
/// on what finished.
void step_driver::try_cut(out& o) {
  if (phase_ != phase::rollout || !plan_ || !deadline_passed_ || !plan_->can_cut(min_finished_))
    return;
  auto ids = plan_->cut(min_finished_);
  o.push_back(cmd::log{cmd::log_level::debug,
                       fmt::format("step {}: deadline passed, aborting {} rollout(s)", step_,
                                   ids.size())});
  o.push_back(cmd::abort_rollouts{static_cast<uint64_t>(step_), std::move(ids), "deadline"});
  end_rollouts(o);
}

void step_driver::on(out& o, const ev::watchdog_tick& t) {
  if (phase_ != phase::rollout || t.step != step_)
    return;
  auto period = opts_.watchdog_ns();
  auto idle = now_ns_ - progress_ns_;
  if (idle < period) {
    o.push_back(cmd::schedule_watchdog{period - idle, t.step});
    return;
  }
  fail(o, fmt::format("step {}: nothing finished for {:.1f} s (rollout.watchdog_s = {}); still "
                      "waiting for {}",
                      step_ + 1, static_cast<double>(idle) / 1e9, opts_.watchdog_s,
                      missing_rollouts()));
}

/// What a stalled rollout phase still waits for, for the watchdog's message.
std::string step_driver::missing_rollouts() const {
  if (!plan_)
    return "the group-size decision of the sagc_controller";
  auto missing = plan_->outstanding();
  std::string text = fmt::format("{} of {} rollouts:", missing.size(), plan_->requested().size());
  constexpr size_t shown = 10;
  for (size_t i = 0; i < missing.size() && i < shown; ++i) {
    const auto& r = missing[i];
    auto w = started_on_.find(r.request_id);
    text += fmt::format("{} request {} (group {}, sample {}, {})", i == 0 ? "" : ";",
                        r.request_id, r.group_id, r.sample_index,
                        w == started_on_.end() ? "not started on any worker"
                                               : "started on " + w->second);
  }
  if (missing.size() > shown)
    text += fmt::format("; and {} more", missing.size() - shown);
  return text;
}

namespace {

/// The spec_* keys of `rec` from the step's summed counts. A step without any decode step
/// counted (speculation off) gets none, so such runs write no new keys; a ratio whose
/// denominator is 0 is left out, as undefined.
void set_speculation(metrics_record& rec, const ev::speculation& s) {
  const auto steps = s.verify_steps + s.plain_steps;
  if (steps == 0)
    return;
  auto ratio = [](uint64_t num, uint64_t den) {
    return static_cast<double>(num) / static_cast<double>(den);
  };
  rec.set(metric::spec_verify_steps, s.verify_steps);
  rec.set(metric::spec_plain_steps, s.plain_steps);
  rec.set(metric::spec_drafted_tokens, s.drafted_tokens);
  rec.set(metric::spec_accepted_tokens, s.accepted_tokens);
  rec.set(metric::spec_draft_calls, s.draft_calls);
  rec.set(metric::spec_share, ratio(s.verify_steps, steps));
  if (s.drafted_tokens > 0)
    rec.set(metric::spec_acceptance, ratio(s.accepted_tokens, s.drafted_tokens));
  if (s.verify_steps > 0)
    rec.set(metric::spec_mean_accepted, ratio(s.accepted_tokens, s.verify_steps));
  if (s.draft_calls > 0)
    rec.set(metric::spec_draft_us, ratio(s.draft_ns, s.draft_calls) / 1e3);
  if (s.verify_ns > 0)
    rec.set(metric::spec_rate_with, ratio(s.verify_tokens, s.verify_ns) * 1e9);
  if (s.plain_ns > 0)
    rec.set(metric::spec_rate_without, ratio(s.plain_tokens, s.plain_ns) * 1e9);
}

/// The prefix-cache and load keys of `rec` from the step's rollouts: where prompt tokens came
/// from, the evictions the workers reported, episode latencies, and each worker's share of the
/// computed tokens (prefill computed + sampled). Rollouts that failed add only their prompt.
template <typename Rollouts>
void set_prefill_and_load(metrics_record& rec, const Rollouts& rollouts) {
  uint64_t prompt = 0, cached = 0, evicted = 0;
  std::map<std::string, double> load;
  std::vector<double> latency;
  for (const auto& [id, t] : rollouts) {
    prompt += t.kv.prompt_tokens;
    cached += t.kv.cached_tokens;
    evicted += t.kv.evicted_blocks;
    load[t.worker] += static_cast<double>(t.kv.prompt_tokens - t.kv.cached_tokens) + t.policy_tokens;
    if (t.outcome != rollout_outcome::failed && t.duration_ns > 0)
      latency.push_back(t.duration_ns / 1e9);
  }
  if (prompt > 0) {
    rec.set(metric::prefix_hit_rate, static_cast<double>(cached) / static_cast<double>(prompt));
    rec.set(metric::prefill_tokens, prompt - cached);
    rec.set(metric::prefix_evictions, evicted);
  }
  if (!latency.empty()) {
    rec.set(metric::episode_p50_s, sagc::nearest_rank_percentile(latency, 50));
    rec.set(metric::episode_p99_s, sagc::nearest_rank_percentile(latency, 99));
  }
  if (!load.empty()) {
    double most = 0, sum = 0;
    for (const auto& [w, l] : load) {
      most = std::max(most, l);
      sum += l;
    }
    rec.set(metric::worker_load_max, most);
    if (sum > 0)
      rec.set(metric::load_imbalance, most / (sum / static_cast<double>(load.size())));
  }
}

} // namespace

/// Every group is in: fill the record's rollout fields and hand the batch to the learner.
void step_driver::end_rollouts(out& o) {
  rollout_end_ns_ = now_ns_;
  if (auto peak = take_peak_rss())
    record_.set(metric::rss_peak_rollout_mib, peak->window_mib);
  o.push_back(cmd::query_step_timing{static_cast<uint64_t>(step_)});
  auto groups = plan_->training_groups();
  auto chosen = plan_->training_requests();
  // Statistics over every rollout of the step (refills included).
  std::vector<double> lengths;
  std::map<uint64_t, std::vector<double>> group_rewards;
  double tokens = 0;
  std::map<std::string, int> finish_counts;
  double replaced = 0;
  ev::speculation spec;
  for (const auto& [id, t] : rollouts_) {
    replaced += t.replaced ? 1 : 0;
    spec.verify_steps += t.spec.verify_steps;
    spec.plain_steps += t.spec.plain_steps;
    spec.drafted_tokens += t.spec.drafted_tokens;
    spec.accepted_tokens += t.spec.accepted_tokens;
    spec.draft_calls += t.spec.draft_calls;
    spec.draft_ns += t.spec.draft_ns;
    spec.verify_tokens += t.spec.verify_tokens;
    spec.verify_ns += t.spec.verify_ns;
    spec.plain_tokens += t.spec.plain_tokens;
    spec.plain_ns += t.spec.plain_ns;
    if (t.outcome == rollout_outcome::failed)
      continue; // nothing was generated that the statistics could describe
    lengths.push_back(t.policy_tokens);
    tokens += t.policy_tokens;
    if (t.outcome == rollout_outcome::ok && std::isfinite(t.reward))
      group_rewards[t.group_id].push_back(t.reward);
    switch (t.finish) {
      case ev::finish_reason::eos:
        ++finish_counts["eos"];
        break;
      case ev::finish_reason::length:
        ++finish_counts["length"];
        break;
      default:
        ++finish_counts["other"];
    }
  }
  // The same nearest-rank definition the SAGC timing statistics use.
  auto pct = [&](double p) {
    return lengths.empty() ? 0.0 : sagc::nearest_rank_percentile(lengths, 100 * p);
  };
  std::vector<double> per_group;
  for (const auto& [g, rs] : group_rewards)
    per_group.push_back(std::accumulate(rs.begin(), rs.end(), 0.0) / static_cast<double>(rs.size()));
  double rollout_s = (rollout_end_ns_ - step_start_ns_) / 1e9;
  auto& rec = record_;
  rec.group_size = group_size_;
  rec.set(metric::group_reason, group_reason_);
  rec.set(metric::prompts, opts_.prompts_per_step);
  rec.set(metric::rollouts, rollouts_.size());
  rec.reward_mean = plan_->mean_reward();
  rec.reward_per_group = per_group;
  rec.resp_len_p50 = static_cast<int64_t>(pct(0.5));
  rec.resp_len_p99 = static_cast<int64_t>(pct(0.99));
  rec.resp_len_max = static_cast<int64_t>(pct(1.0));
  rec.tokens_per_s = rollout_s > 0 ? tokens / rollout_s : 0.0;
  rec.set(metric::finish_eos, finish_counts["eos"]);
  rec.set(metric::finish_length, finish_counts["length"]);
  rec.set(metric::refill_rounds, plan_->refill_rounds());
  rec.set(metric::zero_signal_groups_rollout, plan_->zero_signal_groups().size());
  rec.set(metric::trained_groups, groups.size());
  rec.set(metric::trained_rollouts, chosen.size());
  rec.set(metric::aborted, plan_->aborted());
  rec.set(metric::deadline_cut, plan_->was_cut());
  rec.set(metric::failed_rollouts, plan_->failed_rollouts());
  rec.set(metric::reward_failures, plan_->reward_failures());
  rec.set(metric::replaced_requests, replaced);
  set_speculation(rec, spec);
  set_prefill_and_load(rec, rollouts_);
  if (chosen.empty()) {
    fail(o, fmt::format("step {}: no group to train on: of {} rollouts, {} failed and {} have "
                        "no reward{}",
                        step_ + 1, rollouts_.size(), plan_->failed_rollouts(),
                        plan_->reward_failures(),
                        first_failure_.empty() ? "" : "; the first: " + first_failure_));
    return;
  }
  phase_ = phase::learn;
  o.push_back(cmd::train{static_cast<uint64_t>(step_), std::move(chosen)});
}

void step_driver::on(out&, const ev::step_timing& t) {
  // A reply that comes after its step's record was written must not fill the next step's.
  if (t.step != static_cast<uint64_t>(step_))
    return;
  auto& rec = record_;
  rec.set(metric::duration_p50_s, t.duration_p50_ns / 1e9);
  rec.set(metric::duration_p90_s, t.duration_p90_ns / 1e9);
  rec.set(metric::duration_max_s, t.duration_max_ns / 1e9);
  rec.stragglers = t.stragglers;
  rec.set(metric::straggler_event, t.straggler_event);
  rec.set(metric::straggler_threshold_s, t.threshold_ns / 1e9);
  rec.set(metric::flagged_in_flight, t.flagged_in_flight);
  rec.set(metric::groups_judged, t.groups_judged);
  rec.set(metric::group_events, t.group_events);
  rec.set(metric::rollouts_aborted_timing, t.aborted);
}

// -- learn and sync --------------------------------------------------------------------------

void step_driver::on(out& o, const ev::train_result& r) {
  if (phase_ != phase::learn)
    return;
  if (!r.ok) {
    fail(o, fmt::format("step {}: the learner failed: {}; {}", step_ + 1, r.reason,
                        resume_hint()));
    return;
  }
  learn_end_ns_ = now_ns_;
  if (auto peak = take_peak_rss())
    record_.set(metric::rss_peak_learn_mib, peak->window_mib);
  try {
    for (size_t i = 0; i < r.metric_names.size() && i < r.metric_values.size(); ++i)
      record_.set_numeric(r.metric_names[i], r.metric_values[i]);
  } catch (const std::invalid_argument& e) {
    fail(o, fmt::format("step {}: the learner's result: {}", step_ + 1, e.what()));
    return;
  }
  note_mismatch(o);
  version_ = r.version;
  phase_ = phase::sync;
  if (early_ready_) {
    auto early = std::move(*early_ready_);
    early_ready_.reset();
    if (early.version == version_)
      end_step(o, early);
    else
      o.push_back(cmd::log{cmd::log_level::warn,
                           fmt::format("unexpected version {} ready", early.version)});
  }
}

void step_driver::note_mismatch(out& o) {
  const auto mean = record_.extra.find(metric::mismatch_mean.key);
  if (mean == record_.extra.end())
    return;
  const auto max = record_.extra.find(metric::mismatch_max.key);
  mismatch_mean_sum_ += mean->second;
  ++mismatch_steps_;
  if (max != record_.extra.end())
    mismatch_max_ = std::max(mismatch_max_, max->second);
  if (mean->second > opts_.mismatch_warn) {
    if (++mismatch_alarms_ == 1)
      o.push_back(cmd::log{
        cmd::log_level::warn,
        fmt::format("step {}: the learner's log-probs differ from the rollouts' by {:.3g} nats "
                    "per token on average (max {:.3g}), above algorithm.mismatch_warn = {:g}: "
                    "the rollouts are off-policy by that much. Exact rollouts sit near 1e-5 "
                    "(algorithm.learner_weights = \"bf16\"); a larger gap means the two sides "
                    "score different weights or kernels (docs/exactly-on-policy.md). "
                    "Counted in mismatch_alarms; not repeated",
                    step_ + 1, mean->second, max != record_.extra.end() ? max->second : 0.0,
                    opts_.mismatch_warn)});
  }
  record_.set(metric::mismatch_alarms, mismatch_alarms_);
}

void step_driver::on(out& o, const ev::version_ready& r) {
  if (phase_ == phase::starting) {
    weights_ready_ = true;
    maybe_start(o);
  } else if (phase_ == phase::sync && r.version == version_) {
    end_step(o, r);
  } else if (phase_ == phase::learn) {
    early_ready_ = r;
  } else {
    o.push_back(
      cmd::log{cmd::log_level::warn, fmt::format("unexpected version {} ready", r.version)});
  }
}

void step_driver::end_step(out& o, const ev::version_ready& ready) {
  auto& rec = record_;
  rec.set(metric::version, ready.version);
  rec.set(metric::sync_bytes, static_cast<double>(ready.bytes_sent));
  rec.set(metric::sync_dense_bytes, static_cast<double>(ready.dense_bytes));
  if (ready.sparse_workers > 0 && ready.elements > 0) {
    rec.set(metric::sync_changed_fraction, static_cast<double>(ready.changed_elements)
                                              / static_cast<double>(ready.elements));
    rec.set(metric::sync_sparse_bytes, static_cast<double>(ready.sparse_bytes));
    if (ready.bound_bits > 0.0)
      rec.set(metric::sync_bound_bytes, ready.bound_bits / 8.0);
    if (ready.changed_elements > 0)
      rec.set(metric::sync_recurring_fraction, static_cast<double>(ready.recurring_elements)
                                                 / static_cast<double>(ready.changed_elements));
  }
  rec.set(metric::sync_encode_s, static_cast<double>(ready.encode_ns) / 1e9);
  rec.set(metric::sync_apply_s, static_cast<double>(ready.apply_ns_max) / 1e9);
  rec.set(metric::sync_full_workers, ready.full_workers);
  rec.set(metric::sync_sparse_workers, ready.sparse_workers);
  rec.set(metric::sync_resyncs, ready.resyncs);
  rec.set(metric::model_hash, fmt::format("{:016x}", ready.model_hash));
  // What the publisher verified: ok only when every live worker's acknowledgement carried
  // the published hash (a mismatch gets a full sync, and a failed full sync stops the job).
  rec.set(metric::sync_verified_workers, ready.verified_workers);
  if (ready.workers > 0 && ready.verified_workers == ready.workers)
    rec.set(metric::checksum, ready.resyncs > 0 ? "ok after resync" : "ok");
  else
    rec.set(metric::checksum, fmt::format("unverified: {} of {} workers acknowledged {:016x}",
                                          ready.verified_workers, ready.workers,
                                          ready.model_hash));
  if (auto peak = take_peak_rss()) {
    rec.set(metric::rss_peak_sync_mib, peak->window_mib);
    rec.set(metric::rss_peak_process_mib, peak->process_mib);
  }
  rec.rollout_s = (rollout_end_ns_ - step_start_ns_) / 1e9;
  rec.learn_s = (learn_end_ns_ - rollout_end_ns_) / 1e9;
  rec.sync_s = (now_ns_ - learn_end_ns_) / 1e9;
  rec.wall_s = (now_ns_ - step_start_ns_) / 1e9;
  reward_history_.push_back(rec.reward_mean.value_or(0.0));
  ++step_;
  // The times above exclude the evaluation; the record waits for its results. The last
  // step is left to the final evaluation.
  auto every = opts_.eval_every;
  if (opts_.eval_prompts > 0 && every > 0 && step_ % every == 0 && step_ < opts_.steps) {
    request_eval(o, phase::eval_mid, fmt::format("step {}", step_));
    return;
  }
  write_record(o);
}

void step_driver::write_record(out& o) {
  awaiting_ = awaiting::write;
  o.push_back(cmd::write_metrics{record_});
}

void step_driver::on(out& o, const ev::metrics_written& r) {
  if (awaiting_ != awaiting::write)
    return;
  awaiting_ = awaiting::nothing;
  if (r.error) {
    // step_ already counts the step whose record failed.
    fail(o, fmt::format("step {}: {}; {}", step_, *r.error, resume_hint()));
    return;
  }
  o.push_back(
    cmd::print_line{progress_line(record_, opts_.steps, reward_trailing_mean(reward_history_))});
  bool last = step_ >= opts_.steps || reached_at_;
  auto every = opts_.checkpoint_every;
  if (last || (every > 0 && step_ % every == 0) || !stop_request_.empty()) {
    start_checkpoint(o);
    return;
  }
  begin_step(o);
}

// -- checkpoints -----------------------------------------------------------------------------

/// A checkpoint is due: ask every stateful role for its state first (send_checkpoint follows
/// once all have answered).
void step_driver::start_checkpoint(out& o) {
  phase_ = phase::checkpoint;
  role_states_.clear();
  for (const auto& role : stateful_roles())
    o.push_back(cmd::query_role_state{role, static_cast<uint64_t>(step_)});
}

void step_driver::on(out& o, const ev::role_state& r) {
  if (phase_ != phase::checkpoint || r.step != static_cast<uint64_t>(step_))
    return;
  if (!r.ok) {
    fail(o, fmt::format("checkpoint at step {}: the {} cannot save its state: {}", step_, r.role,
                        r.reason));
    return;
  }
  role_states_[r.role] = r.state;
  if (role_states_.size() == stateful_roles().size())
    send_checkpoint(o);
}

void step_driver::send_checkpoint(out& o) {
  trainer_snapshot s;
  s.step = step_;
  s.counters = counters_;
  s.reward_history = reward_history_;
  s.accuracy_before = acc_before_;
  s.roles = role_states_;
  std::string state;
  try {
    state = to_json(s);
  } catch (const std::exception& ex) {
    fail(o, fmt::format("checkpoint at step {}: {}", step_, ex.what()));
    return;
  }
  o.push_back(cmd::request_checkpoint{static_cast<uint64_t>(step_), opts_.run_dir, state});
}

void step_driver::on(out& o, const ev::checkpoint_done& d) {
  if (!d.ok) {
    fail(o, fmt::format("checkpoint at step {} failed: {}; {}", d.step, d.reason, resume_hint()));
    return;
  }
  o.push_back(cmd::log{cmd::log_level::info, fmt::format("checkpoint {}", d.path)});
  last_checkpoint_ = d.path;
  last_checkpoint_step_ = static_cast<int64_t>(d.step);
  if (!stop_request_.empty()) {
    stop_on_request(o, fmt::format("checkpoint {}", d.path));
    return;
  }
  begin_step(o);
}

/// What survives a failed step and how to continue, appended to the failure's reason: the
/// step in progress is lost, never half-saved (runtime/ml/formats/checkpoint.hpp).
std::string step_driver::resume_hint() const {
  if (last_checkpoint_.empty())
    return "no checkpoint of this run was written, so --resume has nothing to continue from";
  return fmt::format("the last complete checkpoint is {} (step {}); continue the run with "
                     "--resume once the cause is fixed",
                     last_checkpoint_, last_checkpoint_step_);
}

// -- the end ---------------------------------------------------------------------------------

/// Ends the job after a signal asked it to stop; `where` says what was saved.
void step_driver::stop_on_request(out& o, const std::string& where) {
  fail(o, fmt::format("stopped by {} after step {}/{}; {}", stop_request_, step_, opts_.steps,
                      where));
}

void step_driver::on(out& o, const ev::interrupt& i) {
  if (phase_ == phase::done || !stop_request_.empty())
    return;
  stop_request_ = fmt::format("{} on node {}", i.signal, i.node);
  switch (phase_) {
    case phase::starting:
    case phase::eval_before:
      stop_on_request(o, "no step of this run finished, nothing new to save");
      return;
    case phase::eval_after:
      stop_on_request(o, "the last step's checkpoint is complete");
      return;
    case phase::eval_mid:
      // The learner evaluates before it can take a checkpoint request, so waiting for the
      // result costs no time and keeps the step's held-out metrics.
      o.push_back(cmd::log{cmd::log_level::warn,
                           fmt::format("{}: finishing the held-out evaluation after step {}/{}, "
                                       "then writing a checkpoint and stopping",
                                       stop_request_, step_, opts_.steps)});
      return;
    default: // rollout, learn, sync, checkpoint: end_step / checkpoint_done stop the job
      o.push_back(cmd::log{cmd::log_level::warn,
                           fmt::format("{}: finishing step {}/{}, then writing a checkpoint and "
                                       "stopping",
                                       stop_request_,
                                       step_ + (phase_ == phase::checkpoint ? 0 : 1),
                                       opts_.steps)});
  }
}

void step_driver::on(out& o, const ev::peer_down& p) {
  if (p.role == role::rollout_worker)
    o.push_back(cmd::log{cmd::log_level::warn,
                         fmt::format("{} is gone ({}); the scheduler re-places its requests",
                                     p.name, p.why)});
  else if (p.role == role::suffix_index_keeper) // optional: the workers draft without it
    o.push_back(cmd::log{cmd::log_level::warn,
                         fmt::format("{} is gone ({}); each rollout worker drafts from its own "
                                     "responses from now on",
                                     p.name, p.why)});
  else if (phase_ != phase::done)
    fail(o, fmt::format("{} is gone ({})", p.name, p.why));
}

void step_driver::finish(out& o) {
  phase_ = phase::done;
  auto mean = [](std::vector<double>::const_iterator a, std::vector<double>::const_iterator b) {
    return a == b ? 0.0 : std::accumulate(a, b, 0.0) / static_cast<double>(b - a);
  };
  const auto& h = reward_history_;
  auto k = std::min<size_t>(10, h.size());
  std::string summary = fmt::format("{} steps; mean reward first {} steps {:.3f}, last {} "
                                    "steps {:.3f}",
                                    h.size(), k, mean(h.begin(), h.begin() + k), k,
                                    mean(h.end() - k, h.end()));
  if (acc_before_ || acc_after_)
    summary += fmt::format("; held-out accuracy {} → {}",
                           acc_before_ ? fmt::format("{:.3f}", *acc_before_) : "n/a",
                           acc_after_ ? fmt::format("{:.3f}", *acc_after_) : "n/a");
  if (mismatch_steps_ > 0)
    summary += fmt::format("; log-prob mismatch mean {:.2g} nats, max {:.2g}{}",
                           mismatch_mean_sum_ / static_cast<double>(mismatch_steps_), mismatch_max_,
                           mismatch_alarms_ > 0 ? fmt::format(" ({} steps above {:g})", mismatch_alarms_,
                                                              opts_.mismatch_warn)
                                                : "");
  summary += fmt::format("; {:.1f} s", (now_ns_ - run_start_ns_) / 1e9);
  o.push_back(cmd::finish_job{std::move(summary)});
}

} // namespace sorl::trainer
