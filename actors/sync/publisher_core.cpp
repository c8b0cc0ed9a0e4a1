#include "actors/sync/publisher_core.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "runtime/sync/delta_codec.hpp"
#include "runtime/config.hpp"

namespace sorl::sync {

publisher_options publisher_options_from(const experiment_config& cfg) {
  publisher_options o;
  o.protocol = protocol_options_from(cfg);
  o.bucket_bytes = static_cast<uint64_t>(cfg.sync.bucket_bytes);
  return o;
}

publisher_core::publisher_core(std::string name, publisher_options options, clock_ns now)
    : name_(std::move(name)), bucket_bytes_(options.bucket_bytes), now_(std::move(now)),
      protocol_(options.protocol) {
  if (!now_)
    throw std::invalid_argument("publisher_core: no clock");
}

void publisher_core::add_worker(const std::string& name) {
  workers_.insert(name);
  protocol_.add_worker(name);
}

const payload& publisher_core::payload_of(payload_kind kind) const {
  const auto& p = kind == payload_kind::full ? full_ : sparse_;
  if (!p)
    throw std::logic_error(fmt::format("publisher_core: no {} payload of version {}",
                                       kind == payload_kind::full ? "full" : "sparse",
                                       version_));
  return *p;
}

void publisher_core::add_encode_ns(payload_kind kind, int64_t ns) {
  payload_of(kind); // raises when not built
  encode_ns_ += ns;
  (kind == payload_kind::full ? full_ : sparse_)->header.encode_ns = encode_ns_;
}

version_header publisher_core::header(bool full, uint64_t base_version, uint32_t bucket_count,
                                      uint64_t total_bytes) const {
  version_header h;
  h.version = version_;
  h.tensors = metas_;
  h.model_hash = model_hash_;
  h.bucket_count = bucket_count;
  h.total_bytes = total_bytes;
  h.full = full;
  h.base_version = base_version;
  h.changed_elements = full ? 0 : changed_;
  h.encode_ns = encode_ns_;
  return h;
}

const payload& publisher_core::full_payload() {
  if (full_)
    return *full_;
  auto t0 = now_();
  payload p;
  auto buckets = plan_buckets(metas_, bucket_bytes_);
  const auto& blobs = next_->data;
  for (size_t k = 0; k < buckets.size(); ++k) {
    weight_bucket b;
    b.version = version_;
    b.index = static_cast<uint32_t>(k);
    std::vector<uint8_t> all;
    for (const auto& ref : buckets[k]) {
      auto esz = element_size(metas_[ref.tensor].dtype);
      const uint8_t* bytes = blobs[ref.tensor].data + ref.offset * esz;
      size_t n = ref.count * esz;
      b.chunks.push_back({ref.tensor, ref.offset, bytes, n});
      all.insert(all.end(), bytes, bytes + n);
    }
    b.checksum = hash_bytes(all.data(), all.size());
    p.buckets.push_back(std::move(b));
  }
  p.bytes = dense_bytes_;
  encode_ns_ += now_() - t0;
  p.header = header(true, 0, static_cast<uint32_t>(p.buckets.size()), p.bytes);
  full_ = std::move(p);
  return *full_;
}

const payload& publisher_core::sparse_payload(uint64_t base_version) {
  if (sparse_)
    return *sparse_;
  auto t0 = now_();
  payload p;
  const auto& base = *base_;
  const auto& next = *next_;
  if (base.version != base_version)
    throw std::logic_error(fmt::format("base snapshot is version {}, the protocol says {}",
                                       base.version, base_version));
  std::vector<delta_source> sources;
  for (size_t i = 0; i < metas_.size(); ++i) {
    const auto& m = metas_[i];
    if (i >= base.names.size() || m.name != base.names[i] ||
        base.data[i].size != next.data[i].size || m.dtype != weight_dtype::bf16)
      throw std::invalid_argument(fmt::format("tensor \"{}\" changed its name, size or dtype "
                                              "between versions {} and {}",
                                              m.name, base_version, version_));
    delta_source s;
    s.tensor = static_cast<uint32_t>(i);
    s.base = reinterpret_cast<const uint16_t*>(base.data[i].data);
    s.next = reinterpret_cast<const uint16_t*>(next.data[i].data);
    s.elements = m.elements();
    sources.push_back(s);
  }
  delta_options o;
  o.bucket_bytes = bucket_bytes_;
  o.threads = 0; // every core: the learner and the workers wait for this version
  o.history = &history_;
  o.measure_bound = true;
  delta_stats stats;
  auto buckets = encode_delta(base_version, version_, sources, o, &stats);
  changed_ = stats.changed;
  recurring_ = stats.recurring;
  bound_bits_ = stats.bound_bits;
  for (size_t k = 0; k < buckets.size(); ++k) {
    p.bytes += buckets[k].size();
    weight_bucket b;
    b.version = version_;
    b.index = static_cast<uint32_t>(k);
    b.delta = std::move(buckets[k]);
    p.buckets.push_back(std::move(b));
  }
  encode_ns_ += now_() - t0;
  p.header = header(false, base_version, static_cast<uint32_t>(p.buckets.size()), p.bytes);
  sparse_ = std::move(p);
  return *sparse_;
}

void publisher_core::send_payload(result& r, const std::string& worker, payload_kind kind) {
  const auto& p = kind == payload_kind::full ? *full_ : *sparse_;
  if (workers_.count(worker) == 0)
    return;
  r.sends.push_back({worker, kind});
  bytes_sent_ += p.bytes;
}

void publisher_core::begin(const snapshot_view& snap, result& r) {
  started_ns_ = now_();
  metas_.clear();
  full_.reset();
  sparse_.reset();
  changed_ = recurring_ = elements_ = dense_bytes_ = bytes_sent_ = 0;
  bound_bits_ = 0.0;
  full_sends_ = sparse_sends_ = 0;
  encode_ns_ = apply_ns_max_ = 0;
  acked_hash_.clear();
  if (snap.names.size() != snap.shapes.size() || snap.names.size() != snap.data.size())
    throw std::invalid_argument("snapshot lists differ in length");
  std::vector<uint64_t> hashes;
  for (size_t i = 0; i < snap.names.size(); ++i) {
    tensor_meta m;
    m.name = snap.names[i];
    m.shape = snap.shapes[i];
    m.dtype = snap.dtype;
    if (snap.data[i].size != m.bytes())
      throw std::invalid_argument(fmt::format("snapshot tensor \"{}\" has {} bytes, its shape "
                                              "needs {}",
                                              m.name, snap.data[i].size, m.bytes()));
    m.hash = hash_bytes(snap.data[i].data, snap.data[i].size);
    hashes.push_back(m.hash);
    elements_ += m.elements();
    dense_bytes_ += m.bytes();
    metas_.push_back(std::move(m));
  }
  version_ = snap.version;
  model_hash_ = sync::model_hash(hashes);
  next_ = snap;
  auto plan = protocol_.begin(version_);
  if (!plan.full.empty())
    r.logs.push_back({log_line::level::debug,
                      fmt::format("{}: version {}: full sync to {} worker(s): {}", name_,
                                  version_, plan.full.size(), plan.why_full)});
  for (const auto& w : plan.sparse) {
    sparse_payload(*plan.base_version);
    send_payload(r, w, payload_kind::sparse);
    ++sparse_sends_;
  }
  for (const auto& w : plan.full) {
    full_payload();
    send_payload(r, w, payload_kind::full);
    ++full_sends_;
  }
  if (workers_.empty())
    r.fail = "no rollout worker to publish to";
}

publisher_core::result publisher_core::on_snapshot(snapshot_view snapshot) {
  result r;
  if (protocol_.in_flight()) {
    r.fail = fmt::format("snapshot {} arrived while version {} is still being acknowledged",
                         snapshot.version, version_);
    return r;
  }
  try {
    begin(snapshot, r);
  } catch (const std::exception& ex) {
    r.fail = fmt::format("cannot publish version {}: {}", snapshot.version, ex.what());
  }
  return r;
}

void publisher_core::complete(result& r) {
  protocol_.commit();
  base_ = std::move(next_);
  next_.reset();
  auto workers = std::max<size_t>(workers_.size(), 1);
  // Counted here, from the acknowledgements themselves, not from the protocol's verdict: the
  // trainer's `checksum` says ok only when this covers every live worker.
  uint32_t verified = 0;
  for (const auto& name : workers_) {
    auto it = acked_hash_.find(name);
    verified += it != acked_hash_.end() && it->second == model_hash_ ? 1 : 0;
  }
  version_ready v;
  v.version = version_;
  v.model_hash = model_hash_;
  v.workers = static_cast<uint32_t>(workers_.size());
  v.bytes_sent = bytes_sent_ / workers;
  v.dense_bytes = dense_bytes_;
  v.publish_ns = now_() - started_ns_;
  v.changed_elements = changed_;
  v.recurring_elements = recurring_;
  v.bound_bits = bound_bits_;
  v.elements = elements_;
  v.encode_ns = encode_ns_;
  v.apply_ns_max = apply_ns_max_;
  v.full_workers = full_sends_;
  v.sparse_workers = sparse_sends_;
  v.resyncs = protocol_.resyncs();
  v.sparse_bytes = sparse_ ? sparse_->bytes : 0;
  v.verified_workers = verified;
  r.ready = v;
  full_.reset();
  sparse_.reset();
  r.logs.push_back({log_line::level::debug,
                    fmt::format("{}: version {} acknowledged by {} workers", name_, version_,
                                workers_.size())});
}

publisher_core::result publisher_core::on_ack(const std::string& worker, const weight_ack& ack) {
  result r;
  bool ok = ack.ok && ack.model_hash == model_hash_;
  std::string why = !ack.ok ? ack.reason
                            : fmt::format("it computed hash {:016x}, published {:016x}",
                                          ack.model_hash, model_hash_);
  auto action = protocol_.on_ack(worker, ack.version, ok);
  if (action != ack_action::ignore) {
    if (ack.ok)
      acked_hash_[worker] = ack.model_hash;
    else
      acked_hash_.erase(worker);
  }
  switch (action) {
    case ack_action::ignore:
      r.logs.push_back({log_line::level::warn,
                        fmt::format("{}: ignored ack from {} for version {}", name_, worker,
                                    ack.version)});
      return r;
    case ack_action::fail:
      r.fail = fmt::format("{} failed a full sync of version {}: {}", worker, ack.version, why);
      return r;
    case ack_action::send_full:
      r.logs.push_back({log_line::level::warn,
                        fmt::format("{}: {} failed the delta to version {} ({}); sending it in "
                                    "full",
                                    name_, worker, ack.version, why)});
      try {
        full_payload();
        send_payload(r, worker, payload_kind::full);
        ++full_sends_;
      } catch (const std::exception& ex) {
        r.fail = fmt::format("cannot send version {} in full: {}", ack.version, ex.what());
      }
      return r;
    case ack_action::wait:
    case ack_action::complete:
      apply_ns_max_ = std::max(apply_ns_max_, ack.apply_ns);
      if (action == ack_action::complete)
        complete(r);
      return r;
  }
  return r;
}

publisher_core::result publisher_core::on_worker_down(const std::string& name) {
  result r;
  workers_.erase(name);
  bool done = protocol_.remove_worker(name);
  if (workers_.empty()) {
    r.fail = "every rollout worker is gone";
    return r;
  }
  if (done)
    complete(r);
  return r;
}

} // namespace sorl::sync
