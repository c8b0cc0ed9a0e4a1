#pragma once

// The sampling parameters of a GenerateRequest (messages/rollout.capnp), written by the trainer
// and read by the rollout workers through these two functions only, so that both sides agree
// on which fields carry them.

#include <cmath>
#include <cstdint>

#include "messages/rollout.capnp.h"

namespace sorl::rollout {

/// Temperature, top-p and top-k of one rollout request, at the precision the user wrote them.
struct request_sampling {
  double temperature = 1.0; ///< 0 = greedy
  double top_p = 1.0;
  uint32_t top_k = 0;       ///< 0 = off
};

/// Sets the Float64 fields (exact) and top-k. The Float32 `temperature` / `topP` stay 0:
/// every reader takes the Float64 ones (read_sampling), so a second, rounded copy would only
/// be a second place for the value to disagree.
inline void write_sampling(msg::GenerateRequest::Builder b, const request_sampling& s) {
  b.setTemperature64(s.temperature);
  b.setTopP64(s.top_p);
  b.setTopK(s.top_k);
}

/// Reads the Float64 fields; a sender that predates them left them NaN, and then the Float32
/// fields are all there is.
inline request_sampling read_sampling(msg::GenerateRequest::Reader r) {
  request_sampling s;
  s.temperature = std::isnan(r.getTemperature64()) ? r.getTemperature() : r.getTemperature64();
  s.top_p = std::isnan(r.getTopP64()) ? r.getTopP() : r.getTopP64();
  s.top_k = r.getTopK();
  return s;
}

} // namespace sorl::rollout
