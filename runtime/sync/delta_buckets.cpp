// Bucket framing of the delta codec (runtime/sync/delta_codec.hpp, "Bucket format"): headers,
// entry records and checksums written (bucket_builder, delta_bucket_framer with its placement
// and cutting rules) and read back (read_frame, read_entries, read_delta_bucket_info).

#include "runtime/sync/delta_internal.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace sorl::sync {

using namespace detail;

namespace {

uint64_t bucket_checksum(const uint8_t* data, size_t size) {
  return XXH3_64bits(data, size - delta_checksum_bytes);
}

} // namespace

namespace detail {

std::optional<std::string> read_frame(const uint8_t* data, size_t size, header_view* h) {
  if (data == nullptr && size != 0)
    return std::string{"delta bucket: null data"};
  if (size < delta_header_bytes + delta_checksum_bytes)
    return fmt::format("delta bucket: {} bytes is shorter than header and checksum ({})", size,
                       delta_header_bytes + delta_checksum_bytes);
  if (load<uint32_t>(data) != delta_magic)
    return fmt::format("delta bucket: bad magic {:#010x}", load<uint32_t>(data));
  if (load<uint16_t>(data + 4) != delta_format)
    return fmt::format("delta bucket: format {} (expected {})", load<uint16_t>(data + 4),
                       delta_format);
  if (load<uint16_t>(data + 6) != 0 || load<uint32_t>(data + 36) != 0)
    return std::string{"delta bucket: reserved header fields are not zero"};
  const auto size_field = load<uint64_t>(data + 48);
  if (size_field != size)
    return fmt::format("delta bucket: size field {} but {} bytes received", size_field, size);
  const auto stored = load<uint64_t>(data + size - delta_checksum_bytes);
  const auto computed = bucket_checksum(data, size);
  if (stored != computed)
    return fmt::format("delta bucket: checksum {:#018x} but contents hash to {:#018x}", stored,
                       computed);
  h->info.base_version = load<uint64_t>(data + 8);
  h->info.version = load<uint64_t>(data + 16);
  h->info.index = load<uint32_t>(data + 24);
  h->info.count = load<uint32_t>(data + 28);
  h->entries = load<uint32_t>(data + 32);
  h->info.changed = load<uint64_t>(data + 40);
  if (h->info.index >= h->info.count)
    return fmt::format("delta bucket: index {} not below count {}", h->info.index,
                       h->info.count);
  const uint64_t body = size - delta_header_bytes - delta_checksum_bytes;
  if (uint64_t{h->entries} > body / delta_entry_bytes)
    return fmt::format("delta bucket: {} entries do not fit {} bytes", h->entries, body);
  uint64_t payload_left = body - uint64_t{h->entries} * delta_entry_bytes;
  uint64_t changed = 0;
  for (uint32_t e = 0; e < h->entries; ++e) {
    const uint8_t* rec = data + delta_header_bytes + size_t{e} * delta_entry_bytes;
    const auto entry_changed = load<uint64_t>(rec + 24);
    const auto payload = load<uint64_t>(rec + 32);
    if (payload > payload_left)
      return fmt::format("delta bucket: entry {} payload of {} bytes runs past the bucket", e,
                         payload);
    payload_left -= payload;
    if (entry_changed > std::numeric_limits<uint64_t>::max() - changed)
      return fmt::format("delta bucket: entry {} changed count overflows", e);
    changed += entry_changed;
  }
  if (payload_left != 0)
    return fmt::format("delta bucket: {} trailing bytes after the last payload", payload_left);
  if (changed != h->info.changed)
    return fmt::format("delta bucket: header says {} changed elements, entries sum to {}",
                       h->info.changed, changed);
  return std::nullopt;
}

std::optional<std::string> read_entries(const uint8_t* data, size_t size, uint64_t base_version,
                                        uint64_t version, const std::vector<delta_target>& targets,
                                        std::vector<entry_view>* entries) {
  header_view h;
  if (auto err = read_frame(data, size, &h))
    return err;
  if (h.info.base_version != base_version || h.info.version != version)
    return fmt::format("delta bucket: versions {} -> {}, expected {} -> {}",
                       h.info.base_version, h.info.version, base_version, version);
  std::vector<const delta_target*> by_id(targets.size());
  for (size_t i = 0; i < targets.size(); ++i)
    by_id[i] = &targets[i];
  std::sort(by_id.begin(), by_id.end(),
            [](const delta_target* x, const delta_target* y) { return x->tensor < y->tensor; });
  for (size_t i = 1; i < by_id.size(); ++i)
    if (by_id[i]->tensor == by_id[i - 1]->tensor)
      return fmt::format("delta bucket: target tensor id {} given twice", by_id[i]->tensor);
  entries->clear();
  entries->reserve(h.entries);
  const uint8_t* payload = data + delta_header_bytes + size_t{h.entries} * delta_entry_bytes;
  for (uint32_t e = 0; e < h.entries; ++e) {
    const uint8_t* rec = data + delta_header_bytes + size_t{e} * delta_entry_bytes;
    entry_view v{};
    v.tensor = load<uint32_t>(rec);
    const uint8_t kind = rec[4];
    const uint8_t rice_k = rec[5];
    const uint8_t escape_k = rec[6];
    const uint8_t flags = rec[7];
    v.offset = load<uint64_t>(rec + 8);
    v.count = load<uint64_t>(rec + 16);
    v.changed = load<uint64_t>(rec + 24);
    v.payload_bytes = load<uint64_t>(rec + 32);
    v.payload = payload;
    payload += v.payload_bytes;
    auto it = std::lower_bound(
      by_id.begin(), by_id.end(), v.tensor,
      [](const delta_target* t, uint32_t id) { return t->tensor < id; });
    if (it == by_id.end() || (*it)->tensor != v.tensor)
      return fmt::format("delta bucket: entry {} names unknown tensor id {}", e, v.tensor);
    const delta_target& t = **it;
    if (v.count == 0)
      return fmt::format("delta bucket: entry {} (tensor {}) is empty", e, v.tensor);
    if (v.offset > t.elements || v.count > t.elements - v.offset)
      return fmt::format("delta bucket: entry {} range [{}, +{}) outside tensor {} of {} elements",
                         e, v.offset, v.count, v.tensor, t.elements);
    if (t.bits == nullptr)
      return fmt::format("delta bucket: target tensor {} has no storage", v.tensor);
    if (!entries->empty()) {
      const entry_view& prev = entries->back();
      if (v.tensor < prev.tensor || (v.tensor == prev.tensor && v.offset < prev.offset + prev.count))
        return fmt::format("delta bucket: entry {} (tensor {}, offset {}) is out of order or "
                           "overlaps the previous one",
                           e, v.tensor, v.offset);
    }
    v.bits = t.bits;
    if (kind == static_cast<uint8_t>(delta_entry_kind::dense)) {
      v.kind = delta_entry_kind::dense;
      if (rice_k != 0 || escape_k != 0 || flags != 0)
        return fmt::format("delta bucket: dense entry {} has code parameters", e);
      if (v.count > std::numeric_limits<uint64_t>::max() / 2 || v.payload_bytes != 2 * v.count)
        return fmt::format("delta bucket: dense entry {} has {} payload bytes for {} elements", e,
                           v.payload_bytes, v.count);
      if (v.changed > v.count)
        return fmt::format("delta bucket: dense entry {} claims {} changed of {} elements", e,
                           v.changed, v.count);
    } else if (kind == static_cast<uint8_t>(delta_entry_kind::sparse)) {
      v.kind = delta_entry_kind::sparse;
      if (rice_k > delta_max_rice_k || escape_k > delta_max_escape_k || (flags & ~1u) != 0)
        return fmt::format("delta bucket: sparse entry {} has invalid parameters "
                           "(rice_k {}, escape_k {}, flags {})",
                           e, rice_k, escape_k, flags);
      v.params.rice_k = rice_k;
      v.params.escape_k = escape_k;
      v.params.minus_first = (flags & 1u) != 0;
      // Every code takes at least 2 bits (1 gap + 1 step).
      if (v.changed == 0 || v.changed > v.count || v.changed > v.payload_bytes * 4)
        return fmt::format("delta bucket: sparse entry {} claims {} changed of {} elements in {} "
                           "payload bytes",
                           e, v.changed, v.count, v.payload_bytes);
    } else {
      return fmt::format("delta bucket: entry {} has unknown kind {}", e, kind);
    }
    entries->push_back(v);
  }
  return std::nullopt;
}

} // namespace detail

namespace {

/// Builds the buckets of one version.
class bucket_builder {
public:
  bucket_builder(uint64_t base_version, uint64_t version, uint64_t bucket_bytes,
                 const char* who)
    : base_version_(base_version), version_(version), bucket_bytes_(bucket_bytes), who_(who) {
    open();
  }

  /// Room for one more entry's payload in the current bucket.
  uint64_t room() const {
    const uint64_t used = size_ + delta_entry_bytes + delta_checksum_bytes;
    return used >= bucket_bytes_ ? 0 : bucket_bytes_ - used;
  }
  bool empty() const {
    return records_.empty();
  }

  /// Adds an entry whose payload `write(out)` fills (payload_bytes bytes).
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

  /// Closes the current bucket and opens the next.
  void close() {
    const uint64_t total = size_ + delta_checksum_bytes;
    std::vector<uint8_t> b(total);
    uint8_t* h = b.data();
    store<uint32_t>(h, delta_magic);
    store<uint16_t>(h + 4, delta_format);
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
        fmt::format("{}: more than 2^32 - 1 buckets; raise bucket_bytes", who_));
    open();
  }

  /// Closes the last bucket (when it holds entries or is the only one), stamps the bucket
  /// count and seals every bucket with its checksum; fills the stats of the buckets.
  std::vector<std::vector<uint8_t>> finish(delta_stats* stats) {
    if (!empty() || buckets_.empty())
      close();
    const auto count = static_cast<uint32_t>(buckets_.size());
    uint64_t bytes = 0;
    for (auto& b : buckets_) {
      store<uint32_t>(b.data() + 28, count);
      store<uint64_t>(b.data() + b.size() - delta_checksum_bytes,
                      bucket_checksum(b.data(), b.size()));
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
  const char* who_;
  std::vector<std::vector<uint8_t>> buckets_;
  std::vector<uint8_t> records_, payload_;
  uint64_t size_ = 0, changed_ = 0, dense_entries_ = 0, entries_ = 0;
};

/// A segment's changes while its entry is cut: range-relative positions and steps, and the
/// positions relative to a cut's start.
struct cut_changes {
  const uint32_t* positions;
  const uint16_t* steps;
  size_t total;
  std::vector<uint32_t>& rebased;
};

/// Encoded payload bytes of the range [a, e) of a segment (relative to the segment) holding the
/// changes [lo, hi): the smaller of dense and sparse. Returns {bytes, dense?}.
struct range_cost {
  uint64_t bytes;
  bool dense;
  sparse_plan sparse;
};

range_cost cost_of(cut_changes& c, uint64_t a, uint64_t e, size_t lo, size_t hi) {
  const uint32_t* pos = c.positions + lo;
  if (a != 0) {
    c.rebased.resize(hi - lo);
    for (size_t i = lo; i < hi; ++i)
      c.rebased[i - lo] = c.positions[i] - static_cast<uint32_t>(a);
    pos = c.rebased.data();
  }
  range_cost r;
  r.sparse = plan_sparse(pos, c.steps + lo, hi - lo);
  const uint64_t dense = 2 * (e - a);
  r.dense = dense < r.sparse.bytes();
  r.bytes = r.dense ? dense : r.sparse.bytes();
  return r;
}

/// Places a segment's entry into buckets: whole when it fits the current bucket, else cut.
void place_segment(bucket_builder& bb, const delta_segment_entry& en, delta_segment_data& data,
                   std::vector<uint32_t>& rebased, const char* who) {
  const uint32_t tensor = en.tensor;
  const uint64_t seg = en.offset;
  const uint64_t n = en.count;
  const bool whole_dense = delta_dense_wins(n, en.sparse_bits);
  const uint64_t whole_bytes = whole_dense ? 2 * n : delta_sparse_bytes(en.sparse_bits);
  if (whole_bytes <= bb.room()) {
    if (whole_dense)
      bb.add(tensor, delta_entry_kind::dense, {}, seg, n, en.changed, whole_bytes,
             [&](uint8_t* out) { data.write_next(0, n, out); });
    else
      bb.add(tensor, delta_entry_kind::sparse, en.params, seg, n, en.changed, whole_bytes,
             [&](uint8_t* out) { data.write_sparse_payload(out); });
    return;
  }
  cut_changes c{nullptr, nullptr, static_cast<size_t>(en.changed), rebased};
  data.changes(&c.positions, &c.steps);
  uint64_t a = 0; // segment-relative start of what is left
  size_t lo = 0;  // first change at or after a
  const size_t total = c.total;
  bool whole_known_too_big = true; // for a = 0 in the current bucket, checked above
  auto changes_below = [&](uint64_t e) {
    return static_cast<size_t>(std::lower_bound(c.positions + lo, c.positions + total,
                                                static_cast<uint32_t>(e)) -
                               c.positions);
  };
  auto emit = [&](uint64_t e, size_t hi, const range_cost& rc) {
    const uint64_t count = e - a;
    if (rc.dense) {
      bb.add(tensor, delta_entry_kind::dense, {}, seg + a, count, hi - lo, rc.bytes,
             [&](uint8_t* out) { data.write_next(a, count, out); });
    } else {
      // cost_of left the rebased positions of [lo, hi) in c.rebased when a != 0.
      const uint32_t* pos = a != 0 ? c.rebased.data() : c.positions + lo;
      bb.add(tensor, delta_entry_kind::sparse, rc.sparse.params, seg + a, count, hi - lo,
             rc.bytes, [&](uint8_t* out) {
               write_delta_sparse_payload(pos, c.steps + lo, hi - lo, rc.sparse.params, out);
             });
    }
  };
  while (lo < total) {
    const uint64_t room = bb.room();
    // A range [a, e) fits only if 2 (e − a) ≤ room (dense) or its changes ≤ 4 room (every
    // sparse code takes at least 2 bits): beyond both bounds nothing fits, which keeps the
    // work per bucket proportional to what the bucket holds.
    const uint64_t max_changes = 4 * room;
    uint64_t hi_e = n;
    if (total - lo > max_changes) {
      const uint64_t e_changes = uint64_t{c.positions[lo + max_changes]} + 1;
      hi_e = std::min(n, std::max(e_changes, a + room / 2 + 1));
    }
    if (hi_e == n && !whole_known_too_big) {
      const range_cost whole = cost_of(c, a, n, lo, total);
      if (whole.bytes <= room) {
        emit(n, total, whole);
        return;
      }
    }
    whole_known_too_big = false; // every pass below closes the bucket
    // Largest prefix [a, e) that fits: lo_e fits (vacuously for e = a), hi_e does not.
    uint64_t lo_e = a;
    while (hi_e - lo_e > 1) {
      const uint64_t mid = lo_e + (hi_e - lo_e) / 2;
      if (cost_of(c, a, mid, lo, changes_below(mid)).bytes <= room)
        lo_e = mid;
      else
        hi_e = mid;
    }
    const size_t hi = changes_below(lo_e);
    if (lo_e == a || hi == lo) {
      // Nothing useful fits here: a fresh bucket always takes at least one change.
      if (bb.empty())
        throw std::logic_error(fmt::format("{}: an empty bucket holds no change", who));
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

// ---- bucket framing ----

struct delta_bucket_framer::state {
  state(uint64_t base_version, uint64_t version, uint64_t bucket_bytes, const char* w,
        change_history* h)
    : bb(base_version, version, bucket_bytes, w), who(w), history(h) {}
  bucket_builder bb;
  const char* who;
  change_history* history;
  delta_stats stats;
  std::vector<uint64_t> step_counts; ///< per step value, with delta_options::measure_bound
  std::vector<uint32_t> rebased;
};

delta_bucket_framer::delta_bucket_framer(uint64_t base_version, uint64_t version,
                                         const delta_options& options, const char* who) {
  check_delta_options(options, who);
  s_ = std::make_unique<state>(base_version, version, options.bucket_bytes, who, options.history);
  if (options.measure_bound)
    s_->step_counts.assign(size_t{1} << 16, 0);
}

delta_bucket_framer::~delta_bucket_framer() = default;

void delta_bucket_framer::add_segment(const delta_segment_entry& entry,
                                      delta_segment_data& data) {
  s_->stats.elements += entry.count;
  if (entry.changed == 0)
    return;
  s_->stats.changed += entry.changed;
  if (s_->history != nullptr || !s_->step_counts.empty()) {
    const uint32_t* positions = nullptr;
    const uint16_t* steps = nullptr;
    data.changes(&positions, &steps);
    if (s_->history != nullptr)
      s_->stats.recurring += s_->history->record(entry.tensor, entry.offset, positions, entry.changed);
    if (!s_->step_counts.empty())
      for (uint64_t i = 0; i < entry.changed; ++i)
        ++s_->step_counts[steps[i]];
  }
  place_segment(s_->bb, entry, data, s_->rebased, s_->who);
}

std::vector<std::vector<uint8_t>> delta_bucket_framer::finish(delta_stats* stats) {
  delta_stats& st = s_->stats;
  st.dense_bytes = 2 * st.elements;
  if (!s_->step_counts.empty())
    st.bound_bits = delta_bound_bits(st.elements, st.changed, s_->step_counts);
  auto buckets = s_->bb.finish(&st);
  if (stats != nullptr)
    *stats = st;
  return buckets;
}

double delta_bound_bits(uint64_t elements, uint64_t changed, const std::vector<uint64_t>& step_counts) {
  uint64_t total = 0;
  for (const uint64_t c : step_counts)
    total += c;
  if (changed > elements || total != changed)
    throw std::invalid_argument(fmt::format("delta_bound_bits: {} changed of {} elements, steps counted {}",
                                            changed, elements, total));
  // lgamma(x + 1) = ln x! to a few ulps: the bound is a difference of terms up to N ln N
  // (4e10 nats at 10^9 elements), so it is right to well under a bit.
  auto ln_fact = [](uint64_t x) { return std::lgamma(static_cast<double>(x) + 1.0); };
  double nats = ln_fact(elements) - ln_fact(elements - changed); // ln C(N, n) + ln n!
  for (const uint64_t c : step_counts)
    if (c > 1)
      nats -= ln_fact(c);
  return std::max(0.0, nats / std::log(2.0));
}

uint64_t change_history::record(uint32_t tensor, uint64_t offset, const uint32_t* positions,
                                size_t n) {
  if (n == 0)
    return 0;
  if (bits_.size() <= tensor)
    bits_.resize(size_t{tensor} + 1);
  auto& words = bits_[tensor];
  const uint64_t last = offset + positions[n - 1]; // positions increase
  if (words.size() <= last / 64)
    words.resize(last / 64 + 1, 0);
  uint64_t before = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t e = offset + positions[i];
    uint64_t& w = words[e / 64];
    const uint64_t bit = uint64_t{1} << (e % 64);
    before += (w & bit) != 0 ? 1 : 0;
    w |= bit;
  }
  marked_ += n - before;
  return before;
}

void check_delta_options(const delta_options& options, const char* who) {
  if (options.bucket_bytes < delta_min_bucket_bytes)
    throw std::invalid_argument(fmt::format("{}: bucket_bytes = {} is below {}", who,
                                            options.bucket_bytes, delta_min_bucket_bytes));
}

std::vector<const delta_source*> sorted_delta_sources(const std::vector<delta_source>& sources,
                                                      const char* who) {
  std::vector<const delta_source*> order(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    const delta_source& s = sources[i];
    if (s.elements > 0 && (s.base == nullptr || s.next == nullptr))
      throw std::invalid_argument(
        fmt::format("{}: tensor {} has {} elements but no data", who, s.tensor, s.elements));
    order[i] = &s;
  }
  std::sort(order.begin(), order.end(),
            [](const delta_source* x, const delta_source* y) { return x->tensor < y->tensor; });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->tensor == order[i - 1]->tensor)
      throw std::invalid_argument(
        fmt::format("{}: tensor id {} given twice", who, order[i]->tensor));
  return order;
}

std::variant<delta_bucket_info, std::string> read_delta_bucket_info(const uint8_t* data,
                                                                    size_t size) {
  header_view h;
  if (auto err = read_frame(data, size, &h))
    return *err;
  return h.info;
}

} // namespace sorl::sync
