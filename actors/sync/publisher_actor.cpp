#include "actors/sync/publisher_actor.hpp"

#include <map>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <kj/exception.h>

#include "actors/common/shell_util.hpp"
#include "actors/sync/publisher_core.hpp"
#include "actors/sync/sync_wire.hpp"
#include "messages/sync.capnp.h"
#include "messages/train.capnp.h"

namespace sorl {

namespace {

/// The publisher's peers, by role.
struct publisher_peers {
  caf::actor trainer;
  std::map<std::string, caf::actor> workers; ///< live rollout workers, by name

  static publisher_peers from(const std::vector<peer_info>& roster) {
    publisher_peers p{single_peer(roster, role::trainer), {}};
    for (auto& w : peers_with_role(roster, role::rollout_worker))
      p.workers.emplace(w.name(), w.handle);
    return p;
  }
};

struct publisher_state {
  static inline const char* name = "sorl.sync_publisher";
  std::string me;
  caf::actor directory;
  publisher_peers peers;
  std::unique_ptr<sync::publisher_core> core;
  /// The version in flight's payloads as messages (header, then buckets), encoded once each
  /// and shared by every worker that gets them: envelopes are immutable shared buffers, so
  /// fanning out copies no bytes.
  std::map<sync::payload_kind, std::vector<envelope>> wire;
};

using publisher_actor_t = caf::stateful_actor<publisher_state>;

const std::vector<envelope>& wire_payload(publisher_actor_t* self, sync::payload_kind kind) {
  auto& st = self->state;
  if (auto it = st.wire.find(kind); it != st.wire.end())
    return it->second;
  const auto& p = st.core->payload_of(kind);
  auto t0 = steady_now_ns();
  std::vector<envelope> out(1);
  for (const auto& b : p.buckets)
    out.push_back(sync::encode_bucket(b));
  st.core->add_encode_ns(kind, steady_now_ns() - t0);
  out[0] = sync::encode_version_header(p.header);
  return st.wire.emplace(kind, std::move(out)).first->second;
}

void fail_publish(publisher_actor_t* self, const char* why) {
  auto& st = self->state;
  sorl::fail_job(st.directory, st.me,
                 fmt::format("cannot publish version {}: {}", st.core->version(), why));
}

/// Does what the core asked, in its order: logs, payloads, VersionReady, the job's end.
void carry_out(publisher_actor_t* self, const sync::publisher_core::result& r) {
  auto& st = self->state;
  sync::write_logs(r.logs);
  try {
    for (const auto& s : r.sends)
      for (const auto& e : wire_payload(self, s.kind))
        self->send(st.peers.workers.at(s.worker), e);
  } catch (const std::exception& ex) {
    return fail_publish(self, ex.what());
  } catch (const kj::Exception& ex) {
    return fail_publish(self, ex.getDescription().cStr());
  }
  if (r.ready) {
    st.wire.clear();
    self->send(st.peers.trainer, sync::encode_version_ready(*r.ready));
  }
  if (r.fail)
    sorl::fail_job(st.directory, st.me, *r.fail);
}

caf::behavior publisher_actor(publisher_actor_t* self, role_context ctx) {
  auto& st = self->state;
  st.me = ctx.name();
  st.directory = ctx.directory;
  auto po = sync::publisher_options_from(*ctx.config);
  st.core = std::make_unique<sync::publisher_core>(st.me, po, steady_now_ns);
  return {
    [self](roster_atom, const std::vector<peer_info>& roster) {
      auto& st = self->state;
      st.peers = publisher_peers::from(roster);
      for (const auto& w : st.peers.workers)
        st.core->add_worker(w.first);
    },
    [self](const envelope& e) {
      auto& st = self->state;
      if (e.schema_id() == capnp::typeId<msg::WeightSnapshot>()) {
        st.wire.clear();
        sync::publisher_core::result r;
        if (auto err = with_envelope<msg::WeightSnapshot>(e, [&](msg::WeightSnapshot::Reader s) {
              r = st.core->on_snapshot(sync::decode_snapshot(s, e.words()));
            }))
          r.fail = "cannot read a weight snapshot: " + describe(err); // the trainer waits for it
        carry_out(self, r);
        return;
      }
      if (handle_as<msg::WeightAck>(e, st.me, [&](msg::WeightAck::Reader ack) {
            std::string worker = ack.getWorker();
            carry_out(self, st.core->on_ack(worker, sync::decode_ack(ack)));
          }))
        return;
      log_unhandled(e, st.me);
    },
    [self](peer_down_atom, const peer_info& who, const std::string&) {
      auto& st = self->state;
      if (who.role != role::rollout_worker)
        return;
      st.peers.workers.erase(who.name());
      carry_out(self, st.core->on_worker_down(who.name()));
    },
    [self](shutdown_atom, bool, const std::string&) { self->quit(); },
  };
}

} // namespace

caf::actor spawn_sync_publisher(caf::actor_system& sys, const role_context& ctx) {
  return sys.spawn(publisher_actor, ctx);
}

} // namespace sorl
