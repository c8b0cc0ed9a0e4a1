#pragma once

// The policy: a decoder-only transformer of the Llama / Qwen2 family (token embedding,
// RMSNorm, rotary position embedding, grouped-query attention, SwiGLU MLP, optional tied
// embedding / LM head), on plain ATen tensors so that checkpoints, the optimizer and weight
// sync can iterate one ordered list of named tensors. Not thread-safe: one owner at a time.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sorl::ml {

class kv_cache;
/// Handle of one kv_cache sequence; never reused within a cache.
using seq_id = std::int64_t;

/// How RoPE frequencies are rescaled for contexts past the pretraining length, as Hugging Face
/// `rope_scaling` says. Only the kinds that change nothing but the frequencies are here:
/// "dynamic" (NTK, which depends on the running sequence length), "yarn" and "longrope" are
/// refused where a config is read (runtime/ml/formats/hf_model.hpp).
struct rope_scaling_config {
  enum class kind {
    none,    ///< inv_freq_i = theta^(-2i/head_dim)
    linear,  ///< inv_freq_i / factor (Chen et al. 2023, position interpolation)
    llama3,  ///< Llama 3.1's band-wise rule: low frequencies / factor, high kept, a ramp between
  };
  kind type = kind::none;
  double factor = 1.0;           ///< linear, llama3: how much longer the context is; > 0
  double low_freq_factor = 1.0;  ///< llama3: wavelengths over original / this are scaled
  double high_freq_factor = 4.0; ///< llama3: wavelengths under original / this are kept
  std::int64_t original_max_position = 8192;  ///< llama3: pretraining context, tokens

  bool operator==(const rope_scaling_config& o) const noexcept {
    return type == o.type && factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor && original_max_position == o.original_max_position;
  }
};

/// Shape of a policy model. Plain data: the TOML `[model]` section is parsed into this at the
/// entry point. Field names follow Hugging Face `LlamaConfig` where one exists.
struct model_dims {
  std::int64_t vocab = 272;       ///< vocabulary size (byte tokenizer: 256 bytes + specials)
  std::int64_t d_model = 128;     ///< hidden size
  std::int64_t n_layers = 4;      ///< decoder layers
  std::int64_t n_heads = 4;       ///< query heads; head_dim = d_model / n_heads
  std::int64_t n_kv_heads = 2;    ///< key/value heads (grouped-query attention), divides n_heads
  std::int64_t d_ff = 384;        ///< SwiGLU intermediate size
  std::int64_t max_seq = 512;     ///< longest sequence (prompt + completion), tokens
  double rope_theta = 10000.0;    ///< RoPE base (Su et al. 2021, RoFormer eq. 15)
  double norm_eps = 1e-5;         ///< RMSNorm epsilon (Zhang & Sennrich 2019)
  bool tie_embeddings = true;     ///< LM head reuses model.embed_tokens.weight
  bool qkv_bias = false;          ///< q/k/v projections carry a bias (Qwen2 does, Llama does not)
  rope_scaling_config rope_scaling; ///< RoPE frequency rescaling (none by default)

  /// Per-head width, d_model / n_heads.
  std::int64_t head_dim() const noexcept { return d_model / n_heads; }
  /// Number of scalar parameters, counting a tied embedding once.
  std::int64_t parameter_count() const noexcept;
  /// Throws std::invalid_argument naming the first inconsistent field (non-positive sizes,
  /// n_heads not a multiple of n_kv_heads, d_model not a multiple of n_heads, odd head_dim).
  void validate() const;
};

/// Named model shapes. "tiny": d 128, 4 layers, 4 heads / 2 kv heads, d_ff 384, vocab 272,
/// max_seq 512 (~0.83M parameters, learns the built-in tasks on 2 CPU cores in minutes);
/// "tiny-2k": the same with max_seq 2048, for long multi-turn episodes (file_search).
/// "50m": d 768, 8 layers, 12 heads / 4 kv heads, d_ff 2048, vocab 272, max_seq 1024
/// (50.55M parameters). Throws std::invalid_argument for any other name.
model_dims preset(std::string_view name);

/// A parameter with its Hugging Face name, e.g. `model.layers.0.self_attn.q_proj.weight`.
using named_tensor = std::pair<std::string, at::Tensor>;

/// Which positions forward_cached returns logits for.
enum class logits_for {
  last,  ///< one row per sequence: the last appended token (what decoding needs)
  all,   ///< one row per appended token, packed in call order (what draft verification needs)
};

/// How forward_packed computes attention, the only part of it that is per sequence.
enum class packed_attention {
  /// The sequences' queries, keys and values are gathered into a right-padded [seqs, longest]
  /// layout for one batched attention under a block-causal mask, then gathered back: one
  /// matmul per layer instead of one per sequence, at the price of the padded score entries.
  batched,
  /// One attention call per sequence on its own rows: no padded entries, one kernel launch
  /// (and autograd node chain) per sequence and layer.
  per_sequence,
};

/// Which GEMM implementation forward_cached uses for its linear layers (the training forward
/// always uses at::linear, which autograd differentiates).
enum class decode_gemm {
  /// For a model holding bf16 weights on the CPU (a rollout copy): bf16_linear
  /// (runtime/ml/policy/decode_kernels.hpp), which reads the bf16 weights and is batch-invariant.
  /// Otherwise: oneDNN (libtorch's bundled MKLDNN) for fp32 CPU products of >= 2^18 multiply-adds when
  /// libtorch has it, else at::linear. The faster depends on libblas.so.3: netlib's reference
  /// BLAS is several times slower than oneDNN at decode batch 8-64, OpenBLAS can be faster
  /// (docs/decode-speed.md, "The preset benches", says how to time both). On CUDA: plain at::linear.
  automatic,
  aten,  ///< always at::linear (whatever BLAS libtorch was built with)
  /// The fp32 image of the weights with automatic's oneDNN rule, whatever the weights' dtype:
  /// what a bf16 model ran before bf16_linear, kept to measure against.
  fp32_image,
};

/// Seconds forward_cached spends per kind of operation, summed over the calls made while it is
/// attached (policy_model::set_decode_profile). For benches: the CPU ops run synchronously, so
/// each kind's figure is the wall time of its ops. Not thread-safe.
struct decode_profile {
  enum kind : int {
    embed, norm, qkv, rope, kv_cache, attention, o_proj, mlp_in, mlp_act, mlp_out, residual, lm_head,
    kinds
  };
  double seconds[kinds] = {};
  std::int64_t calls = 0;  ///< forward_cached calls measured
  /// A short label of `k` for tables ("q/k/v proj", "attention", ...).
  static const char* name(int k) noexcept;
};

/// RMSNorm: x * rsqrt(mean(x^2, -1) + eps) * weight (Zhang & Sennrich 2019; HF LlamaRMSNorm).
/// x: [..., d] fp32, weight: [d] fp32 → [..., d] fp32.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

/// RoPE tables for positions 0..max_seq-1: cos and sin of pos * theta^(-2i/head_dim),
/// i < head_dim/2, computed in double and rounded to fp32. Returns {cos, sin}, each
/// [max_seq, head_dim/2] fp32 on `device`.
std::pair<at::Tensor, at::Tensor> rope_tables(std::int64_t max_seq, std::int64_t head_dim,
                                              double theta, c10::Device device = c10::kCPU);

/// The RoPE inverse frequencies of `dims` after its rope_scaling, in double: head_dim/2 values,
/// radians per position. Without scaling inv_freq_i = rope_theta^(-2i/head_dim) (RoFormer
/// eq. 15); "llama3" follows Llama 3.1's reference code (Meta, `apply_scaling` in its
/// model.py; Hugging Face `_compute_llama3_parameters`): wavelength 2π/f above
/// original/low_freq_factor is divided by factor, below original/high_freq_factor kept, and in
/// between interpolated with s = (original/wavelength - low) / (high - low):
/// f' = (1 - s) f / factor + s f.
std::vector<double> rope_inv_freq(const model_dims& dims);

/// rope_tables of `dims` (max_seq, head_dim, rope_theta and rope_scaling). Returns {cos, sin},
/// each [max_seq, head_dim/2] fp32 on `device`. Throws std::invalid_argument for bad dims.
std::pair<at::Tensor, at::Tensor> rope_tables(const model_dims& dims, c10::Device device = c10::kCPU);

/// Rotates x by its positions in the Hugging Face "rotate_half" layout: the first and second
/// halves of each head are the (real, imaginary) parts, out = (x1 c - x2 s, x2 c + x1 s).
/// x: [..., heads, head_dim] fp32; cos, sin: [..., head_dim/2] fp32 (leading dims of x without
/// the heads dim) → same shape as x.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// Decoder-only transformer, HF Llama semantics (and Qwen2 with qkv_bias). Weights are held in
/// `weight_dtype()` (fp32 for training, bf16 for a rollout copy); arithmetic is always fp32,
/// from an fp32 image of bf16 weights that is rebuilt when the weights change (and, with
/// set_bf16_compute, from the bf16 rounding of fp32 weights).
/// Move-only: copying would silently share parameters; use clone().
class policy_model {
 public:
  /// Random init as HF Llama: linear and embedding weights ~ N(0, init_std^2), norm weights 1,
  /// biases 0, drawn on the CPU from `seed` (same weights on every device), fp32.
  /// Throws std::invalid_argument if `dims` is inconsistent.
  policy_model(const model_dims& dims, std::uint64_t seed, double init_std = 0.02,
               c10::Device device = c10::kCPU);
  policy_model(policy_model&&) noexcept;
  policy_model& operator=(policy_model&&) noexcept;
  policy_model(const policy_model&) = delete;
  policy_model& operator=(const policy_model&) = delete;
  ~policy_model();

  const model_dims& dims() const noexcept;
  c10::Device device() const noexcept;
  /// Storage dtype of parameters(): kFloat (training) or kBFloat16 (rollout copy).
  c10::ScalarType weight_dtype() const noexcept;

  /// Every parameter once, in HF state-dict order: model.embed_tokens.weight; per layer
  /// self_attn.{q,k,v}_proj.weight (+ .bias if qkv_bias), self_attn.o_proj.weight,
  /// mlp.{gate,up,down}_proj.weight, input_layernorm.weight, post_attention_layernorm.weight;
  /// model.norm.weight; lm_head.weight unless tied (a tied head is the embedding, listed once).
  /// The tensors are the model's storage: write into them in place (copy_, index_put_), never
  /// replace them. Writes through ATen ops are noticed by the next forward; raw pointer writes
  /// need refresh_compute_weights().
  const std::vector<named_tensor>& parameters() const noexcept;
  /// The parameter called `name`; throws std::out_of_range naming it if there is none.
  const at::Tensor& parameter(std::string_view name) const;
  /// Sets requires_grad on every parameter (fp32 models only; throws for bf16).
  void set_requires_grad(bool requires_grad);

  /// A deep copy whose weights are cast to `weight_dtype` (kFloat or kBFloat16; round to
  /// nearest even). `clone(at::kBFloat16)` is the rollout copy of a training model.
  policy_model clone(c10::ScalarType weight_dtype) const;
  /// Copies (and casts) every weight from `source`, which must have the same dims; a full
  /// weight sync. Throws std::invalid_argument on a dims mismatch.
  void copy_weights_from(const policy_model& source);
  /// Rebuilds the fp32 compute image of bf16 weights; needed only after raw pointer writes.
  void refresh_compute_weights();
  /// For an fp32 (training) model: every forward (forward, forward_rows, forward_cached) runs
  /// on the round-to-nearest-even bf16 image of the weights, held in fp32, which is bit for bit
  /// what a bf16 rollout copy of this model (clone(kBFloat16), or a worker fed by the weight
  /// sync) computes with. Gradients pass straight through the rounding to the fp32
  /// parameters: ∂L/∂w = ∂L/∂bf16(w) (the mixed-precision rule of FSDP's
  /// `param_dtype = bf16`: the master keeps the optimizer's small steps, the forward sees
  /// only what the rollouts sample with). The image is rebuilt lazily, by the first forward
  /// after a parameter changed (once per optimizer update), in grad mode when the parameters
  /// require grad. Costs one fp32 copy of the weights. Off by default; a no-op for a bf16
  /// model (whose image is already its weights). clone(kFloat) keeps the setting.
  void set_bf16_compute(bool on);
  /// Whether forwards see the bf16 image of the weights: set_bf16_compute on an fp32 model,
  /// or a bf16 model.
  bool bf16_compute() const noexcept;
  /// Chooses forward_cached's GEMM backend (default decode_gemm::automatic). The backends
  /// round differently in the last bits (|Δlogit| ~1e-6), never more.
  void set_decode_gemm(decode_gemm g) noexcept;
  decode_gemm get_decode_gemm() const noexcept;
  /// Attaches a profile that forward_cached adds its time per kind of operation to (null
  /// detaches). Not owned; must outlive the attachment. Costs two clock reads per kind.
  void set_decode_profile(decode_profile* profile) noexcept;

  /// Training forward, differentiable. ids: [batch, seq] integer token ids < vocab;
  /// attention_mask: optional [batch, seq] (bool or integer, nonzero = real token), any mix of
  /// left and right padding: positions count real tokens only (HF position_ids =
  /// cumsum(mask) - 1), so a padded row gives the same logits at its real tokens as the
  /// unpadded sequence. Logits at padding positions are finite and meaningless.
  /// Returns [batch, seq, vocab] fp32. Throws c10::Error on bad shapes / ids, seq > max_seq.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& attention_mask = {}) const;

  /// forward() with logits at chosen positions only: rows [batch, R] int64 in [0, seq) picks
  /// the positions of each sequence; returns [batch, R, vocab] fp32, the rows of forward()'s
  /// logits up to fp32 rounding of the LM-head matmul (the same position's logits may differ
  /// in the last bits). An undefined `rows` is forward(). The trunk runs over every position
  /// (attention needs them); the LM head, the widest matmul, only over the R chosen ones.
  /// Throws c10::Error as forward() does, and for rows of another shape, dtype or range.
  at::Tensor forward_rows(const at::Tensor& ids, const at::Tensor& attention_mask,
                          const at::Tensor& rows) const;

  /// Training forward over sequences packed end to end without padding: the embedding, the
  /// norms, the linear layers and the MLP see only real tokens, attention is causal within
  /// each sequence (block-diagonal), and positions restart at 0 for each sequence, so every
  /// row's logits are forward()'s for that sequence alone, up to fp32 rounding of the
  /// matmuls. Differentiable; respects set_bf16_compute. ids: [S] integer token ids < vocab,
  /// the sequences concatenated in order; seq_lens: their lengths, each in [1, max_seq],
  /// summing to S; rows: [R] int64 positions in [0, S) whose logits are wanted (undefined =
  /// all S). Returns [R, vocab] fp32. Records nothing: linear_capture's per-row layout needs
  /// forward_rows. Throws c10::Error for bad shapes, ids, lengths or rows.
  at::Tensor forward_packed(const at::Tensor& ids, const std::vector<std::int64_t>& seq_lens,
                            const at::Tensor& rows) const;
  /// forward_packed without the LM head: the final-normed hidden states [R, d_model] fp32 at
  /// `rows`, whose logits are `hidden · lm_head_compute_weight()ᵀ`; for losses that apply the
  /// LM head chunk by chunk (runtime/ml/policy/fused_logprobs.hpp). Throws as forward_packed.
  at::Tensor forward_packed_hidden(const at::Tensor& ids, const std::vector<std::int64_t>& seq_lens,
                                   const at::Tensor& rows) const;
  /// forward_packed_hidden for sequences that share rows: a GRPO group's rollouts share their
  /// prompt, so the prompt's rows are computed once and every rollout's own rows attend to
  /// them. Sequence b is the packed rows seq_rows[b] in order (its position t reads row
  /// seq_rows[b][t]); a row that several sequences read must sit at the same position in each
  /// (a shared prefix), so that its RoPE position and its causal context are the same in all
  /// of them; every row must be read by at least one sequence. The linear layers, norms and
  /// MLP see each row once, so a group of G rollouts with a P-token prompt costs P + Σ
  /// response tokens instead of G·P + Σ response tokens; backward sums a shared row's
  /// gradient over its readers. The values are forward()'s for each sequence alone up to
  /// fp32 rounding. Attention is always packed_attention::batched. ids: [S] integer token
  /// ids < vocab; rows: [R] int64 in [0, S) (undefined = all S). Returns [R, d_model] fp32,
  /// final-normed. Throws c10::Error for bad shapes, ids, rows, lengths over max_seq, a row
  /// read at two positions, or a row no sequence reads.
  at::Tensor forward_shared_hidden(const at::Tensor& ids, const std::vector<std::vector<std::int64_t>>& seq_rows,
                                   const at::Tensor& rows) const;
  /// The LM head weight that forwards compute with: [vocab, d_model] fp32 (the bf16 image with
  /// set_bf16_compute, the embedding when tied), attached to the parameters' graph when they
  /// require grad. Valid until the next parameter change.
  at::Tensor lm_head_compute_weight() const;
  /// Chooses forward_packed's attention (default packed_attention::batched); both give the
  /// same values up to fp32 rounding.
  void set_packed_attention(packed_attention a) noexcept;

  /// One linear layer of a training forward as forward_rows records it, for per-sequence
  /// gradient geometry without per-sample gradients (actors/learner/grad_gram.hpp): the
  /// layer's weight gradient from batch row b alone is e[b]ᵀ · input[b] (+ Σ e[b] for the bias).
  struct linear_record {
    std::string name;   ///< the weight's name in parameters(), e.g. "model.layers.3.mlp.up_proj.weight"
    at::Tensor input;   ///< [batch, positions, in] fp32, detached
    at::Tensor output;  ///< [batch, positions, out] fp32, attached to the graph (differentiate w.r.t. it)
    bool has_bias = false;
  };
  /// What forward_rows records: the linear layers of the last `last_blocks` decoder layers
  /// (q, k, v, o, gate, up, down; −1 = every layer, 0 = none) and the LM head, whose input is
  /// the final-normed hidden state at the chosen rows and whose output is the returned logits.
  /// A tied LM head is recorded as "lm_head.weight" (its use as the input embedding is not).
  struct linear_capture {
    std::int64_t last_blocks = -1;
    std::vector<linear_record> layers;  ///< filled in forward order; cleared first
  };
  /// forward_rows that also fills `*capture` (when non-null); the logits are the same tensor
  /// computation, bit for bit.
  at::Tensor forward_rows(const at::Tensor& ids, const at::Tensor& attention_mask,
                          const at::Tensor& rows, linear_capture* capture) const;

  /// Incremental forward over a KV cache: appends tokens[i] (k_i >= 1 tokens, ragged) to cache
  /// sequence seqs[i], all in one pass, and returns their logits: [seqs.size(), vocab] fp32
  /// for logits_for::last, [sum k_i, vocab] fp32 packed in call order for logits_for::all.
  /// Runs without autograd. Matches forward() on the full sequences up to fp32 rounding
  /// (tests hold max |Δ| <= 1e-4 on logits of magnitude ~1-10). If the pass throws, every
  /// sequence is rolled back to its previous length. Throws c10::Error for unknown or repeated
  /// sequences, empty token lists, ids >= vocab, or a sequence that would exceed max_seq.
  at::Tensor forward_cached(kv_cache& cache, const std::vector<seq_id>& seqs,
                            const std::vector<std::vector<std::int32_t>>& tokens,
                            logits_for which = logits_for::last) const;

 private:
  struct impl;
  explicit policy_model(std::unique_ptr<impl> p);
  // forward_packed_hidden and forward_shared_hidden; per_sequence attention (batched false)
  // needs each sequence's rows consecutive.
  at::Tensor packed_hidden(const at::Tensor& ids, const std::vector<std::vector<std::int64_t>>& seq_rows,
                           const at::Tensor& rows, bool batched) const;
  std::unique_ptr<impl> impl_;
};

}  // namespace sorl::ml
