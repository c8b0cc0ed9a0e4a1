#include "actors/scheduler/scheduler_core.hpp"

#include <stdexcept>
#include <utility>

namespace sorl::scheduler {

scheduler_core::scheduler_core(placement_options options, prompt_fn prompt)
  : placement_(std::move(options)), prompt_(std::move(prompt)) {
}

void scheduler_core::join(const std::string& worker) {
  if (!placement_.is_live(worker))
    placement_.join(worker);
}

void scheduler_core::place(const held_request& h, dispatch_result& out) {
  const auto& r = h.request;
  try {
    auto where = placement_.place(
      placement_request{r.request_id, r.group_id, h.prompt_tokens, h.chain});
    if (!where) {
      out.failures.push_back("cannot place request " + std::to_string(r.request_id) + ": " +
                             where.error);
      return;
    }
    out.sends.push_back({*where.worker, r});
  } catch (const std::exception& ex) {
    out.failures.push_back("placing request " + std::to_string(r.request_id) + ": " + ex.what());
  }
}

dispatch_result scheduler_core::submit(const rollout::rollout_request& r) {
  dispatch_result out;
  if (held_.count(r.request_id) != 0) {
    out.warnings.push_back("request " + std::to_string(r.request_id) + " submitted twice");
    return out;
  }
  if (!weight_version_ || r.weight_version > *weight_version_) {
    if (weight_version_)
      placement_.weights_changed();
    weight_version_ = r.weight_version;
  }
  held_request h{r, 0, {}};
  if (placement_.cache_policy() && prompt_) {
    // Siblings arrive one after another with the same prompt: build it once per group.
    const auto key = std::make_tuple(r.group_id, r.split, r.task_index);
    if (last_prompt_ && last_prompt_->key == key) {
      h.prompt_tokens = last_prompt_->tokens;
      h.chain = last_prompt_->chain;
    } else {
      try {
        const auto tokens = prompt_(r);
        h.prompt_tokens = static_cast<int64_t>(tokens.size());
        h.chain = block_chain(tokens, placement_.options().block_size);
        last_prompt_ = built_prompt{key, h.prompt_tokens, h.chain};
      } catch (const std::exception&) {
        // The worker builds the same prompt, fails the same way and reports it; placing the
        // request anyway keeps that report on the usual path.
      }
    }
  }
  auto held = held_.emplace(r.request_id, std::move(h)).first;
  place(held->second, out);
  return out;
}

dispatch_result scheduler_core::abort(const rollout::abort_request& a) const {
  std::map<std::string, std::vector<uint64_t>> by_worker;
  for (auto id : a.request_ids) {
    if (held_.count(id) == 0)
      continue;
    if (auto w = placement_.worker_of(id))
      by_worker[*w].push_back(id);
  }
  dispatch_result out;
  for (auto& [worker, ids] : by_worker)
    out.aborts.push_back({worker, rollout::abort_request{a.step, std::move(ids), a.reason}});
  return out;
}

bool scheduler_core::on_event(const rollout::event_record& e) {
  if (e.event.kind != rollout::event_kind::finish)
    return false;
  const auto id = e.event.request_id;
  // A finish sent by a lost worker can arrive after its peer_down: the request is placed
  // again by then, and that placement must stay in flight (placement.hpp, `complete`).
  auto holder = placement_.worker_of(id);
  if (holder && *holder != e.worker)
    return false;
  if (held_.erase(id) == 0)
    return false;
  // Held but on no worker: its placement failed and the job is ending; nothing to free.
  if (!holder)
    return false;
  placement_.complete(id);
  placement_.observe_generation(e.event.tokens);
  return true;
}

dispatch_result scheduler_core::worker_lost(const std::string& worker, const std::string& why) {
  dispatch_result out;
  if (!placement_.is_live(worker))
    return out;
  std::vector<held_request*> orphans;
  for (const auto& orphan : placement_.worker_lost(worker))
    if (auto held = held_.find(orphan.request_id); held != held_.end())
      orphans.push_back(&held->second);
  out.warnings.push_back(worker + " is gone (" + why + "); re-placing " +
                         std::to_string(orphans.size()) + " requests");
  for (auto* h : orphans) {
    h->request.replaced_from = worker;
    place(*h, out);
  }
  return out;
}

std::string scheduler_core::save_state() const {
  return save_placement_state(placement_);
}

std::string scheduler_core::restore_state(std::string_view text) {
  try {
    restore_placement_state(text, placement_);
  } catch (const std::exception& ex) {
    return ex.what();
  }
  return "";
}

} // namespace sorl::scheduler
