#include "gpu/sparse_sync.hpp"

#include "gpu/check.hpp"
#include "gpu/delta_framing.hpp"
#include "gpu/device_buffer.hpp"
#include "gpu/sparse_sync_kernels.cuh"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>

#include <chrono>
#include <cstring>
#include <stdexcept>

namespace sorl::gpu {

namespace {

constexpr uint64_t no_payload = ~uint64_t{0};

// ---- kernels (the per-thread logic is in sparse_sync_kernels.cuh; the CPU twin in
// delta_twin.cpp runs the same functions in the same order) ----

/// K1: changed elements per tile.
__global__ void __launch_bounds__(block_threads)
  k1_count(const kernel_segment* segs, uint32_t nseg, uint64_t* counts) {
  using reduce_t = cub::BlockReduce<uint32_t, block_threads>;
  __shared__ typename reduce_t::TempStorage tmp;
  __shared__ kernel_segment s;
  const uint64_t tile = blockIdx.x;
  if (threadIdx.x == 0)
    s = segs[segment_of_tile(segs, nseg, tile)];
  __syncthreads();
  const uint64_t begin =
    (tile - s.tile_begin) * tile_elements + uint64_t{threadIdx.x} * thread_elements;
  const uint32_t c = popcount_u32(thread_changed_mask(s.base, s.next, s.count, begin));
  const uint32_t total = reduce_t(tmp).Sum(c);
  if (threadIdx.x == 0)
    counts[tile] = total;
}

/// K2: segment-relative positions and steps of the changes, in increasing order.
__global__ void __launch_bounds__(block_threads)
  k2_compact(const kernel_segment* segs, uint32_t nseg, const uint64_t* tile_offsets,
             uint32_t* positions, uint16_t* steps) {
  using scan_t = cub::BlockScan<uint32_t, block_threads>;
  __shared__ typename scan_t::TempStorage tmp;
  __shared__ kernel_segment s;
  const uint64_t tile = blockIdx.x;
  if (threadIdx.x == 0)
    s = segs[segment_of_tile(segs, nseg, tile)];
  __syncthreads();
  const uint64_t seg_changes = tile_offsets[s.tile_begin];
  const uint64_t tile_rank = tile_offsets[tile] - seg_changes;
  if (tile_offsets[tile + 1] == tile_offsets[tile])
    return; // no change in this tile (uniform across the block: no barrier follows)
  const uint64_t begin =
    (tile - s.tile_begin) * tile_elements + uint64_t{threadIdx.x} * thread_elements;
  const uint32_t mask = thread_changed_mask(s.base, s.next, s.count, begin);
  uint32_t rank = 0;
  scan_t(tmp).ExclusiveSum(popcount_u32(mask), rank);
  thread_emit_changes(s.base, s.next, begin, mask, positions + seg_changes, steps + seg_changes,
                      tile_rank + rank);
}

/// K3: one block per segment reduces the parameter sums and picks the parameters.
__global__ void __launch_bounds__(block_threads)
  k3_params(const kernel_segment* segs, const uint64_t* tile_offsets, const uint32_t* positions,
            const uint16_t* steps, segment_result* results) {
  __shared__ unsigned long long total[segment_sums::fields];
  const kernel_segment& s = segs[blockIdx.x];
  const uint64_t first = tile_offsets[s.tile_begin];
  const uint64_t m = tile_offsets[s.tile_end] - first;
  if (m == 0) {
    if (threadIdx.x == 0)
      results[blockIdx.x] = segment_result{};
    return;
  }
  for (uint32_t f = threadIdx.x; f < segment_sums::fields; f += blockDim.x)
    total[f] = 0;
  __syncthreads();
  const uint32_t* pos = positions + first;
  const uint16_t* st = steps + first;
  const uint64_t last = pos[m - 1];
  const uint32_t k_lo = rice_window_low(m, last);
  segment_sums local;
  sums_clear(local);
  for (uint64_t i = threadIdx.x; i < m; i += blockDim.x)
    sums_add_element(local, change_gap(pos, i), st[i], k_lo);
  const unsigned lane = threadIdx.x & 31u;
  for (uint32_t f = 0; f < segment_sums::fields; ++f) {
    unsigned long long v = local.v[f];
#pragma unroll
    for (int d = 16; d > 0; d >>= 1)
      v += __shfl_down_sync(0xFFFFFFFFu, v, d);
    if (lane == 0 && v != 0)
      atomicAdd(&total[f], v);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    segment_sums sums;
    for (uint32_t f = 0; f < segment_sums::fields; ++f)
      sums.v[f] = total[f];
    segment_result r;
    r.changed = m;
    r.params = params_from_sums(sums, m, last);
    r.sparse_bits = sparse_bits_from_sums(sums, m, last, r.params);
    results[blockIdx.x] = r;
  }
}

/// K4: one block per sparse segment writes its payload: code lengths, a running block scan
/// into bit offsets, then each thread ORs its codes into the zeroed words. Thread t of a chunk
/// takes changes chunk + t * payload_items + [0, payload_items), so offsets stay in change order.
__global__ void __launch_bounds__(block_threads)
  k4_payload(const kernel_segment* segs, const uint64_t* tile_offsets, const uint32_t* positions,
             const uint16_t* steps, const segment_result* results, const uint64_t* payload_word,
             uint32_t* payload) {
  using scan_t = cub::BlockScan<unsigned long long, block_threads>;
  __shared__ typename scan_t::TempStorage tmp;
  const uint64_t pw = payload_word[blockIdx.x];
  if (pw == no_payload)
    return;
  const kernel_segment& s = segs[blockIdx.x];
  const uint64_t first = tile_offsets[s.tile_begin];
  const uint64_t m = results[blockIdx.x].changed;
  const code_params p = results[blockIdx.x].params;
  const uint32_t* pos = positions + first;
  const uint16_t* st = steps + first;
  uint32_t* words = payload + pw;
  unsigned long long carry = 0;
  for (uint64_t chunk = 0; chunk < m; chunk += uint64_t{block_threads} * payload_items) {
    const uint64_t i0 = chunk + uint64_t{threadIdx.x} * payload_items;
    uint64_t g[payload_items];
    uint16_t step[payload_items];
    unsigned long long bits = 0;
#pragma unroll
    for (uint32_t j = 0; j < payload_items; ++j) {
      g[j] = 0;
      step[j] = 0;
      if (i0 + j < m) {
        g[j] = change_gap(pos, i0 + j);
        step[j] = st[i0 + j];
        bits += element_code_bits(g[j], step[j], p);
      }
    }
    unsigned long long offset = 0, aggregate = 0;
    scan_t(tmp).ExclusiveSum(bits, offset, aggregate);
    uint64_t at = carry + offset;
#pragma unroll
    for (uint32_t j = 0; j < payload_items; ++j) {
      if (i0 + j < m) {
        emit_element_codes(words, at, g[j], step[j], p);
        at += element_code_bits(g[j], step[j], p);
      }
    }
    carry += aggregate;
    __syncthreads(); // tmp is reused by the next chunk's scan
  }
}

/// One sparse entry of a bucket being applied.
struct kernel_entry {
  uint64_t bit;       ///< first payload bit within the bucket words
  code_params params;
  uint64_t changed;
  uint16_t* bits;     ///< the target's element at the entry's offset
  uint64_t change_at; ///< first slot in dst/steps
};

/// K5: one thread per sparse entry decodes its bit stream serially.
__global__ void __launch_bounds__(128)
  k5_decode(const uint32_t* words, const kernel_entry* entries, uint32_t count, uint16_t** dst,
            uint16_t* steps) {
  const uint32_t e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= count)
    return;
  const kernel_entry v = entries[e];
  decode_entry(words, v.bit, v.params, v.changed, v.bits, dst + v.change_at, steps + v.change_at);
}

/// K6: one thread per change adds its step.
__global__ void __launch_bounds__(block_threads)
  k6_scatter(uint16_t* const* dst, const uint16_t* steps, uint64_t count) {
  const uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < count)
    scatter_step(dst[i], steps[i]);
}

uint32_t grid_for(uint64_t items, uint32_t per_block) {
  const uint64_t blocks = (items + per_block - 1) / per_block;
  if (blocks > 0x7FFFFFFFu)
    throw std::invalid_argument("sparse sync: launch exceeds the grid limit");
  return static_cast<uint32_t>(blocks);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

struct delta_gpu_workspace::state {
  cudaStream_t stream = nullptr;
  bool own_stream = false;
  cudaEvent_t start = nullptr, stop = nullptr;
  delta_gpu_timing timing;
  // encode
  device_buffer segs, counts, offsets, scan_tmp, positions, steps, results, payload_word, payload;
  std::vector<uint32_t> host_payload;
  // apply
  device_buffer bucket, entries, dst, apply_steps;
};

delta_gpu_workspace::delta_gpu_workspace(cudaStream_t stream) : impl_(std::make_unique<state>()) {
  impl_->stream = stream;
  if (stream == nullptr) {
    SORL_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
    impl_->own_stream = true;
  }
  SORL_CUDA_CHECK(cudaEventCreate(&impl_->start));
  SORL_CUDA_CHECK(cudaEventCreate(&impl_->stop));
}

delta_gpu_workspace::~delta_gpu_workspace() {
  // Destructors do not throw: statuses are dropped.
  cudaEventDestroy(impl_->start);
  cudaEventDestroy(impl_->stop);
  if (impl_->own_stream)
    cudaStreamDestroy(impl_->stream);
}

cudaStream_t delta_gpu_workspace::stream() const {
  return impl_->stream;
}

const delta_gpu_timing& delta_gpu_workspace::timing() const {
  return impl_->timing;
}

namespace {

/// The framing's view of the device results: the payload comes back once, whole; next bits
/// and changes only for the (rare) dense or cut entries.
class device_data final : public segment_data {
public:
  device_data(delta_gpu_workspace::state& w, const std::vector<kernel_segment>& segs,
              const std::vector<uint64_t>& payload_word, const std::vector<uint64_t>& seg_first,
              const std::vector<segment_result>& results)
    : w_(w), segs_(segs), payload_word_(payload_word), seg_first_(seg_first), results_(results) {}

  const uint8_t* sparse_payload(size_t segment) override {
    return reinterpret_cast<const uint8_t*>(w_.host_payload.data() + payload_word_[segment]);
  }
  void copy_next(size_t segment, uint64_t a, uint64_t count, uint8_t* out) override {
    SORL_CUDA_CHECK(cudaMemcpyAsync(out, segs_[segment].next + a, 2 * count,
                                    cudaMemcpyDeviceToHost, w_.stream));
    SORL_CUDA_CHECK(cudaStreamSynchronize(w_.stream));
  }
  void copy_changes(size_t segment, uint32_t* positions, uint16_t* steps) override {
    const uint64_t first = seg_first_[segment];
    const uint64_t m = results_[segment].changed;
    SORL_CUDA_CHECK(cudaMemcpyAsync(positions, w_.positions.as<uint32_t>() + first, 4 * m,
                                    cudaMemcpyDeviceToHost, w_.stream));
    SORL_CUDA_CHECK(cudaMemcpyAsync(steps, w_.steps.as<uint16_t>() + first, 2 * m,
                                    cudaMemcpyDeviceToHost, w_.stream));
    SORL_CUDA_CHECK(cudaStreamSynchronize(w_.stream));
  }

private:
  delta_gpu_workspace::state& w_;
  const std::vector<kernel_segment>& segs_;
  const std::vector<uint64_t>& payload_word_;
  const std::vector<uint64_t>& seg_first_;
  const std::vector<segment_result>& results_;
};

} // namespace

std::vector<std::vector<uint8_t>> encode_delta_gpu(uint64_t base_version, uint64_t version,
                                                   const std::vector<sync::delta_source>& sources,
                                                   const sync::delta_options& options,
                                                   sync::delta_stats* stats,
                                                   delta_gpu_workspace* ws) {
  const auto t0 = std::chrono::steady_clock::now();
  sync::check_delta_options(options, "encode_delta_gpu");
  const auto sorted = sync::sorted_delta_sources(sources, "encode_delta_gpu");
  std::unique_ptr<delta_gpu_workspace> own;
  if (ws == nullptr) {
    own = std::make_unique<delta_gpu_workspace>();
    ws = own.get();
  }
  delta_gpu_workspace::state& w = ws->impl();
  const cudaStream_t st = w.stream;

  uint64_t tiles = 0;
  const std::vector<segment_desc> plan = plan_delta_segments(sorted, &tiles);
  const size_t nseg = plan.size();
  if (nseg > 0xFFFFFFFFu)
    throw std::invalid_argument("encode_delta_gpu: too many segments for one launch");
  std::vector<kernel_segment> segs(nseg);
  for (size_t i = 0; i < nseg; ++i) {
    const segment_desc& d = plan[i];
    const sync::delta_source& src = *sorted[d.source];
    segs[i] = kernel_segment{src.base + d.offset, src.next + d.offset, d.count, d.tile_begin,
                             d.tile_begin + (d.count + tile_elements - 1) / tile_elements};
  }
  std::vector<segment_result> results(nseg);
  std::vector<uint64_t> payload_word(nseg, no_payload), seg_first(nseg, 0);
  w.timing.encode_device_ms = 0;

  if (nseg > 0) {
    SORL_CUDA_CHECK(cudaEventRecord(w.start, st));
    auto* d_segs = w.segs.reserve_as<kernel_segment>(nseg);
    SORL_CUDA_CHECK(cudaMemcpyAsync(d_segs, segs.data(), nseg * sizeof(kernel_segment),
                                    cudaMemcpyHostToDevice, st));
    auto* d_counts = w.counts.reserve_as<uint64_t>(tiles);
    auto* d_offsets = w.offsets.reserve_as<uint64_t>(tiles + 1);
    const auto nseg32 = static_cast<uint32_t>(nseg);
    k1_count<<<grid_for(tiles, 1), block_threads, 0, st>>>(d_segs, nseg32, d_counts);
    SORL_CUDA_CHECK_LAUNCH();
    // offsets[0] = 0, offsets[t + 1] = counts[0..t].
    size_t tmp_bytes = 0;
    SORL_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, tmp_bytes, d_counts, d_offsets + 1,
                                                  static_cast<int64_t>(tiles), st));
    void* d_tmp = w.scan_tmp.reserve(tmp_bytes);
    SORL_CUDA_CHECK(cub::DeviceScan::InclusiveSum(d_tmp, tmp_bytes, d_counts, d_offsets + 1,
                                                  static_cast<int64_t>(tiles), st));
    SORL_CUDA_CHECK(cudaMemsetAsync(d_offsets, 0, sizeof(uint64_t), st));
    std::vector<uint64_t> offsets(tiles + 1);
    SORL_CUDA_CHECK(cudaMemcpyAsync(offsets.data(), d_offsets, (tiles + 1) * sizeof(uint64_t),
                                    cudaMemcpyDeviceToHost, st));
    SORL_CUDA_CHECK(cudaStreamSynchronize(st));
    const uint64_t changed = offsets[tiles];
    for (size_t i = 0; i < nseg; ++i)
      seg_first[i] = offsets[segs[i].tile_begin];

    auto* d_positions = w.positions.reserve_as<uint32_t>(changed);
    auto* d_steps = w.steps.reserve_as<uint16_t>(changed);
    auto* d_results = w.results.reserve_as<segment_result>(nseg);
    if (changed > 0) {
      k2_compact<<<grid_for(tiles, 1), block_threads, 0, st>>>(d_segs, nseg32, d_offsets,
                                                                d_positions, d_steps);
      SORL_CUDA_CHECK_LAUNCH();
    }
    k3_params<<<nseg32, block_threads, 0, st>>>(d_segs, d_offsets, d_positions, d_steps,
                                                d_results);
    SORL_CUDA_CHECK_LAUNCH();
    SORL_CUDA_CHECK(cudaMemcpyAsync(results.data(), d_results, nseg * sizeof(segment_result),
                                    cudaMemcpyDeviceToHost, st));
    SORL_CUDA_CHECK(cudaStreamSynchronize(st));

    uint64_t words = 0;
    for (size_t i = 0; i < nseg; ++i) {
      if (results[i].changed == 0 || segment_is_dense(plan[i], results[i]))
        continue;
      payload_word[i] = words;
      words += (sparse_payload_bytes(results[i]) + 3) / 4;
    }
    if (words > 0) {
      auto* d_payload_word = w.payload_word.reserve_as<uint64_t>(nseg);
      SORL_CUDA_CHECK(cudaMemcpyAsync(d_payload_word, payload_word.data(), nseg * sizeof(uint64_t),
                                      cudaMemcpyHostToDevice, st));
      auto* d_payload = w.payload.reserve_as<uint32_t>(words);
      SORL_CUDA_CHECK(cudaMemsetAsync(d_payload, 0, words * sizeof(uint32_t), st));
      k4_payload<<<nseg32, block_threads, 0, st>>>(d_segs, d_offsets, d_positions, d_steps,
                                                   d_results, d_payload_word, d_payload);
      SORL_CUDA_CHECK_LAUNCH();
      SORL_CUDA_CHECK(cudaEventRecord(w.stop, st));
      // TODO(perf): pinned host memory would double this copy's bandwidth.
      w.host_payload.resize(words);
      SORL_CUDA_CHECK(cudaMemcpyAsync(w.host_payload.data(), d_payload, words * sizeof(uint32_t),
                                      cudaMemcpyDeviceToHost, st));
    } else {
      SORL_CUDA_CHECK(cudaEventRecord(w.stop, st));
    }
    SORL_CUDA_CHECK(cudaStreamSynchronize(st));
    SORL_CUDA_CHECK(cudaEventElapsedTime(&w.timing.encode_device_ms, w.start, w.stop));
  }

  device_data data(w, segs, payload_word, seg_first, results);
  auto buckets =
    frame_delta_buckets(base_version, version, sorted, plan, results, data, options, stats,
                        "encode_delta_gpu");
  w.timing.encode_total_ms = ms_since(t0);
  return buckets;
}

std::optional<std::string> apply_delta_bucket_gpu(const uint8_t* data, size_t size,
                                                  uint64_t base_version, uint64_t version,
                                                  const std::vector<sync::delta_target>& targets,
                                                  delta_gpu_workspace* ws) {
  const auto t0 = std::chrono::steady_clock::now();
  if (auto err = sync::check_delta_bucket(data, size, base_version, version, targets))
    return err;
  std::unique_ptr<delta_gpu_workspace> own;
  if (ws == nullptr) {
    own = std::make_unique<delta_gpu_workspace>();
    ws = own.get();
  }
  delta_gpu_workspace::state& w = ws->impl();
  w.timing.apply_check_ms = ms_since(t0);
  const cudaStream_t st = w.stream;

  const std::vector<entry_record> entries = read_checked_entries(data, size);
  auto bits_of = [&](uint32_t tensor) {
    for (const sync::delta_target& t : targets)
      if (t.tensor == tensor)
        return t.bits;
    throw std::logic_error("apply_delta_bucket_gpu: a checked bucket names an unknown tensor");
  };
  std::vector<kernel_entry> sparse;
  uint64_t total = 0;
  for (const entry_record& v : entries) {
    if (v.kind != sync::delta_entry_kind::sparse)
      continue;
    sparse.push_back(kernel_entry{v.payload_at * 8, v.params, v.changed,
                                  bits_of(v.tensor) + v.offset, total});
    total += v.changed;
  }

  SORL_CUDA_CHECK(cudaEventRecord(w.start, st));
  const size_t words = (size + 3) / 4 + decode_pad_words;
  auto* d_bucket = w.bucket.reserve_as<uint32_t>(words);
  SORL_CUDA_CHECK(cudaMemsetAsync(d_bucket + words - decode_pad_words - 1, 0,
                                  (decode_pad_words + 1) * sizeof(uint32_t), st));
  SORL_CUDA_CHECK(cudaMemcpyAsync(d_bucket, data, size, cudaMemcpyHostToDevice, st));
  const auto* d_bytes = reinterpret_cast<const uint8_t*>(d_bucket);
  for (const entry_record& v : entries) {
    if (v.kind == sync::delta_entry_kind::dense)
      SORL_CUDA_CHECK(cudaMemcpyAsync(bits_of(v.tensor) + v.offset, d_bytes + v.payload_at,
                                      2 * v.count, cudaMemcpyDeviceToDevice, st));
  }
  if (!sparse.empty()) {
    auto* d_entries = w.entries.reserve_as<kernel_entry>(sparse.size());
    SORL_CUDA_CHECK(cudaMemcpyAsync(d_entries, sparse.data(), sparse.size() * sizeof(kernel_entry),
                                    cudaMemcpyHostToDevice, st));
    auto* d_dst = w.dst.reserve_as<uint16_t*>(total);
    auto* d_steps = w.apply_steps.reserve_as<uint16_t>(total);
    const auto count = static_cast<uint32_t>(sparse.size());
    k5_decode<<<grid_for(count, 128), 128, 0, st>>>(d_bucket, d_entries, count, d_dst, d_steps);
    SORL_CUDA_CHECK_LAUNCH();
    k6_scatter<<<grid_for(total, block_threads), block_threads, 0, st>>>(d_dst, d_steps, total);
    SORL_CUDA_CHECK_LAUNCH();
  }
  SORL_CUDA_CHECK(cudaEventRecord(w.stop, st));
  // The host entry table and bucket bytes must outlive the copies above.
  SORL_CUDA_CHECK(cudaStreamSynchronize(st));
  SORL_CUDA_CHECK(cudaEventElapsedTime(&w.timing.apply_device_ms, w.start, w.stop));
  return std::nullopt;
}

} // namespace sorl::gpu
