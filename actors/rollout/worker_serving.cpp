#include "actors/rollout/worker_serving.hpp"

#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "actors/sync/weight_receiver.hpp"

namespace sorl::rollout {

std::optional<std::string> version_refusal(uint64_t held, uint64_t wanted) {
  if (held == wanted)
    return std::nullopt;
  if (held == sync::weight_receiver::no_version)
    return fmt::format("the worker holds no weights yet, the request wants version {}", wanted);
  return fmt::format("the worker holds weights version {}, the request wants version {}", held,
                     wanted);
}

admission admit(worker_core& core, const rollout_request& req, uint64_t held) {
  admission a;
  try {
    if (auto why = version_refusal(held, req.weight_version)) {
      a.refusal = std::move(*why);
      core.reject(req, a.refusal);
    } else {
      core.enqueue(req);
    }
  } catch (const std::exception& ex) {
    return {false, {}, ex.what()};
  }
  a.held = true;
  return a;
}

tick_result decode_tick(worker_core& core, const std::string& worker) {
  try {
    return {core.step(), std::nullopt};
  } catch (const std::exception& ex) {
    return {abort_after_decode_failure(core, worker, ex.what()), std::string{ex.what()}};
  }
}

std::vector<rollout_result> abort_after_decode_failure(worker_core& core,
                                                       const std::string& worker,
                                                       const std::string& what) {
  auto held = core.abort_all();
  mark_cut_by_failure(held, worker, what);
  return held;
}

void mark_cut_by_failure(std::vector<rollout_result>& held, const std::string& worker,
                         const std::string& what) {
  for (auto& r : held) {
    if (r.finish != ml::finish_reason::abort || r.status != rollout_status::ok)
      continue; // finished (or failed) before the error: sent as it is
    r.status = rollout_status::failed;
    r.failure = "decoding failed on " + worker + ": " + what;
    r.reward_reason = r.failure;
  }
}

std::vector<event_peer> event_destinations(event_kind kind) {
  if (kind == event_kind::start)
    return {event_peer::sagc_controller, event_peer::scheduler, event_peer::trainer};
  return {event_peer::sagc_controller, event_peer::scheduler};
}

receiver_layout receiver_layout_of(const std::vector<ml::named_tensor>& weights) {
  receiver_layout out;
  for (const auto& [name, t] : weights) {
    sync::tensor_meta m;
    m.name = name;
    m.shape.assign(t.sizes().begin(), t.sizes().end());
    m.dtype = sync::weight_dtype::bf16;
    out.expected.push_back(std::move(m));
    if (t.scalar_type() != at::kBFloat16 || !t.is_contiguous())
      throw std::logic_error(fmt::format("rollout parameter \"{}\" is not contiguous bf16", name));
    if (!t.device().is_cpu())
      throw std::logic_error(fmt::format("rollout parameter \"{}\" is not in host memory", name));
    out.targets.push_back({static_cast<uint32_t>(out.targets.size()),
                           reinterpret_cast<uint16_t*>(t.data_ptr()),
                           static_cast<uint64_t>(t.numel())});
  }
  return out;
}

} // namespace sorl::rollout
