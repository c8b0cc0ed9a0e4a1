// The delta codec over whole tensors (runtime/sync/delta_codec.hpp): encode_delta, which scans
// and plans segments on one or several threads and hands them in order to the bucket framer,
// and the bucket checks and applies.

#include "runtime/sync/delta_internal.hpp"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace sorl::sync {

using namespace detail;

namespace {

/// One segment of one source: elements [offset, offset + count) of src.
struct segment_ref {
  const delta_source* src;
  uint64_t offset, count;
};

/// The entry summary of a segment whose `changed` changes are at positions / steps.
delta_segment_entry plan_segment(const segment_ref& r, const uint32_t* positions,
                                 const uint16_t* steps, size_t changed) {
  delta_segment_entry entry;
  entry.tensor = r.src->tensor;
  entry.offset = r.offset;
  entry.count = r.count;
  entry.changed = changed;
  if (changed != 0) {
    const sparse_plan plan = plan_sparse(positions, steps, changed);
    entry.params = plan.params;
    entry.sparse_bits = plan.bits;
  }
  return entry;
}

/// A segment's data as encode_delta hands it to the framer: its changes, its new bits and,
/// when prepared ahead, its whole sparse payload.
class segment_view final : public delta_segment_data {
public:
  segment_view(const delta_segment_entry& entry, const uint16_t* next, const uint32_t* positions,
               const uint16_t* steps, const uint8_t* payload)
    : entry_(entry), next_(next), positions_(positions), steps_(steps), payload_(payload) {
  }

  void write_sparse_payload(uint8_t* out) override {
    if (payload_ != nullptr)
      std::memcpy(out, payload_, delta_sparse_bytes(entry_.sparse_bits));
    else
      write_delta_sparse_payload(positions_, steps_, entry_.changed, entry_.params, out);
  }
  void write_next(uint64_t a, uint64_t count, uint8_t* out) override {
    std::memcpy(out, next_ + a, 2 * count);
  }
  void changes(const uint32_t** p, const uint16_t** s) override {
    *p = positions_;
    *s = steps_;
  }

private:
  const delta_segment_entry& entry_;
  const uint16_t* next_;      // the segment's new bits
  const uint32_t* positions_; // segment-relative
  const uint16_t* steps_;
  const uint8_t* payload_; // null: written on request
};

/// A unit is what one thread prepares at a time: consecutive segments of up to this many
/// elements in all, or a single larger segment. Small tensors are grouped so that the threads
/// synchronise once per unit rather than once per tiny segment.
constexpr uint64_t unit_group_elements = uint64_t{1} << 17;

/// A unit's segments scanned and planned, with the whole sparse payload of each segment whose
/// entry is sparse and can fit a bucket uncut; the changes and payloads of all its segments
/// back to back.
struct prepared_unit {
  struct segment {
    delta_segment_entry entry;
    size_t first_change = 0; // into positions / steps
    size_t payload_at = 0;   // into payload
    bool payload_ready = false;
  };
  std::vector<segment> segments;
  std::vector<uint32_t> positions;
  std::vector<uint16_t> steps;
  std::vector<uint8_t> payload;

  /// `max_room` is the payload room of an empty bucket: larger entries are always cut, so
  /// their whole payload is never asked for.
  void prepare(const segment_ref* refs, size_t n, uint32_t* scan, uint64_t max_room) {
    segments.resize(n);
    positions.clear();
    steps.clear();
    payload.clear();
    for (size_t i = 0; i < n; ++i) {
      const segment_ref& r = refs[i];
      segment& sg = segments[i];
      sg.first_change = positions.size();
      scan_changes(r.src->base + r.offset, r.src->next + r.offset, r.count, scan, positions, steps);
      const uint32_t* pos = positions.data() + sg.first_change;
      const uint16_t* st = steps.data() + sg.first_change;
      sg.entry = plan_segment(r, pos, st, positions.size() - sg.first_change);
      const delta_segment_entry& e = sg.entry;
      sg.payload_at = payload.size();
      sg.payload_ready = e.changed != 0 && !delta_dense_wins(e.count, e.sparse_bits) &&
                         delta_sparse_bytes(e.sparse_bits) <= max_room;
      if (sg.payload_ready) {
        payload.resize(sg.payload_at + delta_sparse_bytes(e.sparse_bits));
        write_delta_sparse_payload(pos, st, e.changed, e.params, payload.data() + sg.payload_at);
      }
    }
  }
};

/// encode_delta's segments on `threads` ≥ 2 threads (the caller's included): units are
/// prepared in any order into a ring of 2 × threads slots, and their segments framed in order
/// by the calling thread, which prepares units too while the one it needs next is not ready. A
/// slot is reused only after its unit was framed, which bounds the extra memory to 2 × threads
/// units' changes and payloads.
class segment_pipeline {
public:
  /// `units` holds the start of each unit within `segments`, then segments.size().
  segment_pipeline(std::vector<segment_ref> segments, std::vector<size_t> units, unsigned threads,
                   uint64_t max_room)
    : segments_(std::move(segments)), units_(std::move(units)), slots_(2 * size_t{threads}),
      max_room_(max_room) {
    try {
      for (unsigned t = 1; t < threads; ++t)
        workers_.emplace_back([this] { work(); });
    } catch (...) {
      stop_and_join();
      throw;
    }
  }
  ~segment_pipeline() {
    stop_and_join();
  }
  segment_pipeline(const segment_pipeline&) = delete;
  segment_pipeline& operator=(const segment_pipeline&) = delete;

  /// Hands every segment in order to the framer.
  void run(delta_bucket_framer& framer) {
    std::vector<uint32_t> scan(scan_elements);
    const size_t n = unit_count();
    for (size_t u = 0; u < n; ++u) {
      slot& sl = slots_[u % slots_.size()];
      {
        std::unique_lock<std::mutex> lk(m_);
        while (sl.ready != u + 1) {
          if (error_)
            std::rethrow_exception(error_);
          if (can_claim()) {
            prepare_claimed(lk, scan.data());
            continue;
          }
          done_cv_.wait(lk);
        }
      }
      const prepared_unit& pu = sl.unit;
      const size_t first = units_[u];
      for (size_t i = 0; i < pu.segments.size(); ++i) {
        const prepared_unit::segment& sg = pu.segments[i];
        const segment_ref& r = segments_[first + i];
        segment_view view(sg.entry, r.src->next + r.offset, pu.positions.data() + sg.first_change,
                          pu.steps.data() + sg.first_change,
                          sg.payload_ready ? pu.payload.data() + sg.payload_at : nullptr);
        framer.add_segment(sg.entry, view);
      }
      std::lock_guard<std::mutex> lk(m_);
      // The window, not the supply of units, held the workers back: one more may start.
      const bool window_full = claimed_ < n && claimed_ == framed_ + slots_.size();
      framed_ = u + 1;
      if (window_full)
        work_cv_.notify_one();
    }
  }

private:
  struct slot {
    prepared_unit unit;
    size_t ready = 0; // 1 + index of the unit prepared in it, 0 for none yet
  };

  size_t unit_count() const {
    return units_.size() - 1;
  }
  bool can_claim() const {
    return claimed_ < unit_count() && claimed_ < framed_ + slots_.size();
  }

  /// Claims the next unit, prepares it unlocked and marks it ready. `lk` is held on entry and
  /// on return.
  void prepare_claimed(std::unique_lock<std::mutex>& lk, uint32_t* scan) {
    const size_t u = claimed_++;
    slot& sl = slots_[u % slots_.size()];
    lk.unlock();
    try {
      sl.unit.prepare(segments_.data() + units_[u], units_[u + 1] - units_[u], scan, max_room_);
    } catch (...) {
      lk.lock();
      if (!error_)
        error_ = std::current_exception();
      done_cv_.notify_all();
      return;
    }
    lk.lock();
    sl.ready = u + 1;
    done_cv_.notify_one();
  }

  void work() {
    std::vector<uint32_t> scan;
    std::unique_lock<std::mutex> lk(m_);
    try {
      scan.resize(scan_elements);
    } catch (...) {
      error_ = std::current_exception();
      done_cv_.notify_all();
      return;
    }
    for (;;) {
      work_cv_.wait(lk, [&] { return stop_ || error_ || can_claim(); });
      if (stop_ || error_)
        return;
      prepare_claimed(lk, scan.data());
    }
  }

  void stop_and_join() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_)
      t.join();
    workers_.clear();
  }

  const std::vector<segment_ref> segments_;
  const std::vector<size_t> units_;
  std::vector<slot> slots_;
  const uint64_t max_room_;
  std::vector<std::thread> workers_;
  std::mutex m_;
  std::condition_variable work_cv_; // workers: a unit may be claimed, or stop
  std::condition_variable done_cv_; // the framing thread: a unit is ready, or an error
  size_t claimed_ = 0;              // units claimed so far (in order)
  size_t framed_ = 0;               // units framed so far; their slots are free
  bool stop_ = false;
  std::exception_ptr error_;
};

std::optional<std::string> check_all(const uint8_t* data, size_t size, uint64_t base_version,
                                     uint64_t version, const std::vector<delta_target>& targets,
                                     std::vector<entry_view>* entries) {
  if (auto err = read_entries(data, size, base_version, version, targets, entries))
    return err;
  for (size_t e = 0; e < entries->size(); ++e) {
    const entry_view& v = (*entries)[e];
    if (v.kind != delta_entry_kind::sparse)
      continue;
    if (auto err = decode_sparse(v, static_cast<uint32_t>(e), [](uint64_t, uint16_t) {}))
      return err;
  }
  return std::nullopt;
}

/// Writes the entries of a bucket whose framing and ranges read_entries accepted. Positions
/// are bounds-checked while decoding, so nothing is written outside the targets; returns the
/// first decoding error (entries before it, and elements of its entry before the bad code, are
/// already written).
std::optional<std::string> write_entries(const std::vector<entry_view>& entries) {
  for (size_t e = 0; e < entries.size(); ++e) {
    const entry_view& v = entries[e];
    uint16_t* out = v.bits + v.offset;
    if (v.kind == delta_entry_kind::dense) {
      std::memcpy(out, v.payload, 2 * v.count);
      continue;
    }
    std::optional<std::string> err;
    if (v.changed >= v.count / 16) {
      // Dense enough that the target lines are cached or streamed anyway: write in place.
      err = decode_sparse(v, static_cast<uint32_t>(e), [&](uint64_t p, uint16_t s) {
        out[p] = static_cast<uint16_t>(out[p] + s);
      });
    } else {
      // Scattered read-modify-writes miss the cache at low densities: decode a batch ahead,
      // prefetching each target line, then apply the batch.
      constexpr size_t batch = 64;
      uint64_t pos[batch];
      uint16_t steps[batch];
      size_t filled = 0;
      auto flush = [&] {
        for (size_t i = 0; i < filled; ++i)
          out[pos[i]] = static_cast<uint16_t>(out[pos[i]] + steps[i]);
        filled = 0;
      };
      err = decode_sparse(v, static_cast<uint32_t>(e), [&](uint64_t p, uint16_t s) {
        __builtin_prefetch(out + p, 1);
        pos[filled] = p;
        steps[filled] = s;
        if (++filled == batch)
          flush();
      });
      flush();
    }
    if (err)
      return err;
  }
  return std::nullopt;
}

} // namespace

std::vector<std::vector<uint8_t>> encode_delta(uint64_t base_version, uint64_t version,
                                               const std::vector<delta_source>& sources,
                                               const delta_options& options,
                                               delta_stats* stats) {
  delta_bucket_framer framer(base_version, version, options, "encode_delta");
  const std::vector<const delta_source*> order = sorted_delta_sources(sources, "encode_delta");

  unsigned threads = options.threads;
  if (threads == 0)
    threads = std::max(1u, std::thread::hardware_concurrency());
  if (threads > 1) {
    std::vector<segment_ref> segments;
    std::vector<size_t> units; // start of each unit in segments, then segments.size()
    uint64_t unit_elements = 0;
    for (const delta_source* src : order) {
      for (uint64_t seg = 0; seg < src->elements; seg += delta_segment_elements) {
        const uint64_t n = std::min(delta_segment_elements, src->elements - seg);
        if (units.empty() || unit_elements + n > unit_group_elements) {
          units.push_back(segments.size());
          unit_elements = 0;
        }
        unit_elements += n;
        segments.push_back({src, seg, n});
      }
    }
    threads = static_cast<unsigned>(std::min<size_t>(threads, units.size()));
    if (threads > 1) {
      units.push_back(segments.size());
      // An empty bucket leaves this much room for one entry's payload.
      const uint64_t max_room =
        options.bucket_bytes - delta_header_bytes - delta_entry_bytes - delta_checksum_bytes;
      segment_pipeline pipeline(std::move(segments), std::move(units), threads, max_room);
      pipeline.run(framer);
      return framer.finish(stats);
    }
  }

  std::vector<uint32_t> scan(scan_elements);
  std::vector<uint32_t> positions;
  std::vector<uint16_t> steps;
  for (const delta_source* src : order) {
    for (uint64_t seg = 0; seg < src->elements; seg += delta_segment_elements) {
      const segment_ref r{src, seg, std::min(delta_segment_elements, src->elements - seg)};
      positions.clear();
      steps.clear();
      scan_changes(src->base + seg, src->next + seg, r.count, scan.data(), positions, steps);
      const delta_segment_entry entry =
        plan_segment(r, positions.data(), steps.data(), positions.size());
      segment_view view(entry, src->next + seg, positions.data(), steps.data(), nullptr);
      framer.add_segment(entry, view);
    }
  }
  return framer.finish(stats);
}

std::optional<std::string> check_delta_bucket(const uint8_t* data, size_t size,
                                              uint64_t base_version, uint64_t version,
                                              const std::vector<delta_target>& targets) {
  std::vector<entry_view> entries;
  return check_all(data, size, base_version, version, targets, &entries);
}

std::optional<std::string> apply_delta_bucket(const uint8_t* data, size_t size,
                                              uint64_t base_version, uint64_t version,
                                              const std::vector<delta_target>& targets) {
  std::vector<entry_view> entries;
  if (auto err = check_all(data, size, base_version, version, targets, &entries))
    return err;
  // Everything is valid: decode again, this time writing.
  if (auto err = write_entries(entries))
    throw std::logic_error("apply_delta_bucket: a checked bucket failed to decode: " + *err);
  return std::nullopt;
}

std::optional<std::string> apply_checked_delta_bucket(const uint8_t* data, size_t size,
                                                      uint64_t base_version, uint64_t version,
                                                      const std::vector<delta_target>& targets) {
  std::vector<entry_view> entries;
  if (auto err = read_entries(data, size, base_version, version, targets, &entries))
    return err;
  return write_entries(entries);
}

} // namespace sorl::sync
