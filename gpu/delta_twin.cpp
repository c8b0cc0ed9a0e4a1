#include "gpu/delta_twin.hpp"

#include "gpu/delta_framing.hpp"
#include "gpu/sparse_sync_kernels.cuh"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace sorl::gpu {

namespace {

/// Host twin of the device buffers of one encode.
struct twin_encode {
  std::vector<kernel_segment> segs;
  std::vector<uint64_t> tile_offsets; // tiles + 1: exclusive scan of the tile counts
  std::vector<uint32_t> positions;
  std::vector<uint16_t> steps;
  std::vector<uint64_t> payload_word; // per segment, ~0 when it has no sparse payload
  std::vector<uint32_t> payload;
};

constexpr uint64_t no_payload = ~uint64_t{0};

// ---- emulated kernels: one function per kernel, blocks then threads in order ----

void k1_count(const twin_encode& t, uint64_t tiles, uint64_t* counts) {
  const auto nseg = static_cast<uint32_t>(t.segs.size());
  for (uint64_t block = 0; block < tiles; ++block) {
    const kernel_segment& s = t.segs[segment_of_tile(t.segs.data(), nseg, block)];
    const uint64_t tile_begin = (block - s.tile_begin) * tile_elements;
    uint64_t total = 0; // the block reduction
    for (uint32_t thread = 0; thread < block_threads; ++thread) {
      const uint64_t begin = tile_begin + uint64_t{thread} * thread_elements;
      total += popcount_u32(thread_changed_mask(s.base, s.next, s.count, begin));
    }
    counts[block] = total;
  }
}

void k2_compact(twin_encode& t, uint64_t tiles) {
  const auto nseg = static_cast<uint32_t>(t.segs.size());
  for (uint64_t block = 0; block < tiles; ++block) {
    const uint32_t si = segment_of_tile(t.segs.data(), nseg, block);
    const kernel_segment& s = t.segs[si];
    const uint64_t tile_begin = (block - s.tile_begin) * tile_elements;
    // The segment's changes start at its first tile's offset; positions are segment-relative.
    const uint64_t seg_changes = t.tile_offsets[s.tile_begin];
    uint64_t rank = t.tile_offsets[block] - seg_changes; // block exclusive scan, running
    for (uint32_t thread = 0; thread < block_threads; ++thread) {
      const uint64_t begin = tile_begin + uint64_t{thread} * thread_elements;
      const uint32_t mask = thread_changed_mask(s.base, s.next, s.count, begin);
      thread_emit_changes(s.base, s.next, begin, mask, t.positions.data() + seg_changes,
                          t.steps.data() + seg_changes, rank);
      rank += popcount_u32(mask);
    }
  }
}

void k3_params(const twin_encode& t, segment_result* results) {
  for (size_t block = 0; block < t.segs.size(); ++block) {
    const kernel_segment& s = t.segs[block];
    const uint64_t first = t.tile_offsets[s.tile_begin];
    const uint64_t m = t.tile_offsets[s.tile_end] - first;
    segment_result r;
    r.changed = m;
    if (m != 0) {
      const uint32_t* pos = t.positions.data() + first;
      const uint16_t* steps = t.steps.data() + first;
      const uint64_t last = pos[m - 1];
      const uint32_t k_lo = rice_window_low(m, last);
      segment_sums total;
      sums_clear(total);
      for (uint32_t thread = 0; thread < block_threads; ++thread) {
        segment_sums local;
        sums_clear(local);
        for (uint64_t i = thread; i < m; i += block_threads)
          sums_add_element(local, change_gap(pos, i), steps[i], k_lo);
        for (uint32_t f = 0; f < segment_sums::fields; ++f) // the block reduction
          total.v[f] += local.v[f];
      }
      r.params = params_from_sums(total, m, last);
      r.sparse_bits = sparse_bits_from_sums(total, m, last, r.params);
    }
    results[block] = r;
  }
}

void k4_payload(twin_encode& t, const segment_result* results) {
  for (size_t block = 0; block < t.segs.size(); ++block) {
    if (t.payload_word[block] == no_payload)
      continue;
    const kernel_segment& s = t.segs[block];
    const uint64_t first = t.tile_offsets[s.tile_begin];
    const uint64_t m = results[block].changed;
    const code_params p = results[block].params;
    const uint32_t* pos = t.positions.data() + first;
    const uint16_t* steps = t.steps.data() + first;
    uint32_t* words = t.payload.data() + t.payload_word[block];
    uint64_t carry = 0;
    for (uint64_t chunk = 0; chunk < m; chunk += uint64_t{block_threads} * payload_items) {
      uint64_t bits[block_threads];
      for (uint32_t thread = 0; thread < block_threads; ++thread) {
        const uint64_t i0 = chunk + uint64_t{thread} * payload_items;
        bits[thread] = 0;
        for (uint32_t j = 0; j < payload_items; ++j)
          if (i0 + j < m)
            bits[thread] += element_code_bits(change_gap(pos, i0 + j), steps[i0 + j], p);
      }
      for (uint32_t thread = 0; thread < block_threads; ++thread) { // block exclusive scan
        const uint64_t i0 = chunk + uint64_t{thread} * payload_items;
        uint64_t at = carry;
        for (uint32_t j = 0; j < payload_items; ++j) {
          if (i0 + j < m) {
            emit_element_codes(words, at, change_gap(pos, i0 + j), steps[i0 + j], p);
            at += element_code_bits(change_gap(pos, i0 + j), steps[i0 + j], p);
          }
        }
        carry += bits[thread];
      }
    }
  }
}

class twin_data final : public segment_data {
public:
  twin_data(const twin_encode& t, const std::vector<segment_result>& r) : t_(t), r_(r) {}
  const uint8_t* sparse_payload(size_t segment) override {
    return reinterpret_cast<const uint8_t*>(t_.payload.data() + t_.payload_word[segment]);
  }
  void copy_next(size_t segment, uint64_t a, uint64_t count, uint8_t* out) override {
    std::memcpy(out, t_.segs[segment].next + a, 2 * count);
  }
  void copy_changes(size_t segment, uint32_t* positions, uint16_t* steps) override {
    const uint64_t first = t_.tile_offsets[t_.segs[segment].tile_begin];
    std::memcpy(positions, t_.positions.data() + first, 4 * r_[segment].changed);
    std::memcpy(steps, t_.steps.data() + first, 2 * r_[segment].changed);
  }

private:
  const twin_encode& t_;
  const std::vector<segment_result>& r_;
};

} // namespace

std::vector<std::vector<uint8_t>> encode_delta_twin(uint64_t base_version, uint64_t version,
                                                    const std::vector<sync::delta_source>& sources,
                                                    const sync::delta_options& options,
                                                    sync::delta_stats* stats) {
  sync::check_delta_options(options, "encode_delta_twin");
  const auto sorted = sync::sorted_delta_sources(sources, "encode_delta_twin");
  uint64_t tiles = 0;
  const std::vector<segment_desc> plan = plan_delta_segments(sorted, &tiles);
  twin_encode t;
  for (const segment_desc& d : plan) {
    const sync::delta_source& src = *sorted[d.source];
    t.segs.push_back(kernel_segment{src.base + d.offset, src.next + d.offset, d.count,
                                    d.tile_begin,
                                    d.tile_begin + (d.count + tile_elements - 1) / tile_elements});
  }
  // K1, then the device-wide scan of the tile counts.
  std::vector<uint64_t> counts(tiles);
  k1_count(t, tiles, counts.data());
  t.tile_offsets.assign(tiles + 1, 0);
  for (uint64_t i = 0; i < tiles; ++i)
    t.tile_offsets[i + 1] = t.tile_offsets[i] + counts[i];
  t.positions.resize(t.tile_offsets[tiles]);
  t.steps.resize(t.tile_offsets[tiles]);
  k2_compact(t, tiles);
  std::vector<segment_result> results(plan.size());
  k3_params(t, results.data());
  // Payload layout: word-aligned per sparse segment (host, as the GPU backend does).
  t.payload_word.assign(plan.size(), no_payload);
  uint64_t words = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (results[i].changed == 0 || segment_is_dense(plan[i], results[i]))
      continue;
    t.payload_word[i] = words;
    words += (sparse_payload_bytes(results[i]) + 3) / 4;
  }
  t.payload.assign(words + 1, 0); // + 1: never empty
  k4_payload(t, results.data());
  twin_data data(t, results);
  return frame_delta_buckets(base_version, version, sorted, plan, results, data, options, stats,
                             "encode_delta_twin");
}

std::optional<std::string> apply_delta_bucket_twin(const uint8_t* data, size_t size,
                                                   uint64_t base_version, uint64_t version,
                                                   const std::vector<sync::delta_target>& targets) {
  if (auto err = sync::check_delta_bucket(data, size, base_version, version, targets))
    return err;
  const std::vector<entry_record> entries = read_checked_entries(data, size);
  std::vector<uint32_t> words((size + 3) / 4 + decode_pad_words, 0);
  std::memcpy(words.data(), data, size);
  auto bits_of = [&](uint32_t tensor) {
    for (const sync::delta_target& t : targets)
      if (t.tensor == tensor)
        return t.bits;
    throw std::logic_error("apply_delta_bucket_twin: a checked bucket names an unknown tensor");
  };
  // Host: where each sparse entry's changes go (exclusive scan of `changed`).
  std::vector<uint64_t> change_at(entries.size(), 0);
  uint64_t total = 0;
  for (size_t e = 0; e < entries.size(); ++e) {
    change_at[e] = total;
    if (entries[e].kind == sync::delta_entry_kind::sparse)
      total += entries[e].changed;
  }
  std::vector<uint16_t*> dst(total);
  std::vector<uint16_t> steps(total);
  // Decode kernel: one thread per sparse entry; dense entries are plain copies.
  for (size_t e = 0; e < entries.size(); ++e) {
    const entry_record& v = entries[e];
    uint16_t* bits = bits_of(v.tensor) + v.offset;
    if (v.kind == sync::delta_entry_kind::dense) {
      std::memcpy(bits, data + v.payload_at, 2 * v.count);
      continue;
    }
    decode_entry(words.data(), v.payload_at * 8, v.params, v.changed, bits,
                 dst.data() + change_at[e], steps.data() + change_at[e]);
  }
  // Scatter kernel: one thread per change.
  for (uint64_t i = 0; i < total; ++i)
    scatter_step(dst[i], steps[i]);
  return std::nullopt;
}

} // namespace sorl::gpu
