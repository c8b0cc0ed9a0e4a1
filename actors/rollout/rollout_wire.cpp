#include "actors/rollout/rollout_wire.hpp"

#include <algorithm>

#include "actors/rollout/request_sampling.hpp"

namespace sorl::rollout {

namespace {

msg::EventKind to_msg(event_kind k) {
  switch (k) {
    case event_kind::start:
      return msg::EventKind::START;
    case event_kind::chunk:
      return msg::EventKind::CHUNK;
    case event_kind::finish:
      return msg::EventKind::FINISH;
  }
  return msg::EventKind::FINISH;
}

event_kind from_msg(msg::EventKind k) {
  switch (k) {
    case msg::EventKind::START:
      return event_kind::start;
    case msg::EventKind::CHUNK:
      return event_kind::chunk;
    case msg::EventKind::FINISH:
      return event_kind::finish;
  }
  return event_kind::finish;
}

msg::RolloutStatus to_msg(rollout_status s) {
  switch (s) {
    case rollout_status::ok:
      return msg::RolloutStatus::OK;
    case rollout_status::failed:
      return msg::RolloutStatus::FAILED;
    case rollout_status::reward_failed:
      return msg::RolloutStatus::REWARD_FAILED;
  }
  return msg::RolloutStatus::REWARD_FAILED;
}

rollout_status from_msg(msg::RolloutStatus s) {
  switch (s) {
    case msg::RolloutStatus::OK:
      return rollout_status::ok;
    case msg::RolloutStatus::FAILED:
      return rollout_status::failed;
    case msg::RolloutStatus::REWARD_FAILED:
      return rollout_status::reward_failed;
  }
  // A status added by a newer sender is not one this reader can train on.
  return rollout_status::failed;
}

bool any_count(const speculation_counts& s) {
  return s.verify_steps != 0 || s.plain_steps != 0 || s.drafted_tokens != 0
         || s.accepted_tokens != 0 || s.draft_calls != 0 || s.draft_ns != 0 || s.verify_tokens != 0
         || s.verify_ns != 0 || s.plain_tokens != 0 || s.plain_ns != 0;
}

} // namespace

msg::FinishReason to_msg(ml::finish_reason r) {
  switch (r) {
    case ml::finish_reason::eos:
      return msg::FinishReason::EOS;
    case ml::finish_reason::length:
      return msg::FinishReason::LENGTH;
    case ml::finish_reason::stop:
      return msg::FinishReason::STOP;
    case ml::finish_reason::abort:
      return msg::FinishReason::ABORT;
  }
  return msg::FinishReason::ABORT;
}

ml::finish_reason from_msg(msg::FinishReason r) {
  switch (r) {
    case msg::FinishReason::EOS:
      return ml::finish_reason::eos;
    case msg::FinishReason::LENGTH:
      return ml::finish_reason::length;
    case msg::FinishReason::STOP:
      return ml::finish_reason::stop;
    case msg::FinishReason::ABORT:
      return ml::finish_reason::abort;
  }
  return ml::finish_reason::abort;
}

envelope to_msg(const rollout_request& r) {
  return build_envelope<msg::GenerateRequest>([&](msg::GenerateRequest::Builder b) {
    b.setRequestId(r.request_id);
    b.setStep(r.step);
    b.setGroupId(r.group_id);
    b.setSampleIndex(r.sample_index);
    b.setSplit(r.split == ml::task_split::eval ? msg::TaskSplit::EVAL : msg::TaskSplit::TRAIN);
    b.setTaskIndex(r.task_index);
    b.setSeed(r.seed);
    b.setWeightVersion(r.weight_version);
    b.setMaxNewTokens(r.max_new_tokens);
    write_sampling(b, {r.temperature, r.top_p, r.top_k});
    if (!r.replaced_from.empty())
      b.setReplacedFrom(r.replaced_from);
  });
}

rollout_request from_msg(msg::GenerateRequest::Reader r) {
  rollout_request req;
  req.request_id = r.getRequestId();
  req.step = r.getStep();
  req.group_id = r.getGroupId();
  req.sample_index = r.getSampleIndex();
  req.split = r.getSplit() == msg::TaskSplit::EVAL ? ml::task_split::eval : ml::task_split::train;
  req.task_index = r.getTaskIndex();
  req.seed = r.getSeed();
  req.weight_version = r.getWeightVersion();
  req.max_new_tokens = r.getMaxNewTokens();
  const auto sampling = read_sampling(r);
  req.temperature = sampling.temperature;
  req.top_p = sampling.top_p;
  req.top_k = sampling.top_k;
  req.replaced_from = r.getReplacedFrom();
  return req;
}

envelope to_msg(const rollout_event& ev, const std::string& worker, uint32_t in_flight) {
  return build_envelope<msg::RolloutEvent>([&](msg::RolloutEvent::Builder b) {
    b.setRequestId(ev.request_id);
    b.setStep(ev.step);
    b.setGroupId(ev.group_id);
    b.setKind(to_msg(ev.kind));
    b.setWorkerNs(ev.ns);
    b.setTokens(ev.tokens);
    b.setWorker(worker);
    b.setFinishReason(to_msg(ev.reason));
    b.setInFlight(in_flight);
  });
}

event_record from_msg(msg::RolloutEvent::Reader r) {
  event_record rec;
  rec.event.request_id = r.getRequestId();
  rec.event.step = r.getStep();
  rec.event.group_id = r.getGroupId();
  rec.event.kind = from_msg(r.getKind());
  rec.event.ns = r.getWorkerNs();
  rec.event.tokens = r.getTokens();
  rec.event.reason = from_msg(r.getFinishReason());
  rec.worker = r.getWorker();
  rec.in_flight = r.getInFlight();
  return rec;
}

envelope to_msg(const rollout_result& r, const std::string& worker, uint64_t version) {
  return build_envelope<msg::Trajectory>([&](msg::Trajectory::Builder b) {
    b.setRequestId(r.request.request_id);
    b.setStep(r.request.step);
    b.setGroupId(r.request.group_id);
    b.setSampleIndex(r.request.sample_index);
    auto prompt = b.initPromptTokens(static_cast<unsigned>(r.prompt.size()));
    for (size_t i = 0; i < r.prompt.size(); ++i)
      prompt.set(static_cast<unsigned>(i), r.prompt[i]);
    auto resp = b.initResponseTokens(static_cast<unsigned>(r.response.size()));
    for (size_t i = 0; i < r.response.size(); ++i)
      resp.set(static_cast<unsigned>(i), r.response[i]);
    b.setLossMask(kj::arrayPtr(r.loss_mask.data(), r.loss_mask.size()));
    auto lp = b.initSamplingLogprobs(static_cast<unsigned>(r.logprobs.size()));
    for (size_t i = 0; i < r.logprobs.size(); ++i)
      lp.set(static_cast<unsigned>(i), r.logprobs[i]);
    b.setReward(static_cast<float>(r.reward));
    b.setRewardReason(r.reward_reason);
    b.setFinishReason(to_msg(r.finish));
    b.setTurns(r.turns);
    b.setStartNs(r.start_ns);
    b.setEndNs(r.end_ns);
    b.setWeightVersion(version);
    b.setWorker(worker);
    b.setStatus(to_msg(r.status));
    b.setFailure(r.failure);
    b.setReplacedFrom(r.request.replaced_from);
    // Left unset with speculation off, so such a trajectory keeps the bytes it had
    // before the field existed; a reader sees all 0 either way.
    if (any_count(r.speculation)) {
      auto s = b.initSpeculation();
      s.setVerifySteps(r.speculation.verify_steps);
      s.setPlainSteps(r.speculation.plain_steps);
      s.setDraftedTokens(r.speculation.drafted_tokens);
      s.setAcceptedTokens(r.speculation.accepted_tokens);
      s.setDraftCalls(r.speculation.draft_calls);
      s.setDraftNs(r.speculation.draft_ns);
      s.setVerifyTokens(r.speculation.verify_tokens);
      s.setVerifyNs(r.speculation.verify_ns);
      s.setPlainTokens(r.speculation.plain_tokens);
      s.setPlainNs(r.speculation.plain_ns);
    }
    // Likewise left unset when all 0 (a request that could not be served).
    if (r.prefill.prompt_tokens != 0 || r.prefill.cached_tokens != 0 || r.prefill.evicted_blocks != 0) {
      auto p = b.initPrefill();
      p.setPromptTokens(r.prefill.prompt_tokens);
      p.setCachedTokens(r.prefill.cached_tokens);
      p.setEvictedBlocks(r.prefill.evicted_blocks);
    }
  });
}

trajectory_record from_msg(msg::Trajectory::Reader t) {
  trajectory_record rec;
  auto& r = rec.result;
  r.request.request_id = t.getRequestId();
  r.request.step = t.getStep();
  r.request.group_id = t.getGroupId();
  r.request.sample_index = t.getSampleIndex();
  r.request.replaced_from = t.getReplacedFrom();
  for (auto x : t.getPromptTokens())
    r.prompt.push_back(x);
  for (auto x : t.getResponseTokens())
    r.response.push_back(x);
  auto mask = t.getLossMask();
  r.loss_mask.assign(mask.begin(), mask.end());
  for (auto x : t.getSamplingLogprobs())
    r.logprobs.push_back(x);
  r.reward = t.getReward();
  r.reward_reason = t.getRewardReason();
  r.status = from_msg(t.getStatus());
  r.failure = t.getFailure();
  r.finish = from_msg(t.getFinishReason());
  r.turns = t.getTurns();
  r.start_ns = t.getStartNs();
  r.end_ns = t.getEndNs();
  const auto s = t.getSpeculation();
  r.speculation.verify_steps = s.getVerifySteps();
  r.speculation.plain_steps = s.getPlainSteps();
  r.speculation.drafted_tokens = s.getDraftedTokens();
  r.speculation.accepted_tokens = s.getAcceptedTokens();
  r.speculation.draft_calls = s.getDraftCalls();
  r.speculation.draft_ns = s.getDraftNs();
  r.speculation.verify_tokens = s.getVerifyTokens();
  r.speculation.verify_ns = s.getVerifyNs();
  r.speculation.plain_tokens = s.getPlainTokens();
  r.speculation.plain_ns = s.getPlainNs();
  const auto p = t.getPrefill();
  r.prefill.prompt_tokens = p.getPromptTokens();
  // More cached tokens than prompt tokens is a malformed message; a rate above 1 would follow.
  r.prefill.cached_tokens = std::min(p.getCachedTokens(), p.getPromptTokens());
  r.prefill.evicted_blocks = p.getEvictedBlocks();
  rec.worker = t.getWorker();
  rec.weight_version = t.getWeightVersion();
  return rec;
}

envelope to_msg(const abort_request& a) {
  return build_envelope<msg::AbortRollouts>([&](msg::AbortRollouts::Builder b) {
    b.setStep(a.step);
    auto list = b.initRequestIds(static_cast<unsigned>(a.request_ids.size()));
    for (size_t i = 0; i < a.request_ids.size(); ++i)
      list.set(static_cast<unsigned>(i), a.request_ids[i]);
    b.setReason(a.reason);
  });
}

abort_request from_msg(msg::AbortRollouts::Reader a) {
  abort_request out;
  out.step = a.getStep();
  for (auto id : a.getRequestIds())
    out.request_ids.push_back(id);
  out.reason = a.getReason();
  return out;
}

} // namespace sorl::rollout
