#include "runtime/ml/policy/model.hpp"

#include "runtime/ml/policy/decode_kernels.hpp"
#include "runtime/ml/policy/kv_cache.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/custom_function.h>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <tuple>

namespace sorl::ml {

// ---------------------------------------------------------------------------------------------
// model_dims

std::int64_t model_dims::parameter_count() const noexcept {
  const std::int64_t hd = head_dim();
  const std::int64_t q = n_heads * hd;
  const std::int64_t kv = n_kv_heads * hd;
  const std::int64_t attn = d_model * q + 2 * d_model * kv + q * d_model + (qkv_bias ? q + 2 * kv : 0);
  const std::int64_t mlp = 3 * d_model * d_ff;
  const std::int64_t per_layer = attn + mlp + 2 * d_model;
  return vocab * d_model + n_layers * per_layer + d_model + (tie_embeddings ? 0 : vocab * d_model);
}

void model_dims::validate() const {
  auto require_positive = [](const char* field, std::int64_t v) {
    if (v <= 0) throw std::invalid_argument(fmt::format("model_dims.{} must be > 0, got {}", field, v));
  };
  require_positive("vocab", vocab);
  require_positive("d_model", d_model);
  require_positive("n_layers", n_layers);
  require_positive("n_heads", n_heads);
  require_positive("n_kv_heads", n_kv_heads);
  require_positive("d_ff", d_ff);
  require_positive("max_seq", max_seq);
  // Sizes come from files too (config.json, GGUF metadata): bound them before anything
  // multiplies them in 64-bit integers. 2^50 parameters is far beyond any model.
  {
    const double v = static_cast<double>(vocab), d = static_cast<double>(d_model);
    const double total = 2.0 * v * d + static_cast<double>(n_layers) * (4.0 * d * d + 3.0 * d * static_cast<double>(d_ff) + 4.0 * d);
    if (total > std::ldexp(1.0, 50))
      throw std::invalid_argument(fmt::format(
          "model_dims: vocab {}, d_model {}, n_layers {}, d_ff {} make about {:.3g} parameters, more than 2^50",
          vocab, d_model, n_layers, d_ff, total));
  }
  if (d_model % n_heads != 0)
    throw std::invalid_argument(
        fmt::format("model_dims.d_model ({}) must be a multiple of n_heads ({})", d_model, n_heads));
  if (n_heads % n_kv_heads != 0)
    throw std::invalid_argument(fmt::format(
        "model_dims.n_heads ({}) must be a multiple of n_kv_heads ({})", n_heads, n_kv_heads));
  if (head_dim() % 2 != 0)
    throw std::invalid_argument(
        fmt::format("model_dims head_dim = d_model / n_heads = {} must be even for RoPE", head_dim()));
  if (!(rope_theta > 0.0))
    throw std::invalid_argument(fmt::format("model_dims.rope_theta must be > 0, got {}", rope_theta));
  if (!(norm_eps > 0.0))
    throw std::invalid_argument(fmt::format("model_dims.norm_eps must be > 0, got {}", norm_eps));
  const rope_scaling_config& rs = rope_scaling;
  if (rs.type != rope_scaling_config::kind::none && !(rs.factor > 0.0 && std::isfinite(rs.factor)))
    throw std::invalid_argument(
        fmt::format("model_dims.rope_scaling.factor must be finite and > 0, got {}", rs.factor));
  if (rs.type == rope_scaling_config::kind::llama3) {
    if (!(rs.low_freq_factor > 0.0 && rs.high_freq_factor > rs.low_freq_factor &&
          std::isfinite(rs.high_freq_factor)))
      throw std::invalid_argument(fmt::format(
          "model_dims.rope_scaling needs 0 < low_freq_factor < high_freq_factor, got {} and {}",
          rs.low_freq_factor, rs.high_freq_factor));
    if (rs.original_max_position <= 0)
      throw std::invalid_argument(fmt::format(
          "model_dims.rope_scaling.original_max_position must be > 0, got {}", rs.original_max_position));
  }
}

model_dims preset(std::string_view name) {
  model_dims d;
  if (name == "tiny" || name == "tiny-2k") {
    d.vocab = 272;
    d.d_model = 128;
    d.n_layers = 4;
    d.n_heads = 4;
    d.n_kv_heads = 2;
    d.d_ff = 384;
    // tiny-2k: the same weights' shapes with a 2048-token context, for multi-turn episodes.
    d.max_seq = name == "tiny" ? 512 : 2048;
  } else if (name == "50m") {
    d.vocab = 272;
    d.d_model = 768;
    d.n_layers = 8;
    d.n_heads = 12;
    d.n_kv_heads = 4;
    d.d_ff = 2048;
    d.max_seq = 1024;
  } else {
    throw std::invalid_argument(fmt::format("unknown model preset '{}' (known: tiny, tiny-2k, 50m)", name));
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
// building blocks

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.size(-1) == weight.size(0), "rms_norm: last dim of x (", x.size(-1),
              ") != weight size (", weight.size(0), ")");
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
}

namespace {

std::vector<double> plain_inv_freq(std::int64_t head_dim, double theta) {
  std::vector<double> f(static_cast<std::size_t>(head_dim / 2));
  for (std::size_t i = 0; i < f.size(); ++i)
    f[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  return f;
}

std::pair<at::Tensor, at::Tensor> tables_of(std::int64_t max_seq, const std::vector<double>& inv_freq,
                                            c10::Device device) {
  const auto half = static_cast<std::int64_t>(inv_freq.size());
  // Double precision here: fp32 angles lose ~pos * 1e-7 rad, visible at long positions.
  at::Tensor cos = at::empty({max_seq, half}, at::kDouble);
  at::Tensor sin = at::empty({max_seq, half}, at::kDouble);
  auto* c = cos.data_ptr<double>();
  auto* s = sin.data_ptr<double>();
  for (std::int64_t i = 0; i < half; ++i) {
    for (std::int64_t p = 0; p < max_seq; ++p) {
      const double angle = static_cast<double>(p) * inv_freq[static_cast<std::size_t>(i)];
      c[p * half + i] = std::cos(angle);
      s[p * half + i] = std::sin(angle);
    }
  }
  return {cos.to(device, at::kFloat), sin.to(device, at::kFloat)};
}

}  // namespace

std::pair<at::Tensor, at::Tensor> rope_tables(std::int64_t max_seq, std::int64_t head_dim,
                                              double theta, c10::Device device) {
  TORCH_CHECK(max_seq > 0 && head_dim > 0 && head_dim % 2 == 0,
              "rope_tables: need max_seq > 0 and an even head_dim > 0, got max_seq=", max_seq,
              " head_dim=", head_dim);
  return tables_of(max_seq, plain_inv_freq(head_dim, theta), device);
}

std::vector<double> rope_inv_freq(const model_dims& dims) {
  dims.validate();
  std::vector<double> f = plain_inv_freq(dims.head_dim(), dims.rope_theta);
  const rope_scaling_config& rs = dims.rope_scaling;
  switch (rs.type) {
    case rope_scaling_config::kind::none:
      break;
    case rope_scaling_config::kind::linear:
      for (double& x : f) x /= rs.factor;
      break;
    case rope_scaling_config::kind::llama3: {
      const double pi = std::acos(-1.0);
      const auto original = static_cast<double>(rs.original_max_position);
      const double low_freq_wavelen = original / rs.low_freq_factor;
      const double high_freq_wavelen = original / rs.high_freq_factor;
      for (double& x : f) {
        const double wavelen = 2.0 * pi / x;
        if (wavelen > low_freq_wavelen) {
          x /= rs.factor;
        } else if (wavelen >= high_freq_wavelen) {
          const double s = (original / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
          x = (1.0 - s) * x / rs.factor + s * x;
        }
      }
      break;
    }
  }
  return f;
}

std::pair<at::Tensor, at::Tensor> rope_tables(const model_dims& dims, c10::Device device) {
  return tables_of(dims.max_seq, rope_inv_freq(dims), device);
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const std::int64_t hd = x.size(-1);
  TORCH_CHECK(hd % 2 == 0 && cos.size(-1) * 2 == hd && sin.sizes() == cos.sizes(),
              "apply_rope: head_dim ", hd, " does not match tables of width ", cos.size(-1));
  const std::int64_t half = hd / 2;
  const at::Tensor x1 = x.narrow(-1, 0, half);
  const at::Tensor x2 = x.narrow(-1, half, half);
  const at::Tensor c = cos.unsqueeze(-2);  // broadcast over heads
  const at::Tensor s = sin.unsqueeze(-2);
  return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

namespace {

// Compute-dtype (fp32) views of one decoder layer's weights, and for a bf16 model the bf16
// weights of its linear layers themselves, which the decode path reads (decode_kernels.hpp).
struct layer_weights {
  at::Tensor q_w, q_b, k_w, k_b, v_w, v_b, o_w;
  at::Tensor gate_w, up_w, down_w;
  at::Tensor in_norm, post_norm;
  at::Tensor q16, k16, v16, o16, gate16, up16, down16;
};

// Scaled dot-product attention with grouped-query heads, shared by the full and the cached
// path so that both round alike. q: [B, T, H, hd]; k, v: [B, S, KV, hd]; masked: [B, T, S]
// bool (true = hidden). Query head h reads kv head h / (H / KV), as HF repeat_kv.
// Returns [B, T, H * hd].
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& masked) {
  const std::int64_t B = q.size(0), T = q.size(1), H = q.size(2), hd = q.size(3);
  const std::int64_t S = k.size(1), KV = k.size(2), rep = H / KV;
  // Grouping the query heads of one kv head into the row dimension lets one matmul serve them
  // all without materialising repeated keys.
  const at::Tensor qg = q.view({B, T, KV, rep, hd}).permute({0, 2, 3, 1, 4}).reshape({B, KV, rep * T, hd});
  at::Tensor scores = at::matmul(qg, k.permute({0, 2, 3, 1}));  // [B, KV, rep*T, S]
  scores = scores.mul_(1.0 / std::sqrt(static_cast<double>(hd)));
  scores = scores.view({B, KV, rep, T, S})
               .masked_fill(masked.view({B, 1, 1, T, S}), -std::numeric_limits<double>::infinity());
  const at::Tensor probs = at::softmax(scores, -1).view({B, KV, rep * T, S});
  const at::Tensor out = at::matmul(probs, v.permute({0, 2, 1, 3}));  // [B, KV, rep*T, hd]
  return out.view({B, KV, rep, T, hd}).permute({0, 3, 1, 2, 4}).reshape({B, T, H * hd});
}

at::Tensor swiglu_mlp(const layer_weights& w, const at::Tensor& x) {
  return at::linear(at::silu(at::linear(x, w.gate_w)) * at::linear(x, w.up_w), w.down_w);
}

// at::linear that records its input and output into `records` when that is non-null.
at::Tensor recorded_linear(std::vector<policy_model::linear_record>* records, const std::string& name,
                           const at::Tensor& x, const at::Tensor& w, const at::Tensor& b = {}) {
  at::Tensor y = at::linear(x, w, b);
  if (records != nullptr) records->push_back({name, x.detach(), y, b.defined()});
  return y;
}

// Linear layer of the no-grad decoding path; see decode_gemm. x: [rows, in] fp32.
// oneDNN's fixed cost (two layout conversions) exceeds its gain on tiny products, where the
// BLAS gemv is as fast: below ~2^18 multiply-adds (the tiny preset at batch 1) ATen is used.
at::Tensor decode_linear(bool onednn, const at::Tensor& x, const at::Tensor& w,
                         const at::Tensor& b = {}) {
  constexpr std::int64_t onednn_min_macs = std::int64_t{1} << 18;
  if (onednn && x.size(0) * w.size(0) * w.size(1) >= onednn_min_macs)
    return at::mkldnn_linear(x.contiguous().to_mkldnn(), w, b).to_dense();
  return at::linear(x, w, b);
}

// Adds the time since the previous tick to a decode_profile, when one is attached. The ops
// run synchronously on the CPU, so wall time between ticks is their time.
class profile_clock {
 public:
  explicit profile_clock(decode_profile* p) : p_(p) {
    if (p_ != nullptr) {
      ++p_->calls;
      last_ = std::chrono::steady_clock::now();
    }
  }
  void tick(decode_profile::kind k) {
    if (p_ == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    p_->seconds[k] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  decode_profile* p_;
  std::chrono::steady_clock::time_point last_;
};

// The decode path's linear layer: the bf16 kernel when the model holds bf16 weights on the
// CPU (w16 defined) and decode_gemm::automatic chose it, else decode_linear on the fp32 image.
struct decode_gemms {
  bool onednn = false;
  bool bf16 = false;
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& w16, const at::Tensor& w32,
                        const at::Tensor& b = {}) const {
    if (bf16) return bf16_linear(x, w16, b);
    return decode_linear(onednn, x, w32, b);
  }
};


// The bf16 image of an fp32 weight with a straight-through gradient (set_bf16_compute): the
// forward is the round-to-nearest-even cast a rollout copy holds, the backward the identity,
// so the update lands on the fp32 master. Nothing is saved for backward, so one image serves
// every forward and backward until the next optimizer update.
struct bf16_round_ste : torch::autograd::Function<bf16_round_ste> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& w) {
    return w.to(at::kBFloat16).to(at::kFloat);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grad) {
    return {grad[0]};
  }
};

void check_ids(const at::Tensor& ids, std::int64_t vocab) {
  if (ids.numel() == 0) return;
  const std::int64_t lo = ids.min().item<std::int64_t>();
  const std::int64_t hi = ids.max().item<std::int64_t>();
  TORCH_CHECK(lo >= 0 && hi < vocab, "token ids must lie in [0, ", vocab, "), got min ", lo,
              " max ", hi);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// policy_model

struct policy_model::impl {
  model_dims dims;
  c10::Device device = c10::kCPU;
  c10::ScalarType dtype = c10::kFloat;
  bool bf16_view = false;  // set_bf16_compute, fp32 models only
  std::vector<named_tensor> params;

  // fp32 compute image: aliases of params for fp32 models, casts for bf16 ones.
  at::Tensor embed, final_norm, lm_head;
  at::Tensor lm_head16;  // bf16 models: the LM head's bf16 weight (decode_kernels.hpp)
  std::vector<layer_weights> layers;
  std::vector<std::int64_t> seen_versions;  // params' version counters at the last bind()

  at::Tensor rope_cos, rope_sin;  // [max_seq, head_dim/2] fp32
  decode_gemm gemm = decode_gemm::automatic;
  decode_profile* profile = nullptr;
  packed_attention attention = packed_attention::batched;

  void bind();
  void bind_if_stale();
};

void policy_model::impl::bind() {
  std::vector<at::Tensor> w;
  w.reserve(params.size());
  if (bf16_view) {
    // The image must carry its link to the parameters even when the first forward after an
    // update is a no-grad one (the old log-probs, an evaluation): a later differentiable
    // forward reuses it.
    at::AutoGradMode grad(true);
    for (const auto& p : params)
      w.push_back(p.second.requires_grad() ? bf16_round_ste::apply(p.second)
                                           : p.second.to(c10::kBFloat16).to(c10::kFloat));
  } else {
    for (const auto& p : params) w.push_back(dtype == c10::kFloat ? p.second : p.second.to(c10::kFloat));
  }
  std::size_t i = 0;
  embed = w[i++];
  layers.assign(static_cast<std::size_t>(dims.n_layers), layer_weights{});
  for (auto& l : layers) {
    l.q_w = w[i++];
    if (dims.qkv_bias) l.q_b = w[i++];
    l.k_w = w[i++];
    if (dims.qkv_bias) l.k_b = w[i++];
    l.v_w = w[i++];
    if (dims.qkv_bias) l.v_b = w[i++];
    l.o_w = w[i++];
    l.gate_w = w[i++];
    l.up_w = w[i++];
    l.down_w = w[i++];
    l.in_norm = w[i++];
    l.post_norm = w[i++];
  }
  final_norm = w[i++];
  lm_head = dims.tie_embeddings ? embed : w[i++];
  TORCH_INTERNAL_ASSERT(i == w.size(), "parameter layout drifted: bound ", i, " of ", w.size());
  if (dtype == c10::kBFloat16) {
    // The same walk over the bf16 parameters themselves, for the decode path.
    std::size_t j = 0;
    const at::Tensor embed16 = params[j++].second;
    for (auto& l : layers) {
      l.q16 = params[j++].second;
      if (dims.qkv_bias) ++j;
      l.k16 = params[j++].second;
      if (dims.qkv_bias) ++j;
      l.v16 = params[j++].second;
      if (dims.qkv_bias) ++j;
      l.o16 = params[j++].second;
      l.gate16 = params[j++].second;
      l.up16 = params[j++].second;
      l.down16 = params[j++].second;
      j += 2;  // norms
    }
    ++j;  // final norm
    lm_head16 = dims.tie_embeddings ? embed16 : params[j++].second;
    TORCH_INTERNAL_ASSERT(j == params.size(), "parameter layout drifted: bound ", j, " of ", params.size());
  }
  seen_versions.clear();
  for (const auto& p : params)
    seen_versions.push_back(p.second.is_inference() ? 0 : p.second._version());
}

void policy_model::impl::bind_if_stale() {
  if (dtype == c10::kFloat && !bf16_view) return;  // the compute image is the parameters themselves
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& t = params[i].second;
    if (!t.is_inference() && t._version() != seen_versions[i]) {
      bind();
      return;
    }
  }
}

policy_model::policy_model(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
policy_model::policy_model(policy_model&&) noexcept = default;
policy_model& policy_model::operator=(policy_model&&) noexcept = default;
policy_model::~policy_model() = default;

policy_model::policy_model(const model_dims& dims, std::uint64_t seed, double init_std,
                           c10::Device device)
    : impl_(std::make_unique<impl>()) {
  dims.validate();
  TORCH_CHECK(init_std >= 0.0, "policy_model: init_std must be >= 0, got ", init_std);
  auto& m = *impl_;
  m.dims = dims;
  m.device = device;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const auto cpu = at::TensorOptions().dtype(at::kFloat).device(c10::kCPU);
  auto normal = [&](std::int64_t rows, std::int64_t cols) {
    return at::empty({rows, cols}, cpu).normal_(0.0, init_std, gen).to(device);
  };
  auto ones = [&](std::int64_t n) { return at::ones({n}, cpu).to(device); };
  auto zeros = [&](std::int64_t n) { return at::zeros({n}, cpu).to(device); };
  const std::int64_t d = dims.d_model, hd = dims.head_dim();
  const std::int64_t q = dims.n_heads * hd, kv = dims.n_kv_heads * hd;
  auto& ps = m.params;
  ps.emplace_back("model.embed_tokens.weight", normal(dims.vocab, d));
  for (std::int64_t l = 0; l < dims.n_layers; ++l) {
    const std::string pre = fmt::format("model.layers.{}.", l);
    ps.emplace_back(pre + "self_attn.q_proj.weight", normal(q, d));
    if (dims.qkv_bias) ps.emplace_back(pre + "self_attn.q_proj.bias", zeros(q));
    ps.emplace_back(pre + "self_attn.k_proj.weight", normal(kv, d));
    if (dims.qkv_bias) ps.emplace_back(pre + "self_attn.k_proj.bias", zeros(kv));
    ps.emplace_back(pre + "self_attn.v_proj.weight", normal(kv, d));
    if (dims.qkv_bias) ps.emplace_back(pre + "self_attn.v_proj.bias", zeros(kv));
    ps.emplace_back(pre + "self_attn.o_proj.weight", normal(d, q));
    ps.emplace_back(pre + "mlp.gate_proj.weight", normal(dims.d_ff, d));
    ps.emplace_back(pre + "mlp.up_proj.weight", normal(dims.d_ff, d));
    ps.emplace_back(pre + "mlp.down_proj.weight", normal(d, dims.d_ff));
    ps.emplace_back(pre + "input_layernorm.weight", ones(d));
    ps.emplace_back(pre + "post_attention_layernorm.weight", ones(d));
  }
  ps.emplace_back("model.norm.weight", ones(d));
  if (!dims.tie_embeddings) ps.emplace_back("lm_head.weight", normal(dims.vocab, d));
  std::tie(m.rope_cos, m.rope_sin) = rope_tables(dims, device);
  m.bind();
}

const model_dims& policy_model::dims() const noexcept { return impl_->dims; }
c10::Device policy_model::device() const noexcept { return impl_->device; }
c10::ScalarType policy_model::weight_dtype() const noexcept { return impl_->dtype; }
const std::vector<named_tensor>& policy_model::parameters() const noexcept { return impl_->params; }

const at::Tensor& policy_model::parameter(std::string_view name) const {
  for (const auto& p : impl_->params)
    if (p.first == name) return p.second;
  throw std::out_of_range(fmt::format("policy_model has no parameter '{}'", name));
}

void policy_model::set_requires_grad(bool requires_grad) {
  TORCH_CHECK(impl_->dtype == c10::kFloat,
              "set_requires_grad: only fp32 models train; this one holds ", impl_->dtype);
  for (auto& p : impl_->params) p.second.set_requires_grad(requires_grad);
  if (impl_->bf16_view) impl_->bind();  // the image's link to the parameters follows
}

void policy_model::set_bf16_compute(bool on) {
  if (impl_->dtype != c10::kFloat) return;  // a bf16 model computes from its bf16 weights
  impl_->bf16_view = on;
  impl_->bind();
}

bool policy_model::bf16_compute() const noexcept {
  return impl_->dtype == c10::kBFloat16 || impl_->bf16_view;
}

policy_model policy_model::clone(c10::ScalarType weight_dtype) const {
  TORCH_CHECK(weight_dtype == c10::kFloat || weight_dtype == c10::kBFloat16,
              "policy_model::clone: weight dtype must be Float or BFloat16, got ", weight_dtype);
  auto p = std::make_unique<impl>();
  p->dims = impl_->dims;
  p->device = impl_->device;
  p->dtype = weight_dtype;
  p->bf16_view = impl_->bf16_view && weight_dtype == c10::kFloat;
  at::NoGradGuard no_grad;
  for (const auto& [name, t] : impl_->params)
    p->params.emplace_back(name, t.detach().to(weight_dtype).clone());
  p->rope_cos = impl_->rope_cos;  // immutable tables: sharing is safe
  p->rope_sin = impl_->rope_sin;
  p->gemm = impl_->gemm;
  p->attention = impl_->attention;
  p->bind();
  return policy_model(std::move(p));
}

void policy_model::copy_weights_from(const policy_model& source) {
  const model_dims& a = impl_->dims;
  const model_dims& b = source.dims();
  if (a.vocab != b.vocab || a.d_model != b.d_model || a.n_layers != b.n_layers ||
      a.n_heads != b.n_heads || a.n_kv_heads != b.n_kv_heads || a.d_ff != b.d_ff ||
      a.tie_embeddings != b.tie_embeddings || a.qkv_bias != b.qkv_bias ||
      a.rope_theta != b.rope_theta || !(a.rope_scaling == b.rope_scaling))
    throw std::invalid_argument("policy_model::copy_weights_from: source has different dims");
  at::NoGradGuard no_grad;
  const auto& src = source.parameters();
  for (std::size_t i = 0; i < impl_->params.size(); ++i) impl_->params[i].second.copy_(src[i].second);
  impl_->bind();
}

void policy_model::refresh_compute_weights() { impl_->bind(); }
void policy_model::set_decode_gemm(decode_gemm g) noexcept { impl_->gemm = g; }
void policy_model::set_decode_profile(decode_profile* profile) noexcept { impl_->profile = profile; }

const char* decode_profile::name(int k) noexcept {
  static constexpr const char* names[kinds] = {"embedding", "rms_norm", "q/k/v proj", "rope", "kv cache",
                                               "attention", "o proj", "gate/up proj", "silu*up",
                                               "down proj", "residual", "lm head"};
  return k >= 0 && k < kinds ? names[k] : "?";
}
decode_gemm policy_model::get_decode_gemm() const noexcept { return impl_->gemm; }

at::Tensor policy_model::forward(const at::Tensor& ids_in, const at::Tensor& attention_mask) const {
  return forward_rows(ids_in, attention_mask, at::Tensor{});
}

at::Tensor policy_model::forward_rows(const at::Tensor& ids_in, const at::Tensor& attention_mask,
                                      const at::Tensor& rows) const {
  return forward_rows(ids_in, attention_mask, rows, nullptr);
}

at::Tensor policy_model::forward_rows(const at::Tensor& ids_in, const at::Tensor& attention_mask,
                                      const at::Tensor& rows, linear_capture* capture) const {
  auto& m = *impl_;
  const model_dims& d = m.dims;
  TORCH_CHECK(ids_in.dim() == 2, "forward: ids must be [batch, seq], got ", ids_in.sizes());
  TORCH_CHECK(at::isIntegralType(ids_in.scalar_type(), /*includeBool=*/false),
              "forward: ids must be an integer tensor, got ", ids_in.scalar_type());
  const std::int64_t B = ids_in.size(0), T = ids_in.size(1);
  TORCH_CHECK(T <= d.max_seq, "forward: seq ", T, " exceeds max_seq ", d.max_seq);
  const at::Tensor ids = ids_in.to(m.device, at::kLong);
  check_ids(ids, d.vocab);
  m.bind_if_stale();

  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(m.device);
  at::Tensor positions;
  at::Tensor masked;  // [B, T, T] bool
  const at::Tensor causal_hidden = at::ones({T, T}, long_opts.dtype(at::kBool)).triu(1);
  if (attention_mask.defined()) {
    TORCH_CHECK(attention_mask.sizes() == ids_in.sizes(), "forward: attention_mask ",
                attention_mask.sizes(), " must match ids ", ids_in.sizes());
    const at::Tensor real = attention_mask.to(m.device).ne(0);  // [B, T]
    positions = (at::cumsum(real.to(at::kLong), 1) - 1).clamp_min(0);
    // A padding key is hidden, except from itself: no query row is ever fully masked, so
    // padding rows stay finite (NaN there would poison masked losses through 0 * NaN).
    const at::Tensor eye = at::eye(T, long_opts.dtype(at::kBool));
    const at::Tensor key_hidden = real.logical_not().unsqueeze(1).logical_and(eye.logical_not().unsqueeze(0));
    masked = causal_hidden.unsqueeze(0).logical_or(key_hidden);
  } else {
    positions = at::arange(T, long_opts).unsqueeze(0).expand({B, T});
    masked = causal_hidden.unsqueeze(0).expand({B, T, T});
  }
  const std::int64_t H = d.n_heads, KV = d.n_kv_heads, hd = d.head_dim();
  const at::Tensor flat_pos = positions.reshape({-1});
  const at::Tensor cos = m.rope_cos.index_select(0, flat_pos).view({B, T, hd / 2});
  const at::Tensor sin = m.rope_sin.index_select(0, flat_pos).view({B, T, hd / 2});

  if (capture != nullptr) capture->layers.clear();
  const auto n_layers = static_cast<std::int64_t>(m.layers.size());
  const std::int64_t first_recorded =
      capture == nullptr ? n_layers
                         : (capture->last_blocks < 0 ? 0 : std::max<std::int64_t>(0, n_layers - capture->last_blocks));
  at::Tensor h = at::embedding(m.embed, ids);  // [B, T, d]
  for (std::int64_t li = 0; li < n_layers; ++li) {
    const auto& w = m.layers[static_cast<std::size_t>(li)];
    if (li < first_recorded) {
      const at::Tensor x = rms_norm(h, w.in_norm, d.norm_eps);
      const at::Tensor q = apply_rope(at::linear(x, w.q_w, w.q_b).view({B, T, H, hd}), cos, sin);
      const at::Tensor k = apply_rope(at::linear(x, w.k_w, w.k_b).view({B, T, KV, hd}), cos, sin);
      const at::Tensor v = at::linear(x, w.v_w, w.v_b).view({B, T, KV, hd});
      h = h + at::linear(attend(q, k, v, masked), w.o_w);
      h = h + swiglu_mlp(w, rms_norm(h, w.post_norm, d.norm_eps));
      continue;
    }
    // The same operations in the same order as above, each linear layer recorded.
    auto* rec = &capture->layers;
    const std::string p = "model.layers." + std::to_string(li) + ".";
    const at::Tensor x = rms_norm(h, w.in_norm, d.norm_eps);
    const at::Tensor q =
        apply_rope(recorded_linear(rec, p + "self_attn.q_proj.weight", x, w.q_w, w.q_b).view({B, T, H, hd}), cos, sin);
    const at::Tensor k =
        apply_rope(recorded_linear(rec, p + "self_attn.k_proj.weight", x, w.k_w, w.k_b).view({B, T, KV, hd}), cos, sin);
    const at::Tensor v = recorded_linear(rec, p + "self_attn.v_proj.weight", x, w.v_w, w.v_b).view({B, T, KV, hd});
    h = h + recorded_linear(rec, p + "self_attn.o_proj.weight", attend(q, k, v, masked), w.o_w);
    const at::Tensor y = rms_norm(h, w.post_norm, d.norm_eps);
    const at::Tensor gated = at::silu(recorded_linear(rec, p + "mlp.gate_proj.weight", y, w.gate_w)) *
                             recorded_linear(rec, p + "mlp.up_proj.weight", y, w.up_w);
    h = h + recorded_linear(rec, p + "mlp.down_proj.weight", gated, w.down_w);
  }
  if (rows.defined()) {
    TORCH_CHECK(rows.dim() == 2 && rows.size(0) == B, "forward_rows: rows must be [", B,
                ", R], got ", rows.sizes());
    TORCH_CHECK(rows.scalar_type() == at::kLong, "forward_rows: rows must be int64, got ",
                rows.scalar_type());
    const at::Tensor r = rows.to(m.device);
    TORCH_CHECK(r.numel() == 0 || (r.min().item<std::int64_t>() >= 0 && r.max().item<std::int64_t>() < T),
                "forward_rows: a row index is outside [0, ", T, ")");
    // The LM head is the widest matmul of the model (vocab columns): only the positions a
    // loss reads pay for it, and for its [rows, vocab] gradient.
    h = h.gather(1, r.unsqueeze(-1).expand({B, r.size(1), d.d_model}));
  }
  return recorded_linear(capture != nullptr ? &capture->layers : nullptr, "lm_head.weight",
                         rms_norm(h, m.final_norm, d.norm_eps), m.lm_head);
}

namespace {

// Where each packed row sits in a right-padded [seqs, longest] layout, for the batched
// attention of forward_packed and forward_shared_hidden.
struct packed_layout {
  std::int64_t seqs = 0, longest = 0;
  at::Tensor to_padded;  // [seqs * longest] int64: the packed row each padded slot reads
  at::Tensor to_packed;  // [S] int64: the padded slot whose attention output a packed row takes
  at::Tensor masked;     // [seqs, longest, longest] bool, true = hidden
  at::Tensor positions;  // [S] int64: each row's position in its sequences
};

// Sequence b reads the packed rows seq_rows[b] in order. A row read by several sequences (a
// shared prefix) takes the attention output of its first reader: the others compute the same
// values, since the row's causal context is the same prefix in each.
packed_layout layout_of(const std::vector<std::vector<std::int64_t>>& seq_rows, std::int64_t S,
                        std::int64_t max_seq, c10::Device device) {
  packed_layout l;
  l.seqs = static_cast<std::int64_t>(seq_rows.size());
  for (const auto& r : seq_rows) {
    TORCH_CHECK(!r.empty() && static_cast<std::int64_t>(r.size()) <= max_seq, "forward_packed: a sequence length is ",
                r.size(), ", outside [1, max_seq = ", max_seq, "]");
    l.longest = std::max(l.longest, static_cast<std::int64_t>(r.size()));
  }
  const std::int64_t L = l.longest;
  at::Tensor to_padded = at::empty({l.seqs * L}, at::kLong);
  at::Tensor to_packed = at::full({S}, -1, at::kLong);
  at::Tensor positions = at::full({S}, -1, at::kLong);
  at::Tensor lens = at::empty({l.seqs}, at::kLong);
  auto* pad = to_padded.data_ptr<std::int64_t>();
  auto* packed = to_packed.data_ptr<std::int64_t>();
  auto* pos = positions.data_ptr<std::int64_t>();
  for (std::int64_t b = 0; b < l.seqs; ++b) {
    const auto& rows = seq_rows[static_cast<std::size_t>(b)];
    const auto n = static_cast<std::int64_t>(rows.size());
    lens.data_ptr<std::int64_t>()[b] = n;
    for (std::int64_t t = 0; t < L; ++t) {
      // A padding slot reads the sequence's first row: any finite value serves, since its key
      // is hidden from every real query and its query row is dropped (so its gradient is 0).
      if (t >= n) {
        pad[b * L + t] = rows[0];
        continue;
      }
      const std::int64_t r = rows[static_cast<std::size_t>(t)];
      TORCH_CHECK(r >= 0 && r < S, "forward_packed: sequence ", b, " reads row ", r, ", outside [0, ", S, ")");
      TORCH_CHECK(pos[r] < 0 || pos[r] == t, "forward_packed: row ", r, " sits at position ", pos[r],
                  " in one sequence and ", t, " in sequence ", b, ": only a shared prefix may be shared");
      pad[b * L + t] = r;
      if (pos[r] < 0) {
        pos[r] = t;
        packed[r] = b * L + t;
      }
    }
  }
  for (std::int64_t r = 0; r < S; ++r)
    TORCH_CHECK(pos[r] >= 0, "forward_packed: no sequence reads row ", r);
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor key = at::arange(L, opts);
  const at::Tensor causal_hidden = at::ones({L, L}, opts.dtype(at::kBool)).triu(1);
  // Padding keys are hidden from every query; a padding query still sees its sequence's first
  // key, so no row is fully masked and the softmax stays finite.
  const at::Tensor key_padding = key.unsqueeze(0).ge(lens.to(device).unsqueeze(1));  // [seqs, L]
  l.masked = causal_hidden.unsqueeze(0).logical_or(key_padding.unsqueeze(1));
  l.to_padded = to_padded.to(device);
  l.to_packed = to_packed.to(device);
  l.positions = positions.to(device);
  return l;
}

std::vector<std::vector<std::int64_t>> consecutive_rows(const std::vector<std::int64_t>& seq_lens, std::int64_t max_seq) {
  std::vector<std::vector<std::int64_t>> out;
  out.reserve(seq_lens.size());
  std::int64_t offset = 0;
  for (const std::int64_t n : seq_lens) {
    TORCH_CHECK(n >= 1 && n <= max_seq, "forward_packed: a sequence length is ", n, ", outside [1, max_seq = ",
                max_seq, "]");
    std::vector<std::int64_t> rows(static_cast<std::size_t>(n));
    std::iota(rows.begin(), rows.end(), offset);
    out.push_back(std::move(rows));
    offset += n;
  }
  return out;
}

}  // namespace

at::Tensor policy_model::forward_packed(const at::Tensor& ids, const std::vector<std::int64_t>& seq_lens,
                                        const at::Tensor& rows) const {
  return at::linear(forward_packed_hidden(ids, seq_lens, rows), impl_->lm_head);
}

at::Tensor policy_model::lm_head_compute_weight() const {
  impl_->bind_if_stale();
  return impl_->lm_head;
}

void policy_model::set_packed_attention(packed_attention a) noexcept { impl_->attention = a; }

at::Tensor policy_model::forward_packed_hidden(const at::Tensor& ids_in, const std::vector<std::int64_t>& seq_lens,
                                               const at::Tensor& rows) const {
  const model_dims& d = impl_->dims;
  TORCH_CHECK(ids_in.dim() == 1, "forward_packed: ids must be [S], got ", ids_in.sizes());
  TORCH_CHECK(!seq_lens.empty(), "forward_packed: no sequences");
  const std::vector<std::vector<std::int64_t>> seq_rows = consecutive_rows(seq_lens, d.max_seq);
  std::int64_t S = 0;
  for (const std::int64_t n : seq_lens) S += n;
  TORCH_CHECK(S == ids_in.size(0), "forward_packed: seq_lens sum to ", S, " but ids hold ", ids_in.size(0),
              " tokens");
  return packed_hidden(ids_in, seq_rows, rows, impl_->attention == packed_attention::batched);
}

at::Tensor policy_model::forward_shared_hidden(const at::Tensor& ids, const std::vector<std::vector<std::int64_t>>& seq_rows,
                                               const at::Tensor& rows) const {
  return packed_hidden(ids, seq_rows, rows, /*batched=*/true);
}

at::Tensor policy_model::packed_hidden(const at::Tensor& ids_in, const std::vector<std::vector<std::int64_t>>& seq_rows,
                                       const at::Tensor& rows, bool batched) const {
  auto& m = *impl_;
  const model_dims& d = m.dims;
  TORCH_CHECK(ids_in.dim() == 1, "forward_packed: ids must be [S], got ", ids_in.sizes());
  TORCH_CHECK(at::isIntegralType(ids_in.scalar_type(), /*includeBool=*/false),
              "forward_packed: ids must be an integer tensor, got ", ids_in.scalar_type());
  TORCH_CHECK(!seq_rows.empty(), "forward_packed: no sequences");
  const std::int64_t S = ids_in.size(0);
  const at::Tensor ids = ids_in.to(m.device, at::kLong);
  check_ids(ids, d.vocab);
  m.bind_if_stale();

  const std::int64_t H = d.n_heads, KV = d.n_kv_heads, hd = d.head_dim();
  const packed_layout lay = layout_of(seq_rows, S, d.max_seq, m.device);
  const at::Tensor cos = m.rope_cos.index_select(0, lay.positions);  // [S, hd/2]
  const at::Tensor sin = m.rope_sin.index_select(0, lay.positions);
  at::Tensor causal_one;  // per_sequence: [1, L, L] masks, cut from the longest sequence's
  if (!batched)
    causal_one = at::ones({lay.longest, lay.longest}, at::TensorOptions().dtype(at::kBool).device(m.device))
                     .triu(1)
                     .unsqueeze(0);
  auto attention = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    if (batched) {
      const std::int64_t B = lay.seqs, L = lay.longest;
      const at::Tensor a = attend(q.index_select(0, lay.to_padded).view({B, L, H, hd}),
                                  k.index_select(0, lay.to_padded).view({B, L, KV, hd}),
                                  v.index_select(0, lay.to_padded).view({B, L, KV, hd}), lay.masked);
      return a.view({B * L, H * hd}).index_select(0, lay.to_packed);
    }
    // per_sequence: only for consecutive rows (forward_packed_hidden).
    std::vector<at::Tensor> parts;
    parts.reserve(seq_rows.size());
    for (const auto& r : seq_rows) {
      const auto n = static_cast<std::int64_t>(r.size());
      const std::int64_t offset = r.front();
      const at::Tensor masked = causal_one.narrow(1, 0, n).narrow(2, 0, n).contiguous();
      parts.push_back(attend(q.narrow(0, offset, n).unsqueeze(0), k.narrow(0, offset, n).unsqueeze(0),
                             v.narrow(0, offset, n).unsqueeze(0), masked)
                          .squeeze(0));
    }
    return at::cat(parts, 0);
  };

  at::Tensor h = at::embedding(m.embed, ids);  // [S, d]
  for (const auto& w : m.layers) {
    const at::Tensor x = rms_norm(h, w.in_norm, d.norm_eps);
    const at::Tensor q = apply_rope(at::linear(x, w.q_w, w.q_b).view({S, H, hd}), cos, sin);
    const at::Tensor k = apply_rope(at::linear(x, w.k_w, w.k_b).view({S, KV, hd}), cos, sin);
    const at::Tensor v = at::linear(x, w.v_w, w.v_b).view({S, KV, hd});
    h = h + at::linear(attention(q, k, v), w.o_w);
    h = h + swiglu_mlp(w, rms_norm(h, w.post_norm, d.norm_eps));
  }
  if (rows.defined()) {
    TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong,
                "forward_packed: rows must be [R] int64, got ", rows.sizes(), " ", rows.scalar_type());
    const at::Tensor r = rows.to(m.device);
    TORCH_CHECK(r.numel() == 0 || (r.min().item<std::int64_t>() >= 0 && r.max().item<std::int64_t>() < S),
                "forward_packed: a row index is outside [0, ", S, ")");
    h = h.index_select(0, r);
  }
  return rms_norm(h, m.final_norm, d.norm_eps);
}

at::Tensor policy_model::forward_cached(kv_cache& cache, const std::vector<seq_id>& seqs,
                                        const std::vector<std::vector<std::int32_t>>& tokens,
                                        logits_for which) const {
  auto& m = *impl_;
  const model_dims& d = m.dims;
  TORCH_CHECK(seqs.size() == tokens.size(), "forward_cached: ", seqs.size(), " sequences but ",
              tokens.size(), " token lists");
  TORCH_CHECK(!seqs.empty(), "forward_cached: no sequences");
  const model_dims& cd = cache.dims();
  TORCH_CHECK(cd.n_layers == d.n_layers && cd.n_kv_heads == d.n_kv_heads &&
                  cd.head_dim() == d.head_dim() && cd.max_seq <= d.max_seq,
              "forward_cached: cache shape (layers ", cd.n_layers, ", kv heads ", cd.n_kv_heads,
              ", head_dim ", cd.head_dim(), ") does not match the model (", d.n_layers, ", ",
              d.n_kv_heads, ", ", d.head_dim(), ")");
  TORCH_CHECK(cache.device() == m.device && cache.dtype() == c10::kFloat,
              "forward_cached: cache must be fp32 on ", m.device);

  std::vector<std::int64_t> counts(seqs.size());
  std::int64_t total = 0;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    counts[i] = static_cast<std::int64_t>(tokens[i].size());
    total += counts[i];
  }
  at::Tensor ids = at::empty({total}, at::kLong);
  {
    auto* p = ids.data_ptr<std::int64_t>();
    for (const auto& t : tokens)
      for (const std::int32_t tok : t) {
        TORCH_CHECK(tok >= 0 && tok < d.vocab, "forward_cached: token id ", tok,
                    " outside [0, ", d.vocab, ")");
        *p++ = tok;
      }
  }
  ids = ids.to(m.device);

  at::NoGradGuard no_grad;
  m.bind_if_stale();
  const kv_append_plan plan = cache.plan_append(seqs, counts);
  try {
    const std::int64_t B = plan.batch, N = plan.total_new, K = plan.max_new, S = plan.max_len;
    const std::int64_t H = d.n_heads, KV = d.n_kv_heads, hd = d.head_dim();
    const at::Tensor cos = m.rope_cos.index_select(0, plan.positions);  // [N, hd/2]
    const at::Tensor sin = m.rope_sin.index_select(0, plan.positions);
    decode_gemms lin;
    lin.onednn = m.gemm != decode_gemm::aten && m.device.is_cpu() && at::hasMKLDNN();
    lin.bf16 = m.gemm == decode_gemm::automatic && m.device.is_cpu() && m.dtype == c10::kBFloat16;
    // Decode steps (one token per sequence) on the CPU read the KV pool in place
    // (paged_decode_attention) instead of gathering a padded copy of it per layer; RoPE is
    // applied in place with the same roundings as apply_rope.
    const bool fused = m.gemm == decode_gemm::automatic && m.device.is_cpu();
    at::Tensor slots;
    std::vector<std::int64_t> lengths;
    if (fused && K == 1) {
      slots = plan.gather_slots.view({B, S});
      for (const std::int64_t old : plan.old_lengths) lengths.push_back(old + 1);
    }
    // One pass per row instead of ATen's five kernels (rms_norm_rows: the sum of squares in
    // fp64, every other rounding as rms_norm's).
    auto norm = [&](const at::Tensor& x, const at::Tensor& weight) {
      return fused && x.dim() == 2 && x.is_contiguous() ? rms_norm_rows(x, weight, d.norm_eps)
                                                        : rms_norm(x, weight, d.norm_eps);
    };
    profile_clock clock(m.profile);
    at::Tensor h = at::embedding(m.embed, ids);  // [N, d]
    clock.tick(decode_profile::embed);
    for (std::int64_t l = 0; l < d.n_layers; ++l) {
      const auto& w = m.layers[static_cast<std::size_t>(l)];
      const at::Tensor x = norm(h, w.in_norm);
      clock.tick(decode_profile::norm);
      at::Tensor q = lin(x, w.q16, w.q_w, w.q_b).view({N, H, hd});
      at::Tensor k = lin(x, w.k16, w.k_w, w.k_b).view({N, KV, hd});
      const at::Tensor v = lin(x, w.v16, w.v_w, w.v_b);
      clock.tick(decode_profile::qkv);
      if (fused) {
        apply_rope_inplace(q, cos, sin);
        apply_rope_inplace(k, cos, sin);
      } else {
        q = apply_rope(q, cos, sin);
        k = apply_rope(k, cos, sin);
      }
      clock.tick(decode_profile::rope);
      at::Tensor kpool = cache.keys(l);
      at::Tensor vpool = cache.values(l);
      kpool.index_copy_(0, plan.write_slots, k.reshape({N, KV * hd}));
      vpool.index_copy_(0, plan.write_slots, v);
      at::Tensor a;
      if (fused && K == 1) {
        clock.tick(decode_profile::kv_cache);
        a = paged_decode_attention(q, kpool, vpool, slots, lengths, KV);
      } else {
        const at::Tensor keys = kpool.index_select(0, plan.gather_slots).view({B, S, KV, hd});
        const at::Tensor vals = vpool.index_select(0, plan.gather_slots).view({B, S, KV, hd});
        const at::Tensor qp = K == 1 ? q.view({B, 1, H, hd}) : q.index_select(0, plan.pad_rows).view({B, K, H, hd});
        clock.tick(decode_profile::kv_cache);
        a = attend(qp, keys, vals, plan.masked).view({B * K, H * hd});
        if (K != 1) a = a.index_select(0, plan.unpad_rows);
      }
      clock.tick(decode_profile::attention);
      const at::Tensor o = lin(a, w.o16, w.o_w);
      clock.tick(decode_profile::o_proj);
      h = h + o;
      const at::Tensor y = norm(h, w.post_norm);
      clock.tick(decode_profile::norm);
      const at::Tensor gate = lin(y, w.gate16, w.gate_w);
      const at::Tensor up = lin(y, w.up16, w.up_w);
      clock.tick(decode_profile::mlp_in);
      const at::Tensor act = at::silu(gate).mul_(up);
      clock.tick(decode_profile::mlp_act);
      const at::Tensor down = lin(act, w.down16, w.down_w);
      clock.tick(decode_profile::mlp_out);
      h = h + down;
      clock.tick(decode_profile::residual);
    }
    if (which == logits_for::last && K != 1) h = h.index_select(0, plan.last_rows);
    const at::Tensor hn = norm(h, m.final_norm);
    clock.tick(decode_profile::norm);
    at::Tensor logits = lin(hn, m.lm_head16, m.lm_head);
    clock.tick(decode_profile::lm_head);
    return logits;
  } catch (...) {
    cache.rollback(plan);
    throw;
  }
}

}  // namespace sorl::ml
