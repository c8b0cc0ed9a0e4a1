#include "runtime/sync/delta_codec.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <thread>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define SORL_DELTA_X86 1
#endif

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <fmt/format.h>

namespace sorl::sync {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the delta codec reads and writes little-endian words directly");

namespace {

// ---- little-endian field access ----

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

uint64_t bucket_checksum(const uint8_t* data, size_t size) {
  return XXH3_64bits(data, size - delta_checksum_bytes);
}

// ---- changed-element scan ----

size_t find_changed_scalar(const uint16_t* a, const uint16_t* b, uint64_t begin, uint64_t n,
                           uint32_t* out, size_t k) {
  for (uint64_t i = begin; i < n; ++i) {
    out[k] = static_cast<uint32_t>(i);
    k += a[i] != b[i];
  }
  return k;
}

#ifdef SORL_DELTA_X86

/// Appends the elements marked in a 2-bits-per-element byte mask (both bits set per element).
inline size_t emit_pairs(uint32_t m, uint32_t first, uint32_t* out, size_t k) {
  while (m != 0) {
    out[k++] = first + (static_cast<uint32_t>(__builtin_ctz(m)) >> 1);
    m &= m - 1;
    m &= m - 1;
  }
  return k;
}

size_t find_changed_sse2(const uint16_t* a, const uint16_t* b, uint64_t n, uint32_t* out) {
  size_t k = 0;
  uint64_t i = 0;
  const __m128i zero = _mm_setzero_si128();
  for (; i + 32 <= n; i += 32) {
    const auto* pa = reinterpret_cast<const __m128i*>(a + i);
    const auto* pb = reinterpret_cast<const __m128i*>(b + i);
    __m128i x0 = _mm_xor_si128(_mm_loadu_si128(pa + 0), _mm_loadu_si128(pb + 0));
    __m128i x1 = _mm_xor_si128(_mm_loadu_si128(pa + 1), _mm_loadu_si128(pb + 1));
    __m128i x2 = _mm_xor_si128(_mm_loadu_si128(pa + 2), _mm_loadu_si128(pb + 2));
    __m128i x3 = _mm_xor_si128(_mm_loadu_si128(pa + 3), _mm_loadu_si128(pb + 3));
    __m128i any = _mm_or_si128(_mm_or_si128(x0, x1), _mm_or_si128(x2, x3));
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(any, zero)) == 0xFFFF)
      continue;
    const __m128i xs[4] = {x0, x1, x2, x3};
    for (uint32_t q = 0; q < 4; ++q) {
      uint32_t m = ~static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi16(xs[q], zero))) &
                   0xFFFFu;
      k = emit_pairs(m, static_cast<uint32_t>(i) + q * 8, out, k);
    }
  }
  return find_changed_scalar(a, b, i, n, out, k);
}

/// Appends the set bits of a 64-bit mask as positions first + bit. Writes 4 slots
/// unconditionally (as simdjson's flatten_bits), so that blocks with up to 4 changes (all but
/// 4e-5 of them at 1 % changed) take no data-dependent branch; the caller guarantees 4 writable
/// slots past k (k ≤ block start and the block is 64 elements inside an array of n ≥ block
/// start + 64 slots).
__attribute__((target("avx2,bmi,popcnt"))) inline size_t emit_mask64(uint64_t m, uint32_t first,
                                                                     uint32_t* out, size_t k) {
  const auto cnt = static_cast<size_t>(_mm_popcnt_u64(m));
  uint32_t* o = out + k;
  for (int j = 0; j < 4; ++j) {
    o[j] = first + static_cast<uint32_t>(_tzcnt_u64(m));
    m = _blsr_u64(m);
  }
  if (cnt > 4) {
    for (size_t j = 4; j < cnt; ++j) {
      o[j] = first + static_cast<uint32_t>(_tzcnt_u64(m));
      m = _blsr_u64(m);
    }
  }
  return k + cnt;
}

__attribute__((target("avx2,bmi,popcnt"))) size_t find_changed_avx2(const uint16_t* a,
                                                                   const uint16_t* b,
                                                                   uint64_t n, uint32_t* out) {
  size_t k = 0;
  uint64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const auto* pa = reinterpret_cast<const __m256i*>(a + i);
    const auto* pb = reinterpret_cast<const __m256i*>(b + i);
    // Equal-element masks (0xFFFF per equal element), narrowed to bytes in element order.
    const __m256i e0 = _mm256_cmpeq_epi16(_mm256_loadu_si256(pa + 0), _mm256_loadu_si256(pb + 0));
    const __m256i e1 = _mm256_cmpeq_epi16(_mm256_loadu_si256(pa + 1), _mm256_loadu_si256(pb + 1));
    const __m256i e2 = _mm256_cmpeq_epi16(_mm256_loadu_si256(pa + 2), _mm256_loadu_si256(pb + 2));
    const __m256i e3 = _mm256_cmpeq_epi16(_mm256_loadu_si256(pa + 3), _mm256_loadu_si256(pb + 3));
    const __m256i p01 = _mm256_permute4x64_epi64(_mm256_packs_epi16(e0, e1), 0xD8);
    const __m256i p23 = _mm256_permute4x64_epi64(_mm256_packs_epi16(e2, e3), 0xD8);
    const uint64_t equal = static_cast<uint32_t>(_mm256_movemask_epi8(p01)) |
                           uint64_t{static_cast<uint32_t>(_mm256_movemask_epi8(p23))} << 32;
    k = emit_mask64(~equal, static_cast<uint32_t>(i), out, k);
  }
  return find_changed_scalar(a, b, i, n, out, k);
}

bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") &&
           __builtin_cpu_supports("popcnt");
  }();
  return has;
}

#endif // SORL_DELTA_X86

// ---- codes ----

inline uint32_t floor_log2(uint64_t v) { // v > 0
  return 63u - static_cast<uint32_t>(__builtin_clzll(v));
}

inline uint32_t zigzag(uint16_t s) {
  const auto v = static_cast<int16_t>(s);
  return static_cast<uint16_t>(static_cast<uint16_t>(s << 1) ^ static_cast<uint16_t>(v >> 15));
}

inline int16_t unzigzag(uint32_t z) {
  return static_cast<int16_t>((z >> 1) ^ (0u - (z & 1u)));
}

/// Bits of ExpGolomb_k(x).
inline uint32_t exp_golomb_bits(uint32_t x, uint32_t k) {
  const uint32_t b = floor_log2(uint64_t{x} + (uint64_t{1} << k));
  return 2 * b - k + 1;
}

constexpr uint16_t step_plus = 1;
constexpr uint16_t step_minus = 0xFFFF;

/// LSB-first bit writer into a buffer of exactly the final size.
class bit_writer {
public:
  explicit bit_writer(uint8_t* out) : out_(out) {}

  /// Appends the n ≤ 32 low bits of v.
  void put(uint64_t v, uint32_t n) {
    acc_ |= v << fill_;
    fill_ += n;
    if (fill_ >= 32) {
      store(out_, static_cast<uint32_t>(acc_));
      out_ += 4;
      acc_ >>= 32;
      fill_ -= 32;
    }
  }

  /// Appends n zero bits followed by a 1 bit.
  void unary(uint64_t n) {
    while (n >= 32) {
      put(0, 32);
      n -= 32;
    }
    put(uint64_t{1} << n, static_cast<uint32_t>(n) + 1);
  }

  /// Writes the last partial bytes.
  void finish() {
    while (fill_ > 0) {
      *out_++ = static_cast<uint8_t>(acc_);
      acc_ >>= 8;
      fill_ = fill_ > 8 ? fill_ - 8 : 0;
    }
  }

private:
  uint8_t* out_;
  uint64_t acc_ = 0;
  uint32_t fill_ = 0;
};

inline void write_step(bit_writer& w, uint16_t s, const delta_sparse_params& p) {
  const uint16_t first = p.minus_first ? step_minus : step_plus;
  const uint16_t second = p.minus_first ? step_plus : step_minus;
  if ((s == first) | (s == second)) {
    // ±1 steps are a coin flip: "0" or "1 0" without a branch.
    const uint32_t is_second = s == second;
    w.put(is_second, 1 + is_second);
  } else {
    w.put(3, 2);
    const uint32_t y = zigzag(s) - 3 + (1u << p.escape_k);
    const uint32_t b = floor_log2(y);
    w.unary(b - p.escape_k);
    w.put(y & ((1u << b) - 1), b);
  }
}

/// Bounds-safe LSB-first bit reader over `bytes` bytes; bits past the end read as 0.
class bit_reader {
public:
  bit_reader(const uint8_t* p, uint64_t bytes) : p_(p), bytes_(bytes), bits_(bytes * 8) {}

  /// At least 56 valid bits starting at the current position (the rest zero).
  uint64_t peek() const {
    const uint64_t byte = pos_ >> 3;
    uint64_t w = 0;
    if (byte + 8 <= bytes_) {
      std::memcpy(&w, p_ + byte, 8);
    } else {
      for (uint64_t i = 0; byte + i < bytes_ && i < 8; ++i)
        w |= uint64_t{p_[byte + i]} << (8 * i);
    }
    return w >> (pos_ & 7);
  }
  void skip(uint64_t n) {
    pos_ += n;
  }
  uint64_t position() const {
    return pos_;
  }
  uint64_t size_bits() const {
    return bits_;
  }
  bool overrun() const {
    return pos_ > bits_;
  }

  /// Counts zero bits up to the next 1 bit and consumes them and the 1. Returns false when the
  /// stream ends first or more than `limit` zeros come.
  bool unary(uint64_t limit, uint64_t* zeros) {
    uint64_t q = 0;
    for (;;) {
      const uint64_t w = peek() | (uint64_t{1} << 56);
      const auto z = static_cast<uint32_t>(__builtin_ctzll(w));
      if (z < 56) {
        q += z;
        pos_ += z + 1;
        break;
      }
      q += 56;
      pos_ += 56;
      if (pos_ > bits_ || q > limit)
        return false;
    }
    *zeros = q;
    return q <= limit && pos_ <= bits_;
  }

private:
  const uint8_t* p_;
  uint64_t bytes_;
  uint64_t bits_;
  uint64_t pos_ = 0;
};

// ---- parsed buckets ----

struct entry_view {
  uint32_t tensor;
  delta_entry_kind kind;
  delta_sparse_params params;
  uint64_t offset, count, changed, payload_bytes;
  const uint8_t* payload;
  uint16_t* bits; // the target's, set by resolve
};

struct header_view {
  delta_bucket_info info;
  uint32_t entries;
};

/// Framing and checksum: everything read_delta_bucket_info promises.
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

/// Header, entry table and ranges against the expected versions and targets; fills `entries`
/// (sized by the entry count, which read_frame bounded by the bucket size).
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

/// Longest step code: "1 1", then ExpGolomb_ek of a value < 2^16 − 3: 2 + 2 (16 − ek) + 1 + ek
/// bits at ek = 0.
constexpr uint32_t max_step_code_bits = 35;

/// Decodes a sparse entry, calling sink(range-relative position, step) per element after its
/// codes were checked. Returns an error message at the first bad code.
template <class Sink>
std::optional<std::string> decode_sparse(const entry_view& v, uint32_t index, Sink&& sink) {
  bit_reader r(v.payload, v.payload_bytes);
  const uint32_t k = v.params.rice_k;
  const uint32_t ek = v.params.escape_k;
  const uint16_t first = v.params.minus_first ? step_minus : step_plus;
  const uint16_t second = v.params.minus_first ? step_plus : step_minus;
  const uint64_t k_mask = k == 64 ? ~uint64_t{0} : (uint64_t{1} << k) - 1;
  uint64_t next = 0; // smallest position the next element may take
  for (uint64_t j = 0; j < v.changed; ++j) {
    // Positions must stay below count: g ≤ count − 1 − next, so q ≤ that >> k.
    if (next >= v.count)
      return fmt::format("delta bucket: entry {} element {} position past its {} elements",
                         index, j, v.count);
    const uint64_t g_max = v.count - 1 - next;
    uint64_t w = r.peek();
    const auto z = static_cast<uint32_t>(__builtin_ctzll(w | (uint64_t{1} << 56)));
    uint64_t g;
    if (z + 1 + k + max_step_code_bits <= 56) {
      // Fastest path: the gap code and the longest step code lie in this window. Both step
      // codes are computed and one is selected, so that the ±1-or-escape coin flip costs no
      // branch.
      g = (uint64_t{z} << k) | ((w >> (z + 1)) & k_mask);
      if (g > g_max)
        return fmt::format("delta bucket: entry {} element {} position {} outside [0, {})",
                           index, j, next + g, v.count);
      w >>= z + 1 + k;
      const auto bit = static_cast<uint32_t>(w & 1u);
      const auto pm = static_cast<uint16_t>(first ^ ((first ^ second) & (0u - bit)));
      // Escape: "1 1", then ExpGolomb_ek: `zeros` zero bits, a 1, then b = zeros + ek bits.
      const uint64_t e = w >> 2;
      const auto zeros = static_cast<uint32_t>(__builtin_ctzll(e | (uint64_t{1} << 40)));
      const uint32_t b = zeros + ek; // ≤ 55
      const uint64_t y = (uint64_t{1} << b) | ((e >> (zeros + 1)) & ((uint64_t{1} << b) - 1));
      const uint64_t x = y - (uint64_t{1} << ek);
      const bool escape = (w & 3u) == 3u;
      if (escape & ((zeros > 16 - ek) | (x > 65532))) {
        if (zeros > 16 - ek)
          return fmt::format("delta bucket: entry {} element {} step code is not decodable",
                             index, j);
        return fmt::format("delta bucket: entry {} element {} step code out of range", index, j);
      }
      const auto esc = static_cast<uint16_t>(unzigzag(static_cast<uint32_t>(x + 3) & 0xFFFFu));
      const uint16_t s = escape ? esc : pm;
      r.skip(z + 1 + k + (escape ? 3 + zeros + b : 1 + bit));
      if (r.overrun())
        return fmt::format("delta bucket: entry {} payload ends inside element {}", index, j);
      const uint64_t pos = next + g;
      sink(pos, s);
      next = pos + 1;
      continue;
    }
    if (z + k + 3 <= 56) {
      // Fast path: the gap code and the step's first two bits lie in this window.
      g = (uint64_t{z} << k) | ((w >> (z + 1)) & k_mask);
      if (g > g_max)
        return fmt::format("delta bucket: entry {} element {} position {} outside [0, {})",
                           index, j, next + g, v.count);
      const uint32_t used = z + 1 + k;
      w >>= used;
      r.skip(used);
    } else {
      uint64_t q = 0;
      if (!r.unary(g_max >> k, &q))
        return fmt::format("delta bucket: entry {} element {} gap code runs past the range or "
                           "the payload",
                           index, j);
      w = r.peek();
      g = (q << k) | (w & k_mask);
      r.skip(k);
      if (g > g_max)
        return fmt::format("delta bucket: entry {} element {} position {} outside [0, {})",
                           index, j, next + g, v.count);
      w = r.peek();
    }
    const uint64_t pos = next + g;
    uint16_t s;
    if ((w & 3u) != 3u) {
      // ±1 steps are a coin flip: select without a branch.
      const auto bit = static_cast<uint16_t>(w & 1u);
      s = static_cast<uint16_t>(first ^ ((first ^ second) & (0u - bit)));
      r.skip(1u + bit);
    } else {
      r.skip(2);
      uint64_t zeros = 0;
      if (!r.unary(16 - ek, &zeros))
        return fmt::format("delta bucket: entry {} element {} step code is not decodable", index,
                           j);
      const auto b = static_cast<uint32_t>(zeros) + ek;
      const uint64_t y = (uint64_t{1} << b) | (r.peek() & ((uint64_t{1} << b) - 1));
      r.skip(b);
      const uint64_t x = y - (uint64_t{1} << ek);
      if (x > 65532)
        return fmt::format("delta bucket: entry {} element {} step code out of range", index, j);
      s = static_cast<uint16_t>(unzigzag(static_cast<uint32_t>(x + 3)));
    }
    if (r.overrun())
      return fmt::format("delta bucket: entry {} payload ends inside element {}", index, j);
    sink(pos, s);
    next = pos + 1;
  }
  const uint64_t used = r.position();
  if ((used + 7) / 8 != v.payload_bytes)
    return fmt::format("delta bucket: entry {} uses {} bits of {} payload bytes", index, used,
                       v.payload_bytes);
  if ((used & 7) != 0 && (v.payload[v.payload_bytes - 1] >> (used & 7)) != 0)
    return fmt::format("delta bucket: entry {} padding bits are not zero", index);
  return std::nullopt;
}

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

// ---- encoder ----

/// Exact sparse cost; params chosen by the rule of choose_delta_params.
struct sparse_plan {
  delta_sparse_params params;
  uint64_t bits = 0;
  uint64_t bytes() const {
    return (bits + 7) / 8;
  }
};

/// From this many escaped steps on, plan_sparse prices the escape orders from a histogram
/// instead of 16 code lengths per escape (both exact).
constexpr uint64_t escape_histogram_from = 64;

/// esc_cost[k] = Σ over the escaped steps (neither +1 nor −1) of the bits of
/// ExpGolomb_k(zigzag(s) − 3), k = 0..delta_max_escape_k, from one histogram pass. With
/// x = zigzag(s) − 3 < 2^16, b = floor_log2(x) and c the number of one bits right below x's top
/// bit: floor(log2(x + 2^k)) is k for k > b, b + 1 for b − c ≤ k ≤ b (the carry of adding 2^k
/// reaches the top bit exactly then) and b for k < b − c; for x = 0 it is k. So the histogram
/// over (b, c) prices every k exactly.
void escape_costs(const uint16_t* steps, size_t changed, uint64_t* esc_cost) {
  constexpr uint32_t bins = 17; // b + 1 for x ≥ 1 (b ≤ 15), 0 for x = 0; c ≤ 15
  uint32_t hist[bins][bins] = {};
  for (size_t i = 0; i < changed; ++i) {
    const uint16_t st = steps[i];
    if ((st == step_plus) | (st == step_minus))
      continue;
    const uint32_t x = zigzag(st) - 3;
    if (x == 0) {
      ++hist[0][0];
      continue;
    }
    const uint32_t b = floor_log2(x);
    // x's top bit moved to bit 31: the ones right below it become leading zeros of ~y.
    const uint32_t y = x << (31 - b);
    const auto c = static_cast<uint32_t>(__builtin_clz(~y)) - 1;
    ++hist[b + 1][c];
  }
  for (uint32_t i = 0; i < bins; ++i) {
    for (uint32_t c = 0; c < bins; ++c) {
      const uint64_t h = hist[i][c];
      if (h == 0)
        continue;
      for (uint32_t k = 0; k <= delta_max_escape_k; ++k) {
        uint32_t top; // floor(log2(x + 2^k))
        if (i == 0) {
          top = k;
        } else {
          const uint32_t b = i - 1;
          top = k > b ? k : (k + c >= b ? b + 1 : b);
        }
        esc_cost[k] += h * (2 * top - k + 1);
      }
    }
  }
}

/// choose_delta_params and the exact payload bits, in one pass over the changes.
sparse_plan plan_sparse(const uint32_t* positions, const uint16_t* steps, size_t changed) {
  sparse_plan p;
  if (changed == 0)
    return p;
  // Σ g = p_last + 1 − changed (the gaps telescope), so the window needs no extra pass.
  const uint64_t sum = uint64_t{positions[changed - 1]} + 1 - changed;
  const uint64_t mean = std::max<uint64_t>(1, sum / changed);
  const auto k0 = static_cast<int32_t>(floor_log2(mean));
  const int32_t k_lo = std::max(0, k0 - 2);
  const int32_t k_hi = std::min(static_cast<int32_t>(delta_max_rice_k), k0 + 1);
  const auto sh = static_cast<uint32_t>(k_lo);
  const uint32_t sh3 = std::min(sh + 3, 31u);
  // Gap costs: g_0 = p_0, g_i = p_i − p_{i−1} − 1 (< 2^32). Separate loops over plain arrays
  // so that GCC vectorises them.
  uint64_t c0 = positions[0] >> sh, c1 = positions[0] >> (sh + 1), c2 = positions[0] >> (sh + 2),
           c3 = positions[0] >> sh3;
  for (size_t i = 1; i < changed; ++i) {
    const uint32_t g = positions[i] - positions[i - 1] - 1;
    c0 += g >> sh;
    c1 += g >> (sh + 1);
    c2 += g >> (sh + 2);
    c3 += g >> sh3;
  }
  if (sh + 3 > 31)
    c3 = 0; // k_lo + 3 ≥ 32: every g < 2^32 shifts to 0
  uint64_t plus = 0, minus = 0;
  for (size_t i = 0; i < changed; ++i) {
    plus += steps[i] == step_plus;
    minus += steps[i] == step_minus;
  }
  const uint64_t escapes = changed - plus - minus;
  uint64_t esc_cost[delta_max_escape_k + 1] = {};
  if (escapes != 0 && escapes < escape_histogram_from) {
    for (size_t i = 0; i < changed; ++i) {
      const uint16_t st = steps[i];
      if ((st != step_plus) & (st != step_minus)) {
        const uint32_t x = zigzag(st) - 3;
        for (uint32_t k = 0; k <= delta_max_escape_k; ++k)
          esc_cost[k] += exp_golomb_bits(x, k);
      }
    }
  } else if (escapes != 0) {
    escape_costs(steps, changed, esc_cost);
  }
  const uint64_t cost[4] = {c0, c1, c2, c3};
  uint64_t best = std::numeric_limits<uint64_t>::max();
  for (int32_t k = k_lo; k <= k_hi; ++k) {
    const uint64_t c = cost[k - k_lo] + changed * (1 + static_cast<uint64_t>(k));
    if (c < best) {
      best = c;
      p.params.rice_k = static_cast<uint32_t>(k);
    }
  }
  p.bits = best;
  p.params.minus_first = minus > plus;
  p.bits += p.params.minus_first ? minus + 2 * plus : plus + 2 * minus;
  if (escapes != 0) {
    best = std::numeric_limits<uint64_t>::max();
    for (uint32_t k = 0; k <= delta_max_escape_k; ++k) {
      if (esc_cost[k] < best) {
        best = esc_cost[k];
        p.params.escape_k = k;
      }
    }
    p.bits += 2 * escapes + best;
  }
  return p;
}

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

/// Elements find_changed scans at a time: 64 Ki elements, 128 KiB of each array, so that the
/// step reads hit L2.
constexpr uint64_t scan_elements = uint64_t{1} << 16;

/// Appends the changes of the n elements at base / next to the vectors: positions relative to
/// base (increasing) and their steps. `scan` holds scan_elements entries.
void scan_changes(const uint16_t* base, const uint16_t* next, uint64_t n, uint32_t* scan,
                  std::vector<uint32_t>& positions, std::vector<uint16_t>& steps) {
  // Scan in L2-sized pieces and read the steps while both pieces are still cached.
  for (uint64_t sub = 0; sub < n; sub += scan_elements) {
    const uint64_t len = std::min(scan_elements, n - sub);
    const uint16_t* b = base + sub;
    const uint16_t* x = next + sub;
    const size_t m = find_changed(b, x, len, scan);
    const size_t at = positions.size();
    positions.resize(at + m);
    steps.resize(at + m);
    for (size_t i = 0; i < m; ++i) {
      const uint32_t p = scan[i];
      positions[at + i] = p + static_cast<uint32_t>(sub);
      steps[at + i] = delta_step(b[p], x[p]);
    }
  }
}

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

} // namespace

// ---- bucket framing ----

struct delta_bucket_framer::state {
  state(uint64_t base_version, uint64_t version, uint64_t bucket_bytes, const char* w)
    : bb(base_version, version, bucket_bytes, w), who(w) {}
  bucket_builder bb;
  const char* who;
  delta_stats stats;
  std::vector<uint32_t> rebased;
};

delta_bucket_framer::delta_bucket_framer(uint64_t base_version, uint64_t version,
                                         const delta_options& options, const char* who) {
  check_delta_options(options, who);
  s_ = std::make_unique<state>(base_version, version, options.bucket_bytes, who);
}

delta_bucket_framer::~delta_bucket_framer() = default;

void delta_bucket_framer::add_segment(const delta_segment_entry& entry,
                                      delta_segment_data& data) {
  s_->stats.elements += entry.count;
  if (entry.changed == 0)
    return;
  s_->stats.changed += entry.changed;
  place_segment(s_->bb, entry, data, s_->rebased, s_->who);
}

std::vector<std::vector<uint8_t>> delta_bucket_framer::finish(delta_stats* stats) {
  delta_stats& st = s_->stats;
  st.dense_bytes = 2 * st.elements;
  auto buckets = s_->bb.finish(&st);
  if (stats != nullptr)
    *stats = st;
  return buckets;
}


// ---- building blocks ----

size_t find_changed(const uint16_t* a, const uint16_t* b, uint64_t n, uint32_t* positions_out) {
  if (n > (uint64_t{1} << 32))
    throw std::invalid_argument(
      fmt::format("find_changed: {} elements exceed 32-bit positions", n));
#ifdef SORL_DELTA_X86
  if (cpu_has_avx2())
    return find_changed_avx2(a, b, n, positions_out);
  return find_changed_sse2(a, b, n, positions_out);
#else
  return find_changed_scalar(a, b, 0, n, positions_out, 0);
#endif
}

uint32_t delta_step_bits(uint16_t s, const delta_sparse_params& params) {
  const uint16_t first = params.minus_first ? step_minus : step_plus;
  const uint16_t second = params.minus_first ? step_plus : step_minus;
  if (s == first)
    return 1;
  if (s == second)
    return 2;
  return 2 + exp_golomb_bits(zigzag(s) - 3, params.escape_k);
}

delta_sparse_params choose_delta_params(const uint32_t* positions, const uint16_t* steps,
                                        size_t changed) {
  return plan_sparse(positions, steps, changed).params;
}

uint64_t delta_sparse_bits(const uint32_t* positions, const uint16_t* steps, size_t changed,
                           const delta_sparse_params& params) {
  uint64_t bits = 0;
  uint64_t prev_end = 0;
  for (size_t i = 0; i < changed; ++i) {
    bits += delta_gap_bits(positions[i] - prev_end, params.rice_k) +
            delta_step_bits(steps[i], params);
    prev_end = uint64_t{positions[i]} + 1;
  }
  return bits;
}

void write_delta_sparse_payload(const uint32_t* positions, const uint16_t* steps,
                                size_t changed, const delta_sparse_params& params,
                                uint8_t* out) {
  bit_writer w(out);
  const uint32_t k = params.rice_k;
  const uint64_t k_mask = (uint64_t{1} << k) - 1;
  uint64_t prev_end = 0;
  for (size_t i = 0; i < changed; ++i) {
    const uint64_t g = positions[i] - prev_end;
    prev_end = uint64_t{positions[i]} + 1;
    const uint64_t q = g >> k;
    if (q + 1 + k <= 32) {
      w.put((uint64_t{1} << q) | ((g & k_mask) << (q + 1)), static_cast<uint32_t>(q) + 1 + k);
    } else {
      w.unary(q);
      if (k != 0)
        w.put(g & k_mask, k);
    }
    write_step(w, steps[i], params);
  }
  w.finish();
}

// ---- codec ----

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

namespace {

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

std::variant<delta_bucket_info, std::string> read_delta_bucket_info(const uint8_t* data,
                                                                    size_t size) {
  header_view h;
  if (auto err = read_frame(data, size, &h))
    return *err;
  return h.info;
}

} // namespace sorl::sync
