#include "actors/trainer/train_wire.hpp"

namespace sorl::trainer {

envelope to_msg(const cmd::query_group_size& c) {
  return build_envelope<msg::GroupSizeQuery>(
    [&](msg::GroupSizeQuery::Builder b) { b.setStep(c.step); });
}

envelope to_msg(const cmd::query_step_timing& c) {
  return build_envelope<msg::StepTimingQuery>(
    [&](msg::StepTimingQuery::Builder b) { b.setStep(c.step); });
}

envelope to_msg(const cmd::request_eval& c) {
  return build_envelope<msg::EvalRequest>([&](msg::EvalRequest::Builder b) {
    b.setTag(c.tag);
    b.setCount(c.count);
  });
}

envelope to_msg(const cmd::query_role_state& c) {
  return build_envelope<msg::RoleStateQuery>(
    [&](msg::RoleStateQuery::Builder b) { b.setStep(c.step); });
}

envelope to_msg(const cmd::restore_role_state& c) {
  return build_envelope<msg::RoleStateRestore>([&](msg::RoleStateRestore::Builder b) {
    b.setState(c.state);
    b.setSource(c.source);
  });
}

envelope to_msg(const cmd::request_checkpoint& c) {
  return build_envelope<msg::CheckpointRequest>([&](msg::CheckpointRequest::Builder b) {
    b.setStep(c.step);
    b.setDir(c.dir);
    b.setTrainerState(c.trainer_state);
  });
}

envelope to_msg(const ev::role_state& s) {
  return build_envelope<msg::RoleState>([&](msg::RoleState::Builder b) {
    b.setStep(s.step);
    b.setRole(s.role);
    b.setState(s.state);
    b.setOk(s.ok);
    if (!s.reason.empty())
      b.setReason(s.reason);
  });
}

envelope to_msg(const ev::role_state_restored& r) {
  return build_envelope<msg::RoleStateRestored>([&](msg::RoleStateRestored::Builder b) {
    b.setRole(r.role);
    b.setOk(r.ok);
    b.setReason(r.reason);
  });
}

envelope to_msg(const ev::learner_ready& r) {
  return build_envelope<msg::LearnerReady>([&](msg::LearnerReady::Builder b) {
    b.setVersion(r.version);
    b.setResumed(r.resumed);
    b.setTrainerState(r.trainer_state);
    b.setSource(r.source);
  });
}

envelope to_msg(const ev::eval_result& r) {
  return build_envelope<msg::EvalResult>([&](msg::EvalResult::Builder b) {
    b.setTag(r.tag);
    b.setCount(r.count);
    b.setAccuracy(r.accuracy);
    b.setMeanReward(r.mean_reward);
    b.setMeanLength(r.mean_length);
    b.setSeconds(r.seconds);
    b.setRewardFailures(r.reward_failures);
  });
}

envelope to_msg(const ev::checkpoint_done& d) {
  return build_envelope<msg::CheckpointDone>([&](msg::CheckpointDone::Builder b) {
    b.setStep(d.step);
    b.setPath(d.path);
    b.setOk(d.ok);
    b.setReason(d.reason);
  });
}

ev::learner_ready from_msg(msg::LearnerReady::Reader r) {
  return {r.getVersion(), r.getResumed(), r.getSource().cStr(), r.getTrainerState().cStr()};
}

ev::eval_result from_msg(msg::EvalResult::Reader r) {
  return {r.getTag().cStr(), r.getCount(),      r.getAccuracy(),      r.getMeanReward(),
          r.getMeanLength(),  r.getSeconds(),    r.getRewardFailures()};
}

ev::group_size_decision from_msg(msg::GroupSizeDecision::Reader d) {
  return {d.getStep(),       d.getGroupSize(),  d.getReason().cStr(),
          d.getPolicy().cStr(), d.getDeadlineNs(), d.getMinFinished(),
          d.getVirtualQueue(), d.getPStraggler(), d.getUtility()};
}

ev::step_timing from_msg(msg::StepTiming::Reader t) {
  return {t.getDurationP50Ns(),  t.getDurationP90Ns(), t.getDurationMaxNs(),
          t.getStragglers(),     t.getStragglerEvent(), t.getThresholdNs(),
          t.getFlaggedInFlight(), t.getAborted(), t.getStep(),
          t.getGroupsJudged(),   t.getGroupEvents()};
}

ev::train_result from_msg(msg::TrainResult::Reader r) {
  ev::train_result x;
  x.version = r.getVersion();
  for (auto n : r.getMetricNames())
    x.metric_names.emplace_back(n.cStr());
  for (auto v : r.getMetricValues())
    x.metric_values.push_back(v);
  x.ok = r.getOk();
  x.reason = r.getReason().cStr();
  return x;
}

ev::checkpoint_done from_msg(msg::CheckpointDone::Reader d) {
  return {d.getStep(), d.getPath().cStr(), d.getOk(), d.getReason().cStr()};
}

ev::role_state from_msg(msg::RoleState::Reader r) {
  return {r.getStep(), r.getRole().cStr(), r.getState().cStr(), r.getOk(), r.getReason().cStr()};
}

ev::role_state_restored from_msg(msg::RoleStateRestored::Reader r) {
  return {r.getRole().cStr(), r.getOk(), r.getReason().cStr()};
}


// -- the sagc_controller's side ---------------------------------------------------------

envelope to_msg(const ev::group_size_decision& d) {
  return build_envelope<msg::GroupSizeDecision>([&](msg::GroupSizeDecision::Builder b) {
    b.setStep(d.step);
    b.setGroupSize(d.group_size);
    b.setReason(d.reason);
    b.setPolicy(d.policy);
    b.setVirtualQueue(d.virtual_queue);
    b.setPStraggler(d.p_straggler);
    b.setUtility(d.utility);
    b.setDeadlineNs(d.deadline_ns);
    b.setMinFinished(d.min_finished);
  });
}

envelope to_msg(const step_timing_reply& t) {
  return build_envelope<msg::StepTiming>([&](msg::StepTiming::Builder b) {
    b.setStep(t.timing.step);
    b.setRollouts(t.rollouts);
    b.setDurationP50Ns(t.timing.duration_p50_ns);
    b.setDurationP90Ns(t.timing.duration_p90_ns);
    b.setDurationMaxNs(t.timing.duration_max_ns);
    b.setStragglers(t.timing.stragglers);
    b.setStragglerEvent(t.timing.straggler_event);
    b.setThresholdNs(t.timing.threshold_ns);
    b.setFlaggedInFlight(t.timing.flagged_in_flight);
    b.setAborted(t.timing.aborted);
    b.setRolloutsTimed(t.rollouts_timed);
    b.setGroupsJudged(t.timing.groups_judged);
    b.setGroupEvents(t.timing.group_events);
  });
}

cmd::query_group_size from_msg(msg::GroupSizeQuery::Reader q) {
  return {q.getStep()};
}

cmd::query_step_timing from_msg(msg::StepTimingQuery::Reader q) {
  return {q.getStep()};
}

cmd::query_role_state from_msg(msg::RoleStateQuery::Reader q) {
  return {"", q.getStep()};
}

cmd::restore_role_state from_msg(msg::RoleStateRestore::Reader r) {
  return {"", r.getState().cStr(), r.getSource().cStr()};
}

// -- the learner's side ---------------------------------------------------------------------

envelope to_msg(const cmd::train& c) {
  return build_envelope<msg::TrainBatch>([&](msg::TrainBatch::Builder b) {
    b.setStep(c.step);
    auto ids = b.initRequestIds(static_cast<unsigned>(c.request_ids.size()));
    for (size_t i = 0; i < c.request_ids.size(); ++i)
      ids.set(static_cast<unsigned>(i), c.request_ids[i]);
  });
}

cmd::train from_msg(msg::TrainBatch::Reader b) {
  cmd::train c;
  c.step = b.getStep();
  for (auto id : b.getRequestIds())
    c.request_ids.push_back(id);
  return c;
}

envelope to_msg(const ev::train_result& r, uint64_t step) {
  return build_envelope<msg::TrainResult>([&](msg::TrainResult::Builder b) {
    b.setStep(step);
    b.setVersion(r.version);
    if (!r.ok) {
      b.setOk(false);
      b.setReason(r.reason);
      return;
    }
    auto names = b.initMetricNames(static_cast<unsigned>(r.metric_names.size()));
    auto values = b.initMetricValues(static_cast<unsigned>(r.metric_values.size()));
    for (size_t i = 0; i < r.metric_names.size(); ++i)
      names.set(static_cast<unsigned>(i), r.metric_names[i]);
    for (size_t i = 0; i < r.metric_values.size(); ++i)
      values.set(static_cast<unsigned>(i), r.metric_values[i]);
    b.setOk(true);
  });
}

cmd::request_eval from_msg(msg::EvalRequest::Reader r) {
  return {r.getTag().cStr(), r.getCount()};
}

cmd::request_checkpoint from_msg(msg::CheckpointRequest::Reader r) {
  return {r.getStep(), r.getDir().cStr(), r.getTrainerState().cStr()};
}

} // namespace sorl::trainer
