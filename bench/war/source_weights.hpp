#pragma once

// The policy weights a WAR bench decodes with (war_bench.cpp, route_bench.cpp), as the
// learner loads them (actors/learner/learner_service.cpp): the latest checkpoint under the
// config's model.checkpoint, else its Hugging Face directory, else a fresh init from
// run.seed. Prints which to stderr.

#include "actors/common/train_setup.hpp"
#include "runtime/config.hpp"
#include "runtime/ml/formats/checkpoint.hpp"
#include "runtime/ml/formats/hf_model.hpp"
#include "runtime/ml/policy/model.hpp"

#include <cstdio>
#include <stdexcept>

namespace sorl::bench {

/// The weights, named as ml::policy_model names them (fp32, on the CPU). Throws
/// std::runtime_error when model.checkpoint names a directory without a checkpoint (the
/// message says how to make one) and whatever loading a checkpoint or model directory raises.
inline ml::named_tensors source_weights(const experiment_config& cfg) {
  const ml::model_dims dims = model_dims_from(cfg);
  if (!cfg.model.checkpoint.empty()) {
    const auto dir = ml::latest_checkpoint(cfg.model.checkpoint);
    if (!dir)
      throw std::runtime_error("model.checkpoint: no checkpoint under " + cfg.model.checkpoint +
                               " (make it with `build/sorl sft` on this config: about 18 minutes for "
                               "configs/agent.toml on 2 cores, a minute or two for configs/default.toml)");
    ml::policy_model m(dims, cfg.run.seed);
    ml::load_checkpoint(*dir, m.parameters());
    std::fprintf(stderr, "weights: %s\n", dir->string().c_str());
    return m.parameters();
  }
  if (!cfg.model.hf_dir.empty()) {
    ml::hf_load_options lo;
    lo.max_seq = dims.max_seq;
    auto hf = ml::load_hf_model(cfg.model.hf_dir, lo);
    std::fprintf(stderr, "weights: %s\n", cfg.model.hf_dir.c_str());
    return hf.model.parameters();
  }
  std::fprintf(stderr, "weights: fresh init (seed %llu)\n", static_cast<unsigned long long>(cfg.run.seed));
  return ml::policy_model(dims, cfg.run.seed).parameters();
}

}  // namespace sorl::bench
