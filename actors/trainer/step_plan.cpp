#include "actors/trainer/step_plan.hpp"

#include <cmath>
#include <stdexcept>

namespace sorl::trainer {

uint64_t group_seed(uint64_t run_seed, uint64_t group_id) {
  uint64_t z = run_seed ^ (group_id * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

step_plan::step_plan(const step_options& opts, trainer_counters& counters) : opts_(opts) {
  if (opts.prompts == 0 || opts.group_size == 0)
    throw std::invalid_argument("step_plan: prompts and group_size must be >= 1");
  if (opts.task_size && *opts.task_size == 0)
    throw std::invalid_argument("step_plan: the task has no training prompts");
  request_groups(opts.prompts, counters);
}

void step_plan::request_groups(uint32_t count, trainer_counters& counters) {
  new_from_ = requested_.size();
  for (uint32_t g = 0; g < count; ++g) {
    auto group = counters.next_group_id++;
    auto index = counters.task_cursor++;
    if (opts_.task_size)
      index %= *opts_.task_size;
    groups_.push_back(group);
    rewards_[group];
    finished_[group];
    for (uint32_t i = 0; i < opts_.group_size; ++i) {
      rollout_spec r;
      r.request_id = counters.next_request_id++;
      r.step = opts_.step;
      r.group_id = group;
      r.sample_index = i;
      r.group_size = opts_.group_size;
      r.task_index = index;
      r.seed = group_seed(opts_.run_seed, group);
      by_request_[r.request_id] = requested_.size();
      requested_.push_back(r);
    }
  }
}

std::vector<rollout_spec> step_plan::take_new_requests() {
  std::vector<rollout_spec> out(requested_.begin() + static_cast<std::ptrdiff_t>(new_from_),
                                requested_.end());
  new_from_ = requested_.size();
  return out;
}

rollout_verdict step_plan::on_rollout(uint64_t request_id, double reward,
                                      rollout_outcome outcome) {
  auto it = by_request_.find(request_id);
  if (it == by_request_.end())
    return rollout_verdict::unknown_request;
  if (cut_)
    return done_.count(request_id) ? rollout_verdict::duplicate : rollout_verdict::after_cut;
  if (outcome == rollout_outcome::ok && !std::isfinite(reward))
    outcome = rollout_outcome::reward_failed;
  if (!done_.emplace(request_id, outcome).second)
    return rollout_verdict::duplicate;
  auto group = requested_[it->second].group_id;
  ++finished_[group];
  if (outcome == rollout_outcome::failed)
    ++failed_;
  else if (outcome == rollout_outcome::reward_failed)
    ++reward_failures_;
  else
    rewards_[group].push_back(reward);
  return rollout_verdict::accepted;
}

bool step_plan::group_complete(uint64_t group) const {
  // After a cut only ok rollouts count towards min_finished: failed ones carry nothing to
  // train on. A complete group without any ok rollout is never trained on.
  if (rewards_.at(group).empty())
    return false;
  return cut_ ? rewards_.at(group).size() >= cut_min_
              : finished_.at(group) == opts_.group_size;
}

std::vector<rollout_spec> step_plan::outstanding() const {
  std::vector<rollout_spec> out;
  for (const auto& r : requested_)
    if (!done_.count(r.request_id))
      out.push_back(r);
  return out;
}

bool step_plan::group_has_signal(uint64_t group) const {
  const auto& r = rewards_.at(group);
  for (auto x : r)
    if (x != r.front())
      return true;
  return false;
}

bool step_plan::rollouts_complete() const {
  return cut_ || done_.size() == requested_.size();
}

bool step_plan::can_cut(uint32_t min_finished) const {
  if (cut_ || done_.size() == requested_.size())
    return false;
  for (auto g : groups_)
    if (rewards_.at(g).size() < min_finished)
      return false;
  return true;
}

std::vector<uint64_t> step_plan::cut(uint32_t min_finished) {
  if (!can_cut(min_finished))
    throw std::logic_error("step_plan::cut: a group has fewer than min_finished finished "
                           "rollouts, or nothing is outstanding");
  std::vector<uint64_t> out;
  for (const auto& r : requested_)
    if (!done_.count(r.request_id))
      out.push_back(r.request_id);
  cut_ = true;
  cut_min_ = min_finished;
  aborted_ = out.size();
  return out;
}

std::vector<uint64_t> step_plan::training_requests() const {
  std::vector<uint64_t> out;
  for (auto g : training_groups())
    for (const auto& r : requested_)
      if (r.group_id == g && done_.count(r.request_id) &&
          done_.at(r.request_id) != rollout_outcome::failed)
        out.push_back(r.request_id);
  return out;
}

std::vector<uint64_t> step_plan::zero_signal_groups() const {
  std::vector<uint64_t> out;
  for (auto g : groups_)
    if (group_complete(g) && !group_has_signal(g))
      out.push_back(g);
  return out;
}

bool step_plan::refill(trainer_counters& counters) {
  if (cut_ || !opts_.dynamic_sampling || !rollouts_complete() ||
      refills_ >= opts_.max_refill_rounds)
    return false;
  uint32_t with_signal = 0;
  for (auto g : groups_)
    if (group_has_signal(g))
      ++with_signal;
  if (with_signal >= opts_.prompts)
    return false;
  ++refills_;
  request_groups(opts_.prompts - with_signal, counters);
  return true;
}

std::vector<uint64_t> step_plan::training_groups() const {
  std::vector<uint64_t> out;
  if (!opts_.dynamic_sampling) {
    for (auto g : groups_)
      if (group_complete(g))
        out.push_back(g);
    return out;
  }
  for (auto g : groups_)
    if (group_complete(g) && group_has_signal(g) && out.size() < opts_.prompts)
      out.push_back(g);
  if (!out.empty())
    return out;
  // Nothing carries signal even after the refills: train on every complete group (their
  // advantages are zero) so that the step ends instead of stalling.
  for (auto g : groups_)
    if (group_complete(g))
      out.push_back(g);
  return out;
}

double step_plan::mean_reward() const {
  double sum = 0;
  size_t n = 0;
  for (auto& [g, r] : rewards_)
    for (auto x : r) {
      sum += x;
      ++n;
    }
  return n == 0 ? 0.0 : sum / static_cast<double>(n);
}

} // namespace sorl::trainer
