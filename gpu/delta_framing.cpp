#include "gpu/delta_framing.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <fmt/format.h>

namespace sorl::gpu {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "bucket framing writes little-endian fields directly");
static_assert(sync::delta_segment_elements % tile_elements == 0,
              "K1/K2 tiles must not straddle segments");

namespace {

using sync::delta_checksum_bytes;
using sync::delta_entry_bytes;
using sync::delta_entry_kind;
using sync::delta_header_bytes;
using sync::delta_sparse_params;

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <class T>
void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

delta_sparse_params to_sync(const code_params& p) {
  delta_sparse_params s;
  s.rice_k = p.rice_k;
  s.escape_k = p.escape_k;
  s.minus_first = p.minus_first != 0;
  return s;
}

/// The buckets of one version; the same bytes as the CPU encoder's bucket builder
/// (actors/sync/delta_codec.cpp), kept in step with it by tests/gpu/gpu_twin_test.cpp.
class bucket_builder {
public:
  bucket_builder(uint64_t base_version, uint64_t version, uint64_t bucket_bytes)
    : base_version_(base_version), version_(version), bucket_bytes_(bucket_bytes) {
    open();
  }

  uint64_t room() const {
    const uint64_t used = size_ + delta_entry_bytes + delta_checksum_bytes;
    return used >= bucket_bytes_ ? 0 : bucket_bytes_ - used;
  }
  bool empty() const {
    return records_.empty();
  }

  template <class Write>
  void add(uint32_t tensor, delta_entry_kind kind, const delta_sparse_params& p, uint64_t offset,
           uint64_t count, uint64_t changed, uint64_t payload_bytes, Write&& write) {
    uint8_t rec[delta_entry_bytes] = {};
    store<uint32_t>(rec, tensor);
    rec[4] = static_cast<uint8_t>(kind);
    if (kind == delta_entry_kind::sparse) {
      rec[5] = static_cast<uint8_t>(p.rice_k);
      rec[6] = static_cast<uint8_t>(p.escape_k);
      rec[7] = p.minus_first ? 1 : 0;
    } else {
      ++dense_entries_;
    }
    store<uint64_t>(rec + 8, offset);
    store<uint64_t>(rec + 16, count);
    store<uint64_t>(rec + 24, changed);
    store<uint64_t>(rec + 32, payload_bytes);
    records_.insert(records_.end(), rec, rec + delta_entry_bytes);
    const size_t at = payload_.size();
    payload_.resize(at + payload_bytes);
    write(payload_.data() + at);
    size_ += delta_entry_bytes + payload_bytes;
    changed_ += changed;
    ++entries_;
  }

  void close() {
    const uint64_t total = size_ + delta_checksum_bytes;
    std::vector<uint8_t> b(total);
    uint8_t* h = b.data();
    store<uint32_t>(h, sync::delta_magic);
    store<uint16_t>(h + 4, sync::delta_format);
    store<uint64_t>(h + 8, base_version_);
    store<uint64_t>(h + 16, version_);
    store<uint32_t>(h + 24, static_cast<uint32_t>(buckets_.size()));
    store<uint32_t>(h + 32, static_cast<uint32_t>(records_.size() / delta_entry_bytes));
    store<uint64_t>(h + 40, changed_);
    store<uint64_t>(h + 48, total);
    if (!records_.empty())
      std::memcpy(h + delta_header_bytes, records_.data(), records_.size());
    if (!payload_.empty())
      std::memcpy(h + delta_header_bytes + records_.size(), payload_.data(), payload_.size());
    buckets_.push_back(std::move(b));
    if (buckets_.size() > std::numeric_limits<uint32_t>::max())
      throw std::invalid_argument(
        "encode_delta_gpu: more than 2^32 - 1 buckets; raise bucket_bytes");
    open();
  }

  std::vector<std::vector<uint8_t>> finish(sync::delta_stats* stats) {
    if (!empty() || buckets_.empty())
      close();
    const auto count = static_cast<uint32_t>(buckets_.size());
    uint64_t bytes = 0;
    for (auto& b : buckets_) {
      store<uint32_t>(b.data() + 28, count);
      store<uint64_t>(b.data() + b.size() - delta_checksum_bytes,
                      XXH3_64bits(b.data(), b.size() - delta_checksum_bytes));
      bytes += b.size();
    }
    stats->encoded_bytes = bytes;
    stats->buckets = buckets_.size();
    stats->dense_segments = dense_entries_;
    stats->entries = entries_;
    return std::move(buckets_);
  }

private:
  void open() {
    records_.clear();
    payload_.clear();
    size_ = delta_header_bytes;
    changed_ = 0;
  }

  uint64_t base_version_, version_, bucket_bytes_;
  std::vector<std::vector<uint8_t>> buckets_;
  std::vector<uint8_t> records_, payload_;
  uint64_t size_ = 0, changed_ = 0, dense_entries_ = 0, entries_ = 0;
};

/// A segment's changes on the host, for an entry that has to be cut.
struct segment_changes {
  std::vector<uint32_t> positions;
  std::vector<uint16_t> steps;
  std::vector<uint32_t> rebased;
};

struct range_cost {
  uint64_t bytes;
  bool dense;
  delta_sparse_params params;
};

range_cost cost_of(segment_changes& c, uint64_t a, uint64_t e, size_t lo, size_t hi) {
  const uint32_t* pos = c.positions.data() + lo;
  if (a != 0) {
    c.rebased.resize(hi - lo);
    for (size_t i = lo; i < hi; ++i)
      c.rebased[i - lo] = c.positions[i] - static_cast<uint32_t>(a);
    pos = c.rebased.data();
  }
  range_cost r;
  r.params = sync::choose_delta_params(pos, c.steps.data() + lo, hi - lo);
  const uint64_t sparse =
    (sync::delta_sparse_bits(pos, c.steps.data() + lo, hi - lo, r.params) + 7) / 8;
  const uint64_t dense = 2 * (e - a);
  r.dense = dense < sparse;
  r.bytes = r.dense ? dense : sparse;
  return r;
}

/// The CPU encoder's placement loop (place_segment in actors/sync/delta_codec.cpp) for a
/// segment whose whole entry does not fit the current bucket.
void place_cut_segment(bucket_builder& bb, uint32_t tensor, size_t segment,
                       const segment_desc& d, segment_changes& c, segment_data& data) {
  const uint64_t seg = d.offset;
  const uint64_t n = d.count;
  uint64_t a = 0;
  size_t lo = 0;
  const size_t total = c.positions.size();
  auto changes_below = [&](uint64_t e) {
    return static_cast<size_t>(
      std::lower_bound(c.positions.begin() + static_cast<std::ptrdiff_t>(lo), c.positions.end(),
                       static_cast<uint32_t>(e)) -
      c.positions.begin());
  };
  auto emit = [&](uint64_t e, size_t hi, const range_cost& rc) {
    const uint64_t count = e - a;
    if (rc.dense) {
      bb.add(tensor, delta_entry_kind::dense, {}, seg + a, count, hi - lo, rc.bytes,
             [&](uint8_t* out) {
               std::vector<uint16_t> next(count);
               data.copy_next(segment, a, count, next.data());
               std::memcpy(out, next.data(), 2 * count);
             });
    } else {
      const uint32_t* pos = a != 0 ? c.rebased.data() : c.positions.data() + lo;
      bb.add(tensor, delta_entry_kind::sparse, rc.params, seg + a, count, hi - lo, rc.bytes,
             [&](uint8_t* out) {
               sync::write_delta_sparse_payload(pos, c.steps.data() + lo, hi - lo, rc.params,
                                                out);
             });
    }
  };
  while (lo < total) {
    const uint64_t room = bb.room();
    range_cost whole = cost_of(c, a, n, lo, total);
    if (whole.bytes <= room) {
      emit(n, total, whole);
      return;
    }
    uint64_t lo_e = a, hi_e = n;
    while (hi_e - lo_e > 1) {
      const uint64_t mid = lo_e + (hi_e - lo_e) / 2;
      if (cost_of(c, a, mid, lo, changes_below(mid)).bytes <= room)
        lo_e = mid;
      else
        hi_e = mid;
    }
    const size_t hi = changes_below(lo_e);
    if (lo_e == a || hi == lo) {
      if (bb.empty())
        throw std::logic_error("encode_delta_gpu: an empty bucket holds no change");
      bb.close();
      continue;
    }
    emit(lo_e, hi, cost_of(c, a, lo_e, lo, hi));
    bb.close();
    a = lo_e;
    lo = hi;
  }
}

} // namespace

std::vector<const sync::delta_source*> sorted_delta_sources(
  const std::vector<sync::delta_source>& sources, const char* who) {
  std::vector<const sync::delta_source*> order(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    const sync::delta_source& s = sources[i];
    if (s.elements > 0 && (s.base == nullptr || s.next == nullptr))
      throw std::invalid_argument(
        fmt::format("{}: tensor {} has {} elements but no data", who, s.tensor, s.elements));
    order[i] = &s;
  }
  std::sort(order.begin(), order.end(),
            [](const sync::delta_source* x, const sync::delta_source* y) {
              return x->tensor < y->tensor;
            });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->tensor == order[i - 1]->tensor)
      throw std::invalid_argument(fmt::format("{}: tensor id {} given twice", who, order[i]->tensor));
  return order;
}

void check_delta_options(const sync::delta_options& options, const char* who) {
  if (options.bucket_bytes < sync::delta_min_bucket_bytes)
    throw std::invalid_argument(fmt::format("{}: bucket_bytes = {} is below {}", who,
                                            options.bucket_bytes, sync::delta_min_bucket_bytes));
}

std::vector<segment_desc> plan_delta_segments(const std::vector<const sync::delta_source*>& sorted,
                                              uint64_t* tiles_out) {
  std::vector<segment_desc> segs;
  uint64_t tiles = 0;
  for (size_t s = 0; s < sorted.size(); ++s) {
    const uint64_t n = sorted[s]->elements;
    for (uint64_t off = 0; off < n; off += sync::delta_segment_elements) {
      segment_desc d;
      d.source = static_cast<uint32_t>(s);
      d.offset = off;
      d.count = std::min(sync::delta_segment_elements, n - off);
      d.tile_begin = tiles;
      tiles += (d.count + tile_elements - 1) / tile_elements;
      segs.push_back(d);
    }
  }
  *tiles_out = tiles;
  return segs;
}

std::vector<std::vector<uint8_t>> frame_delta_buckets(
  uint64_t base_version, uint64_t version, const std::vector<const sync::delta_source*>& sorted,
  const std::vector<segment_desc>& segments, const std::vector<segment_result>& results,
  segment_data& data, const sync::delta_options& options, sync::delta_stats* stats) {
  sync::delta_stats st;
  for (const sync::delta_source* s : sorted)
    st.elements += s->elements;
  bucket_builder bb(base_version, version, options.bucket_bytes);
  segment_changes c;
  for (size_t i = 0; i < segments.size(); ++i) {
    const segment_desc& d = segments[i];
    const segment_result& r = results[i];
    if (r.changed == 0)
      continue;
    st.changed += r.changed;
    const uint32_t tensor = sorted[d.source]->tensor;
    const bool dense = segment_is_dense(d, r);
    const uint64_t bytes = dense ? 2 * d.count : sparse_payload_bytes(r);
    if (bytes <= bb.room()) {
      if (dense) {
        bb.add(tensor, delta_entry_kind::dense, {}, d.offset, d.count, r.changed, bytes,
               [&](uint8_t* out) {
                 std::vector<uint16_t> next(d.count);
                 data.copy_next(i, 0, d.count, next.data());
                 std::memcpy(out, next.data(), bytes);
               });
      } else {
        bb.add(tensor, delta_entry_kind::sparse, to_sync(r.params), d.offset, d.count, r.changed,
               bytes, [&](uint8_t* out) { std::memcpy(out, data.sparse_payload(i), bytes); });
      }
      continue;
    }
    c.positions.resize(r.changed);
    c.steps.resize(r.changed);
    data.copy_changes(i, c.positions.data(), c.steps.data());
    place_cut_segment(bb, tensor, i, d, c, data);
  }
  st.dense_bytes = 2 * st.elements;
  auto buckets = bb.finish(&st);
  if (stats != nullptr)
    *stats = st;
  return buckets;
}

std::vector<entry_record> read_checked_entries(const uint8_t* data, size_t size) {
  (void)size;
  const uint32_t entries = load<uint32_t>(data + 32);
  std::vector<entry_record> out(entries);
  uint64_t payload = delta_header_bytes + uint64_t{entries} * delta_entry_bytes;
  for (uint32_t e = 0; e < entries; ++e) {
    const uint8_t* rec = data + delta_header_bytes + size_t{e} * delta_entry_bytes;
    entry_record& v = out[e];
    v.tensor = load<uint32_t>(rec);
    v.kind = static_cast<delta_entry_kind>(rec[4]);
    v.params = code_params{rec[5], rec[6], static_cast<uint32_t>(rec[7] & 1u)};
    v.offset = load<uint64_t>(rec + 8);
    v.count = load<uint64_t>(rec + 16);
    v.changed = load<uint64_t>(rec + 24);
    v.payload_bytes = load<uint64_t>(rec + 32);
    v.payload_at = payload;
    payload += v.payload_bytes;
  }
  return out;
}

} // namespace sorl::gpu
