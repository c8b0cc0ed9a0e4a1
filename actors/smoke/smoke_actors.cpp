#include "actors/smoke/smoke_actors.hpp"

#include <chrono>
#include <map>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/smoke/ping_logic.hpp"
#include "messages/smoke.capnp.h"
#include "runtime/envelope.hpp"
#include "runtime/role_names.hpp"

namespace sorl::smoke {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

struct ping_state {
  static inline const char* name = "sorl.smoke.ping";
  explicit ping_state() = default;
  std::unique_ptr<ping_logic> logic;
  std::map<std::string, caf::actor> pongers;
};

caf::behavior ping_actor(caf::stateful_actor<ping_state>* self, role_context ctx) {
  const auto& sc = ctx.config->smoke;
  self->state.logic = std::make_unique<ping_logic>(sc.rounds);
  auto me = ctx.name();
  auto end_job = [self, ctx](bool ok, std::string why) {
    auto& lg = *self->state.logic;
    ctx.outcome->set("smoke.rounds", static_cast<double>(lg.rounds_done()));
    ctx.outcome->set("smoke.answers", static_cast<double>(lg.answers()));
    ctx.outcome->set("smoke.mean_rtt_us", lg.mean_rtt_ns() / 1e3);
    self->send(ctx.directory, shutdown_atom::value, ok, std::move(why));
  };
  auto send_round = [self, sc] {
    auto& lg = *self->state.logic;
    auto round = lg.begin_round();
    // One envelope for all pongers: in-process receivers share its bytes.
    auto env = build_envelope<msg::Ping>([&](msg::Ping::Builder b) {
      b.setRound(round);
      b.setSentNs(now_ns());
      b.initPayload(static_cast<unsigned>(sc.payload_bytes));
    });
    for (auto& [name, handle] : self->state.pongers)
      self->send(handle, env);
  };
  // After an answer or a loss: close the round and either finish or schedule the next one.
  auto advance = [self, sc, end_job, me] {
    auto& lg = *self->state.logic;
    if (!lg.close_round_if_complete())
      return;
    if (lg.rounds_done() % 50 == 0 || lg.finished())
      spdlog::info("{}: {} of {} rounds done, mean rtt {:.1f} us", me, lg.rounds_done(),
                   sc.rounds, lg.mean_rtt_ns() / 1e3);
    if (lg.finished())
      end_job(true, fmt::format("{} rounds, {} answers from {} pongers", lg.rounds_done(),
                                lg.answers(), lg.live_pongers()));
    else
      self->delayed_send(self, std::chrono::milliseconds{sc.interval_ms}, tick_atom::value);
  };
  return {
    [self, send_round, end_job, me](roster_atom, const std::vector<peer_info>& roster) {
      std::vector<std::string> names;
      for (const auto& p : roster) {
        if (p.role != role::pong)
          continue;
        names.push_back(p.name());
        self->state.pongers.emplace(p.name(), p.handle);
      }
      self->state.logic->set_pongers(names);
      spdlog::info("{}: roster received, {} pongers", me, names.size());
      if (names.empty()) {
        end_job(false, "the topology has no pong actor");
        return;
      }
      send_round();
    },
    [self, send_round](tick_atom) {
      if (!self->state.logic->finished() && !self->state.logic->in_round())
        send_round();
    },
    [self, ctx, advance, me](const envelope& env) {
      auto err = with_envelope<msg::Pong>(env, [&](msg::Pong::Reader pong) {
        auto verdict = self->state.logic->on_pong(pong.getRound(), pong.getPonger().cStr(),
                                                  now_ns() - pong.getSentNs());
        if (verdict != pong_verdict::counted)
          spdlog::warn("{}: ignored answer from {} for round {}", me,
                       pong.getPonger().cStr(), pong.getRound());
      });
      if (err) {
        ctx.outcome->add("smoke.rejected", 1);
        spdlog::error("{}: rejected an envelope: {}", me, describe(err));
        return;
      }
      advance();
    },
    [self, ctx, advance, end_job, me](peer_down_atom, const peer_info& who,
                                      const std::string& why) {
      spdlog::warn("{}: peer down: {} ({})", me, who.name(), why);
      if (!self->state.logic->on_ponger_down(who.name()))
        return;
      self->state.pongers.erase(who.name());
      ctx.outcome->add("smoke.pongers_lost", 1);
      if (self->state.logic->live_pongers() == 0) {
        end_job(false, "every pong is gone");
        return;
      }
      advance();
    },
    [self](shutdown_atom, bool, const std::string&) { self->quit(); },
  };
}

struct pong_state {
  static inline const char* name = "sorl.smoke.pong";
  uint64_t received = 0;
};

caf::behavior pong_actor(caf::stateful_actor<pong_state>* self, role_context ctx) {
  auto me = ctx.name();
  return {
    [me](roster_atom, const std::vector<peer_info>& roster) {
      spdlog::info("{}: roster received, {} actors", me, roster.size());
    },
    [self, ctx, me](const envelope& env) {
      envelope reply;
      auto err = with_envelope<msg::Ping>(env, [&](msg::Ping::Reader ping) {
        auto& st = self->state;
        ++st.received;
        reply = build_envelope<msg::Pong>([&](msg::Pong::Builder b) {
          b.setRound(ping.getRound());
          b.setPonger(me);
          b.setReceived(st.received);
          b.setPayloadBytes(ping.getPayload().size());
          b.setSentNs(ping.getSentNs());
        });
      });
      if (err) {
        ctx.outcome->add("smoke.rejected", 1);
        spdlog::error("{}: rejected an envelope: {}", me, describe(err));
        return;
      }
      if (self->state.received == 1)
        spdlog::info("{}: first ping received", me);
      self->send(caf::actor_cast<caf::actor>(self->current_sender()), reply);
    },
    [me](peer_down_atom, const peer_info& who, const std::string& why) {
      spdlog::warn("{}: peer down: {} ({})", me, who.name(), why);
    },
    [self](shutdown_atom, bool, const std::string&) { self->quit(); },
  };
}

} // namespace

caf::actor spawn_ping(caf::actor_system& sys, const role_context& ctx) {
  return sys.spawn(ping_actor, ctx);
}

caf::actor spawn_pong(caf::actor_system& sys, const role_context& ctx) {
  return sys.spawn(pong_actor, ctx);
}

} // namespace sorl::smoke
