#pragma once

// Internals shared by the delta codec's sources, not part of its interface
// (runtime/sync/delta_codec.hpp): little-endian field access and the parsed view of a bucket
// (delta_buckets.cpp), the bounds-checked sparse decoder (used by delta_pipeline.cpp), the
// encoder's exact cost plan (delta_codes.cpp) and the changed-element scan (delta_scan.cpp).

#include "runtime/sync/bit_codes.hpp"
#include "runtime/sync/delta_codec.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace sorl::sync::detail {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the delta codec reads and writes little-endian words directly");

// ---- little-endian field access ----

/// Reads a little-endian T at p (any alignment).
template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

/// Writes v at p as a little-endian T (any alignment).
template <class T>
void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// ---- parsed buckets (delta_buckets.cpp) ----

/// One entry record of a bucket, its payload located and its target resolved.
struct entry_view {
  uint32_t tensor;
  delta_entry_kind kind;
  delta_sparse_params params;
  uint64_t offset, count, changed, payload_bytes;
  const uint8_t* payload;
  uint16_t* bits; // the target tensor's bits (read_entries)
};

/// The header fields of a bucket.
struct header_view {
  delta_bucket_info info;
  uint32_t entries;
};

/// Framing and checksum: everything read_delta_bucket_info promises. Fills `h`; returns an error
/// message or std::nullopt.
std::optional<std::string> read_frame(const uint8_t* data, size_t size, header_view* h);

/// Header, entry table and ranges against the expected versions and targets; fills `entries`
/// (sized by the entry count, which read_frame bounded by the bucket size).
std::optional<std::string> read_entries(const uint8_t* data, size_t size, uint64_t base_version,
                                        uint64_t version, const std::vector<delta_target>& targets,
                                        std::vector<entry_view>* entries);

// ---- decoding the sparse codes ----

/// Bounds-safe LSB-first bit reader over `bytes` bytes; bits past the end read as 0.
class bit_reader {
public:
  bit_reader(const uint8_t* p, uint64_t bytes) : p_(p), bytes_(bytes), bits_(bytes * 8) {
  }

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

/// Longest step code: "1 1", then ExpGolomb_ek of a value < 2^16 − 3: 2 + 2 (16 − ek) + 1 + ek
/// bits at ek = 0.
inline constexpr uint32_t max_step_code_bits = 35;

/// Decodes a sparse entry, calling sink(range-relative position, step) per element after its
/// codes were checked. Returns an error message at the first bad code.
template <class Sink>
std::optional<std::string> decode_sparse(const entry_view& v, uint32_t index, Sink&& sink) {
  bit_reader r(v.payload, v.payload_bytes);
  const uint32_t k = v.params.rice_k;
  const uint32_t ek = v.params.escape_k;
  const uint16_t first = first_step(v.params.minus_first);
  const uint16_t second = second_step(v.params.minus_first);
  uint64_t next = 0; // smallest position the next element may take
  for (uint64_t j = 0; j < v.changed; ++j) {
    // Positions must stay below count: g ≤ count − 1 − next, so q ≤ that >> k.
    if (next >= v.count)
      return fmt::format("delta bucket: entry {} element {} position past its {} elements", index,
                         j, v.count);
    const uint64_t g_max = v.count - 1 - next;
    uint64_t w = r.peek();
    const auto z = static_cast<uint32_t>(__builtin_ctzll(w | (uint64_t{1} << 56)));
    uint64_t g;
    if (z + 1 + k + max_step_code_bits <= 56) {
      // Fastest path: the gap code and the longest step code lie in this window. Both step
      // codes are computed and one is selected, so that the ±1-or-escape coin flip costs no
      // branch.
      g = rice_value(z, k, w >> (z + 1));
      if (g > g_max)
        return fmt::format("delta bucket: entry {} element {} position {} outside [0, {})", index,
                           j, next + g, v.count);
      w >>= z + 1 + k;
      const auto bit = static_cast<uint32_t>(w & 1u);
      const auto pm = static_cast<uint16_t>(first ^ ((first ^ second) & (0u - bit)));
      // Escape: "1 1", then ExpGolomb_ek: `zeros` zero bits, a 1, then b = zeros + ek bits.
      const uint64_t e = w >> 2;
      const auto zeros = static_cast<uint32_t>(__builtin_ctzll(e | (uint64_t{1} << 40)));
      const uint32_t b = zeros + ek; // ≤ 55
      const uint64_t x = exp_golomb_value(zeros, ek, e >> (zeros + 1));
      const bool escape = (w & 3u) == 3u;
      if (escape & ((zeros > 16 - ek) | (x > 65532))) {
        if (zeros > 16 - ek)
          return fmt::format("delta bucket: entry {} element {} step code is not decodable", index,
                             j);
        return fmt::format("delta bucket: entry {} element {} step code out of range", index, j);
      }
      const uint16_t esc = escaped_step(x);
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
      g = rice_value(z, k, w >> (z + 1));
      if (g > g_max)
        return fmt::format("delta bucket: entry {} element {} position {} outside [0, {})", index,
                           j, next + g, v.count);
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
      g = rice_value(q, k, w);
      r.skip(k);
      if (g > g_max)
        return fmt::format("delta bucket: entry {} element {} position {} outside [0, {})", index,
                           j, next + g, v.count);
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
      const uint64_t x = exp_golomb_value(static_cast<uint32_t>(zeros), ek, r.peek());
      r.skip(zeros + ek);
      if (x > 65532)
        return fmt::format("delta bucket: entry {} element {} step code out of range", index, j);
      s = escaped_step(x);
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

// ---- encoding (delta_codes.cpp) ----

/// Exact sparse cost; params chosen by the rule of choose_delta_params.
struct sparse_plan {
  delta_sparse_params params;
  uint64_t bits = 0;
  uint64_t bytes() const {
    return (bits + 7) / 8;
  }
};

/// choose_delta_params and the exact payload bits, in one pass over the changes.
sparse_plan plan_sparse(const uint32_t* positions, const uint16_t* steps, size_t changed);

// ---- changed-element scan (delta_scan.cpp) ----

/// Elements find_changed scans at a time: 64 Ki elements, 128 KiB of each array, so that the
/// step reads hit L2.
inline constexpr uint64_t scan_elements = uint64_t{1} << 16;

/// Appends the changes of the n elements at base / next to the vectors: positions relative to
/// base (increasing) and their steps. `scan` holds scan_elements entries.
void scan_changes(const uint16_t* base, const uint16_t* next, uint64_t n, uint32_t* scan,
                  std::vector<uint32_t>& positions, std::vector<uint16_t>& steps);

} // namespace sorl::sync::detail
