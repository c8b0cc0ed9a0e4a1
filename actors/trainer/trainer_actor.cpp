#include "actors/trainer/trainer_actor.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <filesystem>
#include <map>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/common/train_setup.hpp"
#include "actors/rollout/request_sampling.hpp"
#include "actors/sagc/timing.hpp"
#include "actors/trainer/step_plan.hpp"
#include "messages/rollout.capnp.h"
#include "messages/sync.capnp.h"
#include "messages/train.capnp.h"
#include "runtime/metrics.hpp"

namespace sorl {

namespace {

using json = nlohmann::json;

enum class phase { starting, eval_before, rollout, learn, sync, checkpoint, eval_after, done };

struct trainer_state {
  static inline const char* name = "sorl.trainer";
  std::string me;
  const experiment_config* cfg = nullptr;
  caf::actor directory;
  caf::actor scheduler;
  caf::actor learner;
  caf::actor sagc;
  phase now = phase::starting;
  bool learner_ready = false;
  bool weights_ready = false;
  bool resumed = false;
  uint64_t version = 0;
  std::optional<uint64_t> task_size;
  trainer::trainer_counters counters;
  int64_t step = 0;
  uint32_t group_size = 0;
  std::string group_reason;
  /// Deadline mode: the rollout budget of this step (0 = none), and whether it is spent.
  int64_t deadline_ns = 0;
  uint32_t min_finished = 0;
  bool deadline_passed = false;
  std::unique_ptr<trainer::step_plan> plan;
  std::map<uint64_t, envelope> trajectories; ///< by request id, this step
  int64_t step_start_ns = 0;
  int64_t rollout_end_ns = 0;
  int64_t learn_end_ns = 0;
  metrics_record record;       ///< the step's JSONL record, filled as the step goes
  std::unique_ptr<metrics_sink> sink;
  std::vector<double> reward_history;
  std::optional<double> acc_before;
  std::optional<double> acc_after;
  int64_t run_start_ns = 0;
  /// A VersionReady that overtook the TrainResult of the same step (different senders).
  std::optional<envelope> early_ready;
};

using trainer_actor_t = caf::stateful_actor<trainer_state>;

void begin_step(trainer_actor_t* self);

void fail_job(trainer_actor_t* self, std::string why) {
  self->state.now = phase::done;
  sorl::fail_job(self->state.directory, self->state.me, std::move(why));
}

json trainer_state_json(const trainer_state& st) {
  return json{{"step", st.step},
              {"next_group_id", st.counters.next_group_id},
              {"next_request_id", st.counters.next_request_id},
              {"task_cursor", st.counters.task_cursor},
              {"reward_history", st.reward_history}};
}

void request_eval(trainer_actor_t* self, const char* tag) {
  auto& st = self->state;
  st.now = std::string{tag} == "before" ? phase::eval_before : phase::eval_after;
  self->send(st.learner, build_envelope<msg::EvalRequest>([&](msg::EvalRequest::Builder b) {
               b.setTag(tag);
               b.setCount(static_cast<uint32_t>(st.cfg->task.eval_prompts));
             }));
}

void finish_job(trainer_actor_t* self) {
  auto& st = self->state;
  st.now = phase::done;
  auto mean = [](std::vector<double>::const_iterator a, std::vector<double>::const_iterator b) {
    return a == b ? 0.0 : std::accumulate(a, b, 0.0) / static_cast<double>(b - a);
  };
  const auto& h = st.reward_history;
  auto k = std::min<size_t>(10, h.size());
  std::string summary = fmt::format("{} steps; mean reward first {} steps {:.3f}, last {} "
                                    "steps {:.3f}",
                                    h.size(), k, mean(h.begin(), h.begin() + k), k,
                                    mean(h.end() - k, h.end()));
  if (st.acc_before || st.acc_after)
    summary += fmt::format("; held-out accuracy {} → {}",
                           st.acc_before ? fmt::format("{:.3f}", *st.acc_before) : "n/a",
                           st.acc_after ? fmt::format("{:.3f}", *st.acc_after) : "n/a");
  summary += fmt::format("; {:.1f} s", (steady_now_ns() - st.run_start_ns) / 1e9);
  self->send(st.directory, shutdown_atom::value, true, summary);
}

void maybe_start(trainer_actor_t* self) {
  auto& st = self->state;
  if (st.now != phase::starting || !st.learner_ready || !st.weights_ready)
    return;
  st.run_start_ns = steady_now_ns();
  if (st.cfg->task.eval_prompts > 0 && !st.resumed)
    request_eval(self, "before");
  else
    begin_step(self);
}

void send_requests(trainer_actor_t* self) {
  auto& st = self->state;
  const auto& a = st.cfg->algorithm;
  for (const auto& r : st.plan->take_new_requests()) {
    auto env = build_envelope<msg::GenerateRequest>([&](msg::GenerateRequest::Builder b) {
      b.setRequestId(r.request_id);
      b.setStep(r.step);
      b.setGroupId(r.group_id);
      b.setSampleIndex(r.sample_index);
      b.setGroupSize(r.group_size);
      b.setSplit(msg::TaskSplit::TRAIN);
      b.setTaskIndex(r.task_index);
      b.setSeed(r.seed);
      b.setWeightVersion(st.version);
      b.setMaxNewTokens(static_cast<uint32_t>(st.cfg->task.max_new_tokens));
      rollout::write_sampling(b, {a.temperature, a.top_p, static_cast<uint32_t>(a.top_k)});
    });
    self->send(st.scheduler, env);
  }
}

void begin_step(trainer_actor_t* self) {
  auto& st = self->state;
  if (st.step >= st.cfg->run.steps) {
    if (st.cfg->task.eval_prompts > 0)
      request_eval(self, "after");
    else
      finish_job(self);
    return;
  }
  st.now = phase::rollout;
  st.step_start_ns = steady_now_ns();
  st.deadline_ns = 0;
  st.deadline_passed = false;
  st.trajectories.clear();
  st.record = metrics_record{};
  st.record.step = st.step + 1;
  self->send(st.sagc, build_envelope<msg::GroupSizeQuery>([&](msg::GroupSizeQuery::Builder b) {
               b.setStep(static_cast<uint64_t>(st.step));
             }));
}

/// Every group is in: fill the record's rollout fields and hand the batch to the learner.
void end_rollouts(trainer_actor_t* self) {
  auto& st = self->state;
  st.rollout_end_ns = steady_now_ns();
  self->send(st.sagc, build_envelope<msg::StepTimingQuery>([&](msg::StepTimingQuery::Builder b) {
               b.setStep(static_cast<uint64_t>(st.step));
             }));
  auto groups = st.plan->training_groups();
  std::vector<const envelope*> chosen;
  for (auto id : st.plan->training_requests())
    chosen.push_back(&st.trajectories.at(id));
  // Statistics over every rollout of the step (refills included).
  std::vector<double> lengths;
  std::map<uint64_t, std::vector<double>> group_rewards;
  double tokens = 0;
  std::map<std::string, int> finish_counts;
  for (auto& [id, env] : st.trajectories) {
    with_envelope<msg::Trajectory>(env, [&](msg::Trajectory::Reader t) {
      double policy_tokens = 0;
      for (auto m : t.getLossMask())
        policy_tokens += m;
      lengths.push_back(policy_tokens);
      tokens += policy_tokens;
      group_rewards[t.getGroupId()].push_back(t.getReward());
      switch (t.getFinishReason()) {
        case msg::FinishReason::EOS:
          ++finish_counts["eos"];
          break;
        case msg::FinishReason::LENGTH:
          ++finish_counts["length"];
          break;
        default:
          ++finish_counts["other"];
      }
    });
  }
  // The same nearest-rank definition the SAGC timing statistics use.
  auto pct = [&](double p) {
    return lengths.empty() ? 0.0 : sagc::nearest_rank_percentile(lengths, 100 * p);
  };
  std::vector<double> per_group;
  for (auto& [g, rs] : group_rewards)
    per_group.push_back(std::accumulate(rs.begin(), rs.end(), 0.0) / static_cast<double>(rs.size()));
  double rollout_s = (st.rollout_end_ns - st.step_start_ns) / 1e9;
  auto& rec = st.record;
  rec.group_size = st.group_size;
  rec.extra_text["group_reason"] = st.group_reason;
  rec.extra["prompts"] = static_cast<double>(st.cfg->algorithm.prompts_per_step);
  rec.extra["rollouts"] = static_cast<double>(st.trajectories.size());
  rec.reward_mean = st.plan->mean_reward();
  rec.reward_per_group = per_group;
  rec.resp_len_p50 = static_cast<int64_t>(pct(0.5));
  rec.resp_len_p99 = static_cast<int64_t>(pct(0.99));
  rec.resp_len_max = static_cast<int64_t>(pct(1.0));
  rec.tokens_per_s = rollout_s > 0 ? tokens / rollout_s : 0.0;
  rec.extra["finish_eos"] = finish_counts["eos"];
  rec.extra["finish_length"] = finish_counts["length"];
  rec.extra["refill_rounds"] = st.plan->refill_rounds();
  rec.extra["zero_signal_groups_rollout"] = static_cast<double>(st.plan->zero_signal_groups().size());
  rec.extra["trained_groups"] = static_cast<double>(groups.size());
  rec.extra["trained_rollouts"] = static_cast<double>(chosen.size());
  rec.extra["aborted"] = static_cast<double>(st.plan->aborted());
  rec.extra["deadline_cut"] = st.plan->was_cut() ? 1.0 : 0.0;
  if (chosen.empty()) {
    fail_job(self, fmt::format("step {}: no group to train on", st.step));
    return;
  }
  auto batch = build_envelope<msg::TrainBatch>([&](msg::TrainBatch::Builder b) {
    b.setStep(static_cast<uint64_t>(st.step));
    auto list = b.initTrajectories(static_cast<unsigned>(chosen.size()));
    for (size_t i = 0; i < chosen.size(); ++i)
      with_envelope<msg::Trajectory>(*chosen[i], [&](msg::Trajectory::Reader t) {
        list.setWithCaveats(static_cast<unsigned>(i), t);
      });
  });
  st.now = phase::learn;
  self->send(st.learner, batch);
}

void end_step(trainer_actor_t* self, msg::VersionReady::Reader ready) {
  auto& st = self->state;
  auto now = steady_now_ns();
  auto& rec = st.record;
  rec.extra["version"] = static_cast<double>(ready.getVersion());
  rec.extra["sync_bytes"] = static_cast<double>(ready.getBytesSent());
  rec.extra["sync_dense_bytes"] = static_cast<double>(ready.getDenseBytes());
  if (ready.getSparseWorkers() > 0 && ready.getElements() > 0) {
    rec.extra["sync_changed_fraction"] =
      static_cast<double>(ready.getChangedElements()) / static_cast<double>(ready.getElements());
    rec.extra["sync_sparse_bytes"] = static_cast<double>(ready.getSparseBytes());
  }
  rec.extra["sync_encode_s"] = static_cast<double>(ready.getEncodeNs()) / 1e9;
  rec.extra["sync_apply_s"] = static_cast<double>(ready.getApplyNsMax()) / 1e9;
  rec.extra["sync_full_workers"] = ready.getFullWorkers();
  rec.extra["sync_sparse_workers"] = ready.getSparseWorkers();
  rec.extra["sync_resyncs"] = ready.getResyncs();
  rec.extra_text["model_hash"] = fmt::format("{:016x}", ready.getModelHash());
  // Every worker reproduced the published hash: a mismatch gets a full sync, and a failed
  // full sync stops the job, so a written record always says ok.
  rec.extra_text["checksum"] = ready.getResyncs() > 0 ? "ok after resync" : "ok";
  rec.rollout_s = (st.rollout_end_ns - st.step_start_ns) / 1e9;
  rec.learn_s = (st.learn_end_ns - st.rollout_end_ns) / 1e9;
  rec.sync_s = (now - st.learn_end_ns) / 1e9;
  rec.wall_s = (now - st.step_start_ns) / 1e9;
  st.reward_history.push_back(rec.reward_mean.value_or(0.0));
  ++st.step;
  try {
    st.sink->write(rec);
  } catch (const std::exception& ex) {
    fail_job(self, fmt::format("cannot write metrics: {}", ex.what()));
    return;
  }
  fmt::print("{}\n", progress_line(rec, st.cfg->run.steps));
  std::fflush(stdout);
  bool last = st.step >= st.cfg->run.steps;
  auto every = st.cfg->run.checkpoint_every;
  if (last || (every > 0 && st.step % every == 0)) {
    st.now = phase::checkpoint;
    auto state = trainer_state_json(st).dump();
    self->send(st.learner,
               build_envelope<msg::CheckpointRequest>([&](msg::CheckpointRequest::Builder b) {
                 b.setStep(static_cast<uint64_t>(st.step));
                 b.setDir(st.cfg->run.run_dir());
                 b.setTrainerState(state);
               }));
    return;
  }
  begin_step(self);
}

/// Deadline mode: once the budget is spent and every group has min_finished rollouts, abort
/// the rest (the scheduler forwards the ids to the workers, which free their KV) and train
/// on what finished.
void try_cut(trainer_actor_t* self) {
  auto& st = self->state;
  if (st.now != phase::rollout || !st.plan || !st.deadline_passed ||
      !st.plan->can_cut(st.min_finished))
    return;
  auto ids = st.plan->cut(st.min_finished);
  spdlog::debug("{}: step {}: deadline passed, aborting {} rollout(s)", st.me, st.step,
                ids.size());
  self->send(st.scheduler, build_envelope<msg::AbortRollouts>([&](msg::AbortRollouts::Builder b) {
               b.setStep(static_cast<uint64_t>(st.step));
               auto list = b.initRequestIds(static_cast<unsigned>(ids.size()));
               for (size_t i = 0; i < ids.size(); ++i)
                 list.set(static_cast<unsigned>(i), ids[i]);
               b.setReason("deadline");
             }));
  end_rollouts(self);
}

caf::behavior trainer_actor(trainer_actor_t* self, role_context ctx) {
  auto& st = self->state;
  st.me = ctx.name();
  st.cfg = ctx.config;
  st.directory = ctx.directory;
  return {
    [self](roster_atom, const std::vector<peer_info>& roster) {
      auto& st = self->state;
      st.scheduler = single_peer(roster, "scheduler");
      st.learner = single_peer(roster, "learner");
      st.sagc = single_peer(roster, "sagc_controller");
      std::string missing;
      for (auto role : {"scheduler", "learner", "sagc_controller", "sync_publisher",
                        "rollout_worker"})
        if (!single_peer(roster, role))
          missing += std::string{missing.empty() ? "" : ", "} + role;
      if (!missing.empty()) {
        fail_job(self, "the topology lacks " + missing);
        return;
      }
      try {
        auto task = make_task_from(*st.cfg);
        if (task.single_turn)
          st.task_size = task.single_turn->size(ml::task_split::train);
      } catch (const std::exception& ex) {
        fail_job(self, fmt::format("cannot build the task: {}", ex.what()));
      }
    },
    [self](const envelope& e) {
      auto& st = self->state;
      if (handle_as<msg::LearnerReady>(e, st.me, [&](msg::LearnerReady::Reader r) {
            st.learner_ready = true;
            st.version = r.getVersion();
            st.resumed = r.getResumed();
            std::optional<int64_t> resume_after;
            if (st.resumed) {
              auto js = json::parse(std::string{r.getTrainerState().cStr()}, nullptr, false);
              if (js.is_discarded() || !js.contains("step")) {
                fail_job(self, "the checkpoint carries no trainer state");
                return;
              }
              st.step = js["step"].get<int64_t>();
              st.counters.next_group_id = js["next_group_id"].get<uint64_t>();
              st.counters.next_request_id = js["next_request_id"].get<uint64_t>();
              st.counters.task_cursor = js["task_cursor"].get<uint64_t>();
              st.reward_history = js["reward_history"].get<std::vector<double>>();
              resume_after = st.step;
              spdlog::info("{}: resuming after step {} from {}", st.me, st.step,
                           r.getSource().cStr());
            }
            try {
              st.sink = std::make_unique<metrics_sink>(
                std::filesystem::path{st.cfg->run.run_dir()},
                st.resumed ? metrics_open_mode::resume : metrics_open_mode::fresh, resume_after);
            } catch (const std::exception& ex) {
              fail_job(self, fmt::format("cannot open the metrics file: {}", ex.what()));
              return;
            }
            maybe_start(self);
          }))
        return;
      if (handle_as<msg::VersionReady>(e, st.me, [&](msg::VersionReady::Reader r) {
            if (st.now == phase::starting) {
              st.weights_ready = true;
              maybe_start(self);
            } else if (st.now == phase::sync && r.getVersion() == st.version) {
              end_step(self, r);
            } else if (st.now == phase::learn) {
              st.early_ready = e;
            } else {
              spdlog::warn("{}: unexpected version {} ready", st.me, r.getVersion());
            }
          }))
        return;
      if (handle_as<msg::EvalResult>(e, st.me, [&](msg::EvalResult::Reader r) {
            std::string tag = r.getTag();
            fmt::print("held-out accuracy ({}, greedy, {} prompts): {:.3f}  mean reward {:.3f}  "
                       "mean length {:.1f} tokens  ({:.1f} s)\n",
                       tag, r.getCount(), r.getAccuracy(), r.getMeanReward(),
                       r.getMeanLength(), r.getSeconds());
            std::fflush(stdout);
            if (tag == "before") {
              st.acc_before = r.getAccuracy();
              begin_step(self);
            } else {
              st.acc_after = r.getAccuracy();
              finish_job(self);
            }
          }))
        return;
      if (handle_as<msg::GroupSizeDecision>(e, st.me, [&](msg::GroupSizeDecision::Reader d) {
            if (st.now != phase::rollout || d.getStep() != static_cast<uint64_t>(st.step))
              return;
            st.group_size = d.getGroupSize();
            st.group_reason = d.getReason();
            st.deadline_ns = d.getDeadlineNs();
            st.min_finished = d.getMinFinished();
            auto& rec = st.record;
            rec.extra_text["group_policy"] = d.getPolicy();
            rec.extra["virtual_queue"] = d.getVirtualQueue();
            if (std::isfinite(d.getPStraggler()))
              rec.extra["p_straggler"] = d.getPStraggler();
            rec.extra["utility"] = d.getUtility();
            if (st.deadline_ns > 0)
              rec.extra["deadline_s"] = static_cast<double>(st.deadline_ns) / 1e9;
            trainer::step_options o;
            o.step = static_cast<uint64_t>(st.step);
            o.prompts = static_cast<uint32_t>(st.cfg->algorithm.prompts_per_step);
            o.group_size = st.group_size;
            o.run_seed = st.cfg->run.seed;
            o.task_size = st.task_size;
            o.dynamic_sampling = st.cfg->algorithm.dynamic_sampling;
            o.max_refill_rounds = static_cast<uint32_t>(st.cfg->algorithm.max_refill_rounds);
            try {
              st.plan = std::make_unique<trainer::step_plan>(o, st.counters);
            } catch (const std::exception& ex) {
              fail_job(self, ex.what());
              return;
            }
            send_requests(self);
            if (st.deadline_ns > 0) {
              auto left = st.deadline_ns - (steady_now_ns() - st.step_start_ns);
              self->delayed_send(self, std::chrono::nanoseconds{std::max<int64_t>(left, 0)},
                                 deadline_atom::value, static_cast<int64_t>(st.step));
            }
          }))
        return;
      if (handle_as<msg::Trajectory>(e, st.me, [&](msg::Trajectory::Reader t) {
            if (st.now != phase::rollout || !st.plan)
              return;
            auto verdict = st.plan->on_rollout(t.getRequestId(), t.getReward());
            if (verdict == trainer::rollout_verdict::after_cut)
              return; // a straggler that finished while its abort was on the way
            if (verdict != trainer::rollout_verdict::accepted) {
              spdlog::warn("{}: ignored trajectory {} (step {})", st.me, t.getRequestId(),
                           t.getStep());
              return;
            }
            st.trajectories.emplace(t.getRequestId(), e);
            try_cut(self);
            if (st.now != phase::rollout || !st.plan->rollouts_complete())
              return;
            if (st.plan->refill(st.counters)) {
              send_requests(self);
              return;
            }
            end_rollouts(self);
          }))
        return;
      if (handle_as<msg::StepTiming>(e, st.me, [&](msg::StepTiming::Reader t) {
            auto& rec = st.record;
            rec.extra["duration_p50_s"] = t.getDurationP50Ns() / 1e9;
            rec.extra["duration_p90_s"] = t.getDurationP90Ns() / 1e9;
            rec.extra["duration_max_s"] = t.getDurationMaxNs() / 1e9;
            rec.stragglers = t.getStragglers();
            rec.extra["straggler_event"] = t.getStragglerEvent() ? 1.0 : 0.0;
            rec.extra["straggler_threshold_s"] = t.getThresholdNs() / 1e9;
            rec.extra["flagged_in_flight"] = t.getFlaggedInFlight();
            rec.extra["rollouts_aborted_timing"] = t.getAborted();
          }))
        return;
      if (handle_as<msg::TrainResult>(e, st.me, [&](msg::TrainResult::Reader r) {
            if (st.now != phase::learn)
              return;
            st.learn_end_ns = steady_now_ns();
            auto names = r.getMetricNames();
            auto values = r.getMetricValues();
            for (unsigned i = 0; i < names.size() && i < values.size(); ++i)
              st.record.extra[std::string{names[i].cStr()}] = values[i];
            st.version = r.getVersion();
            st.now = phase::sync;
            if (st.early_ready) {
              auto early = std::move(*st.early_ready);
              st.early_ready.reset();
              with_envelope<msg::VersionReady>(early, [&](msg::VersionReady::Reader ready) {
                if (ready.getVersion() == st.version)
                  end_step(self, ready);
                else
                  spdlog::warn("{}: unexpected version {} ready", st.me, ready.getVersion());
              });
            }
          }))
        return;
      if (handle_as<msg::CheckpointDone>(e, st.me, [&](msg::CheckpointDone::Reader d) {
            if (!d.getOk()) {
              fail_job(self, fmt::format("checkpoint at step {} failed: {}", d.getStep(),
                                         d.getReason().cStr()));
              return;
            }
            spdlog::info("{}: checkpoint {}", st.me, d.getPath().cStr());
            begin_step(self);
          }))
        return;
      log_unhandled(e, st.me);
    },
    [self](deadline_atom, int64_t step) {
      auto& st = self->state;
      if (st.now != phase::rollout || step != st.step)
        return;
      st.deadline_passed = true;
      try_cut(self);
    },
    [self](peer_down_atom, const peer_info& who, const std::string& why) {
      auto& st = self->state;
      if (who.role == "rollout_worker")
        spdlog::warn("{}: {} is gone ({}); the scheduler re-places its requests", st.me,
                     who.name(), why);
      else if (st.now != phase::done)
        fail_job(self, fmt::format("{} is gone ({})", who.name(), why));
    },
    [self](shutdown_atom, bool, const std::string&) { self->quit(); },
  };
}

} // namespace

caf::actor spawn_trainer(caf::actor_system& sys, const role_context& ctx) {
  return sys.spawn(trainer_actor, ctx);
}

} // namespace sorl
