#pragma once

// Lossless sparse bf16 weight-delta codec, free of CAF and libtorch (ARCHITECTURE.md §6,
// SparseRL-Sync). The publisher keeps the last published bf16 snapshot ("base"), and for a new
// version sends, per bounded bucket, the positions of the elements whose bits changed and the
// exact integer step between old and new bit patterns. A worker holding `base_version` applies
// the buckets in place and ends bit-identical to `version`.
//
// Library sorl::delta_codec (runtime/sync/CMakeLists.txt): bit_codes.hpp holds the codes (zigzag,
// Rice, Exp-Golomb), compiled for the host here and for the device by gpu/; delta_scan.cpp finds
// the changed elements; delta_codes.cpp chooses the code parameters and writes the bit streams;
// delta_buckets.cpp frames entries into buckets (headers, placement and cutting, checksums) and
// reads them back; delta_pipeline.cpp runs encode_delta over tensors and threads, and the checks
// and applies. delta_internal.hpp is what those files share, not part of this interface.
//
// Codes (sizes measured on uniform random positions, 96 % ±1 ULP steps, 4 % uniform random
// other patterns: the synthetic rows of bench/sync/sync_codec.sh, which prints the full tables):
//   positions: gap coding with one Rice parameter per entry, chosen by exact cost. At 1 %
//              changed the gaps are geometric with mean 99; the best k is 6 and costs
//              7 + 0.99^64 / (1 − 0.99^64) = 8.11 bits per change against the entropy
//              H(p)/p = 8.08 bits. Elias-Fano would cost 6 low bits + ~2.56 upper bits = 8.56;
//              a Golomb code with the ideal m = 69 instead of 64 saves < 0.03 bits. Rice codes
//              have per-element lengths, so a parallel encoder needs only a prefix sum.
//   values:    step s = (new − old) mod 2^16 (never a floating-point delta). A 3-symbol prefix
//              code per entry: the more frequent of ±1 costs 1 bit, the other 2 bits, anything
//              else 2 bits plus an order-k Exp-Golomb code of zigzag(s) − 3 (k chosen per entry
//              by exact cost; ±2 costs 3 bits at k = 0, a random pattern ~17 bits at k = 15):
//              0.48 + 0.96 + 0.04 × 19 = 2.2 bits per change. The entropy of this step stream
//              is 1.84 bits, so an arithmetic / rANS stage could save at most ~0.36 bits
//              (3.5 %, 155× → 160×) and would make the stream sequential to produce; not done.
//   measured:  (bytes table; default 2^30 elements, --quick's 2^24 agree within 0.06 bits)
//              10.33 bits per change at 1 % changed, 155× smaller than dense (16 bits per
//              element); 14.0 bits at 0.1 % (~1150×), 8.0 bits at 5 % (40×). Entry records
//              (40 bytes per 2^20-element segment) are 0.03 bits of that at 1 %, 0.3 at
//              0.1 %. zstd -3 of the same step stream (a u16 per element) is 2.3–2.9× larger,
//              of the XOR of old and new bits 2.3–2.5×. Real AdamW versions of sorl's learner
//              (learner rows, tiny and 50m) at lr 1e-6 and 1e-5 carry more non-±1 steps
//              (11–18 %) and cost 6.6–9.7 bits per change (16–84× smaller than dense); at the
//              shipped configs' lr 2e-4, 75–79 % of the elements change by mostly larger steps
//              (43–47 % ±1), 5.6–5.8 bits per change, 3.5–3.8× smaller than dense and 1.2× smaller
//              than zstd -3 of the step stream.
//   speed:     the bench's speed table gives, per row and in the same rounds, the scan alone
//              (find_changed), encode and memcpy on one thread and on all hardware threads,
//              check_delta_bucket, apply_checked_delta_bucket and apply_delta_bucket (both).
//              Its numbers follow the machine and its load. On 2 cores shared with other builds
//              (load average ~10) they scatter by 2× between runs: at 1 % changed on one
//              thread, encode 2.5–5.4 GB/s (dense bytes / time) against memcpy 2.8–12 GB/s. In
//              the runs where memcpy reached 10–12 GB/s, encode was 24–37 % of it, short of the
//              bench's 50 % target; the scan alone runs near memcpy speed and the rest of
//              encode is ~30 ns per change (cost pass + bit writer). At 75–79 % changed (tiny
//              preset, lr 2e-4, 822k elements) encode takes 19–45 ms per version,
//              apply_delta_bucket 13–26 ms, check_delta_bucket alone 5–13 ms.
//              With delta_options::threads > 1 the scan and planning of the segments run on
//              several threads and only the bucket placement stays on the calling thread.
//   dense:     an entry falls back to raw new bits when that is smaller: with ±1 steps never
//              (≤ 3.5 bits per element at 100 % changed), with random steps above ~75 %.

// ------------------------------------------------------------------------------------------
// Bucket format, version 1. All integers little-endian; offsets and sizes in bytes unless
// stated; "elements" are bf16 elements (2 bytes).
//
//   header (56 bytes)
//     0  u32 magic          0x44535253 (the bytes "SRSD")
//     4  u16 format         1
//     6  u16 flags          0
//     8  u64 base_version   version the deltas apply to
//    16  u64 version        version the buckets produce
//    24  u32 index          of this bucket within the version, < count
//    28  u32 count          buckets of the version (≥ 1)
//    32  u32 entries        entry records that follow
//    36  u32 reserved       0
//    40  u64 changed        sum of the entries' `changed`
//    48  u64 size           bytes of the whole bucket, checksum included
//   entry records (40 bytes each), sorted by (tensor, offset), ranges of one tensor disjoint
//     0  u32 tensor         tensor id (delta_source::tensor)
//     4  u8  kind           0 sparse, 1 dense (delta_entry_kind)
//     5  u8  rice_k         sparse: Rice parameter of the gaps, 0..32; dense: 0
//     6  u8  escape_k       sparse: Exp-Golomb order of escaped steps, 0..15; dense: 0
//     7  u8  flags          sparse: bit 0 = minus_first (−1 is the 1-bit step); dense: 0
//     8  u64 offset         first element of the range
//    16  u64 count          elements in the range, ≥ 1
//    24  u64 changed        sparse: coded elements, 1..count; dense: elements whose bits differ
//                           from the base (informational)
//    32  u64 payload_bytes  dense: 2 × count; sparse: ceil(bits / 8)
//   payloads, in entry order, back to back
//     dense:  count u16 new bit patterns
//     sparse: a bit stream; stream bit i is bit (i mod 8) of payload byte i / 8 (LSB first,
//             i.e. little-endian 64-bit words read from their least significant bit). For each
//             changed element j (range-relative position p_j, strictly increasing) it holds
//             the gap code of g_j = p_j − p_{j−1} − 1 (g_0 = p_0), then the step code of
//             s_j = (new − old) mod 2^16. Unused bits of the last byte are 0.
//       gap code, Rice(k):  (g >> k) zero bits, one 1 bit, then the k low bits of g, least
//                           significant first. Length (g >> k) + 1 + k.
//       step code:          with P = +1 (flags bit 0 clear) or −1 (set) as 16-bit patterns
//                           1 / 0xFFFF:
//                             s == P   → 0
//                             s == −P  → 1 0
//                             else     → 1 1, then ExpGolomb_k(zigzag(s) − 3), where
//                           zigzag(s) = (s << 1) ^ (s >> 15) on s as int16 (so 3..65535 here),
//                           ExpGolomb_k(x): y = x + 2^k, b = floor(log2 y); (b − k) zero bits,
//                           one 1 bit, then the b low bits of y, least significant first.
//                           (The first listed bit is the first in the stream.)
//   checksum (8 bytes)      u64 XXH3-64 (seed 0) of all bytes before it.
//
// Encoder (deterministic, so that a parallel or GPU encoder reproduces the bytes):
//   * sources in increasing tensor id; each tensor cut into segments of
//     delta_segment_elements (the last one shorter);
//   * a segment without changed elements makes no entry; otherwise its entry is dense when
//     2 × count < sparse payload bytes, else sparse with choose_delta_params;
//   * buckets are filled in order; an entry that does not fit the room left
//     (bucket_bytes − bytes so far − 40 − 8) is cut at the largest element count e
//     (binary search over e, invariant "lo fits, hi does not") whose entry fits; if that prefix
//     holds no changed element the bucket is closed first and the segment's rest retried in a
//     fresh bucket; the rest after a cut continues in the next bucket;
//   * a version always has at least one bucket (zero entries when nothing changed).
// The bucket filling and cutting (everything after the per-segment entry) is implemented once,
// by delta_bucket_framer: encode_delta feeds it, in order, the segments it scans on the CPU
// (on one or several threads), the GPU encoder (gpu/delta_framing.cpp) the segments its
// kernels summarised.
// Applying: a worker whose tensors hold `base_version` applies each bucket exactly once; sparse
// steps are added modulo 2^16, dense entries overwrite. Applying twice or over another base
// corrupts the tensor silently at this level; the whole-model hash of the version catches it.
// ------------------------------------------------------------------------------------------

#include "runtime/sync/bit_codes.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace sorl::sync {

/// Magic number of a delta bucket: the bytes "SRSD" read as a little-endian u32.
inline constexpr uint32_t delta_magic = 0x44535253u;
/// Bucket format version written and accepted.
inline constexpr uint16_t delta_format = 1;
/// Bytes of the fixed bucket header.
inline constexpr size_t delta_header_bytes = 56;
/// Bytes of one entry record.
inline constexpr size_t delta_entry_bytes = 40;
/// Bytes of the trailing checksum.
inline constexpr size_t delta_checksum_bytes = 8;
/// Smallest accepted delta_options::bucket_bytes (guarantees progress: a fresh bucket holds at
/// least one changed element in any encoding).
inline constexpr uint64_t delta_min_bucket_bytes = 256;
/// Elements per encoder segment: the unit of the dense-or-sparse choice.
inline constexpr uint64_t delta_segment_elements = uint64_t{1} << 20;
/// Largest Rice parameter of the gap code.
inline constexpr uint32_t delta_max_rice_k = 32;
/// Largest Exp-Golomb order of the escaped step code.
inline constexpr uint32_t delta_max_escape_k = 15;

/// How an entry's payload is coded (bucket format above).
enum class delta_entry_kind : uint8_t { sparse = 0, dense = 1 };

/// One tensor's last published and new bf16 bit patterns (publisher side), `elements` long
/// each. Borrowed: the pointers must stay valid during encode_delta.
struct delta_source {
  uint32_t tensor = 0;
  const uint16_t* base = nullptr;
  const uint16_t* next = nullptr;
  uint64_t elements = 0;
};

/// One tensor's bits on the receiving side, `elements` bf16 patterns, written in place by
/// apply_delta_bucket.
struct delta_target {
  uint32_t tensor = 0;
  uint16_t* bits = nullptr;
  uint64_t elements = 0;
};

/// Encoder settings.
/// The elements that changed in earlier versions, one bit per element of each tensor id: what
/// temporal locality is measured against (SparseRL-Sync reports the share of a step's changed
/// positions that changed before, rising from about half to three quarters within 10 steps).
/// Memory: one bit per element of every tensor that had a change (17 MB for SmolLM2-135M's
/// 134.5 M elements). Not thread-safe; encode_delta updates it from its calling thread.
class change_history {
public:
  /// Marks the `n` changed elements of tensor `tensor` at `offset` + positions[i] (positions
  /// increasing, as a segment's changes are) and returns how many of them were marked before.
  uint64_t record(uint32_t tensor, uint64_t offset, const uint32_t* positions, size_t n);
  /// Elements marked so far.
  uint64_t marked() const {
    return marked_;
  }
  /// Forgets every mark.
  void clear() {
    bits_.clear();
    marked_ = 0;
  }

private:
  std::vector<std::vector<uint64_t>> bits_; ///< per tensor id, grown to the last mark
  uint64_t marked_ = 0;
};

/// The order-0 bound of delta_stats::bound_bits, in bits: log2 C(elements, changed) +
/// log2(changed! / Π_s step_counts[s]!). step_counts: any length (one count per step value),
/// summing to `changed`. Throws std::invalid_argument when they do not, or changed > elements.
double delta_bound_bits(uint64_t elements, uint64_t changed, const std::vector<uint64_t>& step_counts);

struct delta_options {
  /// Largest encoded bucket in bytes, header and checksum included; at least
  /// delta_min_bucket_bytes (encode_delta raises std::invalid_argument below).
  uint64_t bucket_bytes = 64ull << 20;
  /// Threads encode_delta runs on, the calling thread included: 1 (the default) encodes on
  /// the calling thread alone; 0 means std::thread::hardware_concurrency(); never more than
  /// there are units of work (a segment, or consecutive small segments of up to 2^17 elements
  /// in all). With more than one, the per-segment work that does not depend on bucket
  /// placement (scan, steps, parameter choice, whole sparse payload) runs in parallel while
  /// the calling thread places the segments into buckets in order, so the buckets and stats
  /// are byte-identical for every value. Threads are started and joined within each call.
  /// Extra memory: at most 2 × threads prepared units (each its changes, 6 bytes per changed
  /// element, and sparse payloads; ≤ 2^20 elements per unit) plus 256 KiB per thread.
  uint32_t threads = 1;
  /// When set, every changed element is marked in it (on the calling thread, in segment order)
  /// and delta_stats::recurring counts those it had marked before. Borrowed for the call.
  change_history* history = nullptr;
  /// When set, delta_stats::bound_bits gets the delta's order-0 bound (on the calling
  /// thread; 512 KiB for a histogram of the steps).
  bool measure_bound = false;
};

/// What one encode_delta call produced.
struct delta_stats {
  uint64_t elements = 0;       ///< all elements of all sources
  uint64_t changed = 0;        ///< elements whose bits differ
  uint64_t dense_bytes = 0;    ///< 2 × elements
  uint64_t encoded_bytes = 0;  ///< sum of bucket sizes, headers and checksums included
  uint64_t dense_segments = 0; ///< entries that fell back to dense
  uint64_t buckets = 0;        ///< buckets produced (≥ 1)
  uint64_t entries = 0;        ///< entry records over all buckets
  /// Changed elements that delta_options::history had marked before this call (changed in an
  /// earlier version it recorded); 0 without a history.
  uint64_t recurring = 0;
  /// With delta_options::measure_bound, the fewest bits that name this delta among all those
  /// with the same element count N, changed count n and histogram c_s of steps:
  /// log2 C(N, n) + log2(n! / Π_s c_s!), which is N·H(n/N) + n·H(steps) up to O(log N) terms
  /// (the entropy bound SparseRL-Sync compares its payload with; a code that sees the steps
  /// and positions as independent draws cannot average fewer). 0 without it.
  double bound_bits = 0.0;
};

/// Encodes version `version` against `base_version` (ARCHITECTURE.md §6, SparseRL-Sync; the format
/// and the deterministic encoder are specified at the top of this header). Sources may come in
/// any order of tensor id. Returns the buckets in index order, each at most
/// options.bucket_bytes bytes; the same inputs give byte-identical buckets, whatever
/// options.threads is. Reads each source's two arrays once (plus the changed elements again);
/// on options.threads threads (see there) when that is not 1.
/// Throws std::invalid_argument for duplicate tensor ids, a null pointer with elements > 0,
/// bucket_bytes < delta_min_bucket_bytes, or more than 2^32 − 1 buckets (and std::system_error
/// when a thread cannot be started).
std::vector<std::vector<uint8_t>> encode_delta(uint64_t base_version, uint64_t version,
                                               const std::vector<delta_source>& sources,
                                               const delta_options& options,
                                               delta_stats* stats = nullptr);

/// Validates one bucket of `size` bytes against the expected versions and the targets' ids and
/// sizes without writing: framing, magic, format, checksum, versions, index < count, entry
/// order, tensor ids known, ranges inside the tensors, every code decodable, positions inside
/// their range, no trailing bytes. Never reads outside [data, data + size) and allocates
/// nothing from the bucket's lengths. Returns an error message or std::nullopt; duplicate
/// target ids are an error too.
std::optional<std::string> check_delta_bucket(const uint8_t* data, size_t size,
                                              uint64_t base_version, uint64_t version,
                                              const std::vector<delta_target>& targets);

/// check_delta_bucket, then writes the bucket's elements into the targets (sparse: adds the
/// steps modulo 2^16 to the bits in place; dense: overwrites). On error nothing is written.
/// Must be applied exactly once to targets holding `base_version` (see the header comment).
std::optional<std::string> apply_delta_bucket(const uint8_t* data, size_t size,
                                              uint64_t base_version, uint64_t version,
                                              const std::vector<delta_target>& targets);

/// apply_delta_bucket without its validating decode pass, for use only after
/// check_delta_bucket succeeded on these exact bytes with these versions and targets of the
/// same ids and sizes (delta_receiver checks every bucket on arrival). Framing, checksum,
/// versions and the entries' ranges are still verified before anything is written, and every
/// position is bounds-checked while decoding, so it never writes outside the targets; but on
/// bytes that were not checked, a bad code is found only while writing: the elements before it
/// are then already written and the error is returned. Same result as apply_delta_bucket on
/// checked bytes, in about half the time at high change fractions.
std::optional<std::string> apply_checked_delta_bucket(const uint8_t* data, size_t size,
                                                      uint64_t base_version, uint64_t version,
                                                      const std::vector<delta_target>& targets);

/// Header fields of a bucket (read_delta_bucket_info).
struct delta_bucket_info {
  uint64_t base_version = 0, version = 0;
  uint32_t index = 0, count = 0; ///< bucket index within the version, buckets of the version
  uint64_t changed = 0;          ///< changed elements the bucket carries (header field)
};

/// Reads a bucket's header after checking its framing (size, magic, format, flags, size
/// field, entry table and payload sizes adding up to the bucket, index < count, changed equal
/// to the entries' sum) and its checksum. The entries' contents are not decoded: use
/// check_delta_bucket for that. Returns the fields or an error message.
std::variant<delta_bucket_info, std::string> read_delta_bucket_info(const uint8_t* data,
                                                                    size_t size);

// ---- building blocks, exported for a parallel (GPU) encoder to reproduce and test against ----

/// Throws std::invalid_argument naming `who` when options.bucket_bytes <
/// delta_min_bucket_bytes.
void check_delta_options(const delta_options& options, const char* who);

/// The sources in increasing tensor id, validated as encode_delta does: throws
/// std::invalid_argument naming `who` for duplicate ids or a null pointer with elements > 0.
std::vector<const delta_source*> sorted_delta_sources(const std::vector<delta_source>& sources,
                                                      const char* who);

/// Writes the indices i < n with a[i] != b[i] (bitwise), increasing, to positions_out, which
/// must hold n entries; returns how many. Streams both arrays once (AVX2 when the CPU has it,
/// else SSE2, else scalar). Throws std::invalid_argument when n > 2^32.
size_t find_changed(const uint16_t* a, const uint16_t* b, uint64_t n, uint32_t* positions_out);

/// Parameters of a sparse entry's codes (bucket format above).
struct delta_sparse_params {
  uint32_t rice_k = 0;      ///< Rice parameter of the gaps, ≤ delta_max_rice_k
  uint32_t escape_k = 0;    ///< Exp-Golomb order of escaped steps, ≤ delta_max_escape_k
  bool minus_first = false; ///< −1 (0xFFFF) is the 1-bit step instead of +1
};

/// Step of one element: (next − base) mod 2^16 as a bit pattern; nonzero iff it changed.
inline uint16_t delta_step(uint16_t base, uint16_t next) {
  return static_cast<uint16_t>(next - base);
}

/// Bits of the Rice(k) code of gap `g`: (g >> k) + 1 + k.
inline uint64_t delta_gap_bits(uint64_t g, uint32_t rice_k) {
  return rice_bits(g, rice_k);
}

/// Bits of the step code of a nonzero step `s` under `params`: 1, 2, or 3 + its Exp-Golomb
/// code.
uint32_t delta_step_bits(uint16_t s, const delta_sparse_params& params);

/// The encoder's parameter choice for `changed` changed elements at increasing range-relative
/// positions `positions` with nonzero `steps`: rice_k minimises the gap bits over
/// k ∈ [k0 − 2, k0 + 1] ∩ [0, 32], k0 = floor(log2(max(1, Σg / changed))); escape_k minimises
/// the escaped step bits over 0..15; minus_first when −1 is strictly more frequent than +1;
/// ties go to the smaller parameter.
delta_sparse_params choose_delta_params(const uint32_t* positions, const uint16_t* steps,
                                        size_t changed);

/// Payload bits of a sparse entry with these changes and parameters.
uint64_t delta_sparse_bits(const uint32_t* positions, const uint16_t* steps, size_t changed,
                           const delta_sparse_params& params);

/// Writes a sparse entry's bit stream into `out`, which holds exactly
/// ceil(delta_sparse_bits(...) / 8) bytes (all of them are written).
void write_delta_sparse_payload(const uint32_t* positions, const uint16_t* steps,
                                size_t changed, const delta_sparse_params& params,
                                uint8_t* out);

/// Payload bytes of a sparse entry of `sparse_bits` bits.
inline uint64_t delta_sparse_bytes(uint64_t sparse_bits) {
  return (sparse_bits + 7) / 8;
}

/// The encoder's dense-or-sparse rule: an entry of `count` elements whose sparse payload takes
/// `sparse_bits` bits is dense when 2 × count < its sparse payload bytes.
inline bool delta_dense_wins(uint64_t count, uint64_t sparse_bits) {
  return 2 * count < delta_sparse_bytes(sparse_bits);
}

// ---- bucket framing: the one implementation of the encoder's placement rules ----

/// One segment as the framer takes it: the segment's whole entry, summarised. The framer
/// decides dense or sparse (delta_dense_wins) and asks delta_segment_data for the bytes.
struct delta_segment_entry {
  uint32_t tensor = 0;
  uint64_t offset = 0;  ///< first element of the segment within the tensor
  uint64_t count = 0;   ///< elements of the segment, 1..delta_segment_elements
  uint64_t changed = 0; ///< elements whose bits differ; 0 makes no entry
  delta_sparse_params params; ///< choose_delta_params of all the segment's changes
  uint64_t sparse_bits = 0;   ///< delta_sparse_bits of all its changes with `params`
};

/// Where the framer reads one segment's bytes; asked only during the add_segment call that
/// names the segment, and only for what that segment's entries need.
class delta_segment_data {
public:
  virtual ~delta_segment_data() = default;
  /// Writes the whole segment's sparse payload, delta_sparse_bytes(entry.sparse_bits) bytes,
  /// to `out` (asked only when that entry is sparse and fits uncut).
  virtual void write_sparse_payload(uint8_t* out) = 0;
  /// Writes the next bit patterns of the segment-relative elements [a, a + count) to `out`,
  /// 2 × count bytes, not necessarily aligned (for dense entries).
  virtual void write_next(uint64_t a, uint64_t count, uint8_t* out) = 0;
  /// The segment's changes: entry.changed segment-relative positions (increasing) and their
  /// nonzero steps (delta_step), valid until add_segment returns. Asked only when the entry
  /// has to be cut; sparse pieces are then re-encoded from them.
  virtual void changes(const uint32_t** positions, const uint16_t** steps) = 0;
};

/// Fills the buckets of one version by the encoder rules at the top of this header: segments
/// go in (in increasing tensor id and offset, every segment of every tensor including those
/// without changes), buckets come out byte-identical to encode_delta's for the same segments.
class delta_bucket_framer {
public:
  /// `who` names the caller in exceptions. Throws what check_delta_options throws.
  delta_bucket_framer(uint64_t base_version, uint64_t version, const delta_options& options,
                      const char* who = "encode_delta");
  ~delta_bucket_framer();
  delta_bucket_framer(const delta_bucket_framer&) = delete;
  delta_bucket_framer& operator=(const delta_bucket_framer&) = delete;

  /// Places the segment's entry, cutting it at bucket boundaries (entry.changed = 0: counts
  /// its elements only). Throws std::invalid_argument past 2^32 − 1 buckets.
  void add_segment(const delta_segment_entry& entry, delta_segment_data& data);

  /// Closes the last bucket, stamps the bucket count and checksums into every bucket and
  /// returns them in index order; fills every field of `stats` when not null. Call once.
  std::vector<std::vector<uint8_t>> finish(delta_stats* stats = nullptr);

private:
  struct state;
  std::unique_ptr<state> s_;
};

} // namespace sorl::sync
