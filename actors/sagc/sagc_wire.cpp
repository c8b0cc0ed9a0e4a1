#include "actors/sagc/sagc_wire.hpp"

namespace sorl::sagc {

timing_event timing_event_of(const rollout::event_record& r) {
  timing_event t;
  t.request_id = r.event.request_id;
  t.step = static_cast<int64_t>(r.event.step);
  t.group_id = r.event.group_id;
  switch (r.event.kind) {
  case rollout::event_kind::start:
    t.kind = timing_kind::start;
    break;
  case rollout::event_kind::chunk:
    t.kind = timing_kind::chunk;
    break;
  case rollout::event_kind::finish:
    t.kind = r.event.reason == ml::finish_reason::abort ? timing_kind::abort : timing_kind::finish;
    break;
  }
  t.worker_ns = r.event.ns;
  t.tokens = r.event.tokens;
  t.worker = r.worker;
  return t;
}

trainer::ev::group_size_decision decision_message(const group_decision& d) {
  trainer::ev::group_size_decision m;
  m.step = static_cast<uint64_t>(d.step);
  m.group_size = static_cast<uint32_t>(d.group_size);
  m.reason = d.policy + ": " + d.reason;
  m.policy = d.policy;
  m.deadline_ns = d.deadline_ns.value_or(0);
  m.min_finished = static_cast<uint32_t>(d.min_finished);
  m.virtual_queue = d.virtual_queue;
  m.p_straggler = d.p_straggler;
  m.utility = d.utility;
  return m;
}

trainer::step_timing_reply step_timing_message(const step_report& r) {
  const step_timing& t = r.timing;
  trainer::step_timing_reply m;
  m.timing.step = static_cast<uint64_t>(t.step);
  m.timing.duration_p50_ns = t.duration_p50_ns;
  m.timing.duration_p90_ns = t.duration_p90_ns;
  m.timing.duration_max_ns = t.duration_max_ns;
  m.timing.stragglers = static_cast<uint32_t>(t.stragglers.size());
  m.timing.straggler_event = t.straggler_event;
  m.timing.threshold_ns = t.threshold_ns ? static_cast<int64_t>(*t.threshold_ns) : 0;
  m.timing.flagged_in_flight = static_cast<uint32_t>(r.flagged_in_flight);
  m.timing.aborted = static_cast<uint32_t>(t.aborted);
  m.rollouts = static_cast<uint32_t>(t.finished);
  m.rollouts_timed = static_cast<uint32_t>(t.timed);
  m.timing.groups_judged = static_cast<uint32_t>(t.groups_judged);
  m.timing.group_events = static_cast<uint32_t>(t.group_events);
  return m;
}

} // namespace sorl::sagc
