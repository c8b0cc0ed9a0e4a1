#pragma once

// What the decode bench measures against and checks against, shared with the parity test
// (tests/ml/reference_parity_test.cpp):
//  - reference_llama: a dense Llama decoder in plain ATen written the way Hugging Face's
//    modeling_llama.py is (rotate_half RoPE, repeat_kv, a preallocated [B, kv_heads, max_len,
//    head_dim] KV cache per layer). It shares no code with runtime/ml/policy/model.cpp, so
//    agreement of the two is evidence that both compute the Llama forward. Its decode loop, driven
//    from C++ without an interpreter, is the bench's strong baseline.
//  - cached_logits_in_chunks: sorl's cached path fed in ragged chunks, the way the generator
//    and draft verification call it.
//  - parity_tolerance / within_parity: the one tolerance that both the test and the bench
//    (vs the Python reference, bench/decode_reference.py) hold logits to.

#include "runtime/ml/policy/kv_cache.hpp"
#include "runtime/ml/policy/model.hpp"

#include "runtime/ml/policy/torch_compat.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace sorl::bench {

/// Logits of two fp32 implementations of the same forward differ only by summation order:
/// |Δ| ~1e-6 relative to the largest logit in practice. Parity holds when
/// max |Δ| <= parity_tolerance * max(1, max |logit|); 1e-4 leaves room for other BLAS builds
/// and kernels (AVX2 / AVX-512) while a wrong mask, position or norm gives |Δ| ~1e-2 or more.
inline constexpr double parity_tolerance = 1e-4;

/// Whether `max_abs_diff` (max |Δlogit|) is within parity_tolerance of logits whose largest
/// magnitude is `scale`.
inline bool within_parity(double max_abs_diff, double scale) {
  return max_abs_diff <= parity_tolerance * std::max(1.0, scale);
}

/// Dense reference decoder (HF Llama; Qwen2 when the q/k/v biases are present; a tied head
/// when lm_head.weight is absent). Weights are fp32 copies, keyed by HF name.
class reference_llama {
 public:
  /// A per-layer (keys, values) pair, each [batch, kv_heads, max_len, head_dim] fp32.
  using cache = std::vector<std::pair<at::Tensor, at::Tensor>>;

  /// Copies `params` (HF names, as policy_model::parameters() lists them) to fp32.
  /// Throws std::invalid_argument when a weight the dims need is missing.
  reference_llama(const ml::model_dims& dims, const std::vector<ml::named_tensor>& params) : d_(dims) {
    for (const auto& [name, t] : params) w_[name] = t.detach().to(at::kFloat).contiguous();
    auto need = [&](const std::string& name) {
      if (w_.count(name) == 0) throw std::invalid_argument("reference_llama: missing weight " + name);
    };
    need("model.embed_tokens.weight");
    need("model.norm.weight");
    for (std::int64_t i = 0; i < d_.n_layers; ++i)
      for (const char* s : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                            "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                            "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"})
        need(layer(i) + s);
    lm_head_ = w_.count("lm_head.weight") ? w_.at("lm_head.weight") : w_.at("model.embed_tokens.weight");
    // HF LlamaRotaryEmbedding: inv_freq = theta^(-2i/hd), emb = cat(freqs, freqs), in double.
    const std::int64_t hd = d_.head_dim();
    const at::Tensor inv_freq =
        at::pow(d_.rope_theta, at::arange(0, hd, 2, at::kDouble) / static_cast<double>(hd)).reciprocal();
    const at::Tensor freqs = at::outer(at::arange(d_.max_seq, at::kDouble), inv_freq);
    const at::Tensor emb = at::cat({freqs, freqs}, -1);
    cos_ = emb.cos().to(at::kFloat);
    sin_ = emb.sin().to(at::kFloat);
  }

  /// true: route products of >= 2^18 multiply-adds through oneDNN, as sorl's decode path does
  /// under decode_gemm::automatic (when libtorch has oneDNN); false (the default): at::linear,
  /// i.e. whatever BLAS libtorch calls. Which is faster depends on that BLAS (OpenBLAS or the
  /// reference BLAS) and the thread count, so the bench times both.
  void use_onednn(bool on) { onednn_ = on && at::hasMKLDNN(); }

  /// Zeroed cache for `batch` sequences of up to `max_len` tokens (<= dims.max_seq).
  cache new_cache(std::int64_t batch, std::int64_t max_len) const {
    cache c;
    for (std::int64_t i = 0; i < d_.n_layers; ++i)
      c.emplace_back(at::zeros({batch, d_.n_kv_heads, max_len, d_.head_dim()}),
                     at::zeros({batch, d_.n_kv_heads, max_len, d_.head_dim()}));
    return c;
  }

  /// ids: [B, T] int64 at positions start..start+T-1 of every sequence. With a cache, writes
  /// their keys and values at those positions and attends to positions 0..start+T-1; without
  /// one, start must be 0 (a full causal forward). Returns logits [B, T, vocab] fp32.
  at::Tensor forward(const at::Tensor& ids, cache* kv = nullptr, std::int64_t start = 0) const {
    at::NoGradGuard no_grad;
    const std::int64_t B = ids.size(0), T = ids.size(1), S = start + T;
    const std::int64_t hd = d_.head_dim(), H = d_.n_heads, KV = d_.n_kv_heads, rep = H / KV;
    const at::Tensor cos = cos_.narrow(0, start, T).view({1, 1, T, hd});
    const at::Tensor sin = sin_.narrow(0, start, T).view({1, 1, T, hd});
    at::Tensor x = at::embedding(w_.at("model.embed_tokens.weight"), ids);
    at::Tensor mask;
    if (T > 1) mask = at::full({T, S}, -INFINITY).triu(start + 1);
    for (std::int64_t i = 0; i < d_.n_layers; ++i) {
      const std::string p = layer(i);
      const at::Tensor h = rms_norm(x, w_.at(p + "input_layernorm.weight"));
      at::Tensor q = proj(h, p + "self_attn.q_proj").view({B, T, H, hd}).transpose(1, 2);
      at::Tensor k = proj(h, p + "self_attn.k_proj").view({B, T, KV, hd}).transpose(1, 2);
      at::Tensor v = proj(h, p + "self_attn.v_proj").view({B, T, KV, hd}).transpose(1, 2);
      q = q * cos + rotate_half(q) * sin;
      k = k * cos + rotate_half(k) * sin;
      if (kv != nullptr) {
        auto& [kc, vc] = (*kv)[static_cast<std::size_t>(i)];
        kc.narrow(2, start, T).copy_(k);
        vc.narrow(2, start, T).copy_(v);
        k = kc.narrow(2, 0, S);
        v = vc.narrow(2, 0, S);
      } else if (start != 0) {
        throw std::invalid_argument("reference_llama: start > 0 needs a cache");
      }
      k = k.unsqueeze(2).expand({B, KV, rep, S, hd}).reshape({B, H, S, hd});  // repeat_kv
      v = v.unsqueeze(2).expand({B, KV, rep, S, hd}).reshape({B, H, S, hd});
      at::Tensor scores = at::matmul(q, k.transpose(2, 3)) / std::sqrt(static_cast<double>(hd));
      if (mask.defined()) scores = scores + mask;
      const at::Tensor attn = at::matmul(at::softmax(scores, -1), v).transpose(1, 2).reshape({B, T, H * hd});
      x = x + linear(attn, w_.at(p + "self_attn.o_proj.weight"));
      const at::Tensor h2 = rms_norm(x, w_.at(p + "post_attention_layernorm.weight"));
      const at::Tensor gate = linear(h2, w_.at(p + "mlp.gate_proj.weight"));
      const at::Tensor up = linear(h2, w_.at(p + "mlp.up_proj.weight"));
      x = x + linear(at::silu(gate) * up, w_.at(p + "mlp.down_proj.weight"));
    }
    return linear(rms_norm(x, w_.at("model.norm.weight")), lm_head_);
  }

 private:
  static std::string layer(std::int64_t i) { return "model.layers." + std::to_string(i) + "."; }

  at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w) const {
    return w * (x * at::rsqrt(x.pow(2).mean(-1, true) + d_.norm_eps));
  }

  static at::Tensor rotate_half(const at::Tensor& x) {
    const std::int64_t half = x.size(-1) / 2;
    return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  }

  at::Tensor proj(const at::Tensor& x, const std::string& name) const {
    const auto bias = w_.find(name + ".bias");
    return linear(x, w_.at(name + ".weight"), bias == w_.end() ? at::Tensor() : bias->second);
  }

  at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {}) const {
    const std::int64_t rows = x.numel() / x.size(-1);
    if (onednn_ && rows * w.size(0) * w.size(1) >= (std::int64_t{1} << 18)) {
      auto out_shape = x.sizes().vec();
      out_shape.back() = w.size(0);
      return at::mkldnn_linear(x.reshape({rows, x.size(-1)}).contiguous().to_mkldnn(), w, b).to_dense().view(out_shape);
    }
    return at::linear(x, w, b);
  }

  ml::model_dims d_;
  bool onednn_ = false;
  std::map<std::string, at::Tensor> w_;
  at::Tensor lm_head_, cos_, sin_;
};

/// sorl's cached path over ids [B, T] int64: a ragged prefill of first[b] tokens for sequence
/// b (1 <= first[b] <= T), then the rest in chunks of 1..3 tokens that differ between
/// sequences and rounds, all sequences in one forward_cached call per round.
/// Returns logits [B, T, vocab] fp32, comparable to policy_model::forward(ids).
inline at::Tensor cached_logits_in_chunks(const ml::policy_model& m, const at::Tensor& ids,
                                          const std::vector<std::int64_t>& first) {
  const std::int64_t B = ids.size(0), T = ids.size(1);
  if (static_cast<std::int64_t>(first.size()) != B)
    throw std::invalid_argument("cached_logits_in_chunks: one first-chunk length per sequence");
  at::NoGradGuard no_grad;
  const at::Tensor host = ids.to(at::kLong).contiguous();
  const auto* id = host.data_ptr<std::int64_t>();
  ml::kv_cache cache(m.dims());
  std::vector<ml::seq_id> seqs;
  for (std::int64_t b = 0; b < B; ++b) seqs.push_back(cache.create());
  std::vector<std::int64_t> done(static_cast<std::size_t>(B), 0);
  std::vector<std::vector<at::Tensor>> rows(static_cast<std::size_t>(B));
  for (std::int64_t round = 0;; ++round) {
    std::vector<ml::seq_id> s;
    std::vector<std::vector<std::int32_t>> toks;
    std::vector<std::int64_t> which;
    for (std::int64_t b = 0; b < B; ++b) {
      auto& at_b = done[static_cast<std::size_t>(b)];
      if (at_b == T) continue;
      const std::int64_t n = std::min(T - at_b, at_b == 0 ? first[static_cast<std::size_t>(b)] : 1 + (round + b) % 3);
      toks.emplace_back(id + b * T + at_b, id + b * T + at_b + n);
      s.push_back(seqs[static_cast<std::size_t>(b)]);
      which.push_back(b);
      at_b += n;
    }
    if (s.empty()) break;
    const at::Tensor out = m.forward_cached(cache, s, toks, ml::logits_for::all);
    std::int64_t row = 0;
    for (std::size_t i = 0; i < which.size(); ++i) {
      const auto n = static_cast<std::int64_t>(toks[i].size());
      rows[static_cast<std::size_t>(which[i])].push_back(out.narrow(0, row, n));
      row += n;
    }
  }
  std::vector<at::Tensor> per_seq;
  for (const auto& r : rows) per_seq.push_back(at::cat(r));
  return at::stack(per_seq);
}

}  // namespace sorl::bench
