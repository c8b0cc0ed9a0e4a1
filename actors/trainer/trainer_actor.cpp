#include "actors/trainer/trainer_actor.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <filesystem>
#include <map>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/common/train_setup.hpp"
#include "actors/rollout/request_sampling.hpp"
#include "actors/sagc/timing.hpp"
#include "actors/trainer/step_plan.hpp"
#include "actors/trainer/trainer_checkpoint.hpp"
#include "messages/rollout.capnp.h"
#include "messages/sync.capnp.h"
#include "messages/train.capnp.h"
#include "runtime/interrupt.hpp"
#include "runtime/metrics.hpp"

namespace sorl {

namespace {

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
  std::map<uint64_t, std::string> started_on; ///< request id → worker (start events)
  /// Rollout-phase watchdog: the last time the step made progress (group size decided, a
  /// rollout finished).
  int64_t progress_ns = 0;
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
  /// Checkpoint in progress: the stateful roles' replies so far, by role.
  std::map<std::string, std::string> role_states;
  /// Resume: roles that have not yet confirmed their restored state; the run starts at 0.
  size_t restores_pending = 0;
  std::string resume_source;
  /// A signal asked the job to stop ("SIGINT on node main"); "" while none did.
  std::string stop_request;
  /// The run's newest complete checkpoint (written or resumed from) and its step; "" while
  /// there is none. Named when a failure ends the job, so the user knows what --resume finds.
  std::string last_checkpoint;
  int64_t last_checkpoint_step = 0;
};

using trainer_actor_t = caf::stateful_actor<trainer_state>;

void begin_step(trainer_actor_t* self);

std::chrono::nanoseconds watchdog_period(const experiment_config& cfg) {
  return std::chrono::nanoseconds{static_cast<int64_t>(cfg.rollout.watchdog_s * 1e9)};
}

trainer::rollout_outcome outcome_of(msg::Trajectory::Reader t) {
  switch (t.getStatus()) {
    case msg::RolloutStatus::OK:
      return trainer::rollout_outcome::ok;
    case msg::RolloutStatus::FAILED:
      return trainer::rollout_outcome::failed;
    default:
      return trainer::rollout_outcome::reward_failed;
  }
}

/// What a stalled rollout phase still waits for, for the watchdog's message.
std::string missing_rollouts(const trainer_state& st) {
  if (!st.plan)
    return "the group-size decision of the sagc_controller";
  auto missing = st.plan->outstanding();
  std::string out = fmt::format("{} of {} rollouts:", missing.size(), st.plan->requested().size());
  constexpr size_t shown = 10;
  for (size_t i = 0; i < missing.size() && i < shown; ++i) {
    const auto& r = missing[i];
    auto w = st.started_on.find(r.request_id);
    out += fmt::format("{} request {} (group {}, sample {}, {})", i == 0 ? "" : ";",
                       r.request_id, r.group_id, r.sample_index,
                       w == st.started_on.end() ? "not started on any worker"
                                                : "started on " + w->second);
  }
  if (missing.size() > shown)
    out += fmt::format("; and {} more", missing.size() - shown);
  return out;
}

void fail_job(trainer_actor_t* self, std::string why) {
  self->state.now = phase::done;
  sorl::fail_job(self->state.directory, self->state.me, std::move(why));
}

/// What survives a failed step and how to continue, appended to the failure's reason: the
/// step in progress is lost, never half-saved (runtime/ml/checkpoint.hpp).
std::string resume_hint(const trainer_state& st) {
  if (st.last_checkpoint.empty())
    return "no checkpoint of this run was written, so --resume has nothing to continue from";
  return fmt::format("the last complete checkpoint is {} (step {}); continue the run with "
                     "--resume once the cause is fixed",
                     st.last_checkpoint, st.last_checkpoint_step);
}

trainer::trainer_snapshot snapshot_of(const trainer_state& st) {
  trainer::trainer_snapshot s;
  s.step = st.step;
  s.counters = st.counters;
  s.reward_history = st.reward_history;
  s.accuracy_before = st.acc_before;
  s.roles = st.role_states;
  return s;
}

/// A checkpoint is due: ask every stateful role for its state first (send_checkpoint follows
/// once all have answered).
void start_checkpoint(trainer_actor_t* self) {
  auto& st = self->state;
  st.now = phase::checkpoint;
  st.role_states.clear();
  for (const auto& role : trainer::stateful_roles())
    self->send(role == "scheduler" ? st.scheduler : st.sagc,
               build_envelope<msg::RoleStateQuery>([&](msg::RoleStateQuery::Builder b) {
                 b.setStep(static_cast<uint64_t>(st.step));
               }));
}

void send_checkpoint(trainer_actor_t* self) {
  auto& st = self->state;
  std::string state;
  try {
    state = trainer::to_json(snapshot_of(st));
  } catch (const std::exception& ex) {
    fail_job(self, fmt::format("checkpoint at step {}: {}", st.step, ex.what()));
    return;
  }
  self->send(st.learner,
             build_envelope<msg::CheckpointRequest>([&](msg::CheckpointRequest::Builder b) {
               b.setStep(static_cast<uint64_t>(st.step));
               b.setDir(st.cfg->run.run_dir());
               b.setTrainerState(state);
             }));
}

/// Ends the job after a signal asked it to stop; `where` says what was saved.
void stop_on_request(trainer_actor_t* self, const std::string& where) {
  auto& st = self->state;
  fail_job(self, fmt::format("stopped by {} after step {}/{}; {}", st.stop_request, st.step,
                             st.cfg->run.steps, where));
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
  if (st.now != phase::starting || !st.learner_ready || !st.weights_ready
      || st.restores_pending > 0)
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
  st.started_on.clear();
  st.plan.reset();
  st.record = metrics_record{};
  st.record.step = st.step + 1;
  st.progress_ns = st.step_start_ns;
  self->delayed_send(self, watchdog_period(*st.cfg), watchdog_atom::value,
                     static_cast<int64_t>(st.step));
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
  double replaced = 0;
  for (auto& [id, env] : st.trajectories) {
    with_envelope<msg::Trajectory>(env, [&](msg::Trajectory::Reader t) {
      replaced += t.getReplacedFrom().size() > 0;
      if (t.getStatus() == msg::RolloutStatus::FAILED)
        return; // nothing was generated that the statistics could describe
      double policy_tokens = 0;
      for (auto m : t.getLossMask())
        policy_tokens += m;
      lengths.push_back(policy_tokens);
      tokens += policy_tokens;
      if (t.getStatus() == msg::RolloutStatus::OK && std::isfinite(t.getReward()))
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
  rec.extra["failed_rollouts"] = static_cast<double>(st.plan->failed_rollouts());
  rec.extra["reward_failures"] = static_cast<double>(st.plan->reward_failures());
  rec.extra["replaced_requests"] = replaced;
  if (chosen.empty()) {
    fail_job(self, fmt::format("step {}: no group to train on ({} of {} rollouts failed, {} "
                               "without a reward)",
                               st.step + 1, st.plan->failed_rollouts(), st.trajectories.size(),
                               st.plan->reward_failures()));
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
  // What the publisher verified: ok only when every live worker's acknowledgement carried
  // the published hash (a mismatch gets a full sync, and a failed full sync stops the job).
  auto workers = ready.getWorkers();
  auto verified = ready.getVerifiedWorkers();
  rec.extra["sync_verified_workers"] = verified;
  if (workers > 0 && verified == workers)
    rec.extra_text["checksum"] = ready.getResyncs() > 0 ? "ok after resync" : "ok";
  else
    rec.extra_text["checksum"] = fmt::format("unverified: {} of {} workers acknowledged {:016x}",
                                             verified, workers, ready.getModelHash());
  rec.rollout_s = (st.rollout_end_ns - st.step_start_ns) / 1e9;
  rec.learn_s = (st.learn_end_ns - st.rollout_end_ns) / 1e9;
  rec.sync_s = (now - st.learn_end_ns) / 1e9;
  rec.wall_s = (now - st.step_start_ns) / 1e9;
  st.reward_history.push_back(rec.reward_mean.value_or(0.0));
  ++st.step;
  try {
    st.sink->write(rec);
  } catch (const std::exception& ex) {
    fail_job(self, fmt::format("step {}: {}; {}", st.step, ex.what(), resume_hint(st)));
    return;
  }
  fmt::print("{}\n", progress_line(rec, st.cfg->run.steps));
  std::fflush(stdout);
  bool last = st.step >= st.cfg->run.steps;
  auto every = st.cfg->run.checkpoint_every;
  if (last || (every > 0 && st.step % every == 0) || !st.stop_request.empty()) {
    start_checkpoint(self);
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
              st.resume_source = r.getSource();
              trainer::trainer_snapshot saved;
              try {
                saved = trainer::parse_trainer_snapshot(r.getTrainerState().cStr());
              } catch (const std::exception& ex) {
                fail_job(self, fmt::format("cannot resume from {}: {}", st.resume_source,
                                           ex.what()));
                return;
              }
              st.step = saved.step;
              st.counters = saved.counters;
              st.reward_history = saved.reward_history;
              st.acc_before = saved.accuracy_before;
              st.last_checkpoint = st.resume_source;
              st.last_checkpoint_step = st.step;
              resume_after = st.step;
              spdlog::info("{}: resuming after step {} from {}", st.me, st.step,
                           st.resume_source);
              if (!saved.roles)
                spdlog::warn("{}: {} was written before the group-size controller and the "
                             "scheduler saved their state: they start afresh (the first "
                             "steps' G may differ from an uninterrupted run)",
                             st.me, st.resume_source);
              for (const auto& [role, state] : saved.roles.value_or(decltype(st.role_states){})) {
                ++st.restores_pending;
                self->send(role == "scheduler" ? st.scheduler : st.sagc,
                           build_envelope<msg::RoleStateRestore>(
                             [&](msg::RoleStateRestore::Builder b) {
                               b.setState(state);
                               b.setSource(st.resume_source);
                             }));
              }
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
            st.progress_ns = steady_now_ns();
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
            auto outcome = outcome_of(t);
            auto verdict = st.plan->on_rollout(t.getRequestId(), t.getReward(), outcome);
            if (verdict == trainer::rollout_verdict::after_cut)
              return; // a straggler that finished while its abort was on the way
            if (verdict != trainer::rollout_verdict::accepted) {
              spdlog::warn("{}: ignored trajectory {} (step {})", st.me, t.getRequestId(),
                           t.getStep());
              return;
            }
            st.progress_ns = steady_now_ns();
            st.trajectories.emplace(t.getRequestId(), e);
            if (outcome != trainer::rollout_outcome::ok || !std::isfinite(t.getReward())) {
              auto why = outcome == trainer::rollout_outcome::ok
                           ? fmt::format("reward {} is not finite", t.getReward())
                           : std::string{t.getFailure().cStr()};
              auto what = fmt::format("step {}: rollout {} (group {}, sample {}) from {} {}: {}",
                                      st.step + 1, t.getRequestId(), t.getGroupId(),
                                      t.getSampleIndex(), t.getWorker().cStr(),
                                      outcome == trainer::rollout_outcome::failed
                                        ? "failed"
                                        : "has no reward",
                                      why);
              if (outcome != trainer::rollout_outcome::failed &&
                  st.cfg->algorithm.on_reward_failure == reward_failure_kind::fail) {
                fail_job(self, what + " (algorithm.on_reward_failure = \"fail\")");
                return;
              }
              spdlog::warn("{}: {}; not trained on", st.me, what);
            }
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
      if (handle_as<msg::RolloutEvent>(e, st.me, [&](msg::RolloutEvent::Reader ev) {
            if (ev.getKind() == msg::EventKind::START && st.now == phase::rollout)
              st.started_on[ev.getRequestId()] = ev.getWorker();
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
            if (!r.getOk()) {
              fail_job(self, fmt::format("step {}: the learner failed: {}; {}", st.step + 1,
                                         r.getReason().cStr(), resume_hint(st)));
              return;
            }
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
              fail_job(self, fmt::format("checkpoint at step {} failed: {}; {}", d.getStep(),
                                         d.getReason().cStr(), resume_hint(st)));
              return;
            }
            spdlog::info("{}: checkpoint {}", st.me, d.getPath().cStr());
            st.last_checkpoint = d.getPath();
            st.last_checkpoint_step = static_cast<int64_t>(d.getStep());
            if (!st.stop_request.empty()) {
              stop_on_request(self, fmt::format("checkpoint {}", d.getPath().cStr()));
              return;
            }
            begin_step(self);
          }))
        return;
      if (handle_as<msg::RoleState>(e, st.me, [&](msg::RoleState::Reader r) {
            if (st.now != phase::checkpoint || r.getStep() != static_cast<uint64_t>(st.step))
              return;
            if (!r.getOk()) {
              fail_job(self, fmt::format("checkpoint at step {}: the {} cannot save its state: "
                                         "{}",
                                         st.step, r.getRole().cStr(), r.getReason().cStr()));
              return;
            }
            st.role_states[r.getRole()] = r.getState();
            if (st.role_states.size() == trainer::stateful_roles().size())
              send_checkpoint(self);
          }))
        return;
      if (handle_as<msg::RoleStateRestored>(e, st.me, [&](msg::RoleStateRestored::Reader r) {
            if (st.now != phase::starting || st.restores_pending == 0)
              return;
            if (!r.getOk()) {
              // The reason names the role and the key ("sagc_controller state: key ...").
              fail_job(self, fmt::format("cannot resume from {}: {}", st.resume_source,
                                         r.getReason().cStr()));
              return;
            }
            if (r.getReason().size() > 0)
              spdlog::warn("{}: resuming the {}: {}", st.me, r.getRole().cStr(),
                           r.getReason().cStr());
            --st.restores_pending;
            maybe_start(self);
          }))
        return;
      log_unhandled(e, st.me);
    },
    [self](watchdog_atom, int64_t step) {
      auto& st = self->state;
      if (st.now != phase::rollout || step != st.step)
        return;
      auto period = watchdog_period(*st.cfg);
      auto idle = std::chrono::nanoseconds{steady_now_ns() - st.progress_ns};
      if (idle < period) {
        self->delayed_send(self, period - idle, watchdog_atom::value, step);
        return;
      }
      fail_job(self, fmt::format("step {}: nothing finished for {:.1f} s (rollout.watchdog_s = "
                                 "{}); still waiting for {}",
                                 st.step + 1, static_cast<double>(idle.count()) / 1e9,
                                 st.cfg->rollout.watchdog_s, missing_rollouts(st)));
    },
    [self](interrupt_atom, int32_t signo, const std::string& node) {
      auto& st = self->state;
      if (st.now == phase::done || !st.stop_request.empty())
        return;
      st.stop_request = fmt::format("{} on node {}", signal_name(signo), node);
      switch (st.now) {
        case phase::starting:
        case phase::eval_before:
          stop_on_request(self, "no step of this run finished, nothing new to save");
          return;
        case phase::eval_after:
          stop_on_request(self, "the last step's checkpoint is complete");
          return;
        default: // rollout, learn, sync, checkpoint: end_step / CheckpointDone stop the job
          spdlog::warn("{}: {}: finishing step {}/{}, then writing a checkpoint and stopping",
                       st.me, st.stop_request, st.step + (st.now == phase::checkpoint ? 0 : 1),
                       st.cfg->run.steps);
      }
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
