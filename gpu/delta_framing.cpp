#include "gpu/delta_framing.hpp"

#include <algorithm>
#include <cstring>

namespace sorl::gpu {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the entry table is read as little-endian fields directly");
static_assert(sync::delta_segment_elements % tile_elements == 0,
              "K1/K2 tiles must not straddle segments");

namespace {

/// The little-endian unsigned field of `bytes` ≤ 8 bytes at p.
uint64_t field(const uint8_t* p, size_t bytes) {
  uint64_t v = 0;
  std::memcpy(&v, p, bytes);
  return v;
}

/// One segment of the backend as sync::delta_bucket_framer reads it.
class framed_segment final : public sync::delta_segment_data {
public:
  explicit framed_segment(segment_data& data) : data_(data) {}

  void select(size_t segment, uint64_t changed, uint64_t payload_bytes) {
    segment_ = segment;
    changed_ = changed;
    payload_bytes_ = payload_bytes;
  }
  void write_sparse_payload(uint8_t* out) override {
    std::memcpy(out, data_.sparse_payload(segment_), payload_bytes_);
  }
  void write_next(uint64_t a, uint64_t count, uint8_t* out) override {
    data_.copy_next(segment_, a, count, out);
  }
  void changes(const uint32_t** positions, const uint16_t** steps) override {
    positions_.resize(changed_);
    steps_.resize(changed_);
    data_.copy_changes(segment_, positions_.data(), steps_.data());
    *positions = positions_.data();
    *steps = steps_.data();
  }

private:
  segment_data& data_;
  size_t segment_ = 0;
  uint64_t changed_ = 0, payload_bytes_ = 0;
  std::vector<uint32_t> positions_;
  std::vector<uint16_t> steps_;
};

} // namespace

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
  segment_data& data, const sync::delta_options& options, sync::delta_stats* stats,
  const char* who) {
  sync::delta_bucket_framer framer(base_version, version, options, who);
  framed_segment seg(data);
  for (size_t i = 0; i < segments.size(); ++i) {
    const segment_desc& d = segments[i];
    const segment_result& r = results[i];
    sync::delta_segment_entry entry;
    entry.tensor = sorted[d.source]->tensor;
    entry.offset = d.offset;
    entry.count = d.count;
    entry.changed = r.changed;
    entry.params.rice_k = r.params.rice_k;
    entry.params.escape_k = r.params.escape_k;
    entry.params.minus_first = r.params.minus_first != 0;
    entry.sparse_bits = r.sparse_bits;
    seg.select(i, r.changed, sparse_payload_bytes(r));
    framer.add_segment(entry, seg);
  }
  return framer.finish(stats);
}

std::vector<entry_record> read_checked_entries(const uint8_t* data, size_t size) {
  (void)size;
  const auto entries = static_cast<uint32_t>(field(data + 32, 4));
  std::vector<entry_record> out(entries);
  uint64_t payload = sync::delta_header_bytes + uint64_t{entries} * sync::delta_entry_bytes;
  for (uint32_t e = 0; e < entries; ++e) {
    const uint8_t* rec = data + sync::delta_header_bytes + size_t{e} * sync::delta_entry_bytes;
    entry_record& v = out[e];
    v.tensor = static_cast<uint32_t>(field(rec, 4));
    v.kind = static_cast<sync::delta_entry_kind>(rec[4]);
    v.params = code_params{rec[5], rec[6], static_cast<uint32_t>(rec[7] & 1u)};
    v.offset = field(rec + 8, 8);
    v.count = field(rec + 16, 8);
    v.changed = field(rec + 24, 8);
    v.payload_bytes = field(rec + 32, 8);
    v.payload_at = payload;
    payload += v.payload_bytes;
  }
  return out;
}

} // namespace sorl::gpu
