#pragma once

// Rollout timing events for the sagc tests (actors/sagc/timing.hpp), one constructor for all.

#include <cstdint>
#include <string>
#include <utility>

#include "actors/sagc/timing.hpp"

namespace sorl::sagc::test {

/// Event `kind` of rollout `id` (group `group`) of `step`, stamped `ns` on `worker`'s clock,
/// with `tokens` generated so far.
inline timing_event ev(uint64_t id, int64_t step, timing_kind kind, int64_t ns,
                       int64_t tokens = 0, std::string worker = "w0", uint64_t group = 0) {
  timing_event e;
  e.request_id = id;
  e.step = step;
  e.group_id = group;
  e.kind = kind;
  e.worker_ns = ns;
  e.tokens = tokens;
  e.worker = std::move(worker);
  return e;
}

} // namespace sorl::sagc::test
