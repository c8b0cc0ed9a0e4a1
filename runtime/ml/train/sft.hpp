#pragma once

// Supervised warm start (`sorl sft CONFIG`): train a fresh policy on generated demonstrations
// of a task, a configurable share of them deliberately wrong, so that RL later starts from
// partial competence rather than from a model that never emits a well-formed answer.
//
// Sequences (the same encoding evaluate() decodes with, evaluate.hpp):
//   single-turn   <|bos|> prompt completion <|eos|>         loss on completion and <|eos|>
//   multi-turn    encode_chat(episode)                       loss on every assistant turn's
//                                                            text and its <|end_turn|>
// The loss is the mean next-token cross-entropy over the loss tokens of a batch (token-level
// mean, so long episodes weigh in proportion to their actions).
//
// Optimiser: AdamW (Loshchilov & Hutter 2019, decoupled weight decay; no decay on 1-D norm
// weights), global gradient-norm clipping, linear warm-up then cosine decay to
// min_lr_fraction × lr. Everything is seeded: the same options and thread count give the same
// weights on the same CPU kernels (runtime/ml/policy/cpu_kernels.hpp pins them for sorl and
// scripts/measure_sft; the figures below were measured before that, on native kernels).
//
// Measured with scripts/measure_sft (bench/sft/sft_measure.cpp), 1 intra-op thread on
// the 2-core development machine (Debian libtorch 1.13 on the reference BLAS), other jobs
// running alongside:
//   arithmetic (defaults: 1–2 digit operands, '+'), all sft_options defaults — 1000 steps × 32:
//     held-out greedy accuracy 0.000 → 0.240 (48/200), sampled (T = 1) 0.140; 3.9 min,
//     ~1100 training tokens/s. `steps` is the dial: longer cosine schedules gave 0.14 at
//     step 800 and 0.19 at 1000 of 1200 (reference BLAS), and 0.19 / 0.34 / 0.50 at steps
//     500 / 1000 / 1500 of 3000 (OpenBLAS, whose different rounding moves the curve by a few
//     hundred steps). Untrained accuracy is 0: the random model never emits a bare integer.
//   number_guess (defaults: 1..100, 10 turns), steps 300, batch_size 8, other defaults:
//     greedy 0.000 → 0.550 (55/100 episodes found), sampled 0.310, mean 7.4 turns; 4.6 min.

#include "runtime/ml/formats/safetensors.hpp"
#include "runtime/ml/policy/model.hpp"
#include "runtime/ml/tasks/tasks.hpp"
#include "runtime/ml/train/evaluate.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sorl::ml {

/// Everything run_sft needs. Plain data: the CLI parses `sorl sft CONFIG` into this.
/// Units: steps are optimizer steps, sizes are sequences (demonstrations or episodes), tokens
/// are tokenizer ids.
struct sft_options {
  // -- model ---------------------------------------------------------------------------------
  /// Model preset name (runtime/ml/policy/model.hpp: "tiny", "tiny-2k", "50m"); used when
  /// `dims` is empty.
  std::string preset = "tiny";
  /// Explicit model shape; overrides `preset` when set (its vocab must be >= 272, the byte
  /// tokenizer's size). Checkpoint metadata then names the preset "custom".
  std::optional<model_dims> dims;
  /// Standard deviation of the random initialisation (HF Llama initializer_range).
  double init_std = 0.02;

  // -- task ----------------------------------------------------------------------------------
  /// Task name for make_task: "arithmetic" (default: 1–2 digit operands, '+'),
  /// "number_guess", "jsonl".
  std::string task = "arithmetic";
  /// Options of the task (its seed selects prompts; its eval_fraction the held-out share).
  task_options task_config;

  // -- data ----------------------------------------------------------------------------------
  /// Share of demonstrations that carry a wrong answer (single-turn: task.wrong_completion)
  /// or come from the feedback-ignoring policy (multi-turn), in [0, 1]. Exactly
  /// round(pool × wrong_fraction) of the pool is wrong. Greedy accuracy is governed mostly by
  /// `steps`; this mainly lowers the probability mass on the right answer, i.e. the accuracy
  /// of *sampled* rollouts, which is what RL sees.
  double wrong_fraction = 0.2;
  /// Demonstrations (single-turn) or episodes (multi-turn) in the training pool, >= 0.
  /// 0 = steps × batch_size, so every example is fresh (for a split of finite size, e.g. a
  /// JSONL file, the whole train split). The pool is drawn from train indices 0..pool-1 and
  /// visited in shuffled epochs.
  std::int64_t pool_size = 0;

  // -- optimisation --------------------------------------------------------------------------
  /// Optimizer steps, >= 1.
  std::int64_t steps = 1000;
  /// Sequences per step, >= 1.
  std::int64_t batch_size = 32;
  /// Length grouping, >= 0: when >= 2, the shuffled order is taken a window of
  /// group_by_length × batch_size examples at a time, each window is sorted by length and
  /// cut into batches, and the window's batches are served in random order. Every example is
  /// still seen once per epoch; what changes is that a batch's rows have similar lengths, so
  /// little of it is padding. Worth it when lengths vary widely (multi-turn episodes:
  /// docs/notebook/2026-12-file-search-agent.md gives the measured gain); 0 or 1 = off (plain shuffled batches).
  std::int64_t group_by_length = 0;
  /// Peak learning rate (after warm-up), > 0.
  double lr = 3e-3;
  /// Linear warm-up, steps, >= 0; clamped to `steps`.
  std::int64_t warmup_steps = 50;
  /// Final learning rate of the cosine decay as a fraction of `lr`, in [0, 1].
  double min_lr_fraction = 0.1;
  /// AdamW decoupled weight decay per step, as a coefficient of lr (torch.optim.AdamW's
  /// weight_decay), >= 0. Not applied to 1-D (norm) weights.
  double weight_decay = 0.01;
  double beta1 = 0.9;        ///< AdamW first-moment decay, in [0, 1)
  double beta2 = 0.98;       ///< AdamW second-moment decay, in [0, 1)
  double adam_eps = 1e-8;    ///< AdamW denominator epsilon, > 0
  /// Global L2 gradient-norm clip; <= 0 = off.
  double grad_clip = 1.0;
  /// Seed of the model initialisation, the wrong-demonstration positions and the batch order.
  std::uint64_t seed = 0;

  // -- evaluation ----------------------------------------------------------------------------
  /// Held-out prompts / episodes (eval split, greedy) evaluated before training, every
  /// `eval_every` steps and at the end, >= 0; 0 = no evaluation.
  std::int64_t eval_count = 200;
  /// Evaluate every this many steps as well, >= 0; 0 = only before and after.
  std::int64_t eval_every = 0;
  /// Evaluate the untrained model too (its accuracy is the "before" figure).
  bool eval_before = true;
  /// Greedy generation budget per completion / action, tokens, >= 1.
  std::int64_t eval_max_new_tokens = 16;
  /// Sequences decoded at once during evaluation, >= 1.
  std::int64_t eval_batch = 64;

  // -- starting point ------------------------------------------------------------------------
  /// A checkpoint root (runtime/ml/formats/checkpoint.hpp layout) whose `latest` step's weights
  /// replace the fresh initialisation; the optimizer state starts fresh. Empty = fresh weights.
  /// run_sft raises std::invalid_argument naming it when it holds no checkpoint, and
  /// checkpoint_error when its tensors are not the model's (another preset) or it is corrupt.
  std::string init_checkpoint;

  // -- output --------------------------------------------------------------------------------
  /// Checkpoint root (runtime/ml/formats/checkpoint.hpp layout; created if needed).
  /// Empty = write nothing.
  std::string output_dir;
  /// Intra-op CPU threads (at::set_num_threads) for the run, >= 0; 0 = leave libtorch's
  /// setting. The setting stays in force after run_sft returns (it is process-wide).
  /// On a machine shared with other work prefer 1: with 2 threads on 2 busy cores every
  /// OpenMP region waits for a descheduled thread, measured 8x slower here (65 vs 520
  /// training tokens/s), and Debian's reference BLAS runs matrix products on one thread anyway.
  int threads = 0;
};

/// Throws std::invalid_argument naming the first out-of-range field of `o` (see the field
/// comments); also checks that the preset exists.
void validate(const sft_options& o);

/// The order in which run_sft visits a pool of `lengths.size()` examples (lengths in tokens,
/// any unit that orders them): `steps` batches of `batch_size` pool indices, from shuffled
/// epochs seeded by `seed`, grouped by length when `group_by_length` >= 2 (see
/// sft_options::group_by_length). Throws std::invalid_argument when the pool is empty or
/// batch_size < 1.
std::vector<std::vector<std::size_t>> sft_batch_schedule(const std::vector<std::int64_t>& lengths,
                                                         std::int64_t steps, std::int64_t batch_size,
                                                         std::int64_t group_by_length, std::uint64_t seed);

/// The model shape `o` asks for: o.dims, or preset(o.preset).
model_dims sft_model_dims(const sft_options& o);

/// One progress report, sent after every optimizer step (and with `eval` set right after an
/// evaluation at that step). Called on run_sft's thread.
struct sft_progress {
  std::int64_t step = 0;            ///< steps done, 1..steps (0 for the "before" evaluation)
  std::int64_t steps = 0;           ///< total steps of the run
  double loss = 0.0;                ///< this step's mean cross-entropy over loss tokens, nats
  double lr = 0.0;                  ///< learning rate used for this step
  double grad_norm = 0.0;           ///< global L2 gradient norm before clipping
  double tokens_per_second = 0.0;   ///< training tokens (non-padding inputs) / training seconds, since the start
  double elapsed_seconds = 0.0;     ///< wall time since run_sft started, evaluations included, s
  const eval_report* eval = nullptr;  ///< set when an evaluation just finished; valid during the call
};

/// Callback for live progress lines; may be empty.
using sft_progress_fn = std::function<void(const sft_progress&)>;

/// What run_sft did.
struct sft_report {
  model_dims dims;                     ///< shape of the trained model
  std::string preset;                  ///< preset name, or "custom"
  std::string task;                    ///< task name
  std::optional<eval_report> before;   ///< untrained model (when eval_before and eval_count > 0)
  std::optional<eval_report> after;    ///< trained model (when eval_count > 0)
  /// Periodic evaluations (eval_every), with the step they followed.
  std::vector<std::pair<std::int64_t, eval_report>> during;
  std::vector<double> losses;          ///< per step, nats
  std::int64_t steps = 0;              ///< optimizer steps taken
  std::int64_t train_tokens = 0;       ///< non-padding input tokens processed
  std::int64_t loss_tokens = 0;        ///< tokens the loss was taken on
  std::int64_t pool_size = 0;          ///< demonstrations / episodes in the training pool
  std::int64_t wrong_in_pool = 0;      ///< of them, deliberately wrong
  double train_seconds = 0.0;          ///< wall time in training steps, s
  double total_seconds = 0.0;          ///< wall time of the whole run, evaluations included, s
  double tokens_per_second = 0.0;      ///< train_tokens / train_seconds
  /// The checkpoint directory written (empty when output_dir is empty).
  std::filesystem::path checkpoint;
  /// Temporary directories of crashed checkpoint writes that saving it removed
  /// (remove_stale_checkpoint_temporaries, runtime/ml/formats/checkpoint.hpp).
  std::vector<std::filesystem::path> removed_stale;
  /// The trained fp32 model (never null on return).
  std::unique_ptr<policy_model> model;
  /// Final AdamW state, as saved in the checkpoint's optimizer file: for each trained
  /// parameter `<name>.exp_avg` and `<name>.exp_avg_sq`, fp32, the parameter's shape.
  named_tensors optimizer_state;
};

/// Runs the warm start on the task `o.task` / `o.task_config` (make_task). Writes a checkpoint
/// to o.output_dir (when set) with save_checkpoint: the model, the AdamW moments, the step,
/// the data-order RNG state ("sft.data", std::mt19937_64 text) and metadata
/// "sorl.sft.{preset,task,wrong_fraction,seed,steps,eval_accuracy,eval_count,...}" and
/// "sorl.model.{vocab,d_model,...}". Throws std::invalid_argument for bad options (validate),
/// what make_task throws, checkpoint_error if the checkpoint cannot be written, and
/// std::runtime_error naming the step when a loss or gradient norm is not finite (nothing is
/// written then).
sft_report run_sft(const sft_options& o, const sft_progress_fn& progress = {});

/// As above, on a task built by the caller (tests, custom tasks); `o.task` and
/// `o.task_config` are then only recorded in the metadata. Throws std::invalid_argument for an
/// empty task.
sft_report run_sft(const sft_options& o, const any_task& task, const sft_progress_fn& progress = {});

/// One training sequence: token ids and, per id, whether the model is trained to predict it.
struct sft_sequence {
  std::vector<token_id> ids;            ///< the whole sequence, <|bos|> first
  std::vector<std::uint8_t> loss_mask;  ///< same length as ids; 1 = predicted (loss token)
};

/// Encodes one single-turn demonstration for training: ids = <|bos|> encode(prompt)
/// encode(completion) <|eos|> (prompt and completion encoded separately, as evaluate() feeds
/// the prompt alone), loss_mask 1 on the completion tokens and the final <|eos|>.
sft_sequence encode_demonstration(const tokenizer& tok, const demonstration& d);

/// Encodes a demonstration episode: ids equal encode_chat(tok, chat, false); loss_mask is 1 on
/// every assistant turn's content tokens and its closing <|end_turn|> (not on the
/// <|assistant|> marker, which is part of the generation prompt).
sft_sequence encode_episode(const tokenizer& tok, const std::vector<chat_message>& chat);

}  // namespace sorl::ml
