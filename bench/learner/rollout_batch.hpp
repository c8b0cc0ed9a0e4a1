#pragma once

// One step's rollouts for the learner benches (onpolicy_bench.cpp, learner_step_bench.cpp), as
// the synchronous loop samples them, without actors.

#include "actors/learner/rollout_sample.hpp"
#include "runtime/config.hpp"
#include "runtime/ml/formats/prompt_format.hpp"
#include "runtime/ml/policy/generate.hpp"
#include "runtime/ml/tasks/tasks.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace sorl::bench {

/// B prompts × G rollouts of the training split (prompts first_prompt .. first_prompt + B − 1)
/// sampled by `worker` (the bf16 rollout copy) through the batched generator with the config's
/// sampling settings and per-prompt seeds, scored by the single-turn `task`; every response
/// token trained. In the generator's finishing order.
inline std::vector<learner::rollout_sample> sample_rollouts(const experiment_config& cfg, const ml::any_task& task,
                                                            const ml::prompt_format& format,
                                                            const ml::policy_model& worker, std::int64_t B,
                                                            std::int64_t G, std::int64_t first_prompt) {
  ml::generator_options go;
  go.max_batch = std::max<std::int64_t>(cfg.rollout.max_batch, G);
  ml::generator gen(worker, go);
  std::map<std::uint64_t, ml::task_prompt> prompts;
  std::map<std::uint64_t, std::vector<std::int32_t>> encoded;
  for (std::int64_t b = 0; b < B; ++b) {
    const auto index = static_cast<std::uint64_t>(first_prompt + b);
    const ml::task_prompt tp = task.single_turn->prompt(ml::task_split::train, index);
    ml::sampling_params sp;
    sp.temperature = cfg.algorithm.temperature;
    sp.top_p = cfg.algorithm.top_p;
    sp.top_k = cfg.algorithm.top_k;
    sp.max_new_tokens = cfg.task.max_new_tokens;
    sp.eos_token_ids = format.stop_ids();
    sp.seed = cfg.run.seed * 1000003u + index;
    auto ids = format.single_turn(tp.prompt);
    const std::uint64_t id = gen.submit(ids, sp, G);
    prompts[id] = tp;
    encoded[id] = std::move(ids);
  }
  std::vector<learner::rollout_sample> batch;
  for (const auto& r : gen.run_until_idle()) {
    learner::rollout_sample s;
    s.group_id = r.request_id;
    s.prompt = encoded.at(r.request_id);
    s.response = r.tokens;
    s.loss_mask.assign(r.tokens.size(), 1);
    s.sampling_logprobs = r.logprobs;
    s.truncated = r.reason == ml::finish_reason::length;
    s.reward = static_cast<float>(
      task.single_turn->score(prompts.at(r.request_id), format.tok().decode(r.tokens, ml::decode_specials::skip))
        .reward);
    batch.push_back(std::move(s));
  }
  return batch;
}

}  // namespace sorl::bench
