#include "actors/sync/sync_protocol.hpp"

#include "runtime/config.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace sorl::sync {

sync_protocol_options protocol_options_from(const experiment_config& cfg) {
  sync_protocol_options o;
  o.sparse = cfg.sync.mode == sync_kind::sparse;
  o.full_every = cfg.sync.full_every;
  return o;
}

const char* to_string(ack_action a) {
  switch (a) {
    case ack_action::wait:
      return "wait";
    case ack_action::complete:
      return "complete";
    case ack_action::send_full:
      return "send_full";
    case ack_action::fail:
      return "fail";
    case ack_action::ignore:
      return "ignore";
  }
  return "?";
}

sync_protocol::sync_protocol(sync_protocol_options options) : options_(options) {
  if (options_.full_every < 0)
    throw std::invalid_argument(
      fmt::format("sync_protocol: full_every = {} must be ≥ 0", options_.full_every));
}

void sync_protocol::add_worker(const std::string& name) {
  workers_.emplace(name, worker_state{});
}

bool sync_protocol::remove_worker(const std::string& name) {
  auto it = workers_.find(name);
  if (it == workers_.end())
    return false;
  bool was_waiting = it->second.waiting;
  workers_.erase(it);
  return in_flight_ && was_waiting && waiting().empty();
}

sync_plan sync_protocol::begin(uint64_t version) {
  if (in_flight_)
    throw std::logic_error(
      fmt::format("sync_protocol: version {} begun while {} is in flight", version, version_));
  if (last_begun_ && version <= *last_begun_)
    throw std::invalid_argument(fmt::format("sync_protocol: version {} is not after {}",
                                            version, *last_begun_));
  last_begun_ = version;
  version_ = version;
  in_flight_ = true;
  resyncs_ = 0;
  sync_plan plan;
  plan.version = version;
  bool anchor = options_.full_every > 0 &&
                version % static_cast<uint64_t>(options_.full_every) == 0;
  bool delta_possible = options_.sparse && base_ && !anchor;
  if (!options_.sparse)
    plan.why_full = "sync.mode = full";
  else if (!base_)
    plan.why_full = "first version";
  else if (anchor)
    plan.why_full = fmt::format("full anchor (every {} versions)", options_.full_every);
  for (auto& [name, w] : workers_) {
    w.waiting = true;
    w.full = !(delta_possible && w.holds && *w.holds == *base_);
    if (w.full) {
      plan.full.push_back(name);
      if (delta_possible && plan.why_full.empty())
        plan.why_full = "new or stale workers";
    } else {
      plan.sparse.push_back(name);
    }
  }
  if (!plan.sparse.empty())
    plan.base_version = base_;
  return plan;
}

ack_action sync_protocol::on_ack(const std::string& worker, uint64_t version, bool ok) {
  auto it = workers_.find(worker);
  if (!in_flight_ || version != version_ || it == workers_.end() || !it->second.waiting)
    return ack_action::ignore;
  auto& w = it->second;
  if (!ok) {
    w.holds.reset(); // whatever it holds now is unknown
    if (w.full)
      return ack_action::fail;
    w.full = true;
    ++resyncs_;
    return ack_action::send_full;
  }
  w.holds = version;
  w.waiting = false;
  return waiting().empty() ? ack_action::complete : ack_action::wait;
}

void sync_protocol::commit() {
  if (!in_flight_)
    throw std::logic_error("sync_protocol: commit without a version in flight");
  auto left = waiting();
  if (!left.empty())
    throw std::logic_error(fmt::format("sync_protocol: commit of version {} while {} worker(s) "
                                       "still owe an acknowledgement",
                                       version_, left.size()));
  in_flight_ = false;
  base_ = version_;
}

std::vector<std::string> sync_protocol::waiting() const {
  std::vector<std::string> out;
  for (const auto& [name, w] : workers_)
    if (w.waiting)
      out.push_back(name);
  return out;
}

std::optional<uint64_t> sync_protocol::holds(const std::string& worker) const {
  auto it = workers_.find(worker);
  if (it == workers_.end())
    return std::nullopt;
  return it->second.holds;
}

} // namespace sorl::sync
