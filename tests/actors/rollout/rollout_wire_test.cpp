// The bytes on the wire: what the encoders of actors/rollout/rollout_wire.hpp send must be the
// bytes the shells built themselves before. The reference encoders below are the shells' own
// code (actors/rollout/worker_actor.cpp, actors/trainer/trainer_actor.cpp and
// actors/scheduler/scheduler_actor.cpp as they were when rollout_wire was introduced), kept
// verbatim apart from their arguments, except the GenerateRequest's: it no longer carries
// groupSize and the Float32 copies of temperature and top-p, which no reader took.

#include <catch2/catch.hpp>

#include "tests/support/same_bytes.hpp"

#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

#include "actors/rollout/rollout_wire.hpp"

// The trainer and scheduler shells include rollout_wire.hpp: it must reach no libtorch header.
// Every ATen / torch / c10 header includes c10/macros/Macros.h, and this test is built without
// the forced c10 include of tests/CMakeLists.txt.
#ifdef C10_MACROS_MACROS_H_
#error "actors/rollout/rollout_wire.hpp reaches a libtorch header"
#endif

using namespace sorl;
using namespace sorl::rollout;

namespace {

namespace reference {

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

/// The worker's encode_event.
envelope encode_event(const rollout::rollout_event& ev, const std::string& worker,
                      uint32_t in_flight) {
  return build_envelope<msg::RolloutEvent>([&](msg::RolloutEvent::Builder b) {
    b.setRequestId(ev.request_id);
    b.setStep(ev.step);
    b.setGroupId(ev.group_id);
    b.setKind(ev.kind == rollout::event_kind::start   ? msg::EventKind::START
              : ev.kind == rollout::event_kind::chunk ? msg::EventKind::CHUNK
                                                      : msg::EventKind::FINISH);
    b.setWorkerNs(ev.ns);
    b.setTokens(ev.tokens);
    b.setWorker(worker);
    b.setFinishReason(to_msg(ev.reason));
    b.setInFlight(in_flight);
  });
}

/// The worker's encode_trajectory.
envelope encode_trajectory(const rollout::rollout_result& r, const std::string& worker,
                           uint64_t version) {
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
    b.setStatus(r.status == rollout::rollout_status::ok       ? msg::RolloutStatus::OK
                : r.status == rollout::rollout_status::failed ? msg::RolloutStatus::FAILED
                                                               : msg::RolloutStatus::REWARD_FAILED);
    b.setFailure(r.failure);
    b.setReplacedFrom(r.request.replaced_from);
  });
}

/// The trainer's GenerateRequest of cmd::generate (one request; the command's shared fields
/// taken from `r`), without groupSize and the Float32 sampling fields.
envelope encode_request(const rollout::rollout_request& r) {
  return build_envelope<msg::GenerateRequest>([&](msg::GenerateRequest::Builder b) {
    b.setRequestId(r.request_id);
    b.setStep(r.step);
    b.setGroupId(r.group_id);
    b.setSampleIndex(r.sample_index);
    b.setSplit(msg::TaskSplit::TRAIN);
    b.setTaskIndex(r.task_index);
    b.setSeed(r.seed);
    b.setWeightVersion(r.weight_version);
    b.setMaxNewTokens(r.max_new_tokens);
    b.setTemperature64(r.temperature);
    b.setTopP64(r.top_p);
    b.setTopK(r.top_k);
  });
}

/// The scheduler's mark_replaced.
envelope mark_replaced(const envelope& request, const std::string& lost) {
  std::optional<envelope> marked;
  auto err = with_envelope<msg::GenerateRequest>(request, [&](msg::GenerateRequest::Reader r) {
    capnp::MallocMessageBuilder builder;
    builder.setRoot(r);
    builder.getRoot<msg::GenerateRequest>().setReplacedFrom(lost);
    marked = make_envelope<msg::GenerateRequest>(builder);
  });
  REQUIRE_FALSE(err);
  return *marked;
}

/// The trainer's AbortRollouts of cmd::abort_rollouts.
envelope encode_abort(uint64_t step, const std::vector<uint64_t>& request_ids,
                      const std::string& reason) {
  return build_envelope<msg::AbortRollouts>([&](msg::AbortRollouts::Builder b) {
    b.setStep(step);
    auto list = b.initRequestIds(static_cast<unsigned>(request_ids.size()));
    for (size_t i = 0; i < request_ids.size(); ++i)
      list.set(static_cast<unsigned>(i), request_ids[i]);
    b.setReason(reason);
  });
}

} // namespace reference

using sorl::test::same_bytes;

template <class Schema, class T = decltype(from_msg(std::declval<typename Schema::Reader>()))>
T decoded(const envelope& e) {
  T out;
  REQUIRE_FALSE(with_envelope<Schema>(e, [&](typename Schema::Reader r) { out = from_msg(r); }));
  return out;
}

rollout_request a_request() {
  rollout_request r;
  r.request_id = 41;
  r.step = 7;
  r.group_id = 12;
  r.sample_index = 3;
  r.split = ml::task_split::train;
  r.task_index = 905;
  r.seed = 0xDEADBEEFCAFEull;
  r.weight_version = 6;
  r.max_new_tokens = 96;
  r.temperature = 0.7; // not a float: the Float64 field must carry it exactly
  r.top_p = 0.8;
  r.top_k = 20;
  return r;
}

rollout_result a_result(rollout_status status) {
  rollout_result r;
  r.request = a_request();
  r.request.replaced_from = "rollout_worker#1@n0";
  r.prompt = {101, 7, -3, 2048};
  r.response = {5, 6, 7};
  r.loss_mask = {1, 0, 1};
  r.logprobs = {-0.25f, 0.0f, -1.5f};
  r.reward = 0.75; // exact in Float32
  r.reward_reason = "correct";
  r.status = status;
  r.failure = status == rollout_status::ok ? "" : "scorer threw";
  r.finish = ml::finish_reason::stop;
  r.turns = 2;
  r.start_ns = 1'000'000'123;
  r.end_ns = 1'500'000'456;
  return r;
}

} // namespace

TEST_CASE("a rollout event is byte for byte what the worker's shell sent and decodes back") {
  const event_kind kinds[] = {event_kind::start, event_kind::chunk, event_kind::finish};
  const ml::finish_reason reasons[] = {ml::finish_reason::eos, ml::finish_reason::length,
                                       ml::finish_reason::stop, ml::finish_reason::abort};
  for (auto kind : kinds)
    for (auto reason : reasons) {
      rollout_event ev;
      ev.request_id = 41;
      ev.step = 7;
      ev.group_id = 12;
      ev.kind = kind;
      ev.ns = -5; // another clock's times are never compared, but the sign must survive
      ev.tokens = 33;
      ev.reason = reason;
      auto e = to_msg(ev, "rollout_worker#2@n1", 9);
      CHECK(same_bytes(e, reference::encode_event(ev, "rollout_worker#2@n1", 9)));
      auto back = decoded<msg::RolloutEvent>(e);
      CHECK(back.event.request_id == 41);
      CHECK(back.event.step == 7);
      CHECK(back.event.group_id == 12);
      CHECK(back.event.kind == kind);
      CHECK(back.event.ns == -5);
      CHECK(back.event.tokens == 33);
      CHECK(back.event.reason == reason);
      CHECK(back.worker == "rollout_worker#2@n1");
      CHECK(back.in_flight == 9);
    }
}

TEST_CASE("a trajectory is byte for byte what the worker's shell sent and decodes back") {
  for (auto status : {rollout_status::ok, rollout_status::failed, rollout_status::reward_failed}) {
    const auto r = a_result(status);
    auto e = to_msg(r, "rollout_worker#0@n0", 6);
    CHECK(same_bytes(e, reference::encode_trajectory(r, "rollout_worker#0@n0", 6)));
    auto back = decoded<msg::Trajectory>(e);
    const auto& b = back.result;
    CHECK(b.request.request_id == 41);
    CHECK(b.request.step == 7);
    CHECK(b.request.group_id == 12);
    CHECK(b.request.sample_index == 3);
    CHECK(b.request.replaced_from == "rollout_worker#1@n0");
    CHECK(b.prompt == std::vector<int32_t>{101, 7, -3, 2048});
    CHECK(b.response == std::vector<int32_t>{5, 6, 7});
    CHECK(b.loss_mask == std::vector<uint8_t>{1, 0, 1});
    CHECK(b.logprobs == std::vector<float>{-0.25f, 0.0f, -1.5f});
    CHECK(b.reward == 0.75);
    CHECK(b.reward_reason == "correct");
    CHECK(b.status == status);
    CHECK(b.failure == r.failure);
    CHECK(b.finish == ml::finish_reason::stop);
    CHECK(b.turns == 2);
    CHECK(b.start_ns == 1'000'000'123);
    CHECK(b.end_ns == 1'500'000'456);
    CHECK(back.worker == "rollout_worker#0@n0");
    CHECK(back.weight_version == 6);
  }
}

TEST_CASE("an empty trajectory (a failed request) keeps the worker shell's bytes") {
  rollout_result r;
  r.request.request_id = 3;
  r.status = rollout_status::failed;
  r.failure = "the worker holds no weights yet";
  auto e = to_msg(r, "w", 0);
  CHECK(same_bytes(e, reference::encode_trajectory(r, "w", 0)));
  auto back = decoded<msg::Trajectory>(e);
  CHECK(back.result.prompt.empty());
  CHECK(back.result.response.empty());
  CHECK(back.result.status == rollout_status::failed);
  CHECK(back.result.failure == "the worker holds no weights yet");
}

TEST_CASE("a trajectory's speculation counts decode back and cost no bytes when all 0") {
  auto r = a_result(rollout_status::ok);
  // The ns fields need all 64 bits.
  r.speculation = {3, 1, 12, 9, 4, (1ull << 40) + 8000, 14, (1ull << 41) + 7, 2, (1ull << 42) + 5};
  auto e = to_msg(r, "rollout_worker#0@n0", 6);
  auto with_counts = [&](msg::Trajectory::Builder b) {
    auto s = b.initSpeculation();
    s.setVerifySteps(3);
    s.setPlainSteps(1);
    s.setDraftedTokens(12);
    s.setAcceptedTokens(9);
    s.setDraftCalls(4);
    s.setDraftNs((1ull << 40) + 8000);
    s.setVerifyTokens(14);
    s.setVerifyNs((1ull << 41) + 7);
    s.setPlainTokens(2);
    s.setPlainNs((1ull << 42) + 5);
  };
  // The reference encoder's bytes with the counts added by hand: nothing else moved.
  auto reference_bytes = reference::encode_trajectory(r, "rollout_worker#0@n0", 6);
  std::optional<envelope> expected;
  REQUIRE_FALSE(with_envelope<msg::Trajectory>(reference_bytes, [&](msg::Trajectory::Reader t) {
    capnp::MallocMessageBuilder builder;
    builder.setRoot(t);
    with_counts(builder.getRoot<msg::Trajectory>());
    expected = make_envelope<msg::Trajectory>(builder);
  }));
  CHECK(same_bytes(e, *expected));
  const auto s = decoded<msg::Trajectory>(e).result.speculation;
  CHECK(s.verify_steps == 3);
  CHECK(s.plain_steps == 1);
  CHECK(s.drafted_tokens == 12);
  CHECK(s.accepted_tokens == 9);
  CHECK(s.draft_calls == 4);
  CHECK(s.draft_ns == (1ull << 40) + 8000);
  CHECK(s.verify_tokens == 14);
  CHECK(s.verify_ns == (1ull << 41) + 7);
  CHECK(s.plain_tokens == 2);
  CHECK(s.plain_ns == (1ull << 42) + 5);

  // Any single non-zero count is sent; all 0 leaves the field unset.
  r.speculation = {};
  r.speculation.draft_calls = 1;
  REQUIRE_FALSE(with_envelope<msg::Trajectory>(to_msg(r, "w", 0), [](msg::Trajectory::Reader t) {
    CHECK(t.hasSpeculation());
    CHECK(t.getSpeculation().getDraftCalls() == 1);
  }));
  r.speculation = {};
  auto plain = to_msg(r, "w", 0);
  CHECK(same_bytes(plain, reference::encode_trajectory(r, "w", 0)));
  REQUIRE_FALSE(with_envelope<msg::Trajectory>(
    plain, [](msg::Trajectory::Reader t) { CHECK_FALSE(t.hasSpeculation()); }));
  const auto zero = decoded<msg::Trajectory>(plain).result.speculation;
  CHECK(zero.verify_steps == 0);
  CHECK(zero.accepted_tokens == 0);
  CHECK(zero.draft_ns == 0);
}

TEST_CASE("a generate request is the trainer's and the scheduler's bytes and decodes back") {
  auto req = a_request();
  auto e = to_msg(req);
  CHECK(same_bytes(e, reference::encode_request(req)));
  // Re-placed by the scheduler: the same request with the lost worker's name.
  auto marked = req;
  marked.replaced_from = "rollout_worker#4@n2";
  CHECK(same_bytes(to_msg(marked), reference::mark_replaced(e, "rollout_worker#4@n2")));

  auto eval = req;
  eval.split = ml::task_split::eval;
  for (const auto& r : {req, marked, eval}) {
    auto back = decoded<msg::GenerateRequest>(to_msg(r));
    CHECK(back.request_id == 41);
    CHECK(back.step == 7);
    CHECK(back.group_id == 12);
    CHECK(back.sample_index == 3);
    CHECK(back.split == r.split);
    CHECK(back.task_index == 905);
    CHECK(back.seed == 0xDEADBEEFCAFEull);
    CHECK(back.weight_version == 6);
    CHECK(back.max_new_tokens == 96);
    CHECK(back.temperature == 0.7); // exact, not 0.699999988079071
    CHECK(back.top_p == 0.8);
    CHECK(back.top_k == 20);
    CHECK(back.replaced_from == r.replaced_from);
  }
  // Fields no reader takes are not written: G, and the Float32 copies of the sampling values.
  REQUIRE_FALSE(with_envelope<msg::GenerateRequest>(e, [](msg::GenerateRequest::Reader r) {
    CHECK(r.getGroupSize() == 0);
    CHECK(r.getTemperature() == 0.0f);
    CHECK(r.getTopP() == 0.0f);
    CHECK(r.getTemperature64() == 0.7);
    CHECK(r.getTopP64() == 0.8);
  }));
}

TEST_CASE("a generate request's sampling is read from Float64 fields, else from Float32 ones") {
  // A sender that set both (as senders did before the Float32 copies were dropped), and one
  // that predates the Float64 fields, which are then NaN.
  const bool with_float64 = GENERATE(true, false);
  auto e = build_envelope<msg::GenerateRequest>([&](msg::GenerateRequest::Builder b) {
    b.setTemperature(0.5f);
    b.setTopP(0.25f);
    b.setTopK(4);
    if (with_float64) {
      b.setTemperature64(0.7);
      b.setTopP64(0.8);
    }
  });
  auto back = decoded<msg::GenerateRequest>(e);
  CHECK(back.temperature == (with_float64 ? 0.7 : 0.5));
  CHECK(back.top_p == (with_float64 ? 0.8 : 0.25));
  CHECK(back.top_k == 4);
}

TEST_CASE("an abort is byte for byte what the trainer's shell sent and decodes back") {
  abort_request a;
  a.step = 11;
  a.request_ids = {4, 9, 1ull << 40};
  a.reason = "deadline";
  auto e = to_msg(a);
  CHECK(same_bytes(e, reference::encode_abort(11, {4, 9, 1ull << 40}, "deadline")));
  auto back = decoded<msg::AbortRollouts>(e);
  CHECK(back.step == 11);
  CHECK(back.request_ids == std::vector<uint64_t>{4, 9, 1ull << 40});
  CHECK(back.reason == "deadline");
}

TEST_CASE("a trajectory's prefill counts decode back, cost no bytes when all 0 and never exceed the prompt") {
  auto r = a_result(rollout_status::ok);
  r.prefill = {4000000000u, 3999999999u, 17};
  const auto got = decoded<msg::Trajectory>(to_msg(r, "w", 0)).result.prefill;
  CHECK(got.prompt_tokens == 4000000000u);
  CHECK(got.cached_tokens == 3999999999u);
  CHECK(got.evicted_blocks == 17);
  r.prefill = {};
  const auto plain = to_msg(r, "w", 0);
  CHECK(same_bytes(plain, reference::encode_trajectory(r, "w", 0)));
  REQUIRE_FALSE(with_envelope<msg::Trajectory>(plain, [](msg::Trajectory::Reader t) { CHECK_FALSE(t.hasPrefill()); }));
  // A sender that claims more cached than prompt tokens: the reader caps them at the prompt,
  // so a step's hit rate stays within [0, 1].
  std::optional<envelope> hostile;
  REQUIRE_FALSE(with_envelope<msg::Trajectory>(plain, [&](msg::Trajectory::Reader t) {
    capnp::MallocMessageBuilder builder;
    builder.setRoot(t);
    auto p = builder.getRoot<msg::Trajectory>().initPrefill();
    p.setPromptTokens(10);
    p.setCachedTokens(50);
    hostile = make_envelope<msg::Trajectory>(builder);
  }));
  const auto capped = decoded<msg::Trajectory>(*hostile).result.prefill;
  CHECK(capped.prompt_tokens == 10);
  CHECK(capped.cached_tokens == 10);
}
