#pragma once

// Byte equality of two envelopes, for the wire-codec tests that pin each encoder's bytes
// against a reference encoder.

#include <cstring>

#include "runtime/envelope.hpp"

namespace sorl::test {

/// True when `a` and `b` carry the same schema and exactly the same bytes.
inline bool same_bytes(const envelope& a, const envelope& b) {
  return a.schema_id() == b.schema_id() && a.size_bytes() == b.size_bytes() &&
         std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

} // namespace sorl::test
