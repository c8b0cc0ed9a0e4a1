// The trainer's actor shell: every decision of the synchronous step is the step driver's
// (actors/trainer/step_driver.hpp, ARCHITECTURE.md §3). This file only decodes each message
// into the driver's `ev::` event, hands it over with the steady-clock time and carries out the
// returned commands: encoding and sending, timers, the metrics file, printing, logging and
// ending the job. It also keeps the trajectories' envelopes and forwards them to the learner
// ahead of the TrainBatch that names them, so they never pass through the driver.

#include "actors/trainer/trainer_actor.hpp"

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/common/train_setup.hpp"
#include "actors/rollout/rollout_wire.hpp"
#include "actors/sync/sync_wire.hpp"
#include "actors/trainer/rollout_mapping.hpp"
#include "actors/trainer/step_driver.hpp"
#include "actors/trainer/sync_mapping.hpp"
#include "actors/trainer/train_wire.hpp"
#include "messages/rollout.capnp.h"
#include "messages/sync.capnp.h"
#include "messages/train.capnp.h"
#include "runtime/interrupt.hpp"
#include "runtime/metrics.hpp"
#include "runtime/process_memory.hpp"

namespace sorl {

namespace {

namespace ev = trainer::ev;
namespace cmd = trainer::cmd;

/// The trainer's peers, from the roster.
struct trainer_peers {
  caf::actor scheduler;
  caf::actor learner;
  caf::actor sagc; ///< the sagc_controller
};

trainer_peers trainer_peers_from(const std::vector<peer_info>& roster) {
  return {single_peer(roster, role::scheduler), single_peer(roster, role::learner),
          single_peer(roster, role::sagc_controller)};
}

struct trainer_state {
  static inline const char* name = "sorl.trainer";
  std::string me;
  const experiment_config* cfg = nullptr;
  caf::actor directory;
  trainer_peers peers;
  /// Built once the roster is in: its options need the task's size.
  std::unique_ptr<trainer::step_driver> driver;
  /// Events that arrived before the roster, with their envelope, handed over once the
  /// driver exists.
  std::vector<std::pair<trainer::event, envelope>> early;
  std::unique_ptr<metrics_sink> sink;
  std::map<uint64_t, envelope> trajectories; ///< kept for the TrainBatch, by request id
};

using trainer_actor_t = caf::stateful_actor<trainer_state>;

/// Carries out one command of the driver; `current` is the envelope of the event being
/// handled, and `next` receives the outcome of a barrier command (metrics file operations).
struct executor {
  trainer_actor_t* self;
  trainer_state& st;
  const envelope& current;
  std::optional<trainer::event>& next;

  const caf::actor& role(const std::string& name) const {
    return name == role::scheduler ? st.peers.scheduler : st.peers.sagc;
  }

  void operator()(const cmd::query_group_size& c) const {
    self->send(st.peers.sagc, trainer::to_msg(c));
  }
  void operator()(const cmd::generate& c) const {
    for (const auto& req : trainer::requests_of(c))
      self->send(st.peers.scheduler, rollout::to_msg(req));
  }
  void operator()(const cmd::abort_rollouts& c) const {
    self->send(st.peers.scheduler,
               rollout::to_msg(rollout::abort_request{c.step, c.request_ids, c.reason}));
  }
  void operator()(const cmd::query_step_timing& c) const {
    self->send(st.peers.sagc, trainer::to_msg(c));
  }
  void operator()(const cmd::keep_trajectory& c) const {
    st.trajectories.emplace(c.request_id, current);
  }
  void operator()(const cmd::train& c) const {
    // The kept envelopes themselves (in-process a pointer each), then the batch naming them:
    // one sender's messages reach the learner in order.
    for (auto id : c.request_ids)
      self->send(st.peers.learner, st.trajectories.at(id));
    st.trajectories.clear();
    self->send(st.peers.learner, trainer::to_msg(c));
  }
  void operator()(const cmd::request_eval& c) const {
    self->send(st.peers.learner, trainer::to_msg(c));
  }
  void operator()(const cmd::query_role_state& c) const {
    self->send(role(c.role), trainer::to_msg(c));
  }
  void operator()(const cmd::restore_role_state& c) const {
    self->send(role(c.role), trainer::to_msg(c));
  }
  void operator()(const cmd::request_checkpoint& c) const {
    self->send(st.peers.learner, trainer::to_msg(c));
  }
  void operator()(const cmd::open_metrics& c) const {
    ev::metrics_opened r;
    try {
      st.sink = std::make_unique<metrics_sink>(std::filesystem::path{st.cfg->run.run_dir()},
                                                 c.mode, c.keep_through_step);
    } catch (const std::exception& ex) {
      r.error = ex.what();
    }
    next = r;
  }
  void operator()(const cmd::write_metrics& c) const {
    ev::metrics_written r;
    try {
      st.sink->write(c.record);
    } catch (const std::exception& ex) {
      r.error = ex.what();
    }
    next = r;
  }
  void operator()(const cmd::print_line& c) const {
    fmt::print("{}\n", c.text);
    std::fflush(stdout);
  }
  void operator()(const cmd::log& c) const {
    constexpr spdlog::level::level_enum level[] = {spdlog::level::debug, spdlog::level::info,
                                                   spdlog::level::warn};
    spdlog::log(level[static_cast<int>(c.level)], "{}: {}", st.me, c.text);
  }
  void operator()(const cmd::schedule_watchdog& c) const {
    self->delayed_send(self, std::chrono::nanoseconds{c.delay_ns}, watchdog_atom::value, c.step);
  }
  void operator()(const cmd::schedule_deadline& c) const {
    self->delayed_send(self, std::chrono::nanoseconds{c.delay_ns}, deadline_atom::value, c.step);
  }
  void operator()(const cmd::fail_job& c) const {
    sorl::fail_job(st.directory, st.me, c.why);
  }
  void operator()(const cmd::finish_job& c) const {
    self->send(st.directory, shutdown_atom::value, true, c.summary);
  }
};

/// Hands `e` (decoded from `current`, or empty for timers and signals) to the driver and
/// carries out its commands, feeding a barrier's outcome back before anything else.
void feed(trainer_actor_t* self, trainer::event e, const envelope& current = envelope{}) {
  auto& st = self->state;
  if (!st.driver) {
    st.early.emplace_back(std::move(e), current);
    return;
  }
  std::optional<trainer::event> next = std::move(e);
  while (next) {
    auto commands = st.driver->handle(steady_now_ns(), *next);
    next.reset();
    for (const auto& c : commands)
      std::visit(executor{self, st, current, next}, c);
  }
}

// -- decoding: one `from_msg` per message the driver reads; those of messages/train.capnp are
// in actors/trainer/train_wire.hpp --------------------------------------------------------

using trainer::from_msg;

ev::version_ready from_msg(msg::VersionReady::Reader r) {
  return trainer::version_ready_of(sync::decode_version_ready(r));
}

ev::rollout_finished from_msg(msg::Trajectory::Reader t) {
  return trainer::finished_of(rollout::from_msg(t));
}

caf::behavior trainer_actor(trainer_actor_t* self, role_context ctx) {
  auto& st = self->state;
  st.me = ctx.name();
  st.cfg = ctx.config;
  st.directory = ctx.directory;
  return {
    [self](roster_atom, const std::vector<peer_info>& roster) {
      auto& st = self->state;
      st.peers = trainer_peers_from(roster);
      const auto missing = role::missing_for_training([&](std::string_view name) {
        return static_cast<int64_t>(peers_with_role(roster, name).size());
      });
      if (!missing.empty()) {
        sorl::fail_job(st.directory, st.me, "the topology lacks " + missing);
        return;
      }
      std::optional<uint64_t> task_size;
      try {
        auto task = make_task_from(*st.cfg);
        if (task.single_turn)
          task_size = task.single_turn->size(ml::task_split::train);
      } catch (const std::exception& ex) {
        sorl::fail_job(st.directory, st.me, fmt::format("cannot build the task: {}", ex.what()));
        return;
      }
      auto opts = trainer::driver_options_from(*st.cfg, task_size);
      // Per-phase peak RSS of this process; windows start at the first step's rollout.
      opts.peak_rss = [windows = std::make_shared<peak_rss_windows>()] { return windows->take(); };
      st.driver = std::make_unique<trainer::step_driver>(std::move(opts));
      for (auto& [e, env] : std::exchange(st.early, {}))
        feed(self, std::move(e), env);
    },
    [self](const envelope& e) {
      if (handle_any<msg::LearnerReady, msg::VersionReady, msg::EvalResult,
                     msg::GroupSizeDecision, msg::Trajectory, msg::StepTiming, msg::TrainResult,
                     msg::CheckpointDone, msg::RoleState, msg::RoleStateRestored>(
            e, self->state.me, [&](auto r) { feed(self, from_msg(r), e); }))
        return;
      if (handle_as<msg::RolloutEvent>(e, self->state.me, [&](msg::RolloutEvent::Reader r) {
            if (auto started = trainer::started_of(rollout::from_msg(r)))
              feed(self, *started, e);
          }))
        return;
      log_unhandled(e, self->state.me);
    },
    [self](watchdog_atom, int64_t step) { feed(self, ev::watchdog_tick{step}); },
    [self](deadline_atom, int64_t step) { feed(self, ev::deadline_tick{step}); },
    [self](interrupt_atom, int32_t signo, const std::string& node) {
      feed(self, ev::interrupt{signal_name(signo), node});
    },
    [self](peer_down_atom, const peer_info& who, const std::string& why) {
      feed(self, ev::peer_down{who.role, who.name(), why});
    },
    [self](shutdown_atom, bool, const std::string&) { self->quit(); },
  };
}

} // namespace

caf::actor spawn_trainer(caf::actor_system& sys, const role_context& ctx) {
  return sys.spawn(trainer_actor, ctx);
}

} // namespace sorl
