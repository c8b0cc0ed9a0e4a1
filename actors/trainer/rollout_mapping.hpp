#pragma once

// The trainer's side of the rollout protocol, as pure functions between the step driver's
// events and commands (step_driver.hpp) and the rollout protocol's plain structs
// (actors/rollout/rollout_types.hpp). The trainer shell decodes and encodes the messages
// through actors/rollout/rollout_wire.hpp and maps them here, so it reads no field itself.

#include <optional>
#include <vector>

#include "actors/rollout/rollout_types.hpp"
#include "actors/trainer/step_driver.hpp"

namespace sorl::trainer {

/// The GenerateRequests of `c`, one per `c.requests` entry in its order: its ids, task index
/// and seed, with the command's weight version, per-turn token budget and sampling
/// parameters; split train, no replaced_from. The spec's group_size stays with the driver
/// (no reader of the request needs G).
inline std::vector<rollout::rollout_request> requests_of(const cmd::generate& c) {
  std::vector<rollout::rollout_request> out;
  out.reserve(c.requests.size());
  for (const auto& r : c.requests) {
    rollout::rollout_request req;
    req.request_id = r.request_id;
    req.step = r.step;
    req.group_id = r.group_id;
    req.sample_index = r.sample_index;
    req.task_index = r.task_index;
    req.seed = r.seed;
    req.weight_version = c.weight_version;
    req.max_new_tokens = c.max_new_tokens;
    req.temperature = c.temperature;
    req.top_p = c.top_p;
    req.top_k = c.top_k;
    out.push_back(std::move(req));
  }
  return out;
}

/// The driver's event of a finished rollout: ids, reward (the worker's Float32, widened),
/// outcome, failure, worker, policy tokens (the sum of the loss mask), finish reason (stop and
/// abort are `other`), whether the scheduler re-placed it (replaced_from non-empty), its
/// speculation and prefill counts and its duration on the worker's clock.
inline ev::rollout_finished finished_of(const rollout::trajectory_record& t) {
  const auto& r = t.result;
  ev::rollout_finished x;
  x.request_id = r.request.request_id;
  x.step = r.request.step;
  x.group_id = r.request.group_id;
  x.sample_index = r.request.sample_index;
  x.reward = r.reward;
  x.outcome = r.status == rollout::rollout_status::ok       ? rollout_outcome::ok
              : r.status == rollout::rollout_status::failed ? rollout_outcome::failed
                                                            : rollout_outcome::reward_failed;
  x.failure = r.failure;
  x.worker = t.worker;
  for (auto m : r.loss_mask)
    x.policy_tokens += m;
  x.finish = r.finish == ml::finish_reason::eos      ? ev::finish_reason::eos
             : r.finish == ml::finish_reason::length ? ev::finish_reason::length
                                                     : ev::finish_reason::other;
  x.replaced = !r.request.replaced_from.empty();
  const auto& s = r.speculation;
  x.spec = {s.verify_steps, s.plain_steps, s.drafted_tokens, s.accepted_tokens, s.draft_calls,
            s.draft_ns,       s.verify_tokens, s.verify_ns,    s.plain_tokens,    s.plain_ns};
  x.kv = {r.prefill.prompt_tokens, r.prefill.cached_tokens, r.prefill.evicted_blocks};
  x.duration_ns = r.end_ns > r.start_ns ? r.end_ns - r.start_ns : 0;
  return x;
}

/// The driver's event of a rollout event: of a rollout's events the driver only notes where
/// it started (for the watchdog's message), so chunk and finish events give none.
inline std::optional<ev::rollout_started> started_of(const rollout::event_record& e) {
  if (e.event.kind != rollout::event_kind::start)
    return std::nullopt;
  return ev::rollout_started{e.event.request_id, e.worker};
}

} // namespace sorl::trainer
