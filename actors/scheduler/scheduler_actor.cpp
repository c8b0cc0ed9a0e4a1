#include "actors/scheduler/scheduler_actor.hpp"

#include <map>
#include <optional>

#include <capnp/message.h>
#include <caf/all.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/rollout/rollout_wire.hpp"
#include "actors/scheduler/placement.hpp"
#include "actors/trainer/train_wire.hpp"
#include "messages/rollout.capnp.h"
#include "messages/train.capnp.h"

namespace sorl {

namespace {

struct scheduler_state {
  static inline const char* name = "sorl.scheduler";
  std::string me;
  caf::actor directory;
  std::unique_ptr<scheduler::placement> placement;
  std::map<std::string, caf::actor> workers;
  std::map<uint64_t, envelope> in_flight; ///< request id → the request, for re-placement
  std::vector<uint64_t> unplaced;         ///< waiting for a worker
};

using scheduler_actor_t = caf::stateful_actor<scheduler_state>;

void fail_job(scheduler_actor_t* self, std::string why) {
  sorl::fail_job(self->state.directory, self->state.me, std::move(why));
}

void place(scheduler_actor_t* self, uint64_t request_id, uint64_t group_id) {
  auto& st = self->state;
  auto where = st.placement->place(request_id, group_id, 0);
  if (!where) {
    fail_job(self, fmt::format("cannot place request {}: {}", request_id, where.error));
    return;
  }
  self->send(st.workers.at(*where.worker), st.in_flight.at(request_id));
}

/// `request` with replacedFrom = `lost`, so that its trajectory says it was re-placed (the
/// trainer counts these as `replaced_requests`).
envelope mark_replaced(const envelope& request, const std::string& lost) {
  std::optional<envelope> marked;
  auto err = with_envelope<msg::GenerateRequest>(request, [&](msg::GenerateRequest::Reader r) {
    capnp::MallocMessageBuilder builder;
    builder.setRoot(r);
    builder.getRoot<msg::GenerateRequest>().setReplacedFrom(lost);
    marked = make_envelope<msg::GenerateRequest>(builder);
  });
  // It was opened once already when it arrived; should that fail now, send it unmarked.
  if (err || !marked)
    return request;
  return *marked;
}

caf::behavior scheduler_actor(scheduler_actor_t* self, role_context ctx) {
  auto& st = self->state;
  st.me = ctx.name();
  st.directory = ctx.directory;
  st.placement =
    std::make_unique<scheduler::placement>(scheduler::placement_options_from(*ctx.config));
  return {
    [self](roster_atom, const std::vector<peer_info>& roster) {
      auto& st = self->state;
      for (auto& p : peers_with_role(roster, role::rollout_worker)) {
        st.workers.emplace(p.name(), p.handle);
        if (!st.placement->is_live(p.name()))
          st.placement->join(p.name());
      }
    },
    [self](const envelope& e) {
      auto& st = self->state;
      if (handle_as<msg::GenerateRequest>(e, st.me, [&](msg::GenerateRequest::Reader r) {
            auto id = r.getRequestId();
            if (!st.in_flight.emplace(id, e).second) {
              spdlog::warn("{}: request {} submitted twice", st.me, id);
              return;
            }
            try {
              place(self, id, r.getGroupId());
            } catch (const std::exception& ex) {
              fail_job(self, fmt::format("placing request {}: {}", id, ex.what()));
            }
          }))
        return;
      if (handle_as<msg::AbortRollouts>(e, st.me, [&](msg::AbortRollouts::Reader a) {
            // Forward each id to the worker that holds it; the worker's abort finish events
            // then free the placement slots as a normal finish does.
            const auto req = rollout::from_msg(a);
            std::map<std::string, std::vector<uint64_t>> by_worker;
            for (auto id : req.request_ids) {
              if (st.in_flight.count(id) == 0)
                continue;
              if (auto w = st.placement->worker_of(id); w && st.workers.count(*w))
                by_worker[*w].push_back(id);
            }
            for (auto& [w, ids] : by_worker) {
              self->send(st.workers.at(w),
                         rollout::to_msg(rollout::abort_request{req.step, ids, req.reason}));
            }
          }))
        return;
      if (handle_as<msg::RolloutEvent>(e, st.me, [&](msg::RolloutEvent::Reader ev) {
            if (ev.getKind() != msg::EventKind::FINISH)
              return;
            auto id = ev.getRequestId();
            // A finish sent by a lost worker can arrive after its peer_down: the request is
            // placed again by then, and that placement must stay in flight
            // (placement.hpp, `complete`).
            auto holder = st.placement->worker_of(id);
            if (holder && *holder != ev.getWorker().cStr())
              return;
            if (st.in_flight.erase(id) == 0)
              return;
            try {
              st.placement->complete(id);
            } catch (const std::exception& ex) {
              spdlog::warn("{}: completing request {}: {}", st.me, id, ex.what());
            }
          }))
        return;
      if (handle_as<msg::RoleStateQuery>(e, st.me, [&](msg::RoleStateQuery::Reader q) {
            self->send(caf::actor_cast<caf::actor>(self->current_sender()),
                       trainer::to_msg(trainer::ev::role_state{
                         q.getStep(), role::scheduler,
                         scheduler::save_placement_state(*st.placement), true, ""}));
          }))
        return;
      if (handle_as<msg::RoleStateRestore>(e, st.me, [&](msg::RoleStateRestore::Reader r) {
            std::string why;
            try {
              scheduler::restore_placement_state(r.getState().cStr(), *st.placement);
            } catch (const std::exception& ex) {
              why = ex.what();
            }
            self->send(caf::actor_cast<caf::actor>(self->current_sender()),
                       trainer::to_msg(
                         trainer::ev::role_state_restored{role::scheduler, why.empty(), why}));
          }))
        return;
      log_unhandled(e, st.me);
    },
    [self](peer_down_atom, const peer_info& who, const std::string& why) {
      auto& st = self->state;
      if (who.role != role::rollout_worker)
        return;
      st.workers.erase(who.name());
      auto orphans = st.placement->worker_lost(who.name());
      spdlog::warn("{}: {} is gone ({}); re-placing {} requests", st.me, who.name(), why,
                   orphans.size());
      for (auto& o : orphans) {
        auto held = st.in_flight.find(o.request_id);
        if (held == st.in_flight.end())
          continue;
        held->second = mark_replaced(held->second, who.name());
        place(self, o.request_id, o.group_id);
      }
    },
    [self](shutdown_atom, bool, const std::string&) { self->quit(); },
  };
}

} // namespace

caf::actor spawn_scheduler(caf::actor_system& sys, const role_context& ctx) {
  return sys.spawn(scheduler_actor, ctx);
}

} // namespace sorl
