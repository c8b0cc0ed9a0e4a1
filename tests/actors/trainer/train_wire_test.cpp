// The train protocol's bytes: the encoders of actors/trainer/train_wire.hpp must send the bytes
// the trainer shell built itself before they moved there, and the decoders must carry every
// field into the step driver's events. The reference encoders below are the shell's own code
// (actors/trainer/trainer_actor.cpp's executor as it was), kept verbatim apart from returning
// the envelope instead of sending it.

#include <catch2/catch.hpp>

#include "tests/support/same_bytes.hpp"

#include <cmath>
#include <cstring>
#include <tuple>

#include "actors/trainer/train_wire.hpp"

using namespace sorl;
using namespace sorl::trainer;

namespace {

namespace reference {

envelope query_group_size(const cmd::query_group_size& c) {
  return build_envelope<msg::GroupSizeQuery>(
                            [&](msg::GroupSizeQuery::Builder b) { b.setStep(c.step); });
}
envelope query_step_timing(const cmd::query_step_timing& c) {
  return build_envelope<msg::StepTimingQuery>(
                            [&](msg::StepTimingQuery::Builder b) { b.setStep(c.step); });
}
envelope request_eval(const cmd::request_eval& c) {
  return build_envelope<msg::EvalRequest>([&](msg::EvalRequest::Builder b) {
                 b.setTag(c.tag);
                 b.setCount(c.count);
               });
}
envelope query_role_state(const cmd::query_role_state& c) {
  return build_envelope<msg::RoleStateQuery>(
                               [&](msg::RoleStateQuery::Builder b) { b.setStep(c.step); });
}
envelope restore_role_state(const cmd::restore_role_state& c) {
  return build_envelope<msg::RoleStateRestore>([&](msg::RoleStateRestore::Builder b) {
                 b.setState(c.state);
                 b.setSource(c.source);
               });
}
envelope request_checkpoint(const cmd::request_checkpoint& c) {
  return build_envelope<msg::CheckpointRequest>([&](msg::CheckpointRequest::Builder b) {
                 b.setStep(c.step);
                 b.setDir(c.dir);
                 b.setTrainerState(c.trainer_state);
               });
}

// The stateful roles' replies (actors/sagc/controller_actor.cpp; the scheduler's differs only
// in the role's name and state).
envelope role_state(uint64_t step, const std::string& role, const std::string& state) {
  return build_envelope<msg::RoleState>([&](msg::RoleState::Builder b) {
              b.setStep(step);
              b.setRole(role);
              b.setState(state);
              b.setOk(true);
            });
}
envelope role_state_restored(const std::string& role, bool ok, const std::string& why) {
  return build_envelope<msg::RoleStateRestored>(
              [&](msg::RoleStateRestored::Builder b) {
                b.setRole(role);
                b.setOk(ok);
                b.setReason(why);
              });
}

// The learner's replies (actors/learner/learner_actor.cpp).
envelope learner_ready(uint64_t step, bool resumed, const std::string& trainer_state,
                       const std::string& source) {
  return build_envelope<msg::LearnerReady>([&](msg::LearnerReady::Builder b) {
          b.setVersion(static_cast<uint64_t>(step));
          b.setResumed(resumed);
          b.setTrainerState(trainer_state);
          b.setSource(source);
        });
}
envelope eval_result(const std::string& tag, const ev::eval_result& rep) {
  return build_envelope<msg::EvalResult>([&](msg::EvalResult::Builder b) {
              b.setTag(tag);
              b.setCount(static_cast<uint32_t>(rep.count));
              b.setAccuracy(rep.accuracy);
              b.setMeanReward(rep.mean_reward);
              b.setMeanLength(rep.mean_length);
              b.setSeconds(rep.seconds);
              b.setRewardFailures(rep.reward_failures);
            });
}
envelope checkpoint_done(uint64_t step, const std::string& path, const std::string& why) {
  return build_envelope<msg::CheckpointDone>([&](msg::CheckpointDone::Builder b) {
              b.setStep(step);
              b.setPath(path);
              b.setOk(why.empty());
              b.setReason(why);
            });
}

} // namespace reference

using sorl::test::same_bytes;

/// Runs `check` on the reader of `e` as `Schema`; fails when `e` is not one.
template <class Schema, class Check>
void read_as(const envelope& e, Check&& check) {
  bool seen = false;
  auto err = with_envelope<Schema>(e, [&](typename Schema::Reader r) {
    seen = true;
    check(r);
  });
  REQUIRE(!err);
  REQUIRE(seen);
}

} // namespace

TEST_CASE("the train protocol's queries and requests keep the shell's bytes and every field",
          "[train_wire]") {
  SECTION("GroupSizeQuery") {
    cmd::query_group_size c{0x0102030405060708ULL};
    CHECK(same_bytes(to_msg(c), reference::query_group_size(c)));
    read_as<msg::GroupSizeQuery>(to_msg(c), [&](auto r) { CHECK(r.getStep() == c.step); });
  }
  SECTION("StepTimingQuery") {
    cmd::query_step_timing c{41};
    CHECK(same_bytes(to_msg(c), reference::query_step_timing(c)));
    read_as<msg::StepTimingQuery>(to_msg(c), [&](auto r) { CHECK(r.getStep() == 41); });
  }
  SECTION("EvalRequest") {
    cmd::request_eval c{"after", 128};
    CHECK(same_bytes(to_msg(c), reference::request_eval(c)));
    read_as<msg::EvalRequest>(to_msg(c), [&](auto r) {
      CHECK(std::string{r.getTag().cStr()} == "after");
      CHECK(r.getCount() == 128);
    });
  }
  SECTION("RoleStateQuery") {
    cmd::query_role_state c{"scheduler", 7};
    CHECK(same_bytes(to_msg(c), reference::query_role_state(c)));
    read_as<msg::RoleStateQuery>(to_msg(c), [&](auto r) { CHECK(r.getStep() == 7); });
  }
  SECTION("RoleStateRestore") {
    cmd::restore_role_state c{"sagc_controller", R"({"q":1.5})", "runs/x/ckpt/step-3"};
    CHECK(same_bytes(to_msg(c), reference::restore_role_state(c)));
    read_as<msg::RoleStateRestore>(to_msg(c), [&](auto r) {
      CHECK(std::string{r.getState().cStr()} == R"({"q":1.5})");
      CHECK(std::string{r.getSource().cStr()} == "runs/x/ckpt/step-3");
    });
  }
  SECTION("CheckpointRequest") {
    cmd::request_checkpoint c{12, "runs/x/ckpt/step-12", R"({"step":12})"};
    CHECK(same_bytes(to_msg(c), reference::request_checkpoint(c)));
    read_as<msg::CheckpointRequest>(to_msg(c), [&](auto r) {
      CHECK(r.getStep() == 12);
      CHECK(std::string{r.getDir().cStr()} == "runs/x/ckpt/step-12");
      CHECK(std::string{r.getTrainerState().cStr()} == R"({"step":12})");
    });
  }
  SECTION("empty texts and zero counts keep the shell's bytes too") {
    CHECK(same_bytes(to_msg(cmd::request_eval{}), reference::request_eval({})));
    CHECK(same_bytes(to_msg(cmd::restore_role_state{}), reference::restore_role_state({})));
    CHECK(same_bytes(to_msg(cmd::request_checkpoint{}), reference::request_checkpoint({})));
  }
}

TEST_CASE("the stateful roles' replies keep their bytes and every field", "[train_wire]") {
  SECTION("RoleState") {
    ev::role_state s{11, "sagc_controller", R"({"q":2})", true, ""};
    CHECK(same_bytes(to_msg(s), reference::role_state(11, "sagc_controller", R"({"q":2})")));
    read_as<msg::RoleState>(to_msg(s), [](auto r) {
      auto x = from_msg(r);
      CHECK(x.step == 11);
      CHECK(x.role == "sagc_controller");
      CHECK(x.state == R"({"q":2})");
      CHECK(x.ok);
      CHECK(x.reason.empty());
      CHECK_FALSE(r.hasReason());
    });
  }
  SECTION("a RoleState with a reason carries it") {
    ev::role_state s{1, "scheduler", "", false, "cannot save"};
    read_as<msg::RoleState>(to_msg(s), [](auto r) {
      auto x = from_msg(r);
      CHECK_FALSE(x.ok);
      CHECK(x.reason == "cannot save");
    });
  }
  SECTION("RoleStateRestored") {
    for (bool ok : {true, false}) {
      ev::role_state_restored s{"scheduler", ok, ok ? "" : "bad JSON"};
      CHECK(same_bytes(to_msg(s), reference::role_state_restored("scheduler", ok, s.reason)));
      read_as<msg::RoleStateRestored>(to_msg(s), [&](auto r) {
        auto x = from_msg(r);
        CHECK(x.role == "scheduler");
        CHECK(x.ok == ok);
        CHECK(x.reason == s.reason);
      });
    }
  }
}

TEST_CASE("the learner's replies keep its bytes", "[train_wire]") {
  ev::learner_ready ready{9, true, "runs/x/ckpt/step-9", R"({"step":9})"};
  CHECK(same_bytes(to_msg(ready),
                   reference::learner_ready(9, true, R"({"step":9})", "runs/x/ckpt/step-9")));
  read_as<msg::LearnerReady>(to_msg(ready), [](auto r) {
    auto x = from_msg(r);
    CHECK(x.version == 9);
    CHECK(x.resumed);
    CHECK(x.source == "runs/x/ckpt/step-9");
    CHECK(x.trainer_state == R"({"step":9})");
  });
  ev::eval_result eval{"after", 64, 0.25, 0.375, 17.5, 3.125, 5};
  CHECK(same_bytes(to_msg(eval), reference::eval_result("after", eval)));
  read_as<msg::EvalResult>(to_msg(eval), [](auto r) {
    auto x = from_msg(r);
    CHECK(x.tag == "after");
    CHECK(x.count == 64);
    CHECK(x.accuracy == 0.25);
    CHECK(x.mean_reward == 0.375);
    CHECK(x.mean_length == 17.5);
    CHECK(x.seconds == 3.125);
    CHECK(x.reward_failures == 5);
  });
  for (std::string why : {"", "disk full"}) {
    ev::checkpoint_done done{8, "runs/x/ckpt/step-8", why.empty(), why};
    CHECK(same_bytes(to_msg(done), reference::checkpoint_done(8, "runs/x/ckpt/step-8", why)));
    read_as<msg::CheckpointDone>(to_msg(done), [&](auto r) {
      auto x = from_msg(r);
      CHECK(x.step == 8);
      CHECK(x.path == "runs/x/ckpt/step-8");
      CHECK(x.ok == why.empty());
      CHECK(x.reason == why);
    });
  }
}

TEST_CASE("every field of the learner's and the controller's replies reaches the driver's event",
          "[train_wire]") {
  SECTION("LearnerReady") {
    auto e = build_envelope<msg::LearnerReady>([](msg::LearnerReady::Builder b) {
      b.setVersion(9);
      b.setResumed(true);
      b.setTrainerState(R"({"step":9})");
      b.setSource("runs/x/ckpt/step-9");
    });
    read_as<msg::LearnerReady>(e, [](auto r) {
      auto x = from_msg(r);
      CHECK(x.version == 9);
      CHECK(x.resumed);
      CHECK(x.source == "runs/x/ckpt/step-9");
      CHECK(x.trainer_state == R"({"step":9})");
    });
  }
  SECTION("EvalResult") {
    auto e = build_envelope<msg::EvalResult>([](msg::EvalResult::Builder b) {
      b.setTag("before");
      b.setCount(64);
      b.setAccuracy(0.25);
      b.setMeanReward(0.375);
      b.setMeanLength(17.5);
      b.setSeconds(3.125);
      b.setRewardFailures(7);
    });
    read_as<msg::EvalResult>(e, [](auto r) {
      auto x = from_msg(r);
      CHECK(x.tag == "before");
      CHECK(x.count == 64);
      CHECK(x.accuracy == 0.25);
      CHECK(x.mean_reward == 0.375);
      CHECK(x.mean_length == 17.5);
      CHECK(x.seconds == 3.125);
      CHECK(x.reward_failures == 7);
    });
  }
  SECTION("GroupSizeDecision") {
    auto e = build_envelope<msg::GroupSizeDecision>([](msg::GroupSizeDecision::Builder b) {
      b.setStep(5);
      b.setGroupSize(12);
      b.setReason("queue above target");
      b.setPolicy("deadline");
      b.setVirtualQueue(1.5);
      b.setPStraggler(0.0625);
      b.setUtility(-2.25);
      b.setDeadlineNs(3000000000LL);
      b.setMinFinished(4);
    });
    read_as<msg::GroupSizeDecision>(e, [](auto r) {
      auto x = from_msg(r);
      CHECK(x.step == 5);
      CHECK(x.group_size == 12);
      CHECK(x.reason == "queue above target");
      CHECK(x.policy == "deadline");
      CHECK(x.deadline_ns == 3000000000LL);
      CHECK(x.min_finished == 4);
      CHECK(x.virtual_queue == 1.5);
      CHECK(x.p_straggler == 0.0625);
      CHECK(x.utility == -2.25);
    });
  }
  SECTION("a GroupSizeDecision's NaN straggler probability stays NaN") {
    auto e = build_envelope<msg::GroupSizeDecision>([](msg::GroupSizeDecision::Builder b) {
      b.setPStraggler(std::nan(""));
    });
    read_as<msg::GroupSizeDecision>(e, [](auto r) { CHECK(std::isnan(from_msg(r).p_straggler)); });
  }
  SECTION("StepTiming") {
    auto e = build_envelope<msg::StepTiming>([](msg::StepTiming::Builder b) {
      b.setStep(6);
      b.setRollouts(32);
      b.setDurationP50Ns(100);
      b.setDurationP90Ns(200);
      b.setDurationMaxNs(300);
      b.setStragglers(2);
      b.setStragglerEvent(true);
      b.setThresholdNs(250);
      b.setFlaggedInFlight(3);
      b.setAborted(1);
      b.setRolloutsTimed(31);
      b.setGroupsJudged(4);
      b.setGroupEvents(2);
    });
    read_as<msg::StepTiming>(e, [](auto r) {
      auto x = from_msg(r);
      CHECK(x.step == 6);
      CHECK(x.duration_p50_ns == 100);
      CHECK(x.duration_p90_ns == 200);
      CHECK(x.duration_max_ns == 300);
      CHECK(x.stragglers == 2);
      CHECK(x.straggler_event);
      CHECK(x.threshold_ns == 250);
      CHECK(x.flagged_in_flight == 3);
      CHECK(x.aborted == 1);
      CHECK(x.groups_judged == 4);
      CHECK(x.group_events == 2);
    });
  }
  SECTION("TrainResult") {
    auto e = build_envelope<msg::TrainResult>([](msg::TrainResult::Builder b) {
      b.setStep(2);
      b.setVersion(3);
      auto names = b.initMetricNames(2);
      names.set(0, "loss");
      names.set(1, "kl");
      auto values = b.initMetricValues(2);
      values.set(0, -0.5);
      values.set(1, 0.125);
      b.setOk(false);
      b.setReason("every update non-finite");
    });
    read_as<msg::TrainResult>(e, [](auto r) {
      auto x = from_msg(r);
      CHECK(x.version == 3);
      CHECK(x.metric_names == std::vector<std::string>{"loss", "kl"});
      CHECK(x.metric_values == std::vector<double>{-0.5, 0.125});
      CHECK_FALSE(x.ok);
      CHECK(x.reason == "every update non-finite");
    });
  }
  SECTION("CheckpointDone") {
    auto e = build_envelope<msg::CheckpointDone>([](msg::CheckpointDone::Builder b) {
      b.setStep(8);
      b.setPath("runs/x/ckpt/step-8");
      b.setOk(false);
      b.setReason("disk full");
    });
    read_as<msg::CheckpointDone>(e, [](auto r) {
      auto x = from_msg(r);
      CHECK(x.step == 8);
      CHECK(x.path == "runs/x/ckpt/step-8");
      CHECK_FALSE(x.ok);
      CHECK(x.reason == "disk full");
    });
  }
  SECTION("RoleState") {
    auto e = build_envelope<msg::RoleState>([](msg::RoleState::Builder b) {
      b.setStep(4);
      b.setRole("scheduler");
      b.setState(R"({"slots":[]})");
      b.setOk(true);
      b.setReason("partial history");
    });
    read_as<msg::RoleState>(e, [](auto r) {
      auto x = from_msg(r);
      CHECK(x.step == 4);
      CHECK(x.role == "scheduler");
      CHECK(x.state == R"({"slots":[]})");
      CHECK(x.ok);
      CHECK(x.reason == "partial history");
    });
  }
  SECTION("RoleStateRestored") {
    auto e = build_envelope<msg::RoleStateRestored>([](msg::RoleStateRestored::Builder b) {
      b.setRole("sagc_controller");
      b.setOk(false);
      b.setReason("bad JSON");
    });
    read_as<msg::RoleStateRestored>(e, [](auto r) {
      auto x = from_msg(r);
      CHECK(x.role == "sagc_controller");
      CHECK_FALSE(x.ok);
      CHECK(x.reason == "bad JSON");
    });
  }
}

// -- the sagc_controller's side: its queries decoded, its replies encoded ----------------
// The bytes the controller sends are pinned against its former shell code in
// tests/actors/sagc/sagc_wire_test.cpp; here every field goes round.

TEST_CASE("the controller's queries decode to the commands they were encoded from",
          "[train_wire]") {
  read_as<msg::GroupSizeQuery>(to_msg(cmd::query_group_size{0x0102030405060708ULL}),
                               [](auto r) { CHECK(from_msg(r).step == 0x0102030405060708ULL); });
  read_as<msg::StepTimingQuery>(to_msg(cmd::query_step_timing{41}),
                                [](auto r) { CHECK(from_msg(r).step == 41); });
  read_as<msg::RoleStateQuery>(to_msg(cmd::query_role_state{"sagc_controller", 7}), [](auto r) {
    auto x = from_msg(r);
    CHECK(x.step == 7);
    CHECK(x.role.empty()); // the addressee does not travel
  });
  read_as<msg::RoleStateRestore>(
    to_msg(cmd::restore_role_state{"sagc_controller", R"({"q":1.5})", "runs/x/ckpt/step-3"}),
    [](auto r) {
      auto x = from_msg(r);
      CHECK(x.role.empty());
      CHECK(x.state == R"({"q":1.5})");
      CHECK(x.source == "runs/x/ckpt/step-3");
    });
}

TEST_CASE("the controller's replies carry every field to the driver's events and back",
          "[train_wire]") {
  SECTION("GroupSizeDecision") {
    ev::group_size_decision d{5, 12, "deadline: queue above target", "deadline", 3000000000LL, 4,
                              1.5, 0.0625, 0.875};
    auto fields = [](const ev::group_size_decision& x) {
      return std::tie(x.step, x.group_size, x.reason, x.policy, x.deadline_ns, x.min_finished,
                      x.virtual_queue, x.p_straggler, x.utility);
    };
    read_as<msg::GroupSizeDecision>(to_msg(d),
                                    [&](auto r) { CHECK(fields(from_msg(r)) == fields(d)); });
    d.p_straggler = std::nan("");
    read_as<msg::GroupSizeDecision>(to_msg(d),
                                    [](auto r) { CHECK(std::isnan(from_msg(r).p_straggler)); });
  }
  SECTION("StepTiming") {
    const step_timing_reply t{{100, 200, 300, 2, true, 250, 3, 1, 6, 4, 2}, 32, 31};
    auto fields = [](const ev::step_timing& x) {
      return std::tie(x.step, x.duration_p50_ns, x.duration_p90_ns, x.duration_max_ns,
                      x.stragglers, x.straggler_event, x.threshold_ns, x.flagged_in_flight,
                      x.aborted, x.groups_judged, x.group_events);
    };
    read_as<msg::StepTiming>(to_msg(t), [&](auto r) {
      const ev::step_timing x = from_msg(r);
      CHECK(fields(x) == fields(t.timing));
      CHECK(r.getRollouts() == 32);
      CHECK(r.getRolloutsTimed() == 31);
    });
  }
}

// -- the learner's side: TrainBatch, TrainResult and the requests the learner reads ----------

namespace {

// The learner's TrainResult encoders as actors/learner/learner_actor.cpp had them, verbatim
// apart from taking their inputs as arguments and returning the envelope.
envelope reference_train_result(uint64_t step, uint64_t version,
                                const std::vector<std::pair<const char*, double>>& metrics) {
  return build_envelope<msg::TrainResult>([&](msg::TrainResult::Builder b) {
              b.setStep(step);
              b.setVersion(version);
              auto names = b.initMetricNames(static_cast<unsigned>(metrics.size()));
              auto values = b.initMetricValues(static_cast<unsigned>(metrics.size()));
              for (size_t i = 0; i < metrics.size(); ++i) {
                names.set(static_cast<unsigned>(i), metrics[i].first);
                values.set(static_cast<unsigned>(i), metrics[i].second);
              }
              b.setOk(true);
            });
}
envelope reference_failed_train_result(uint64_t step, uint64_t version, const char* why) {
  return build_envelope<msg::TrainResult>([&](msg::TrainResult::Builder b) {
                           b.setStep(step);
                           b.setVersion(version);
                           b.setOk(false);
                           b.setReason(why);
                         });
}

} // namespace

TEST_CASE("the learner's TrainBatch, TrainResult and requests round-trip through one codec",
          "[train_wire]") {
  SECTION("TrainBatch: the step and the request ids in training order, no trajectories") {
    cmd::train c{7, {5, 3, 0x0102030405060708ULL, 0}};
    read_as<msg::TrainBatch>(to_msg(c), [&](auto r) {
      CHECK(r.getStep() == 7);
      CHECK_FALSE(r.hasTrajectories());
      auto x = from_msg(r);
      CHECK(x.step == 7);
      CHECK(x.request_ids == std::vector<uint64_t>{5, 3, 0x0102030405060708ULL, 0});
    });
    read_as<msg::TrainBatch>(to_msg(cmd::train{}), [](auto r) {
      auto x = from_msg(r);
      CHECK(x.step == 0);
      CHECK(x.request_ids.empty());
    });
  }
  SECTION("TrainResult of a step taken: the learner's bytes, every field back") {
    ev::train_result r{3, {"loss", "kl", "tokens_trained"}, {-0.5, 0.125, 96.0}, true, ""};
    auto e = to_msg(r, 2);
    CHECK(same_bytes(e, reference_train_result(
                          2, 3, {{"loss", -0.5}, {"kl", 0.125}, {"tokens_trained", 96.0}})));
    read_as<msg::TrainResult>(e, [](auto m) {
      CHECK(m.getStep() == 2);
      CHECK_FALSE(m.hasReason());
      auto x = from_msg(m);
      CHECK(x.version == 3);
      CHECK(x.metric_names == std::vector<std::string>{"loss", "kl", "tokens_trained"});
      CHECK(x.metric_values == std::vector<double>{-0.5, 0.125, 96.0});
      CHECK(x.ok);
      CHECK(x.reason.empty());
    });
  }
  SECTION("TrainResult of a step not taken: the learner's bytes, the reason back") {
    ev::train_result r{4, {}, {}, false, "every update non-finite"};
    auto e = to_msg(r, 4);
    CHECK(same_bytes(e, reference_failed_train_result(4, 4, "every update non-finite")));
    read_as<msg::TrainResult>(e, [](auto m) {
      CHECK(m.getStep() == 4);
      CHECK_FALSE(m.hasMetricNames());
      auto x = from_msg(m);
      CHECK(x.version == 4);
      CHECK(x.metric_names.empty());
      CHECK(x.metric_values.empty());
      CHECK_FALSE(x.ok);
      CHECK(x.reason == "every update non-finite");
    });
  }
  SECTION("EvalRequest and CheckpointRequest read back into the trainer's commands") {
    read_as<msg::EvalRequest>(to_msg(cmd::request_eval{"before", 48}), [](auto m) {
      auto x = from_msg(m);
      CHECK(x.tag == "before");
      CHECK(x.count == 48);
    });
    cmd::request_checkpoint c{12, "runs/x", R"({"step":12,"rng":"a1"})"};
    read_as<msg::CheckpointRequest>(to_msg(c), [](auto m) {
      auto x = from_msg(m);
      CHECK(x.step == 12);
      CHECK(x.dir == "runs/x");
      CHECK(x.trainer_state == R"({"step":12,"rng":"a1"})");
    });
  }
}
