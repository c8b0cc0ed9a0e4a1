#pragma once

// The learner's update step as a plain class: a batch of finished rollouts in, one GRPO / DAPO
// policy update of a policy_model out, plus the step's metrics. The learner actor shell owns
// one learner_core and only turns messages into train_step calls and metrics into messages.
//
// One train_step (ARCHITECTURE.md §6, "GRPO / DAPO"):
//   1. group samples by group_id and compute group-relative advantages (grpo.hpp), after DAPO's
//      soft overlong punishment when enabled;
//   2. pack the batch: its sequences end to end for the log-prob forwards (no padding,
//      learner_options::packed_forward), and right-padded [N, L] ids with an attention mask
//      for the forwards SALT records;
//   3. the "old" log-probs π_old of the importance ratio: the rollout's own sampling log-probs
//      (old_logprob_source::rollout), or a no-grad recompute of every response token with the
//      current weights before any update (recompute). Either way the learner's log-probs at
//      the pre-update weights are compared with the rollout's (the mismatch metrics);
//   4. with kl_coef > 0, log-probs of the frozen reference model;
//   5. epochs × minibatches of forward, policy_loss, backward, gradient-norm clipping, AdamW.
//      With SALT on, each minibatch's advantages are first reweighted from the Gram matrix of
//      its rollouts' gradients (salt.hpp, grad_gram.hpp) and the loss uses those.
// After the first minibatch update the ratio leaves 1, so clipping can engage in later ones.
//
// Exactly on-policy (ARCHITECTURE.md §6, "GRPO / DAPO"): the rollout workers sample with the
// bf16 round-to-nearest-even image of the fp32 master, so by default every forward of the
// learner runs on that same image (policy_model::set_bf16_compute) and the gradient passes
// straight through to the master, which AdamW steps. The learner then scores the policy the
// rollouts came from; its log-probs differ from the rollout's only by the kernels' rounding
// (the cached decode against the full forward).

#include "actors/learner/grpo.hpp"
#include "actors/learner/grad_gram.hpp"
#include "actors/learner/rollout_sample.hpp"
#include "actors/learner/salt.hpp"
#include "runtime/ml/policy/model.hpp"

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace sorl {
struct experiment_config;
}

namespace sorl::learner {

/// DAPO's handling of responses cut off at the length limit (Yu et al. 2025 §3.4).
enum class overlong_mode {
  none,   ///< truncated responses are trained like any other
  filter, ///< overlong filtering: samples with `truncated` get loss mask 0 (kept in group stats)
  /// Soft overlong punishment: reward += overlong_penalty(generated, max_len, cache_len), where
  /// `generated` is the length of a *turn*: a maximal run of response tokens with
  /// loss_mask ≠ 0 (the whole response in single-turn tasks). max_len is a per-turn budget
  /// (max_new_tokens), so a multi-turn episode is shaped by its longest turn, i.e. the
  /// smallest (most negative) penalty over its turns; many short turns are never overlong.
  shape,
};

/// Which weights the learner's forward and backward passes see.
enum class forward_weights {
  /// The bf16 image of the fp32 master that the rollout workers hold, bit for bit, with the
  /// gradient applied to the master (straight-through; policy_model::set_bf16_compute).
  bf16,
  /// The fp32 master itself. The rollouts then come from a policy the learner never scores
  /// (the master drifts below half a bf16 ulp); kept only to measure that drift.
  fp32,
};

/// Where π_old of the importance ratio comes from.
enum class old_logprob_source {
  /// The rollout's own sampling log-probs, for every epoch and minibatch; no separate pass.
  /// Unbiased when rollout and learner score the same weights (forward_weights::bf16), but
  /// their last bits depend on how the worker batched the rollout (sampler.hpp, "Batch
  /// independence"), so a run is no longer bit-for-bit reproducible (a resumed run drifts
  /// from the uninterrupted one in the last bits).
  rollout,
  /// A no-grad forward of the learner over the batch before any update: reproducible bit for
  /// bit, and free when the only update's forwards double as it (epochs = minibatches = 1,
  /// without tis_cap; each micro-batch's forward gives π_old of its own rows).
  recompute,
};

/// Hyper-parameters of the learner. Plain data: the TOML `[algorithm]` section is parsed into
/// this at the entry point.
struct learner_options {
  /// AdamW learning rate, >= 0. 0 is a frozen policy: the loss, gradients and Adam moments are
  /// computed as usual but no weight bit changes (a baseline on the same prompts and seeds).
  double lr = 1e-4;
  double adam_beta1 = 0.9;    ///< first-moment decay, in [0, 1)
  double adam_beta2 = 0.999;  ///< second-moment decay, in [0, 1)
  double adam_eps = 1e-8;     ///< added to sqrt(v̂) (> 0)
  double weight_decay = 0.0;  ///< decoupled, applied to every parameter (≥ 0)
  /// Clip the global L2 gradient norm to this (as torch.nn.utils.clip_grad_norm_); ≤ 0 disables
  /// clipping (the norm is still measured and reported).
  double max_grad_norm = 1.0;
  loss_options loss;            ///< clip ε_low / ε_high, kl_coef, token | sequence normalisation
  bool scale_advantages = true; ///< divide by the group std (GRPO) or not (Dr. GRPO)
  double advantage_eps = 1e-6;  ///< eps of group_advantages
  overlong_mode overlong = overlong_mode::none;
  std::int64_t overlong_max_len = 0;   ///< L_max of eq. 13, tokens (> 0 for mode shape)
  std::int64_t overlong_cache_len = 0; ///< L_cache of eq. 13, tokens, in [0, L_max]
  /// Logits are divided by this before log-softmax, to score tokens under the distribution the
  /// rollout sampled from (it must match the rollout's temperature; >= ml::min_temperature,
  /// below which fp32 log-probs overflow). The division is done in double, so the value
  /// counts at full precision, and rounded once to fp32.
  double temperature = 1.0;
  int epochs = 1; ///< passes over the batch per train_step (≥ 1)
  /// Optimizer updates per epoch (≥ 1); the batch is shuffled and split into this many
  /// near-equal minibatches (fewer when the batch has fewer samples).
  int minibatches = 1;
  /// Minibatches hold whole groups (veRL splits by prompt): the groups are shuffled and split
  /// into near-equal counts of groups, so a group's advantages sum to 0 within its minibatch
  /// (with SALT, the Gram of actors/learner/salt.hpp then sees every sibling of a rollout).
  /// Off = single rollouts are shuffled and split. No effect with one minibatch.
  bool group_minibatches = false;
  /// Bound on one forward pass, in padded tokens (rows × the longest row's prompt + response),
  /// ≥ 0; 0 = no bound. A minibatch or the old-log-prob pass that would exceed it is split
  /// into micro-batches of rows of similar length (plan_micro_batches) whose gradients add up
  /// to the minibatch's, so long-tailed multi-turn batches stop padding every episode to the
  /// longest one. A batch within the bound runs in one forward, exactly as without the bound.
  std::int64_t micro_batch_tokens = 4096;
  /// train_step throws training_stalled once this many consecutive steps applied no update
  /// for lack of trained tokens (every response masked out); 0 = never. Steps that drop
  /// updates for non-finite values fail at once instead (see training_stalled).
  int max_idle_steps = 3;
  /// SALT (actors/learner/salt.hpp): each update's loss uses coefficients reweighted from the
  /// minibatch's per-rollout gradient Gram matrix instead of the advantages. Off = the plain
  /// GRPO / DAPO update, untouched.
  bool salt_enabled = false;
  salt_options salt;
  /// Decoder layers, counted from the last, whose linear layers (q, k, v, o, gate, up, down)
  /// enter SALT's Gram matrix besides the LM head (always in); −1 = all of them. Embeddings
  /// and norm weights never enter it. 0 (the LM head only) by default: K of a layer costs
  /// about N² · in · out multiply-adds in fp64 for N rollouts, several backward passes' worth
  /// for the decoder's linear layers (docs/salt.md has the measured overheads).
  std::int64_t salt_layers = 0;
  gram_method salt_gram = gram_method::automatic; ///< how K is computed (grad_gram.hpp)
  forward_weights weights = forward_weights::bf16;       ///< see forward_weights
  old_logprob_source old_logprobs = old_logprob_source::recompute; ///< see old_logprob_source
  /// Truncated importance sampling against inexact rollout kernels (Yao et al. 2025, "Your
  /// efficient RL framework secretly brings you off-policy RL training"): each trained
  /// token's policy-gradient term is weighted by min(π_old / π_rollout, tis_cap), detached.
  /// 0 = off; otherwise >= 1 and old_logprobs must be recompute (with rollout the weight is 1).
  double tis_cap = 0.0;
  /// A minibatch whose advantages (coefficients) are all exactly 0, without a KL term, skips
  /// its backward pass: its gradient is exactly 0, so AdamW steps with zero gradients instead,
  /// bit for bit the same weights and moments (and the step's first such update takes its
  /// log-probs from the old-log-prob pass, which ran on the same weights and rows). Not a
  /// config key; false runs the backward anyway (the reference the tests compare against).
  bool skip_zero_signal = true;
  /// Log-prob forwards run over the micro-batch's sequences packed end to end, without padding
  /// (policy_model::forward_packed_hidden), and the LM head with its log-softmax is applied a
  /// chunk of rows at a time in forward and backward (ml::token_logprobs_fused), never
  /// materialising the [rows, vocab] logits. Values agree with the padded path up to fp32
  /// rounding. With SALT on every forward stays padded: its Gram matrix needs each rollout's
  /// LM-head output gradient, whole logits, and the update reuses SALT's recorded forward, so
  /// one layout keeps SALT idle the (padded) plain step bit for bit. Not a config key; false
  /// is the padded path with whole logits (the reference the tests and the bench compare
  /// against).
  bool packed_forward = true;
  /// With packed_forward, rollouts whose prompts are equal token for token (a group's) read
  /// one copy of the prompt in the log-prob forwards (policy_model::forward_shared_hidden):
  /// the linear layers and MLP run over each prompt once instead of G times, and backward sums
  /// the prompt rows' gradients over the group. Values agree with the unshared packed forward
  /// up to fp32 rounding. Not a config key; false packs every rollout's prompt (the reference
  /// the tests and the bench compare against).
  bool share_prompts = true;

  /// Throws std::invalid_argument naming the first field out of range (or not finite).
  void validate() const;
};

/// The learner's options from a loaded (validated) experiment: [algorithm] plus the per-turn
/// token budget `task.max_new_tokens` (L_max of the overlong shaping, Yu et al. 2025 eq. 13,
/// with L_cache = min(overlong_cache, L_max)). Greedy rollouts (temperature 0) are scored at
/// temperature 1. The defaults above equal the config's ([algorithm] in runtime/config.hpp),
/// so a key the file leaves out means the same here.
learner_options learner_options_from(const experiment_config& cfg);

/// What one train_step measured. Averages over "updates" are over the optimizer updates that
/// were applied (0 when none was).
struct step_metrics {
  double loss = 0.0;           ///< pg_loss + kl_coef · kl, mean over updates
  double pg_loss = 0.0;        ///< clipped surrogate, mean over updates
  double kl = 0.0;             ///< k3 KL to the reference, mean over updates (0 without one)
  double clip_frac_low = 0.0;  ///< see loss_terms, mean over updates
  double clip_frac_high = 0.0; ///< see loss_terms, mean over updates
  double ratio_mean = 0.0;     ///< mean importance ratio, mean over updates
  double ratio_max = 0.0;      ///< largest importance ratio seen in any update
  double grad_norm = 0.0;      ///< global L2 gradient norm before clipping, mean over updates
  double grad_norm_max = 0.0;  ///< largest pre-clip gradient norm of any update
  /// Train/inference mismatch, over the trained tokens of mismatch_tokens: the rollout's
  /// sampling log-prob against the learner's at the same (pre-update) weights, Δ = learner −
  /// rollout. With old_logprobs recompute the learner's are the recompute over the whole
  /// batch; with rollout, those of the forwards run before the step's first update (the whole
  /// batch with one minibatch, the first minibatch otherwise), at no extra cost.
  double mismatch_mean = 0.0;    ///< mean |Δ|, nats
  double mismatch_max = 0.0;     ///< max |Δ|, nats
  /// Mean of k3 = exp(Δ) − Δ − 1 (Schulman 2020), an unbiased estimate of KL(π_rollout ‖
  /// π_learner) from the rollout's own samples, nats; computed in fp64.
  double mismatch_k3 = 0.0;
  /// NeMo-RL's token_mult_prob_error: mean of exp|Δ| (1 = no mismatch).
  double token_mult_prob_error = 0.0;
  double mismatch_bitwise = 0.0;      ///< share of the tokens whose two log-probs are bitwise equal
  std::int64_t mismatch_tokens = 0;   ///< trained tokens the mismatch figures cover
  /// Mean token entropy (nats) of the pre-update policy over the same tokens.
  double entropy = 0.0;
  /// Truncated IS (tis_cap > 0): mean weight min(π_old / π_rollout, cap) over trained tokens,
  /// and the share of trained tokens whose ratio exceeded the cap. 0 when off.
  double tis_weight_mean = 0.0;
  double tis_capped_frac = 0.0;
  /// Forward passes over the batch's rows this step (micro-batches count one each): the
  /// old-log-prob recompute, the reference, the updates' and SALT's own. A cost figure for
  /// tests and benchmarks.
  std::int64_t forwards = 0;
  double reward_mean = 0.0; ///< mean task reward of samples with one, before overlong shaping
  double overlong_penalty_mean = 0.0;  ///< mean shaping term over samples with a reward
  std::int64_t overlong_shaped = 0;    ///< samples whose shaping term is < 0 (mode shape)
  std::int64_t reward_failures = 0;    ///< samples with reward_failed (masked out)
  double advantage_abs_mean = 0.0;     ///< mean |A_i| over samples
  std::int64_t samples = 0;            ///< N
  std::int64_t groups = 0;             ///< distinct group ids
  std::int64_t zero_signal_groups = 0; ///< groups whose (shaped) rewards are all equal, or G = 1
  std::int64_t tokens_trained = 0;    ///< trained tokens in the batch (counted once, not per epoch)
  std::int64_t overlong_filtered = 0; ///< samples masked out by overlong filtering
  std::int64_t updates = 0;           ///< optimizer updates applied
  /// Minibatches without an update: no trained token, or a non-finite loss or gradient norm
  /// (then the gradient is dropped so that one bad batch can't poison the weights and Adam's
  /// moments).
  std::int64_t skipped_updates = 0;
  /// Of skipped_updates, those dropped for a non-finite loss or gradient norm.
  std::int64_t nonfinite_updates = 0;
  /// Of updates, those whose minibatch had no signal (every advantage 0, no KL term): the
  /// backward pass was skipped and AdamW stepped with its exact gradient, zero.
  std::int64_t zero_signal_updates = 0;
  double seconds = 0.0; ///< wall time of train_step
  /// Of seconds: the log-prob forwards (old log-probs, reference, updates; SALT's own are in
  /// salt_seconds) and the backward passes of the updates. A cost figure for benchmarks.
  double forward_seconds = 0.0;
  double backward_seconds = 0.0;
  /// SALT, over the updates it ran for (salt_updates; every other field is 0 when that is 0):
  /// means over those updates of its cancellation c, dominant rank r, amplification γ and
  /// ‖Σ a_i g_i‖ before and after the reweighting (over the weights that enter K), and the
  /// wall time it took (the output gradients, K and the eigh, and a forward of its own where a
  /// minibatch has several micro-batches; a single one's forward is the update's), summed.
  std::int64_t salt_updates = 0;
  std::int64_t salt_noops = 0;  ///< of them, minibatches it left as they were (salt_noop)
  double salt_cancellation = 0.0;
  double salt_rank = 0.0;
  double salt_gamma = 0.0;
  double salt_norm_before = 0.0;
  double salt_norm_after = 0.0;
  double salt_seconds = 0.0;
};

/// Thrown by learner_core::train_step when training has stopped happening, so that the job
/// fails with the reason instead of finishing with unchanged weights: a step in which every
/// update attempt had a non-finite loss or gradient (it names the step and the likely causes),
/// or learner_options::max_idle_steps consecutive steps with nothing to train. The step is
/// counted and no weight or optimizer state was changed by the dropped updates.
class training_stalled : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Optimizer state for a checkpoint's optimizer file (runtime/ml/formats/checkpoint.hpp).
///
/// `tensors` holds new CPU tensors (copies, safe to keep while training continues):
///   "adam.step"                    [1] int64: AdamW's update count t (bias correction)
///   "adam.exp_avg.<param name>"    fp32, the parameter's shape: first moment m
///   "adam.exp_avg_sq.<param name>" fp32, the parameter's shape: second moment v
///   "reference.<param name>"       fp32: the frozen reference weights (only when kl_coef > 0,
///                                  so that a resumed run penalises KL to the same reference)
/// Parameter names are the model's Hugging Face names (policy_model::parameters()).
struct optimizer_state {
  std::int64_t step = 0; ///< train_step calls so far; the checkpoint's step
  std::vector<ml::named_tensor> tensors;
};

/// Advantage of every sample of `batch`, in batch order: samples are grouped by group_id,
/// rewards shaped by the overlong penalty of the longest turn when options.overlong is shape
/// (see overlong_mode::shape), then group_advantages(scale_advantages, advantage_eps) per
/// group over the samples whose reward did not fail; reward_failed samples get exactly 0.
/// Throws std::invalid_argument naming the sample for a non-finite reward that is not marked
/// reward_failed, or for invalid options.
std::vector<float> batch_advantages(const std::vector<rollout_sample>& batch,
                                    const learner_options& options);

/// Log-prob (natural log, at `temperature`) of every response token of every sample under
/// `model` (its compute weights: the bf16 image once a learner_core with forward_weights::bf16
/// holds it), computed exactly as train_step computes the old log-probs (one packed batch forward,
/// no grad), so rollouts that report these as sampling_logprobs show zero mismatch.
/// Result [i][t] pairs with batch[i].response[t]. Throws std::invalid_argument for a malformed
/// batch (see learner_core::train_step).
std::vector<std::vector<float>> response_logprobs(const ml::policy_model& model,
                                                  const std::vector<rollout_sample>& batch,
                                                  double temperature = 1.0);

/// SALT's Gram matrix of `batch` as train_step computes it for a minibatch that is the whole
/// batch: K [N, N] fp64 in batch order, K_ij = ⟨g_i, g_j⟩ where g_i is the gradient of sample
/// i's term of the policy objective at ratio 1 without its advantage, Σ_t w_t ∇ log π(y_t)
/// (w_t as options.loss.norm normalises the loss; untrained tokens weigh 0), over the LM head
/// and the linear layers (weights and biases) of the last options.salt_layers decoder layers
/// (grad_gram.hpp; options.salt_gram chooses the method, options.micro_batch_tokens the
/// forwards). Throws std::invalid_argument as train_step does for a malformed batch or options.
at::Tensor rollout_gradient_gram(const ml::policy_model& model, const std::vector<rollout_sample>& batch,
                                 const learner_options& options);

/// The differentiable form of response_logprobs: [N, T] fp32, T = the longest response, row i
/// holding batch[i]'s response log-probs in its first response-length columns (values beyond
/// are finite and meaningless). The same single forward train_step's policy loss uses when a
/// minibatch fits one micro-batch; gradients flow to the model when grad mode is on. `packed`
/// as learner_options::packed_forward (false: the padded forward with whole logits),
/// `share_prompts` as learner_options::share_prompts. Throws as response_logprobs.
at::Tensor response_logprobs_tensor(const ml::policy_model& model,
                                    const std::vector<rollout_sample>& batch,
                                    double temperature = 1.0, bool packed = true,
                                    bool share_prompts = true);

/// Rows of one forward pass each: `rows` (indices into `seq_len`) split so that every group's
/// padded size, its row count × its longest seq_len (tokens), is at most `budget`; a row longer
/// than the budget gets a group of its own. When all of `rows` fit (or budget is 0) the result
/// is the one group `rows` in the given order; otherwise rows are taken longest first (stable
/// among equal lengths), each group filled greedily, so that rows of similar length share a
/// forward. Empty `rows` gives no group. Throws std::invalid_argument for a negative budget or
/// a row index outside seq_len.
std::vector<std::vector<std::int64_t>> plan_micro_batches(const std::vector<std::int64_t>& rows,
                                                          const std::vector<std::int64_t>& seq_len,
                                                          std::int64_t budget);

/// Row indices of each minibatch of one epoch. `units` are what is shuffled: one row each, or
/// one group's rows each (learner_options::group_minibatches). With `minibatches` > 1 they are
/// shuffled by the generator seeded with (seed, step, epoch) and cut into min(minibatches,
/// units) contiguous slices whose unit counts differ by at most one; a minibatch is its units'
/// rows, unit after unit. One minibatch is every unit in the given order. Throws
/// std::invalid_argument when minibatches < 1.
std::vector<std::vector<std::int64_t>> minibatch_rows(const std::vector<std::vector<std::int64_t>>& units,
                                                      int minibatches, std::uint64_t seed,
                                                      std::int64_t step, int epoch);

/// GRPO / DAPO learner over a caller-owned fp32 policy_model. Not thread-safe: call it from
/// one thread (the learner actor's). libtorch's intra-op thread pool is used as configured by
/// the caller (at::set_num_threads).
///
/// Determinism: the same weights, options, seed, batch and thread count give bit-identical
/// weights after train_step; minibatch shuffling draws from a generator seeded by
/// (seed, step, epoch), so it needs no state beyond the step count.
class learner_core {
public:
  /// Takes `model` for training (sets requires_grad on its parameters and, with
  /// forward_weights::bf16, makes its forwards see the bf16 image of its weights; with fp32,
  /// the weights themselves) and, when options.loss.kl_coef > 0, clones it into a frozen
  /// reference scored the same way. `model` must outlive this.
  /// Throws std::invalid_argument for invalid options or a model whose weights are not fp32.
  learner_core(ml::policy_model& model, learner_options options, std::uint64_t seed);
  ~learner_core();
  learner_core(const learner_core&) = delete;
  learner_core& operator=(const learner_core&) = delete;

  /// One GRPO / DAPO update on `batch` (see the file comment). reward_failed samples are
  /// masked out of the loss and left out of their group's statistics. For every sample:
  /// prompt is non-empty, loss_mask and sampling_logprobs have response.size() entries, token
  /// ids are in [0, vocab), prompt + response fit in max_seq, reward is finite (unless
  /// reward_failed); otherwise
  /// std::invalid_argument naming the sample, thrown before anything changes. The log-prob of
  /// response token t is read from the logits at position prompt.size() + t − 1.
  /// Cost: epochs × (forward + backward) over the batch, plus, with old_logprobs recompute,
  /// one no-grad forward for the old log-probs unless epochs = minibatches = 1 and tis_cap is
  /// 0 (then the update's own forwards provide them, bit-identically, micro-batch by
  /// micro-batch),
  /// plus one no-grad forward of the reference when kl_coef > 0. Each pass runs in micro-batches of at most micro_batch_tokens
  /// padded tokens; micro-batches without a trained token are skipped in the updates.
  /// An exception from libtorch midway may leave a partial update. Throws training_stalled
  /// (after the step) when training has stopped happening (see there).
  step_metrics train_step(const std::vector<rollout_sample>& batch);

  /// Copies of the optimizer state (see optimizer_state).
  optimizer_state save_optimizer_state() const;
  /// Restores a state from save_optimizer_state of a learner with the same model shape and
  /// kl_coef > 0 exactly when that one had it. All or nothing: throws std::invalid_argument
  /// naming the first missing, extra, mis-shaped or mis-typed tensor before changing anything.
  /// Together with the model weights this makes the next train_step bit-identical to the one
  /// the saving learner would have taken.
  void load_optimizer_state(const optimizer_state& state);

  /// train_step calls so far (restored by load_optimizer_state).
  std::int64_t step() const noexcept {
    return step_;
  }
  /// AdamW updates applied so far, t of the bias correction.
  std::int64_t optimizer_updates() const noexcept {
    return adam_step_;
  }
  const learner_options& options() const noexcept {
    return options_;
  }
  /// The model being trained (the caller's).
  ml::policy_model& model() noexcept {
    return model_;
  }
  /// The frozen reference, or nullptr when kl_coef is 0.
  const ml::policy_model* reference() const noexcept {
    return reference_.get();
  }

private:
  void adamw_update();

  ml::policy_model& model_;
  learner_options options_;
  std::uint64_t seed_;
  std::unique_ptr<ml::policy_model> reference_;
  std::vector<at::Tensor> exp_avg_;    ///< per parameter, in parameters() order
  std::vector<at::Tensor> exp_avg_sq_; ///< per parameter, in parameters() order
  std::int64_t step_ = 0;
  std::int64_t adam_step_ = 0;
  std::int64_t idle_steps_ = 0; ///< consecutive steps that applied no update
};

} // namespace sorl::learner
