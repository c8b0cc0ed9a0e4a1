#pragma once

// Translation from the experiment config to the ML core's plain option structs, shared by
// the roles that build a model or a task. Pure: no CAF.

#include "runtime/config.hpp"
#include "runtime/ml/formats/prompt_format.hpp"
#include "runtime/ml/policy/model.hpp"
#include "runtime/ml/tasks/tasks.hpp"
#include "runtime/ml/train/sft.hpp"

namespace sorl {

/// The task of [task], seeded by run.seed; a jsonl task refuses prompts that leave no room
/// in the model's context as prompt_format_from(cfg) encodes them. Raises what ml::make_task
/// and prompt_format_from raise.
ml::any_task make_task_from(const experiment_config& cfg);

/// The model shape of [model]: the preset's, or model.hf_dir's config.json with max_seq =
/// min(max_position_embeddings, model.max_seq or 32768). Raises ml::checkpoint_error naming
/// the config.json field at fault.
ml::model_dims model_dims_from(const experiment_config& cfg);

/// How the policy encodes prompts and where its turns end: sorl's byte format for a preset,
/// model.hf_dir's tokenizer and chat template (with task.system_prompt) otherwise. Raises
/// what ml::prompt_format::hugging_face and ml::read_hf_config raise.
ml::prompt_format prompt_format_from(const experiment_config& cfg);

/// The warm start of [sft] + [model] + [task]: writes into model.checkpoint.
ml::sft_options sft_options_from(const experiment_config& cfg);

} // namespace sorl
