#include "actors/sync/sync_wire.hpp"

#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace sorl::sync {

namespace {

msg::WeightDtype to_msg(weight_dtype d) {
  return d == weight_dtype::bf16 ? msg::WeightDtype::BF16 : msg::WeightDtype::FP32;
}

weight_dtype from_msg(msg::WeightDtype d) {
  return d == msg::WeightDtype::BF16 ? weight_dtype::bf16 : weight_dtype::fp32;
}

} // namespace

envelope encode_version_header(const version_header& h) {
  return build_envelope<msg::WeightVersion>([&](msg::WeightVersion::Builder b) {
    b.setVersion(h.version);
    auto list = b.initTensors(static_cast<unsigned>(h.tensors.size()));
    for (size_t i = 0; i < h.tensors.size(); ++i) {
      const auto& m = h.tensors[i];
      auto t = list[static_cast<unsigned>(i)];
      t.setName(m.name);
      auto shape = t.initShape(static_cast<unsigned>(m.shape.size()));
      for (size_t k = 0; k < m.shape.size(); ++k)
        shape.set(static_cast<unsigned>(k), m.shape[k]);
      t.setDtype(to_msg(m.dtype));
      t.setHash(m.hash);
    }
    b.setModelHash(h.model_hash);
    b.setBucketCount(h.bucket_count);
    b.setTotalBytes(h.total_bytes);
    b.setFull(h.full);
    b.setBaseVersion(h.base_version);
    b.setChangedElements(h.changed_elements);
    b.setEncodeNs(h.encode_ns);
  });
}

envelope encode_bucket(const weight_bucket& w) {
  return build_envelope<msg::WeightBucket>([&](msg::WeightBucket::Builder b) {
    b.setVersion(w.version);
    b.setIndex(w.index);
    if (!w.delta.empty()) {
      b.setDelta(kj::arrayPtr(w.delta.data(), w.delta.size()));
      return;
    }
    auto chunks = b.initChunks(static_cast<unsigned>(w.chunks.size()));
    for (size_t c = 0; c < w.chunks.size(); ++c) {
      const auto& ref = w.chunks[c];
      auto out = chunks[static_cast<unsigned>(c)];
      out.setTensor(ref.tensor);
      out.setOffset(ref.offset);
      out.setData(kj::arrayPtr(ref.data, ref.bytes));
    }
    b.setChecksum(w.checksum);
  });
}

envelope encode_ack(const weight_ack& a, const std::string& worker) {
  return build_envelope<msg::WeightAck>([&](msg::WeightAck::Builder b) {
    b.setVersion(a.version);
    b.setWorker(worker);
    b.setOk(a.ok);
    b.setModelHash(a.model_hash);
    b.setReason(a.reason);
    b.setApplyNs(a.apply_ns);
    b.setFull(a.full);
  });
}

envelope encode_version_ready(const version_ready& v) {
  return build_envelope<msg::VersionReady>([&](msg::VersionReady::Builder b) {
    b.setVersion(v.version);
    b.setModelHash(v.model_hash);
    b.setWorkers(v.workers);
    b.setBytesSent(v.bytes_sent);
    b.setDenseBytes(v.dense_bytes);
    b.setPublishNs(v.publish_ns);
    b.setChangedElements(v.changed_elements);
    b.setElements(v.elements);
    b.setEncodeNs(v.encode_ns);
    b.setApplyNsMax(v.apply_ns_max);
    b.setFullWorkers(v.full_workers);
    b.setSparseWorkers(v.sparse_workers);
    b.setResyncs(v.resyncs);
    b.setSparseBytes(v.sparse_bytes);
    b.setVerifiedWorkers(v.verified_workers);
    b.setRecurringElements(v.recurring_elements);
    b.setBoundBits(v.bound_bits);
  });
}

version_ready decode_version_ready(msg::VersionReady::Reader r) {
  version_ready v;
  v.version = r.getVersion();
  v.model_hash = r.getModelHash();
  v.workers = r.getWorkers();
  v.bytes_sent = r.getBytesSent();
  v.dense_bytes = r.getDenseBytes();
  v.publish_ns = r.getPublishNs();
  v.changed_elements = r.getChangedElements();
  v.elements = r.getElements();
  v.encode_ns = r.getEncodeNs();
  v.apply_ns_max = r.getApplyNsMax();
  v.full_workers = r.getFullWorkers();
  v.sparse_workers = r.getSparseWorkers();
  v.resyncs = r.getResyncs();
  v.sparse_bytes = r.getSparseBytes();
  v.verified_workers = r.getVerifiedWorkers();
  v.recurring_elements = r.getRecurringElements();
  v.bound_bits = r.getBoundBits();
  return v;
}

version_header decode_version_header(msg::WeightVersion::Reader v) {
  version_header h;
  h.version = v.getVersion();
  for (auto t : v.getTensors()) {
    tensor_meta m;
    m.name = t.getName();
    for (auto d : t.getShape())
      m.shape.push_back(d);
    m.dtype = from_msg(t.getDtype());
    m.hash = t.getHash();
    h.tensors.push_back(std::move(m));
  }
  h.model_hash = v.getModelHash();
  h.bucket_count = v.getBucketCount();
  h.total_bytes = v.getTotalBytes();
  h.full = v.getFull();
  h.base_version = v.getBaseVersion();
  h.changed_elements = v.getChangedElements();
  h.encode_ns = v.getEncodeNs();
  return h;
}

bucket_view decode_bucket(msg::WeightBucket::Reader b) {
  bucket_view v;
  v.version = b.getVersion();
  v.index = b.getIndex();
  if (b.hasDelta()) {
    auto delta = b.getDelta();
    if (delta.size() > 0) {
      v.delta = delta.begin();
      v.delta_size = delta.size();
      return v;
    }
  }
  for (auto c : b.getChunks()) {
    auto data = c.getData();
    v.chunks.push_back({c.getTensor(), c.getOffset(), data.begin(), data.size()});
  }
  v.checksum = b.getChecksum();
  return v;
}

weight_ack decode_ack(msg::WeightAck::Reader a) {
  weight_ack w;
  w.version = a.getVersion();
  w.ok = a.getOk();
  w.model_hash = a.getModelHash();
  w.reason = a.getReason().cStr();
  w.apply_ns = a.getApplyNs();
  w.full = a.getFull();
  return w;
}

envelope encode_snapshot(const snapshot_view& s) {
  if (s.shapes.size() != s.names.size() || s.data.size() != s.names.size())
    throw std::invalid_argument(fmt::format("snapshot of version {}: {} names, {} shapes, {} "
                                            "tensors",
                                            s.version, s.names.size(), s.shapes.size(),
                                            s.data.size()));
  return build_envelope<msg::WeightSnapshot>([&](msg::WeightSnapshot::Builder b) {
    const auto n = static_cast<unsigned>(s.names.size());
    b.setVersion(s.version);
    b.setDtype(to_msg(s.dtype));
    auto names = b.initNames(n);
    auto shapes = b.initShapes(n);
    auto data = b.initData(n);
    for (unsigned k = 0; k < n; ++k) {
      names.set(k, s.names[k]);
      auto shape = shapes.init(k, static_cast<unsigned>(s.shapes[k].size()));
      for (size_t d = 0; d < s.shapes[k].size(); ++d)
        shape.set(static_cast<unsigned>(d), s.shapes[k][d]);
      data.set(k, kj::arrayPtr(reinterpret_cast<const kj::byte*>(s.data[k].data), s.data[k].size));
    }
  });
}

snapshot_view decode_snapshot(msg::WeightSnapshot::Reader s,
                              std::shared_ptr<const void> keep_alive) {
  snapshot_view v;
  v.version = s.getVersion();
  v.dtype = from_msg(s.getDtype());
  for (auto n : s.getNames())
    v.names.emplace_back(n.cStr(), n.size());
  for (auto shape : s.getShapes()) {
    std::vector<int64_t> dims;
    for (auto d : shape)
      dims.push_back(d);
    v.shapes.push_back(std::move(dims));
  }
  for (auto d : s.getData())
    v.data.push_back({d.begin(), d.size()});
  v.keep_alive = std::move(keep_alive);
  return v;
}

void write_logs(const std::vector<log_line>& logs) {
  for (const auto& l : logs) {
    switch (l.lvl) {
      case log_line::level::debug:
        spdlog::debug("{}", l.text);
        break;
      case log_line::level::warn:
        spdlog::warn("{}", l.text);
        break;
      case log_line::level::error:
        spdlog::error("{}", l.text);
        break;
    }
  }
}

} // namespace sorl::sync
