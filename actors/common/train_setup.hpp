#pragma once

// Translation from the experiment config to the ML core's plain option structs, shared by
// the roles that build a model or a task. Pure: no CAF.

#include "runtime/config.hpp"
#include "runtime/ml/model.hpp"
#include "runtime/ml/sft.hpp"
#include "runtime/ml/tasks.hpp"

namespace sorl {

/// The task of [task], seeded by run.seed. Raises what ml::make_task raises.
ml::any_task make_task_from(const experiment_config& cfg);

/// The model shape of [model].preset.
ml::model_dims model_dims_from(const experiment_config& cfg);

/// The warm start of [sft] + [model] + [task]: writes into model.checkpoint.
ml::sft_options sft_options_from(const experiment_config& cfg);

} // namespace sorl
