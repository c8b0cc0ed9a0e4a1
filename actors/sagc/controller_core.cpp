#include "actors/sagc/controller_core.hpp"

#include <utility>

#include "actors/sagc/controller_state.hpp"

namespace sorl::sagc {

controller_core::controller_core(straggler_rule_options rule, const group_policy_options& policy)
  : timing_(rule), policy_(make_group_policy(policy)) {
}

bool controller_core::closed(int64_t step) const {
  const auto last = timing_.last_closed_step();
  return last && step <= *last;
}

std::vector<straggler_flag> controller_core::observe(const timing_event& event) {
  if (event.step >= 0 && !closed(event.step))
    open_.insert(event.step);
  std::vector<straggler_flag> fresh;
  if (!timing_.observe(event) || event.kind != timing_kind::chunk)
    return fresh;
  // The chunk's own timestamp is the worker's "now": no clocks are compared.
  for (auto& f : timing_.in_flight_stragglers(event.step))
    if (flagged_[event.step].insert(f.request_id).second)
      fresh.push_back(std::move(f));
  return fresh;
}

group_decision controller_core::decide(int64_t step) {
  close_before(step);
  group_decision d = policy_->decide(step);
  if (!closed(step))
    open_.insert(step);
  return d;
}

step_report controller_core::step_timing(int64_t step) {
  if (auto it = reports_.find(step); it != reports_.end())
    return it->second;
  if (step >= 0 && !closed(step)) {
    close_before(step);
    return close(step);
  }
  step_report r;
  r.timing = timing_.summary(step);
  // The policy notes the repeated, backward or negative step for its next decision's reason.
  policy_->observe(r.timing, timing_.rule());
  r.warning = step < 0 ? "step " + std::to_string(step) + " is negative"
                       : "step " + std::to_string(step) + " is not after the last closed step " +
                           std::to_string(*timing_.last_closed_step()) +
                           " and its report is not kept (only the last " +
                           std::to_string(kept_reports) + " are)";
  return r;
}

void controller_core::close_before(int64_t step) {
  while (!open_.empty() && *open_.begin() < step)
    close(*open_.begin());
}

const step_report& controller_core::close(int64_t step) {
  step_report r;
  r.timing = timing_.close_step(step);
  policy_->observe(r.timing, timing_.rule());
  if (auto it = flagged_.find(step); it != flagged_.end())
    r.flagged_in_flight = static_cast<int64_t>(it->second.size());
  flagged_.erase(flagged_.begin(), flagged_.upper_bound(step));
  open_.erase(open_.begin(), open_.upper_bound(step));
  reports_[step] = std::move(r);
  // `step` is the newest closed step: the oldest reports go, never this one.
  while (reports_.size() > kept_reports)
    reports_.erase(reports_.begin());
  return reports_.at(step);
}

std::string controller_core::save() const {
  return save_controller_state(timing_, *policy_);
}

std::string controller_core::restore(std::string_view text) {
  std::string warning = restore_controller_state(text, timing_, *policy_);
  open_.clear();
  flagged_.clear();
  reports_.clear();
  return warning;
}

} // namespace sorl::sagc
