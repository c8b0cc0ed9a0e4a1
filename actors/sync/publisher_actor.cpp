#include "actors/sync/publisher_actor.hpp"

#include <map>
#include <set>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/sync/weight_sync.hpp"
#include "messages/sync.capnp.h"
#include "messages/train.capnp.h"

namespace sorl {

namespace {

struct publisher_state {
  static inline const char* name = "sorl.sync_publisher";
  std::string me;
  caf::actor trainer;
  caf::actor directory;
  std::map<std::string, caf::actor> workers; ///< live, by name
  // The version in flight.
  bool publishing = false;
  uint64_t version = 0;
  uint64_t model_hash = 0;
  std::set<std::string> waiting;
  uint64_t bytes_sent = 0;
  uint64_t dense_bytes = 0;
  int64_t started_ns = 0;
};

using publisher_actor_t = caf::stateful_actor<publisher_state>;

void maybe_ready(publisher_actor_t* self) {
  auto& st = self->state;
  if (!st.publishing || !st.waiting.empty())
    return;
  st.publishing = false;
  auto ready = build_envelope<msg::VersionReady>([&](msg::VersionReady::Builder b) {
    b.setVersion(st.version);
    b.setModelHash(st.model_hash);
    b.setWorkers(static_cast<uint32_t>(st.workers.size()));
    b.setBytesSent(st.bytes_sent);
    b.setDenseBytes(st.dense_bytes);
    b.setPublishNs(steady_now_ns() - st.started_ns);
  });
  spdlog::debug("{}: version {} acknowledged by {} workers", st.me, st.version,
                st.workers.size());
  self->send(st.trainer, ready);
}

void fail_job(publisher_actor_t* self, std::string why) {
  sorl::fail_job(self->state.directory, self->state.me, std::move(why));
}

/// Encodes and sends one full version to every live worker.
void publish(publisher_actor_t* self, msg::WeightSnapshot::Reader snap, uint64_t bucket_bytes) {
  auto& st = self->state;
  st.started_ns = steady_now_ns();
  std::vector<sync::tensor_meta> metas;
  std::vector<capnp::Data::Reader> blobs;
  auto names = snap.getNames();
  auto shapes = snap.getShapes();
  auto data = snap.getData();
  if (names.size() != shapes.size() || names.size() != data.size())
    throw std::invalid_argument("snapshot lists differ in length");
  auto dtype = snap.getDtype() == msg::WeightDtype::BF16 ? sync::weight_dtype::bf16
                                                         : sync::weight_dtype::fp32;
  std::vector<uint64_t> hashes;
  for (unsigned i = 0; i < names.size(); ++i) {
    sync::tensor_meta m;
    m.name = names[i];
    for (auto d : shapes[i])
      m.shape.push_back(d);
    m.dtype = dtype;
    if (data[i].size() != m.bytes())
      throw std::invalid_argument(fmt::format("snapshot tensor \"{}\" has {} bytes, its shape "
                                              "needs {}",
                                              m.name, data[i].size(), m.bytes()));
    m.hash = sync::hash_bytes(data[i].begin(), data[i].size());
    hashes.push_back(m.hash);
    metas.push_back(std::move(m));
    blobs.push_back(data[i]);
  }
  st.version = snap.getVersion();
  st.model_hash = sync::model_hash(hashes);
  auto buckets = sync::plan_buckets(metas, bucket_bytes);
  uint64_t total = 0;
  for (auto& m : metas)
    total += m.bytes();
  st.dense_bytes = total;
  st.bytes_sent = total;
  auto header = build_envelope<msg::WeightVersion>([&](msg::WeightVersion::Builder b) {
    b.setVersion(st.version);
    auto list = b.initTensors(static_cast<unsigned>(metas.size()));
    for (size_t i = 0; i < metas.size(); ++i) {
      auto t = list[static_cast<unsigned>(i)];
      t.setName(metas[i].name);
      auto shape = t.initShape(static_cast<unsigned>(metas[i].shape.size()));
      for (size_t k = 0; k < metas[i].shape.size(); ++k)
        shape.set(static_cast<unsigned>(k), metas[i].shape[k]);
      t.setDtype(dtype == sync::weight_dtype::bf16 ? msg::WeightDtype::BF16
                                                   : msg::WeightDtype::FP32);
      t.setHash(metas[i].hash);
    }
    b.setModelHash(st.model_hash);
    b.setBucketCount(static_cast<uint32_t>(buckets.size()));
    b.setTotalBytes(total);
    b.setFull(true);
  });
  std::vector<envelope> encoded;
  for (size_t k = 0; k < buckets.size(); ++k) {
    encoded.push_back(build_envelope<msg::WeightBucket>([&](msg::WeightBucket::Builder b) {
      b.setVersion(st.version);
      b.setIndex(static_cast<uint32_t>(k));
      auto chunks = b.initChunks(static_cast<unsigned>(buckets[k].size()));
      std::vector<uint8_t> all;
      for (size_t c = 0; c < buckets[k].size(); ++c) {
        const auto& ref = buckets[k][c];
        auto esz = sync::element_size(metas[ref.tensor].dtype);
        auto bytes = kj::arrayPtr(blobs[ref.tensor].begin() + ref.offset * esz, ref.count * esz);
        auto out = chunks[static_cast<unsigned>(c)];
        out.setTensor(ref.tensor);
        out.setOffset(ref.offset);
        out.setData(bytes);
        all.insert(all.end(), bytes.begin(), bytes.end());
      }
      b.setChecksum(sync::hash_bytes(all.data(), all.size()));
    }));
  }
  st.waiting.clear();
  for (auto& [name, handle] : st.workers) {
    st.waiting.insert(name);
    self->send(handle, header);
    for (auto& e : encoded)
      self->send(handle, e);
  }
  st.publishing = true;
  maybe_ready(self);
}

caf::behavior publisher_actor(publisher_actor_t* self, role_context ctx) {
  self->state.me = ctx.name();
  self->state.directory = ctx.directory;
  auto bucket_bytes = static_cast<uint64_t>(ctx.config->sync.bucket_bytes);
  return {
    [self](roster_atom, const std::vector<peer_info>& roster) {
      auto& st = self->state;
      st.trainer = single_peer(roster, "trainer");
      for (auto& p : peers_with_role(roster, "rollout_worker"))
        st.workers.emplace(p.name(), p.handle);
    },
    [self, bucket_bytes](const envelope& e) {
      auto& st = self->state;
      if (handle_as<msg::WeightSnapshot>(e, st.me, [&](msg::WeightSnapshot::Reader snap) {
            if (st.publishing) {
              fail_job(self, fmt::format("snapshot {} arrived while version {} is still being "
                                         "acknowledged",
                                         snap.getVersion(), st.version));
              return;
            }
            try {
              publish(self, snap, bucket_bytes);
            } catch (const std::exception& ex) {
              fail_job(self, fmt::format("cannot publish version {}: {}", snap.getVersion(),
                                         ex.what()));
            }
          }))
        return;
      if (handle_as<msg::WeightAck>(e, st.me, [&](msg::WeightAck::Reader ack) {
            std::string worker = ack.getWorker();
            if (!st.publishing || ack.getVersion() != st.version) {
              spdlog::warn("{}: stale ack from {} for version {}", st.me, worker,
                           ack.getVersion());
              return;
            }
            if (!ack.getOk()) {
              fail_job(self, fmt::format("{} failed to apply version {}: {}", worker,
                                         ack.getVersion(), ack.getReason().cStr()));
              return;
            }
            if (ack.getModelHash() != st.model_hash) {
              fail_job(self, fmt::format("{} holds version {} with hash {:016x}, published "
                                         "{:016x}",
                                         worker, ack.getVersion(), ack.getModelHash(),
                                         st.model_hash));
              return;
            }
            st.waiting.erase(worker);
            maybe_ready(self);
          }))
        return;
      log_unhandled(e, st.me);
    },
    [self](peer_down_atom, const peer_info& who, const std::string& why) {
      auto& st = self->state;
      if (who.role != "rollout_worker")
        return;
      st.workers.erase(who.name());
      st.waiting.erase(who.name());
      if (st.workers.empty()) {
        fail_job(self, "every rollout worker is gone");
        return;
      }
      maybe_ready(self);
    },
    [self](shutdown_atom, bool, const std::string&) { self->quit(); },
  };
}

} // namespace

caf::actor spawn_sync_publisher(caf::actor_system& sys, const role_context& ctx) {
  return sys.spawn(publisher_actor, ctx);
}

} // namespace sorl
