#pragma once

// Shared by the rollout worker's tests: a policy small enough that a test decodes hundreds of
// rollouts in a second.

#include "runtime/ml/policy/model.hpp"

namespace sorl::rollout::fixtures {

/// The tiny preset cut to one layer of width 32, with a `max_seq`-token context.
inline ml::model_dims small_dims(std::int64_t max_seq = 96) {
  ml::model_dims d = ml::preset("tiny");
  d.d_model = 32;
  d.n_layers = 1;
  d.n_heads = 2;
  d.n_kv_heads = 1;
  d.d_ff = 64;
  d.max_seq = max_seq;
  return d;
}

} // namespace sorl::rollout::fixtures
