#include "actors/common/train_setup.hpp"

#include <algorithm>

#include "runtime/ml/formats/hf_model.hpp"

namespace sorl {

namespace {

ml::task_options task_options_from(const experiment_config& cfg) {
  ml::task_options o;
  const auto& t = cfg.task;
  o.seed = cfg.run.seed;
  o.eval_fraction = t.eval_fraction;
  o.arithmetic.min_digits = static_cast<int>(t.min_digits);
  o.arithmetic.max_digits = static_cast<int>(t.max_digits);
  o.arithmetic.operators = t.operators;
  o.arithmetic.allow_negative = t.allow_negative;
  o.arithmetic.wrong_answers = t.wrong_answers;
  o.number_guess.lo = t.lo;
  o.number_guess.hi = t.hi;
  o.number_guess.max_turns = static_cast<int>(t.max_turns);
  o.file_search.depth = static_cast<int>(t.depth);
  o.file_search.max_dirs = static_cast<int>(t.max_dirs);
  o.file_search.max_files = static_cast<int>(t.max_files);
  o.file_search.max_turns = static_cast<int>(t.max_turns);
  o.file_search.max_episode_tokens = t.max_episode_tokens;
  o.file_search.detour_rate = t.detour_rate;
  o.file_search.wrong_episodes = t.wrong_episodes;
  o.file_search.wander_share = t.wander_share;
  o.file_search.preamble_bytes = t.preamble_bytes;
  o.file_search.preamble_families = t.preamble_families;
  o.jsonl.path = t.path;
  o.jsonl.eval_path = t.eval_path;
  switch (t.match) {
  case match_kind::exact: o.jsonl.match = ml::answer_match::exact; break;
  case match_kind::integer: o.jsonl.match = ml::answer_match::integer; break;
  case match_kind::first_number: o.jsonl.match = ml::answer_match::first_number; break;
  case match_kind::last_number: o.jsonl.match = ml::answer_match::last_number; break;
  case match_kind::countdown: o.jsonl.match = ml::answer_match::countdown; break;
  }
  o.jsonl.reward.argv = t.reward_command;
  o.jsonl.reward.timeout_ms = t.reward_timeout_ms;
  // What the rollout workers could never serve is refused when the task is built, before
  // anything starts (`sorl check`, `sorl train`).
  o.jsonl.context_tokens = model_dims_from(cfg).max_seq;
  if (!cfg.model.hf_dir.empty() && t.name == "jsonl") {
    auto format = std::make_shared<ml::prompt_format>(prompt_format_from(cfg));
    o.jsonl.prompt_tokens = [format](const std::string& prompt) {
      return static_cast<std::int64_t>(format->single_turn(prompt).size());
    };
  }
  return o;
}

} // namespace

ml::any_task make_task_from(const experiment_config& cfg) {
  return ml::make_task(cfg.task.name, task_options_from(cfg));
}

ml::model_dims model_dims_from(const experiment_config& cfg) {
  if (cfg.model.hf_dir.empty())
    return ml::preset(cfg.model.preset);
  const auto hf = ml::read_hf_config(cfg.model.hf_dir);
  auto dims = hf.dims;
  const std::int64_t cap = cfg.model.max_seq > 0 ? cfg.model.max_seq : 32768;
  dims.max_seq = std::min(hf.max_position_embeddings, cap);
  return dims;
}

ml::prompt_format prompt_format_from(const experiment_config& cfg) {
  if (cfg.model.hf_dir.empty())
    return ml::prompt_format::byte_level();
  const auto hf = ml::read_hf_config(cfg.model.hf_dir);
  return ml::prompt_format::hugging_face(cfg.model.hf_dir, hf.eos_token_ids, cfg.task.system_prompt);
}

ml::sft_options sft_options_from(const experiment_config& cfg) {
  ml::sft_options o;
  o.preset = cfg.model.preset;
  o.task = cfg.task.name;
  o.task_config = task_options_from(cfg);
  o.wrong_fraction = cfg.sft.wrong_fraction;
  o.steps = cfg.sft.steps;
  o.batch_size = cfg.sft.batch_size;
  o.lr = cfg.sft.lr;
  o.warmup_steps = cfg.sft.warmup_steps;
  o.seed = cfg.run.seed;
  o.eval_count = cfg.sft.eval_count;
  o.group_by_length = cfg.sft.group_by_length;
  o.init_checkpoint = cfg.sft.init_checkpoint;
  o.eval_max_new_tokens = cfg.task.max_new_tokens;
  o.output_dir = cfg.model.checkpoint;
  o.threads = static_cast<int>(cfg.run.threads);
  return o;
}

} // namespace sorl
