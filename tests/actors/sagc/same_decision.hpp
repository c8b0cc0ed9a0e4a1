#pragma once

// Field-by-field equality of two group-size decisions, for the tests that check a controller
// decides the same whichever way it got there (restored, or without being asked for a step's
// timing).

#include <catch2/catch.hpp>

#include <cmath>

#include "actors/sagc/group_policy.hpp"

namespace sorl::sagc::test {

/// Checks every field of `a` and `b` for equality, bit for bit; two NaN straggler
/// probabilities (not estimated) are equal.
inline void check_same(const group_decision& a, const group_decision& b) {
  CHECK(a.step == b.step);
  CHECK(a.group_size == b.group_size);
  CHECK(a.policy == b.policy);
  CHECK(a.reason == b.reason);
  CHECK(a.virtual_queue == b.virtual_queue); // bit for bit
  CHECK(
    (a.p_straggler == b.p_straggler || (std::isnan(a.p_straggler) && std::isnan(b.p_straggler))));
  CHECK(a.utility == b.utility);
  CHECK(a.target_rate == b.target_rate);
  CHECK(a.deadline_ns == b.deadline_ns);
  CHECK(a.min_finished == b.min_finished);
}

} // namespace sorl::sagc::test
