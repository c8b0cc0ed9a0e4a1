#include "actors/scheduler/placement.hpp"

#include "runtime/config.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace sorl::scheduler {

namespace {

std::string quoted(const std::string& s) {
  return "'" + s + "'";
}

} // namespace

placement_options placement_options_from(const experiment_config& cfg,
                                         int64_t prefix_cache_blocks) {
  placement_options o;
  switch (cfg.scheduler.policy) {
    case placement_kind::round_robin:
      o.policy = placement_policy::round_robin;
      break;
    case placement_kind::least_loaded:
      o.policy = placement_policy::least_loaded;
      break;
    case placement_kind::cache_aware:
      o.policy = placement_policy::cache_aware;
      break;
    case placement_kind::sglang_cache_aware:
      o.policy = placement_policy::sglang_cache_aware;
      break;
  }
  // SGLang's rule routes each request by its own prompt: no group affinity (placement_policy).
  o.group_affinity = o.policy != placement_policy::sglang_cache_aware;
  o.imbalance_threshold = cfg.scheduler.imbalance_threshold;
  o.cache_threshold = cfg.scheduler.cache_threshold;
  o.cache_imbalance_threshold = cfg.scheduler.cache_imbalance_threshold;
  o.index_blocks = std::max<int64_t>(0, prefix_cache_blocks);
  return o;
}

placement::placement(placement_options options) : options_(options) {
  if (!std::isfinite(options_.queued_token_weight) || options_.queued_token_weight < 0)
    throw std::invalid_argument("placement: queued_token_weight must be finite and >= 0, got "
                                + std::to_string(options_.queued_token_weight));
  if (!std::isfinite(options_.imbalance_threshold) || options_.imbalance_threshold < 0)
    throw std::invalid_argument("placement: imbalance_threshold must be finite and >= 0, got "
                                + std::to_string(options_.imbalance_threshold));
  if (!std::isfinite(options_.cache_imbalance_threshold) || options_.cache_imbalance_threshold < 0)
    throw std::invalid_argument("placement: cache_imbalance_threshold must be finite and >= 0, got "
                                + std::to_string(options_.cache_imbalance_threshold));
  if (!(options_.cache_threshold >= 0 && options_.cache_threshold <= 1))
    throw std::invalid_argument("placement: cache_threshold must be in [0, 1], got "
                                + std::to_string(options_.cache_threshold));
  if (options_.block_size < 1)
    throw std::invalid_argument("placement: block_size must be >= 1, got "
                                + std::to_string(options_.block_size));
  if (options_.index_blocks < 0)
    throw std::invalid_argument("placement: index_blocks must be >= 0, got "
                                + std::to_string(options_.index_blocks));
}

bool placement::cache_policy() const {
  return options_.policy == placement_policy::cache_aware
         || options_.policy == placement_policy::sglang_cache_aware;
}

void placement::join(const std::string& name) {
  if (name.empty())
    throw std::invalid_argument("placement::join: empty worker name");
  if (!workers_.emplace(name, worker_state(options_.index_blocks)).second)
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
  return place(placement_request{request_id, group_id, prompt_tokens, {}});
}

place_result placement::place(const placement_request& r) {
  if (r.prompt_tokens < 0)
    throw std::invalid_argument("placement::place: request " + std::to_string(r.request_id)
                                + " has prompt_tokens = " + std::to_string(r.prompt_tokens)
                                + " < 0");
  if (auto it = requests_.find(r.request_id); it != requests_.end())
    throw std::invalid_argument("placement::place: request " + std::to_string(r.request_id)
                                + " is already in flight on worker "
                                + quoted(it->second.worker));
  if (workers_.empty())
    return {std::nullopt, "no live rollout worker to place request "
                            + std::to_string(r.request_id) + " (group "
                            + std::to_string(r.group_id) + ") on; keep it until a worker joins"};

  const std::string* chosen = nullptr;
  bool shares_prefill = false;
  group_state* group = nullptr;
  if (options_.group_affinity) {
    group = &groups_[r.group_id];
    if (!group->home.empty()) {
      const auto& home = workers_.at(group->home);
      const auto& least = choose_least_loaded();
      // Under cache_aware the home holds the group's prompt as the cache decided it should: a
      // sibling sent elsewhere would prefill it again and spread the prefix over two caches,
      // which only pays where the sibling's own decoding outweighs that prefill.
      // The prefix match behind that test runs only once the plain threshold is passed.
      const double excess = load_of(home) - load_of(workers_.at(least));
      const bool move =
        excess > options_.imbalance_threshold
        && (options_.policy != placement_policy::cache_aware
            || excess > options_.cache_imbalance_threshold || cheap_to_move(r, workers_.at(least)));
      if (move) {
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
    chosen = &choose_by_policy(r);

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
    w.placed_tokens += r.prompt_tokens;
  if (cache_policy() && !r.chain.empty()) {
    const int64_t matched = std::min(w.index.match(r.chain) * options_.block_size, r.prompt_tokens);
    stats_.matched_tokens += matched;
    stats_.prompt_tokens += r.prompt_tokens;
    // The worker will hold the prompt's blocks once it has prefilled them.
    w.index.insert(r.chain);
  }
  requests_.emplace(r.request_id, request_state{worker, r.group_id, r.prompt_tokens});
  ++stats_.placed;
  return {worker, {}};
}

void placement::observe_generation(int64_t tokens) {
  if (tokens < 0)
    throw std::invalid_argument("placement::observe_generation: tokens = " + std::to_string(tokens)
                                + " < 0");
  const auto t = static_cast<double>(tokens);
  generation_estimate_ =
    generation_estimate_ ? *generation_estimate_ + (t - *generation_estimate_) / 16.0 : t;
}

void placement::restore_generation_estimate(std::optional<double> tokens) {
  if (tokens && !(std::isfinite(*tokens) && *tokens >= 0))
    throw std::invalid_argument("placement::restore_generation_estimate: tokens must be finite "
                                "and >= 0, got " + std::to_string(*tokens));
  generation_estimate_ = tokens;
}

bool placement::cheap_to_move(const placement_request& r, const worker_state& to) const {
  // Before any rollout has finished nothing says the decode outweighs the prefill: stay.
  if (!generation_estimate_)
    return false;
  const int64_t cached = std::min(to.index.match(r.chain) * options_.block_size, r.prompt_tokens);
  return static_cast<double>(r.prompt_tokens - cached) <= *generation_estimate_;
}

void placement::weights_changed() {
  for (auto& [name, w] : workers_)
    w.index.clear();
}

const prefix_index& placement::index(const std::string& name) const {
  return live_worker(name, "placement::index").index;
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

const std::string& placement::choose_cache_aware(const placement_request& r) {
  const auto& least = choose_least_loaded();
  if (r.chain.empty() || r.prompt_tokens <= 0)
    return least;
  // The longest estimated prefix; among equal ones the less loaded, then the name first.
  auto best = workers_.end();
  int64_t best_blocks = 0;
  for (auto it = workers_.begin(); it != workers_.end(); ++it) {
    const int64_t m = it->second.index.match(r.chain);
    if (m > best_blocks
        || (m == best_blocks && m > 0 && load_of(it->second) < load_of(best->second))) {
      best = it;
      best_blocks = m;
    }
  }
  const double covered =
    static_cast<double>(std::min(best_blocks * options_.block_size, r.prompt_tokens))
    / static_cast<double>(r.prompt_tokens);
  const double least_load = load_of(workers_.at(least));
  if (best != workers_.end() && covered >= options_.cache_threshold) {
    // A cached prefix saves a prefill, but a long queue costs more than one: past the
    // imbalance threshold the least loaded worker takes it (and caches it in turn).
    if (load_of(best->second) - least_load > options_.cache_imbalance_threshold
        || idle_relief(best->second, least)) {
      ++stats_.cache_balanced;
      return least;
    }
    ++stats_.cache_routed;
    return best->first;
  }
  // A new prefix goes where the cache has the most room, among the workers within the
  // imbalance threshold of the least loaded: placing prefixes by load alone can give one worker
  // more of them than its cache holds while another's has room, and then it thrashes.
  auto roomiest = workers_.end();
  for (auto it = workers_.begin(); it != workers_.end(); ++it) {
    if (load_of(it->second) - least_load > options_.cache_imbalance_threshold)
      continue;
    if (roomiest == workers_.end() || it->second.index.size() < roomiest->second.index.size()
        || (it->second.index.size() == roomiest->second.index.size()
            && load_of(it->second) < load_of(roomiest->second)))
      roomiest = it;
  }
  if (idle_relief(roomiest->second, least))
    return least;
  return roomiest->first;
}

bool placement::idle_relief(const worker_state& chosen, const std::string& least) const {
  // Work conservation: the cache imbalance threshold is absolute, so with fewer requests in a
  // step than it allows, every prompt sharing a prefix (the instructions, say) would follow the
  // worker that cached it first while the others had nothing to run. An idle worker costs the
  // step more than one prefill; once it takes a request it holds the prefix too, and the ties
  // between equal matches then go to the less loaded. Siblings stay with their group's home
  // (place): an idle worker is owed the next group, not a share of one, since spreading a
  // group prefills its prompt again on every worker and crowds their caches (the long
  // shared-prefix trace of bench/war/route_bench.cpp lost a quarter of its throughput that way
  // in commit 45409a3, which relieved siblings too).
  const auto& l = workers_.at(least);
  return l.in_flight == 0 && load_of(chosen) - load_of(l) > options_.imbalance_threshold;
}

const std::string& placement::choose_sglang(const placement_request& r) {
  // Loads are requests in flight, as the router's own counters are; the thresholds are the
  // router launcher's defaults (placement.hpp).
  constexpr int64_t balance_abs_threshold = 64;
  constexpr double balance_rel_threshold = 1.5;
  constexpr double sglang_cache_threshold = 0.3;
  auto least = workers_.begin();
  int64_t max_load = least->second.in_flight;
  for (auto it = workers_.begin(); it != workers_.end(); ++it) {
    if (it->second.in_flight < least->second.in_flight)
      least = it;
    max_load = std::max(max_load, it->second.in_flight);
  }
  const int64_t min_load = least->second.in_flight;
  if (max_load - min_load > balance_abs_threshold
      && static_cast<double>(max_load) > balance_rel_threshold * static_cast<double>(min_load)) {
    ++stats_.cache_balanced;
    return least->first;
  }
  auto best = workers_.end();
  int64_t best_blocks = 0;
  for (auto it = workers_.begin(); it != workers_.end(); ++it)
    if (const int64_t m = it->second.index.match(r.chain); m > best_blocks) {
      best = it;
      best_blocks = m;
    }
  if (best != workers_.end() && r.prompt_tokens > 0) {
    const double rate = static_cast<double>(std::min(best_blocks * options_.block_size,
                                                     r.prompt_tokens))
                        / static_cast<double>(r.prompt_tokens);
    if (rate > sglang_cache_threshold) {
      ++stats_.cache_routed;
      return best->first;
    }
  }
  // The worker whose tree holds the least: the most free cache.
  auto smallest = workers_.begin();
  for (auto it = workers_.begin(); it != workers_.end(); ++it)
    if (it->second.index.size() < smallest->second.index.size())
      smallest = it;
  return smallest->first;
}

const std::string& placement::choose_by_policy(const placement_request& r) {
  switch (options_.policy) {
    case placement_policy::round_robin:
      return choose_round_robin();
    case placement_policy::least_loaded:
      return choose_least_loaded();
    case placement_policy::cache_aware:
      return choose_cache_aware(r);
    case placement_policy::sglang_cache_aware:
      return choose_sglang(r);
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
