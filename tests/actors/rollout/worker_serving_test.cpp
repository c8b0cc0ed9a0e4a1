// The rollout worker shell serves requests: a served request sends its start event to the
// controller, the scheduler and the trainer, its finish event to the first two, and its
// trajectory, carrying the request's ids, to the trainer; its seed alone decides the tokens;
// an aborted rollout sends an abort finish event and no trajectory. (Requests it cannot serve
// and weight versions: worker_actor_test.cpp.)

#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/learner/learner_actor.hpp"
#include "actors/rollout/worker_actor.hpp"
#include "actors/sync/publisher_actor.hpp"
#include "messages/rollout.capnp.h"
#include "messages/sync.capnp.h"
#include "messages/train.capnp.h"
#include "runtime/actor_types.hpp"
#include "runtime/config.hpp"
#include "runtime/envelope.hpp"
#include "tests/support/actor_system.hpp"

using namespace sorl;
using sorl::test::expect;
using sorl::test::test_context;
using sorl::test::test_system_config;


namespace {

/// A rollout worker (tiny preset, arithmetic) holding weights version 0: a learner's fresh
/// policy reaches it through a sync publisher, as in a run. The trainer (also the directory),
/// the scheduler and the SAGC controller are played by the test. Stopped at the end.
struct worker_harness {
  test_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor trainer{sys};
  caf::scoped_actor scheduler{sys};
  caf::scoped_actor sagc{sys};
  experiment_config exp;
  caf::actor learner, publisher, worker;

  worker_harness() {
    // Timing chunks off: how far a rollout gets before an abort arrives varies from run to
    // run, and should not change which events it sends.
    exp.rollout.chunk_tokens = 0;
    auto dir = caf::actor_cast<caf::actor>(trainer);
    learner = spawn_learner(sys, test_context(exp, "learner", dir));
    publisher = spawn_sync_publisher(sys, test_context(exp, "sync_publisher", dir));
    worker = spawn_rollout_worker(sys, test_context(exp, "rollout_worker", dir));
    std::vector<peer_info> roster{{"trainer", 0, "test", dir},
                                  {"scheduler", 0, "test", caf::actor_cast<caf::actor>(scheduler)},
                                  {"sagc_controller", 0, "test", caf::actor_cast<caf::actor>(sagc)},
                                  {"sync_publisher", 0, "test", publisher},
                                  {"learner", 0, "test", learner},
                                  {"rollout_worker", 0, "test", worker}};
    // The learner sends version 0 on its roster: the others know their peers by then.
    for (auto& a : {worker, publisher, learner})
      trainer->send(a, roster_atom::value, roster);
    // The learner sends its LearnerReady to the trainer after handing version 0 to the
    // publisher, so the worker's VersionReady may arrive first: take both, in either order,
    // so that neither is left for the checks below.
    bool version_ready = false, learner_ready = false;
    while (!(version_ready && learner_ready))
      trainer->receive(
        [&](const envelope& e) {
          if (e.schema_id() == capnp::typeId<msg::VersionReady>()) {
            version_ready = true;
            CHECK_FALSE(with_envelope<msg::VersionReady>(e, [](msg::VersionReady::Reader r) {
              CHECK(r.getVersion() == 0);
              CHECK(r.getWorkers() == 1);
            }));
          } else {
            REQUIRE(e.schema_id() == capnp::typeId<msg::LearnerReady>());
            learner_ready = true;
          }
        },
        caf::after(std::chrono::seconds(20)) >> [&] { FAIL("no VersionReady and LearnerReady"); });
  }
  ~worker_harness() {
    for (auto& a : {worker, publisher, learner})
      trainer->send_exit(a, caf::exit_reason::user_shutdown);
  }

  void send(const envelope& e) {
    trainer->send(worker, e);
  }
};

struct request_fields {
  uint64_t id = 1;
  uint64_t step = 0;
  uint64_t group = 0;
  uint32_t sample = 0;
  uint64_t task = 0;
  uint64_t seed = 1;
  uint64_t version = 0;
  uint32_t max_new_tokens = 6;
  std::string replaced_from;
};

envelope request(const request_fields& f) {
  return build_envelope<msg::GenerateRequest>([&](msg::GenerateRequest::Builder b) {
    b.setRequestId(f.id);
    b.setStep(f.step);
    b.setGroupId(f.group);
    b.setSampleIndex(f.sample);
    b.setGroupSize(2);
    b.setTaskIndex(f.task);
    b.setSeed(f.seed);
    b.setWeightVersion(f.version);
    b.setMaxNewTokens(f.max_new_tokens);
    b.setTemperature(1.0f);
    b.setTopP(1.0f);
    b.setReplacedFrom(f.replaced_from);
  });
}

/// One line per RolloutEvent: "start 7 tokens 0 in_flight 1 rollout_worker#0@test",
/// "finish 7 tokens 6 in_flight 0 rollout_worker#0@test reason done" (or "reason abort").
std::string describe(msg::RolloutEvent::Reader ev) {
  const char* kind = ev.getKind() == msg::EventKind::START   ? "start"
                     : ev.getKind() == msg::EventKind::CHUNK ? "chunk"
                                                             : "finish";
  auto line = std::string{kind} + " " + std::to_string(ev.getRequestId()) + " tokens " +
              std::to_string(ev.getTokens()) + " in_flight " + std::to_string(ev.getInFlight()) +
              " " + ev.getWorker().cStr();
  if (ev.getKind() == msg::EventKind::FINISH)
    line += ev.getFinishReason() == msg::FinishReason::ABORT ? " reason abort" : " reason done";
  return line;
}

/// The RolloutEvents `who` receives up to and including request `id`'s finish.
std::vector<std::string> events_until_finish(caf::scoped_actor& who, uint64_t id) {
  std::vector<std::string> lines;
  for (bool done = false; !done;)
    expect<msg::RolloutEvent>(who, [&](msg::RolloutEvent::Reader ev) {
      lines.push_back(describe(ev));
      done = ev.getKind() == msg::EventKind::FINISH && ev.getRequestId() == id;
    });
  return lines;
}

/// The next Trajectory the trainer receives; the RolloutEvents before it go to `events`.
struct trajectory {
  uint64_t id = 0, step = 0, group = 0, version = 0;
  uint32_t sample = 0;
  msg::RolloutStatus status = msg::RolloutStatus::OK;
  msg::FinishReason finish = msg::FinishReason::EOS;
  std::string failure, worker, replaced_from;
  std::vector<int32_t> prompt, response;
  std::vector<float> logprobs;
  size_t mask_bytes = 0;
};

trajectory next_trajectory(caf::scoped_actor& trainer, std::vector<std::string>* events = nullptr) {
  trajectory t;
  for (bool found = false; !found;)
    trainer->receive(
      [&](const envelope& e) {
        if (e.schema_id() == capnp::typeId<msg::RolloutEvent>()) {
          CHECK_FALSE(with_envelope<msg::RolloutEvent>(e, [&](msg::RolloutEvent::Reader ev) {
            if (events)
              events->push_back(describe(ev));
          }));
          return;
        }
        REQUIRE(e.schema_id() == capnp::typeId<msg::Trajectory>());
        found = true;
        CHECK_FALSE(with_envelope<msg::Trajectory>(e, [&](msg::Trajectory::Reader r) {
          t.id = r.getRequestId();
          t.step = r.getStep();
          t.group = r.getGroupId();
          t.sample = r.getSampleIndex();
          t.version = r.getWeightVersion();
          t.status = r.getStatus();
          t.finish = r.getFinishReason();
          t.failure = r.getFailure().cStr();
          t.worker = r.getWorker().cStr();
          t.replaced_from = r.getReplacedFrom().cStr();
          for (auto x : r.getPromptTokens())
            t.prompt.push_back(x);
          for (auto x : r.getResponseTokens())
            t.response.push_back(x);
          for (auto x : r.getSamplingLogprobs())
            t.logprobs.push_back(x);
          t.mask_bytes = r.getLossMask().size();
        }));
      },
      [&](shutdown_atom, bool, const std::string& why) { FAIL("the job ended: " << why); },
      caf::after(std::chrono::seconds(20)) >> [&] { FAIL("no trajectory arrived"); });
  return t;
}

const std::string worker_name = "rollout_worker#0@test";

} // namespace

TEST_CASE("a worker holding the requested version serves requests and answers aborts") {
  worker_harness h;

  SECTION("a request is answered with its events to controller, scheduler and trainer and a "
          "trajectory with its ids") {
    request_fields f;
    f.id = 11;
    f.step = 2;
    f.group = 5;
    f.sample = 1;
    f.task = 3;
    f.seed = 42;
    f.replaced_from = "rollout_worker#9@test";
    h.send(request(f));
    auto to_scheduler = events_until_finish(h.scheduler, 11);
    CHECK(events_until_finish(h.sagc, 11) == to_scheduler);
    // Only the start reaches the trainer, then the trajectory.
    std::vector<std::string> to_trainer;
    auto t = next_trajectory(h.trainer, &to_trainer);
    CHECK(to_trainer == std::vector<std::string>{to_scheduler.front()});
    CHECK(t.id == 11);
    CHECK(t.step == 2);
    CHECK(t.group == 5);
    CHECK(t.sample == 1);
    CHECK(t.version == 0);
    CHECK(t.status == msg::RolloutStatus::OK);
    CHECK(t.failure == "");
    CHECK(t.worker == worker_name);
    CHECK(t.replaced_from == "rollout_worker#9@test");
    CHECK_FALSE(t.prompt.empty());
    // The fresh policy does not end its answer within six tokens with this seed.
    CHECK(t.finish == msg::FinishReason::LENGTH);
    CHECK(t.response.size() == 6);
    CHECK(t.mask_bytes == t.response.size());
    CHECK(t.logprobs.size() == t.response.size());
    REQUIRE(to_scheduler.size() == 2);
    CHECK(to_scheduler[0] == "start 11 tokens 0 in_flight 1 " + worker_name);
    CHECK(to_scheduler[1] == "finish 11 tokens " + std::to_string(t.response.size()) +
                               " in_flight 0 " + worker_name + " reason done");
  }

  SECTION("the same request is generated the same way, and another seed generates another "
          "rollout") {
    request_fields f;
    f.max_new_tokens = 8;
    f.seed = 7;
    f.id = 1;
    h.send(request(f));
    auto first = next_trajectory(h.trainer);
    f.id = 2;
    h.send(request(f));
    auto again = next_trajectory(h.trainer);
    f.id = 3;
    f.seed = 8;
    h.send(request(f));
    auto other = next_trajectory(h.trainer);
    REQUIRE(first.id == 1);
    REQUIRE(again.id == 2);
    REQUIRE(other.id == 3);
    CHECK(first.response.size() == 8);
    CHECK(again.prompt == first.prompt);
    CHECK(again.response == first.response);
    CHECK(again.logprobs == first.logprobs);
    CHECK(other.prompt == first.prompt);
    CHECK(other.response != first.response);
  }

  SECTION("aborted rollouts come back as abort finish events and never as trajectories") {
    request_fields f;
    f.id = 20;
    f.seed = 3;
    // Unaborted, this seed decodes 214 tokens before its EOS: the abort arrives long before.
    f.max_new_tokens = 400;
    h.send(request(f));
    h.send(build_envelope<msg::AbortRollouts>([](msg::AbortRollouts::Builder b) {
      b.setStep(0);
      auto ids = b.initRequestIds(2);
      ids.set(0, 20);
      ids.set(1, 77); // unknown: ignored
      b.setReason("deadline");
    }));
    auto to_scheduler = events_until_finish(h.scheduler, 20);
    // Whether a token was decoded before the abort arrived depends on timing; the shape not.
    REQUIRE(to_scheduler.size() == 2);
    CHECK(to_scheduler[0].rfind("start 20 tokens 0 in_flight ", 0) == 0);
    CHECK(to_scheduler[1].rfind("finish 20 tokens ", 0) == 0);
    auto tail = " in_flight 0 " + worker_name + " reason abort";
    CHECK(to_scheduler[1].size() > tail.size());
    CHECK(to_scheduler[1].substr(to_scheduler[1].size() - tail.size()) == tail);
    CHECK(events_until_finish(h.sagc, 20) == to_scheduler);
    // The next request's trajectory is the first the trainer gets: none for request 20.
    f.id = 21;
    f.max_new_tokens = 2;
    h.send(request(f));
    CHECK(next_trajectory(h.trainer).id == 21);
  }

  SECTION("a request for a version the worker does not hold comes back failed with the reason") {
    request_fields f;
    f.id = 30;
    f.group = 4;
    f.version = 3;
    h.send(request(f));
    auto t = next_trajectory(h.trainer);
    CHECK(t.id == 30);
    CHECK(t.group == 4);
    CHECK(t.status == msg::RolloutStatus::FAILED);
    CHECK(t.failure == "the worker holds weights version 0, the request wants version 3");
    CHECK(t.finish == msg::FinishReason::ABORT);
    CHECK(t.response.empty());
    // Its finish event frees the scheduler's slot like any other. Both events leave in the
    // same step, stamped with the load after it: nothing held.
    CHECK(
      events_until_finish(h.scheduler, 30) ==
      std::vector<std::string>{"start 30 tokens 0 in_flight 0 " + worker_name,
                               "finish 30 tokens 0 in_flight 0 " + worker_name + " reason abort"});
  }
}
