#pragma once

// Field-by-field comparison of two delta_stats, shared by the codec's tests and the GPU twin's.

#include "runtime/sync/delta_codec.hpp"

#include <catch2/catch.hpp>

namespace sorl::sync::test {

/// CHECKs every field of `a` against `b` (each mismatch reported by name).
inline void check_same_stats(const delta_stats& a, const delta_stats& b) {
  CHECK(a.elements == b.elements);
  CHECK(a.changed == b.changed);
  CHECK(a.dense_bytes == b.dense_bytes);
  CHECK(a.encoded_bytes == b.encoded_bytes);
  CHECK(a.dense_segments == b.dense_segments);
  CHECK(a.buckets == b.buckets);
  CHECK(a.entries == b.entries);
  CHECK(a.recurring == b.recurring);
  CHECK(a.bound_bits == b.bound_bits);
}

} // namespace sorl::sync::test
