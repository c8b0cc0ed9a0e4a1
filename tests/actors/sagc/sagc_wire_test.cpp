// The sagc_controller's messages (actors/sagc/sagc_wire.hpp): its replies must be the bytes
// its shell built itself before they went through the train codec, and a RolloutEvent must
// become the timing event the shell read from its getters. The reference code below is the
// shell's own (actors/sagc/controller_actor.cpp as it was), kept verbatim apart from
// returning its result instead of sending or observing it.

#include <catch2/catch.hpp>

#include <cmath>
#include <optional>
#include <string>

#include "actors/sagc/sagc_wire.hpp"
#include "tests/support/same_bytes.hpp"

using namespace sorl;
using sorl::test::same_bytes;

namespace {

namespace reference {

envelope decision(uint64_t step, const sagc::group_decision& d) {
  return build_envelope<msg::GroupSizeDecision>([&](msg::GroupSizeDecision::Builder b) {
    b.setStep(step);
    b.setGroupSize(static_cast<uint32_t>(d.group_size));
    b.setReason(d.policy + ": " + d.reason);
    b.setPolicy(d.policy);
    b.setVirtualQueue(d.virtual_queue);
    b.setPStraggler(d.p_straggler);
    b.setUtility(d.utility);
    b.setDeadlineNs(d.deadline_ns.value_or(0));
    b.setMinFinished(static_cast<uint32_t>(d.min_finished));
  });
}

envelope step_timing(uint64_t step, const sagc::step_timing& t, uint32_t flagged) {
  return build_envelope<msg::StepTiming>([&](msg::StepTiming::Builder b) {
    b.setStep(step);
    b.setRollouts(static_cast<uint32_t>(t.finished));
    b.setDurationP50Ns(t.duration_p50_ns);
    b.setDurationP90Ns(t.duration_p90_ns);
    b.setDurationMaxNs(t.duration_max_ns);
    b.setStragglers(static_cast<uint32_t>(t.stragglers.size()));
    b.setStragglerEvent(t.straggler_event);
    b.setThresholdNs(t.threshold_ns ? static_cast<int64_t>(*t.threshold_ns) : 0);
    b.setFlaggedInFlight(flagged);
    b.setAborted(static_cast<uint32_t>(t.aborted));
    b.setRolloutsTimed(static_cast<uint32_t>(t.timed));
    b.setGroupsJudged(static_cast<uint32_t>(t.groups_judged));
    b.setGroupEvents(static_cast<uint32_t>(t.group_events));
  });
}

sagc::timing_event timing_event(msg::RolloutEvent::Reader ev) {
  sagc::timing_event t;
  t.request_id = ev.getRequestId();
  t.step = static_cast<int64_t>(ev.getStep());
  t.group_id = ev.getGroupId();
  switch (ev.getKind()) {
  case msg::EventKind::START:
    t.kind = sagc::timing_kind::start;
    break;
  case msg::EventKind::CHUNK:
    t.kind = sagc::timing_kind::chunk;
    break;
  case msg::EventKind::FINISH:
    t.kind = ev.getFinishReason() == msg::FinishReason::ABORT ? sagc::timing_kind::abort
                                                              : sagc::timing_kind::finish;
    break;
  }
  t.worker_ns = ev.getWorkerNs();
  t.tokens = ev.getTokens();
  t.worker = ev.getWorker();
  return t;
}

} // namespace reference

constexpr int64_t s = 1'000'000'000; // ns per second

envelope rollout_event(msg::EventKind kind, msg::FinishReason reason) {
  return build_envelope<msg::RolloutEvent>([&](msg::RolloutEvent::Builder b) {
    b.setRequestId(0x0102030405060708ULL);
    b.setStep(17);
    b.setGroupId(9);
    b.setKind(kind);
    b.setWorkerNs(-3 * s); // another process's clock: any value, even negative
    b.setTokens(4000000000U);
    b.setWorker("rollout_worker#1@node-b");
    b.setFinishReason(reason);
    b.setInFlight(5);
  });
}

} // namespace

TEST_CASE("the controller's group-size decisions keep the shell's bytes", "[sagc_wire]") {
  sagc::group_decision d;
  d.step = 12;
  d.group_size = 6;
  d.policy = "sagc";
  d.reason = "Q=0.5 window k=1/8 > thr=2s p=0.167 -> G=6";
  d.virtual_queue = 0.5;
  d.p_straggler = 0.75;
  d.utility = 1 - 1.0 / 6;
  SECTION("sagc, no deadline") {
    CHECK(same_bytes(trainer::to_msg(sagc::decision_message(d)), reference::decision(12, d)));
    const auto m = sagc::decision_message(d);
    CHECK(m.step == 12);
    CHECK(m.group_size == 6);
    CHECK(m.reason == "sagc: Q=0.5 window k=1/8 > thr=2s p=0.167 -> G=6");
    CHECK(m.policy == "sagc");
    CHECK(m.deadline_ns == 0);
    CHECK(m.min_finished == 0);
    CHECK(m.virtual_queue == 0.5);
    CHECK(m.p_straggler == 0.75);
    CHECK(m.utility == 1 - 1.0 / 6);
  }
  SECTION("deadline, with its budget and g_min") {
    d.policy = "deadline";
    d.deadline_ns = 6 * s;
    d.min_finished = 2;
    d.p_straggler = std::nan("");
    CHECK(same_bytes(trainer::to_msg(sagc::decision_message(d)), reference::decision(12, d)));
    const auto m = sagc::decision_message(d);
    CHECK(m.deadline_ns == 6 * s);
    CHECK(m.min_finished == 2);
    CHECK(std::isnan(m.p_straggler));
  }
}

TEST_CASE("the controller's step timings keep the shell's bytes", "[sagc_wire]") {
  sagc::step_report r;
  r.timing.step = 4;
  r.timing.started = 34;
  r.timing.finished = 32;
  r.timing.aborted = 1;
  r.timing.running = 1;
  r.timing.timed = 31;
  r.timing.duration_p50_ns = 1 * s;
  r.timing.duration_p90_ns = 2 * s;
  r.timing.duration_max_ns = 7 * s;
  r.timing.threshold_ns = 3.75e9 + 0.75; // truncated to whole ns on the wire
  r.timing.stragglers.resize(2);
  r.timing.straggler_event = true;
  r.timing.groups_judged = 4;
  r.timing.group_events = 1;
  r.flagged_in_flight = 3;
  SECTION("with a threshold") {
    CHECK(same_bytes(trainer::to_msg(sagc::step_timing_message(r)),
                     reference::step_timing(4, r.timing, 3)));
    const auto m = sagc::step_timing_message(r);
    CHECK(m.timing.step == 4);
    CHECK(m.timing.duration_p50_ns == 1 * s);
    CHECK(m.timing.duration_p90_ns == 2 * s);
    CHECK(m.timing.duration_max_ns == 7 * s);
    CHECK(m.timing.stragglers == 2);
    CHECK(m.timing.straggler_event);
    CHECK(m.timing.threshold_ns == 3'750'000'000);
    CHECK(m.timing.flagged_in_flight == 3);
    CHECK(m.timing.aborted == 1);
    CHECK(m.rollouts == 32);
    CHECK(m.rollouts_timed == 31);
    CHECK(m.timing.groups_judged == 4);
    CHECK(m.timing.group_events == 1);
  }
  SECTION("before the window has a threshold") {
    r.timing.threshold_ns.reset();
    CHECK(same_bytes(trainer::to_msg(sagc::step_timing_message(r)),
                     reference::step_timing(4, r.timing, 3)));
    CHECK(sagc::step_timing_message(r).timing.threshold_ns == 0);
  }
}

TEST_CASE("a rollout event becomes the timing event the shell read from it", "[sagc_wire]") {
  struct kase {
    msg::EventKind kind;
    msg::FinishReason reason;
    sagc::timing_kind expected;
  };
  for (const kase& k :
       {kase{msg::EventKind::START, msg::FinishReason::EOS, sagc::timing_kind::start},
        kase{msg::EventKind::CHUNK, msg::FinishReason::ABORT, sagc::timing_kind::chunk},
        kase{msg::EventKind::FINISH, msg::FinishReason::EOS, sagc::timing_kind::finish},
        kase{msg::EventKind::FINISH, msg::FinishReason::LENGTH, sagc::timing_kind::finish},
        kase{msg::EventKind::FINISH, msg::FinishReason::STOP, sagc::timing_kind::finish},
        kase{msg::EventKind::FINISH, msg::FinishReason::ABORT, sagc::timing_kind::abort}}) {
    auto err = with_envelope<msg::RolloutEvent>(
      rollout_event(k.kind, k.reason), [&](msg::RolloutEvent::Reader r) {
        const sagc::timing_event t = sagc::timing_event_of(rollout::from_msg(r));
        const sagc::timing_event ref = reference::timing_event(r);
        CHECK(t.kind == k.expected);
        CHECK(t.kind == ref.kind);
        CHECK(t.request_id == 0x0102030405060708ULL);
        CHECK(t.step == 17);
        CHECK(t.group_id == 9);
        CHECK(t.worker_ns == -3 * s);
        CHECK(t.tokens == 4000000000);
        CHECK(t.worker == "rollout_worker#1@node-b");
        CHECK(t.request_id == ref.request_id);
        CHECK(t.step == ref.step);
        CHECK(t.group_id == ref.group_id);
        CHECK(t.worker_ns == ref.worker_ns);
        CHECK(t.tokens == ref.tokens);
        CHECK(t.worker == ref.worker);
      });
    CHECK_FALSE(err);
  }
}
