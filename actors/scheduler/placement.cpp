#include "actors/scheduler/placement.hpp"

#include "runtime/config.hpp"

#include <cmath>
#include <iterator>

namespace sorl::scheduler {

namespace {

std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

} // namespace

placement_options placement_options_from(const experiment_config& cfg) {
  placement_options o;
  o.policy = cfg.scheduler.policy == placement_kind::least_loaded ? placement_policy::least_loaded
                                                                  : placement_policy::round_robin;
  o.group_affinity = true;
  o.imbalance_threshold = cfg.scheduler.imbalance_threshold;
  return o;
}

placement::placement(placement_options options) : options_(options) {
  if (!std::isfinite(options_.queued_token_weight) || options_.queued_token_weight < 0)
    throw std::invalid_argument("placement: queued_token_weight must be finite and >= 0, got "
                                + std::to_string(options_.queued_token_weight));
  if (!std::isfinite(options_.imbalance_threshold) || options_.imbalance_threshold < 0)
    throw std::invalid_argument("placement: imbalance_threshold must be finite and >= 0, got "
                                + std::to_string(options_.imbalance_threshold));
}

void placement::join(const std::string& name) {
  if (name.empty())
    throw std::invalid_argument("placement::join: empty worker name");
  if (!workers_.emplace(name, worker_state{}).second)
    throw std::invalid_argument("placement::join: worker " + quoted(name) + " is already live");
}

std::vector<orphaned_request> placement::leave(const std::string& name) {
  return worker_lost(name);
}

std::vector<orphaned_request> placement::worker_lost(const std::string& name) {
  auto w = workers_.find(name);
  if (w == workers_.end())
    throw std::invalid_argument("placement::worker_lost: worker " + quoted(name)
                                + " is not live");
  std::vector<orphaned_request> orphans;
  for (auto it = requests_.begin(); it != requests_.end();) {
    if (it->second.worker != name) {
      ++it;
      continue;
    }
    // requests_ is ordered by id, so the list comes out sorted without a sort.
    orphans.push_back({it->first, it->second.group_id, it->second.prompt_tokens});
    release(it->second);
    it = requests_.erase(it);
  }
  // Surviving siblings stay where they are, but the prompt's KV is gone with the worker.
  for (auto& [id, g] : groups_)
    if (g.home == name)
      g.home.clear();
  workers_.erase(w);
  stats_.orphaned += static_cast<int64_t>(orphans.size());
  return orphans;
}

void placement::report_load(const std::string& name, const worker_load_report& report) {
  auto& w = live_worker(name, "placement::report_load");
  if (report.queued_tokens < 0)
    throw std::invalid_argument("placement::report_load: worker " + quoted(name)
                                + " reported queued_tokens = "
                                + std::to_string(report.queued_tokens) + " < 0");
  w.reported_tokens = report.queued_tokens;
  // The report already covers the prompts placed before it was sent. Anything placed while
  // it was in transit is briefly forgotten; the next report restores it.
  w.placed_tokens = 0;
}

place_result placement::place(uint64_t request_id, uint64_t group_id, int64_t prompt_tokens) {
  if (prompt_tokens < 0)
    throw std::invalid_argument("placement::place: request " + std::to_string(request_id)
                                + " has prompt_tokens = " + std::to_string(prompt_tokens)
                                + " < 0");
  if (auto it = requests_.find(request_id); it != requests_.end())
    throw std::invalid_argument("placement::place: request " + std::to_string(request_id)
                                + " is already in flight on worker "
                                + quoted(it->second.worker));
  if (workers_.empty())
    return {std::nullopt, "no live rollout worker to place request " + std::to_string(request_id)
                            + " (group " + std::to_string(group_id)
                            + ") on; keep it until a worker joins"};

  const std::string* chosen = nullptr;
  bool shares_prefill = false;
  group_state* group = nullptr;
  if (options_.group_affinity) {
    group = &groups_[group_id];
    if (!group->home.empty()) {
      const auto& home = workers_.at(group->home);
      const auto& least = choose_least_loaded();
      if (load_of(home) - load_of(workers_.at(least)) > options_.imbalance_threshold) {
        chosen = &least;
        ++stats_.affinity_overrides;
      } else {
        chosen = &group->home;
        shares_prefill = true;
        ++stats_.affinity_hits;
      }
    }
  }
  if (chosen == nullptr)
    chosen = &choose_by_policy();

  // Copy before touching the maps: `chosen` may point into them.
  std::string worker = *chosen;
  if (group != nullptr) {
    if (group->home.empty())
      group->home = worker;
    ++group->in_flight;
  }
  auto& w = workers_.at(worker);
  ++w.in_flight;
  if (!shares_prefill)
    w.placed_tokens += prompt_tokens;
  requests_.emplace(request_id, request_state{worker, group_id, prompt_tokens});
  ++stats_.placed;
  return {worker, {}};
}

std::string placement::complete(uint64_t request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end())
    throw std::invalid_argument("placement::complete: request " + std::to_string(request_id)
                                + " is not in flight (never placed, already completed, or "
                                  "orphaned by a lost worker)");
  std::string worker = it->second.worker;
  release(it->second);
  requests_.erase(it);
  return worker;
}

std::optional<std::string> placement::worker_of(uint64_t request_id) const {
  auto it = requests_.find(request_id);
  if (it == requests_.end())
    return std::nullopt;
  return it->second.worker;
}

std::vector<std::string> placement::workers() const {
  std::vector<std::string> names;
  names.reserve(workers_.size());
  for (const auto& [name, w] : workers_)
    names.push_back(name);
  return names;
}

bool placement::is_live(const std::string& name) const {
  return workers_.count(name) != 0;
}

double placement::load(const std::string& name) const {
  return load_of(live_worker(name, "placement::load"));
}

int64_t placement::in_flight(const std::string& name) const {
  return live_worker(name, "placement::in_flight").in_flight;
}

std::optional<std::string> placement::group_home(uint64_t group_id) const {
  auto it = groups_.find(group_id);
  if (it == groups_.end() || it->second.home.empty())
    return std::nullopt;
  return it->second.home;
}

double placement::load_of(const worker_state& w) const {
  // The in-flight count is the scheduler's own book, exact and current; reports only
  // supply what the scheduler cannot know (how much work each request still holds).
  return static_cast<double>(w.in_flight)
         + options_.queued_token_weight
             * static_cast<double>(w.reported_tokens + w.placed_tokens);
}

const std::string& placement::choose_round_robin() {
  // Resume after the last name chosen, so a join or a loss never restarts the cycle.
  auto it = workers_.upper_bound(rr_last_);
  if (it == workers_.end())
    it = workers_.begin();
  rr_last_ = it->first;
  return it->first;
}

const std::string& placement::choose_least_loaded() const {
  auto best = workers_.begin();
  double best_load = load_of(best->second);
  for (auto it = std::next(best); it != workers_.end(); ++it) {
    double l = load_of(it->second);
    if (l < best_load) { // strict: a tie keeps the name that sorts first
      best = it;
      best_load = l;
    }
  }
  return best->first;
}

const std::string& placement::choose_by_policy() {
  switch (options_.policy) {
    case placement_policy::round_robin:
      return choose_round_robin();
    case placement_policy::least_loaded:
      return choose_least_loaded();
  }
  throw std::logic_error("placement: invalid policy value");
}

placement::worker_state& placement::live_worker(const std::string& name, const char* what) {
  auto it = workers_.find(name);
  if (it == workers_.end())
    throw std::invalid_argument(std::string(what) + ": worker " + quoted(name) + " is not live");
  return it->second;
}

const placement::worker_state& placement::live_worker(const std::string& name,
                                                      const char* what) const {
  return const_cast<placement*>(this)->live_worker(name, what);
}

void placement::release(const request_state& r) {
  if (auto w = workers_.find(r.worker); w != workers_.end())
    --w->second.in_flight;
  if (auto g = groups_.find(r.group_id); g != groups_.end())
    if (--g->second.in_flight <= 0)
      groups_.erase(g);
}

} // namespace sorl::scheduler
