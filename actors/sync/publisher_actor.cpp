#include "actors/sync/publisher_actor.hpp"

#include <map>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "actors/common/shell_util.hpp"
#include "actors/sync/delta_codec.hpp"
#include "actors/sync/sync_protocol.hpp"
#include "actors/sync/weight_sync.hpp"
#include "messages/sync.capnp.h"
#include "messages/train.capnp.h"

namespace sorl {

namespace {

/// One version's payloads, encoded once and shared by every worker that gets them (the
/// envelopes are immutable shared buffers: fanning out copies no bytes).
struct payload {
  envelope header;
  std::vector<envelope> buckets;
  uint64_t bytes = 0; ///< bucket payload bytes
};

struct publisher_state {
  static inline const char* name = "sorl.sync_publisher";
  std::string me;
  caf::actor trainer;
  caf::actor directory;
  std::map<std::string, caf::actor> workers; ///< live, by name
  std::unique_ptr<sync::sync_protocol> protocol;
  uint64_t bucket_bytes = 0;
  /// The snapshot every live worker acknowledged (the delta base) and the one in flight.
  std::optional<envelope> base;
  std::optional<envelope> next;
  // The version in flight.
  uint64_t version = 0;
  uint64_t model_hash = 0;
  std::vector<sync::tensor_meta> metas;
  std::optional<payload> full;   ///< built on first need
  std::optional<payload> sparse;
  uint64_t changed = 0;
  uint64_t elements = 0;
  uint64_t dense_bytes = 0;
  uint64_t bytes_sent = 0;       ///< over all workers
  uint32_t full_sends = 0;
  uint32_t sparse_sends = 0;
  int64_t encode_ns = 0;
  int64_t apply_ns_max = 0;
  int64_t started_ns = 0;
  /// The model hash of each worker's last ok acknowledgement of the version in flight.
  std::map<std::string, uint64_t> acked_hash;
};

using publisher_actor_t = caf::stateful_actor<publisher_state>;

void fail_job(publisher_actor_t* self, std::string why) {
  sorl::fail_job(self->state.directory, self->state.me, std::move(why));
}

/// Every live worker holds the version in flight: advance the base and tell the trainer.
void complete(publisher_actor_t* self) {
  auto& st = self->state;
  st.protocol->commit();
  st.base = std::move(st.next);
  st.next.reset();
  auto workers = std::max<size_t>(st.workers.size(), 1);
  // Counted here, from the acknowledgements themselves, not from the protocol's verdict: the
  // trainer's `checksum` says ok only when this covers every live worker.
  uint32_t verified = 0;
  for (const auto& [name, handle] : st.workers) {
    auto it = st.acked_hash.find(name);
    verified += it != st.acked_hash.end() && it->second == st.model_hash ? 1 : 0;
  }
  auto ready = build_envelope<msg::VersionReady>([&](msg::VersionReady::Builder b) {
    b.setVersion(st.version);
    b.setModelHash(st.model_hash);
    b.setWorkers(static_cast<uint32_t>(st.workers.size()));
    b.setBytesSent(st.bytes_sent / workers);
    b.setDenseBytes(st.dense_bytes);
    b.setPublishNs(steady_now_ns() - st.started_ns);
    b.setChangedElements(st.changed);
    b.setElements(st.elements);
    b.setEncodeNs(st.encode_ns);
    b.setApplyNsMax(st.apply_ns_max);
    b.setFullWorkers(st.full_sends);
    b.setSparseWorkers(st.sparse_sends);
    b.setResyncs(st.protocol->resyncs());
    b.setSparseBytes(st.sparse ? st.sparse->bytes : 0);
    b.setVerifiedWorkers(verified);
  });
  st.full.reset();
  st.sparse.reset();
  spdlog::debug("{}: version {} acknowledged by {} workers", st.me, st.version,
                st.workers.size());
  self->send(st.trainer, ready);
}

envelope version_header(const publisher_state& st, bool full, uint64_t base_version,
                        uint32_t bucket_count, uint64_t total_bytes) {
  return build_envelope<msg::WeightVersion>([&](msg::WeightVersion::Builder b) {
    b.setVersion(st.version);
    auto list = b.initTensors(static_cast<unsigned>(st.metas.size()));
    for (size_t i = 0; i < st.metas.size(); ++i) {
      const auto& m = st.metas[i];
      auto t = list[static_cast<unsigned>(i)];
      t.setName(m.name);
      auto shape = t.initShape(static_cast<unsigned>(m.shape.size()));
      for (size_t k = 0; k < m.shape.size(); ++k)
        shape.set(static_cast<unsigned>(k), m.shape[k]);
      t.setDtype(m.dtype == sync::weight_dtype::bf16 ? msg::WeightDtype::BF16
                                                     : msg::WeightDtype::FP32);
      t.setHash(m.hash);
    }
    b.setModelHash(st.model_hash);
    b.setBucketCount(bucket_count);
    b.setTotalBytes(total_bytes);
    b.setFull(full);
    b.setBaseVersion(base_version);
    b.setChangedElements(full ? 0 : st.changed);
    b.setEncodeNs(st.encode_ns);
  });
}

/// The full payload of the snapshot in flight: every element, in bounded buckets.
const payload& full_payload(publisher_actor_t* self) {
  auto& st = self->state;
  if (st.full)
    return *st.full;
  auto t0 = steady_now_ns();
  payload p;
  auto buckets = sync::plan_buckets(st.metas, st.bucket_bytes);
  auto err = with_envelope<msg::WeightSnapshot>(*st.next, [&](msg::WeightSnapshot::Reader snap) {
    // Each capnp access of a blob counts its whole size against the reader's traversal
    // limit: take every tensor's bytes once, not once per bucket.
    std::vector<kj::ArrayPtr<const kj::byte>> blobs;
    for (auto d : snap.getData())
      blobs.push_back(d);
    for (size_t k = 0; k < buckets.size(); ++k) {
      p.buckets.push_back(build_envelope<msg::WeightBucket>([&](msg::WeightBucket::Builder b) {
        b.setVersion(st.version);
        b.setIndex(static_cast<uint32_t>(k));
        auto chunks = b.initChunks(static_cast<unsigned>(buckets[k].size()));
        std::vector<uint8_t> all;
        for (size_t c = 0; c < buckets[k].size(); ++c) {
          const auto& ref = buckets[k][c];
          auto esz = sync::element_size(st.metas[ref.tensor].dtype);
          auto bytes = blobs[ref.tensor].slice(ref.offset * esz, (ref.offset + ref.count) * esz);
          auto out = chunks[static_cast<unsigned>(c)];
          out.setTensor(ref.tensor);
          out.setOffset(ref.offset);
          out.setData(bytes);
          all.insert(all.end(), bytes.begin(), bytes.end());
        }
        b.setChecksum(sync::hash_bytes(all.data(), all.size()));
      }));
    }
  });
  if (err)
    throw std::runtime_error("cannot read the snapshot: " + describe(err));
  p.bytes = st.dense_bytes;
  st.encode_ns += steady_now_ns() - t0;
  p.header = version_header(st, true, 0, static_cast<uint32_t>(p.buckets.size()), p.bytes);
  st.full = std::move(p);
  return *st.full;
}

/// The sparse payload: the delta of the snapshot in flight against the base snapshot.
const payload& sparse_payload(publisher_actor_t* self, uint64_t base_version) {
  auto& st = self->state;
  if (st.sparse)
    return *st.sparse;
  auto t0 = steady_now_ns();
  payload p;
  caf::error inner;
  auto outer = with_envelope<msg::WeightSnapshot>(*st.base, [&](msg::WeightSnapshot::Reader base) {
    inner = with_envelope<msg::WeightSnapshot>(*st.next, [&](msg::WeightSnapshot::Reader next) {
      if (base.getVersion() != base_version)
        throw std::logic_error(fmt::format("base snapshot is version {}, the protocol says {}",
                                           base.getVersion(), base_version));
      auto old_names = base.getNames();
      auto old_data = base.getData();
      auto new_data = next.getData();
      std::vector<sync::delta_source> sources;
      for (unsigned i = 0; i < st.metas.size(); ++i) {
        const auto& m = st.metas[i];
        if (i >= old_names.size() || m.name != old_names[i].cStr() ||
            old_data[i].size() != new_data[i].size() || m.dtype != sync::weight_dtype::bf16)
          throw std::invalid_argument(fmt::format("tensor \"{}\" changed its name, size or "
                                                  "dtype between versions {} and {}",
                                                  m.name, base_version, st.version));
        sync::delta_source s;
        s.tensor = i;
        s.base = reinterpret_cast<const uint16_t*>(old_data[i].begin());
        s.next = reinterpret_cast<const uint16_t*>(new_data[i].begin());
        s.elements = m.elements();
        sources.push_back(s);
      }
      sync::delta_options o;
      o.bucket_bytes = st.bucket_bytes;
      o.threads = 0; // every core: the learner and the workers wait for this version
      sync::delta_stats stats;
      auto buckets = sync::encode_delta(base_version, st.version, sources, o, &stats);
      st.changed = stats.changed;
      for (size_t k = 0; k < buckets.size(); ++k) {
        p.bytes += buckets[k].size();
        p.buckets.push_back(build_envelope<msg::WeightBucket>([&](msg::WeightBucket::Builder b) {
          b.setVersion(st.version);
          b.setIndex(static_cast<uint32_t>(k));
          b.setDelta(kj::arrayPtr(buckets[k].data(), buckets[k].size()));
        }));
      }
    });
  });
  if (outer || inner)
    throw std::runtime_error("cannot read the snapshots: " + describe(outer ? outer : inner));
  st.encode_ns += steady_now_ns() - t0;
  p.header = version_header(st, false, base_version, static_cast<uint32_t>(p.buckets.size()),
                            p.bytes);
  st.sparse = std::move(p);
  return *st.sparse;
}

void send_payload(publisher_actor_t* self, const std::string& worker, const payload& p) {
  auto& st = self->state;
  auto it = st.workers.find(worker);
  if (it == st.workers.end())
    return;
  self->send(it->second, p.header);
  for (const auto& b : p.buckets)
    self->send(it->second, b);
  st.bytes_sent += p.bytes;
}

/// Starts one version: reads the snapshot's header, asks the protocol who gets what, sends.
void publish(publisher_actor_t* self, const envelope& e) {
  auto& st = self->state;
  st.started_ns = steady_now_ns();
  st.metas.clear();
  st.full.reset();
  st.sparse.reset();
  st.changed = st.elements = st.dense_bytes = st.bytes_sent = 0;
  st.full_sends = st.sparse_sends = 0;
  st.encode_ns = st.apply_ns_max = 0;
  st.acked_hash.clear();
  with_envelope<msg::WeightSnapshot>(e, [&](msg::WeightSnapshot::Reader snap) {
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
        throw std::invalid_argument(fmt::format("snapshot tensor \"{}\" has {} bytes, its "
                                                "shape needs {}",
                                                m.name, data[i].size(), m.bytes()));
      m.hash = sync::hash_bytes(data[i].begin(), data[i].size());
      hashes.push_back(m.hash);
      st.elements += m.elements();
      st.dense_bytes += m.bytes();
      st.metas.push_back(std::move(m));
    }
    st.version = snap.getVersion();
    st.model_hash = sync::model_hash(hashes);
  });
  st.next = e;
  auto plan = st.protocol->begin(st.version);
  if (!plan.full.empty())
    spdlog::debug("{}: version {}: full sync to {} worker(s): {}", st.me, st.version,
                  plan.full.size(), plan.why_full);
  for (const auto& w : plan.sparse) {
    send_payload(self, w, sparse_payload(self, *plan.base_version));
    ++st.sparse_sends;
  }
  for (const auto& w : plan.full) {
    send_payload(self, w, full_payload(self));
    ++st.full_sends;
  }
  if (st.workers.empty())
    fail_job(self, "no rollout worker to publish to");
}

caf::behavior publisher_actor(publisher_actor_t* self, role_context ctx) {
  auto& st = self->state;
  st.me = ctx.name();
  st.directory = ctx.directory;
  st.bucket_bytes = static_cast<uint64_t>(ctx.config->sync.bucket_bytes);
  st.protocol = std::make_unique<sync::sync_protocol>(sync::protocol_options_from(*ctx.config));
  return {
    [self](roster_atom, const std::vector<peer_info>& roster) {
      auto& st = self->state;
      st.trainer = single_peer(roster, "trainer");
      for (auto& p : peers_with_role(roster, "rollout_worker")) {
        st.workers.emplace(p.name(), p.handle);
        st.protocol->add_worker(p.name());
      }
    },
    [self](const envelope& e) {
      auto& st = self->state;
      if (handle_as<msg::WeightSnapshot>(e, st.me, [&](msg::WeightSnapshot::Reader snap) {
            if (st.protocol->in_flight()) {
              fail_job(self, fmt::format("snapshot {} arrived while version {} is still being "
                                         "acknowledged",
                                         snap.getVersion(), st.version));
              return;
            }
            try {
              publish(self, e);
            } catch (const std::exception& ex) {
              fail_job(self, fmt::format("cannot publish version {}: {}", snap.getVersion(),
                                         ex.what()));
            }
          }))
        return;
      if (handle_as<msg::WeightAck>(e, st.me, [&](msg::WeightAck::Reader ack) {
            std::string worker = ack.getWorker();
            bool ok = ack.getOk() && ack.getModelHash() == st.model_hash;
            std::string why = !ack.getOk() ? std::string{ack.getReason().cStr()}
                                           : fmt::format("it computed hash {:016x}, published "
                                                         "{:016x}",
                                                         ack.getModelHash(), st.model_hash);
            auto action = st.protocol->on_ack(worker, ack.getVersion(), ok);
            if (action != sync::ack_action::ignore) {
              if (ack.getOk())
                st.acked_hash[worker] = ack.getModelHash();
              else
                st.acked_hash.erase(worker);
            }
            switch (action) {
              case sync::ack_action::ignore:
                spdlog::warn("{}: ignored ack from {} for version {}", st.me, worker,
                             ack.getVersion());
                return;
              case sync::ack_action::fail:
                fail_job(self, fmt::format("{} failed a full sync of version {}: {}", worker,
                                           ack.getVersion(), why));
                return;
              case sync::ack_action::send_full:
                spdlog::warn("{}: {} failed the delta to version {} ({}); sending it in full",
                             st.me, worker, ack.getVersion(), why);
                try {
                  send_payload(self, worker, full_payload(self));
                  ++st.full_sends;
                } catch (const std::exception& ex) {
                  fail_job(self, fmt::format("cannot send version {} in full: {}",
                                             ack.getVersion(), ex.what()));
                }
                return;
              case sync::ack_action::wait:
              case sync::ack_action::complete:
                st.apply_ns_max = std::max(st.apply_ns_max, ack.getApplyNs());
                if (action == sync::ack_action::complete)
                  complete(self);
                return;
            }
          }))
        return;
      log_unhandled(e, st.me);
    },
    [self](peer_down_atom, const peer_info& who, const std::string&) {
      auto& st = self->state;
      if (who.role != "rollout_worker")
        return;
      st.workers.erase(who.name());
      bool done = st.protocol->remove_worker(who.name());
      if (st.workers.empty()) {
        fail_job(self, "every rollout worker is gone");
        return;
      }
      if (done)
        complete(self);
    },
    [self](shutdown_atom, bool, const std::string&) { self->quit(); },
  };
}

} // namespace

caf::actor spawn_sync_publisher(caf::actor_system& sys, const role_context& ctx) {
  return sys.spawn(publisher_actor, ctx);
}

} // namespace sorl
