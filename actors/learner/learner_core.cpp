#include "actors/learner/learner_core.hpp"

#include "runtime/config.hpp"
#include "runtime/ml/policy/fused_logprobs.hpp"
#include "runtime/ml/policy/sampler.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <torch/csrc/autograd/autograd.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace sorl::learner {

namespace {

// ---------------------------------------------------------------------------------------------
// Batch validation and grouping

void validate_batch(const std::vector<rollout_sample>& batch, const ml::model_dims& dims) {
  if (batch.empty())
    throw std::invalid_argument("learner: empty batch");
  auto check_ids = [&](const std::vector<std::int32_t>& ids, std::size_t i, const char* what) {
    for (std::size_t t = 0; t < ids.size(); ++t)
      if (ids[t] < 0 || ids[t] >= dims.vocab)
        throw std::invalid_argument(fmt::format("learner: sample {} (group {}): {} token {} is {}, "
                                                "outside [0, {})",
                                                i, batch[i].group_id, what, t, ids[t], dims.vocab));
  };
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const rollout_sample& s = batch[i];
    if (s.prompt.empty())
      throw std::invalid_argument(
        fmt::format("learner: sample {} (group {}) has an empty prompt", i, s.group_id));
    if (s.loss_mask.size() != s.response.size() || s.sampling_logprobs.size() != s.response.size())
      throw std::invalid_argument(fmt::format(
        "learner: sample {} (group {}): response has {} tokens but loss_mask {} and "
        "sampling_logprobs {}",
        i, s.group_id, s.response.size(), s.loss_mask.size(), s.sampling_logprobs.size()));
    const auto len = static_cast<std::int64_t>(s.prompt.size() + s.response.size());
    if (len > dims.max_seq)
      throw std::invalid_argument(fmt::format(
        "learner: sample {} (group {}): prompt {} + response {} tokens exceed max_seq {}", i,
        s.group_id, s.prompt.size(), s.response.size(), dims.max_seq));
    if (!s.reward_failed && !std::isfinite(s.reward))
      throw std::invalid_argument(fmt::format(
        "learner: sample {} (group {}): reward {} is not finite", i, s.group_id, s.reward));
    check_ids(s.prompt, i, "prompt");
    check_ids(s.response, i, "response");
  }
}

/// Sample indices per group, groups in order of first appearance (so results never depend on
/// hash order).
std::vector<std::vector<std::size_t>> group_indices(const std::vector<rollout_sample>& batch) {
  std::unordered_map<std::uint64_t, std::size_t> slot;
  std::vector<std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    auto [it, inserted] = slot.emplace(batch[i].group_id, groups.size());
    if (inserted)
      groups.emplace_back();
    groups[it->second].push_back(i);
  }
  return groups;
}

/// DAPO's length limit is a generation budget per turn (max_new_tokens), so each turn (a
/// maximal run of policy tokens; environment tokens separate turns) is compared with it and
/// the episode gets the penalty of its longest turn. Comparing the whole episode with a
/// per-turn budget would punish an episode for taking many short turns.
float shaping_term(const rollout_sample& s, const learner_options& o) {
  if (o.overlong != overlong_mode::shape)
    return 0.0f;
  std::int64_t longest = 0, run = 0;
  for (const std::uint8_t m : s.loss_mask) {
    run = m != 0 ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  return overlong_penalty(longest, o.overlong_max_len, o.overlong_cache_len);
}

struct advantage_result {
  std::vector<float> advantages; // per sample
  std::int64_t groups = 0;
  std::int64_t zero_signal_groups = 0;
  double penalty_sum = 0.0;
  std::int64_t shaped = 0;          // samples with a negative shaping term
  std::int64_t reward_failures = 0; // samples left out of their group's statistics
};

advantage_result compute_advantages(const std::vector<rollout_sample>& batch,
                                    const learner_options& o) {
  advantage_result out;
  out.advantages.assign(batch.size(), 0.0f);
  const auto groups = group_indices(batch);
  out.groups = static_cast<std::int64_t>(groups.size());
  for (const auto& g : groups) {
    // The group's statistics are over the samples with a reward: a failed one is not a 0.
    std::vector<std::size_t> scored;
    std::vector<float> rewards;
    rewards.reserve(g.size());
    for (const std::size_t i : g) {
      const rollout_sample& s = batch[i];
      if (s.reward_failed) {
        ++out.reward_failures;
        continue;
      }
      if (!std::isfinite(s.reward))
        throw std::invalid_argument(fmt::format(
          "learner: sample {} (group {}): reward {} is not finite", i, s.group_id, s.reward));
      const float pen = shaping_term(s, o);
      out.penalty_sum += pen;
      out.shaped += pen < 0.0f ? 1 : 0;
      scored.push_back(i);
      rewards.push_back(s.reward + pen);
    }
    if (!has_signal(rewards))
      ++out.zero_signal_groups;
    const std::vector<float> adv = group_advantages(rewards, o.scale_advantages, o.advantage_eps);
    for (std::size_t k = 0; k < scored.size(); ++k)
      out.advantages[scored[k]] = adv[k];
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Packing and log-probs

/// A batch as right-padded tensors on the model's device.
struct packed_batch {
  at::Tensor ids;       // [N, L] int64, padding 0
  at::Tensor attention; // [N, L] int64, 1 = real token
  at::Tensor rows;      // [N, T] int64: logit position of response token t, prompt_len + t − 1
  at::Tensor targets;   // [N, T] int64: response token ids, padding 0
  at::Tensor mask;      // [N, T] fp32: 1 = trained token
  at::Tensor sampling;  // [N, T] fp32: the rollout's sampling log-probs, padding 0
  std::vector<std::int64_t> seq_len;  // prompt + response, per sample
  std::vector<std::int64_t> resp_len; // response, per sample
  // Host copies for packed forwards: every sample's prompt + response end to end, where each
  // starts, and the response token ids.
  std::vector<std::int64_t> flat_ids;
  std::vector<std::int64_t> offset;
  std::vector<std::int64_t> flat_targets; // responses end to end
};

/// `trained(i)` says whether sample i's loss_mask counts at all (overlong filtering).
template <class Trained>
packed_batch pack(const std::vector<rollout_sample>& batch, c10::Device device, Trained trained) {
  packed_batch p;
  const auto n = static_cast<std::int64_t>(batch.size());
  std::int64_t L = 0, T = 0;
  for (const auto& s : batch) {
    p.seq_len.push_back(static_cast<std::int64_t>(s.prompt.size() + s.response.size()));
    p.resp_len.push_back(static_cast<std::int64_t>(s.response.size()));
    L = std::max(L, p.seq_len.back());
    T = std::max(T, p.resp_len.back());
  }
  at::Tensor ids = at::zeros({n, L}, at::kLong);
  at::Tensor attention = at::zeros({n, L}, at::kLong);
  at::Tensor rows = at::zeros({n, T}, at::kLong);
  at::Tensor targets = at::zeros({n, T}, at::kLong);
  at::Tensor mask = at::zeros({n, T}, at::kFloat);
  at::Tensor sampling = at::zeros({n, T}, at::kFloat);
  auto* ids_p = ids.data_ptr<std::int64_t>();
  auto* att_p = attention.data_ptr<std::int64_t>();
  auto* rows_p = rows.data_ptr<std::int64_t>();
  auto* tgt_p = targets.data_ptr<std::int64_t>();
  auto* mask_p = mask.data_ptr<float>();
  auto* samp_p = sampling.data_ptr<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    const rollout_sample& s = batch[static_cast<std::size_t>(i)];
    const auto plen = static_cast<std::int64_t>(s.prompt.size());
    const bool train_this = trained(static_cast<std::size_t>(i));
    p.offset.push_back(static_cast<std::int64_t>(p.flat_ids.size()));
    p.flat_ids.insert(p.flat_ids.end(), s.prompt.begin(), s.prompt.end());
    p.flat_ids.insert(p.flat_ids.end(), s.response.begin(), s.response.end());
    p.flat_targets.insert(p.flat_targets.end(), s.response.begin(), s.response.end());
    std::int64_t col = 0;
    for (const std::int32_t tok : s.prompt) {
      ids_p[i * L + col] = tok;
      att_p[i * L + col] = 1;
      ++col;
    }
    for (std::size_t t = 0; t < s.response.size(); ++t) {
      ids_p[i * L + col] = s.response[t];
      att_p[i * L + col] = 1;
      ++col;
      const std::int64_t k = i * T + static_cast<std::int64_t>(t);
      // The logits at position j predict token j + 1.
      rows_p[k] = plen + static_cast<std::int64_t>(t) - 1;
      tgt_p[k] = s.response[t];
      mask_p[k] = (train_this && s.loss_mask[t] != 0) ? 1.0f : 0.0f;
      samp_p[k] = s.sampling_logprobs[t];
    }
  }
  p.ids = ids.to(device);
  p.attention = attention.to(device);
  p.rows = rows.to(device);
  p.targets = targets.to(device);
  p.mask = mask.to(device);
  p.sampling = sampling.to(device);
  return p;
}

/// Rows of one forward pass of a packed_batch, with what the loss needs to weigh them.
struct micro_batch {
  at::Tensor idx;   // [k] int64 row indices; undefined = every row of the batch, in order
  std::vector<std::int64_t> rows; // the same row indices on the host, always filled
  std::int64_t L = 1, T = 0; // longest sequence and response among the rows, tokens
  at::Tensor mask;  // [k, T] fp32
  double tokens = 0.0; // trained tokens (set by count_trained)
  double seqs = 0.0;   // rows with at least one trained token (set by count_trained)
  /// The rows of a [N, *] tensor, first `cols` columns; the tensor itself when idx is undefined.
  at::Tensor rows_of(const at::Tensor& t, std::int64_t cols) const {
    return idx.defined() ? t.index_select(0, idx).narrow(1, 0, cols) : t;
  }
};

/// Fills mb.tokens and mb.seqs, which only the updates need.
void count_trained(micro_batch& mb) {
  mb.tokens = mb.mask.sum().item<double>();
  mb.seqs = mb.mask.sum(1).gt(0).sum().item<double>();
}

/// The micro_batch of `rows`; `whole` = the rows are the batch in order and need no copy.
micro_batch slice(const packed_batch& p, const std::vector<std::int64_t>& rows, c10::Device device,
                  bool whole) {
  micro_batch mb;
  mb.rows = rows;
  for (const std::int64_t r : rows) {
    mb.L = std::max(mb.L, p.seq_len[static_cast<std::size_t>(r)]);
    mb.T = std::max(mb.T, p.resp_len[static_cast<std::size_t>(r)]);
  }
  if (whole) {
    mb.mask = p.mask;
  } else {
    mb.idx = at::tensor(rows, at::kLong).to(device);
    mb.mask = mb.rows_of(p.mask, mb.T);
  }
  return mb;
}

/// Log-probs [n, T] fp32 of `targets` read from the logits at `rows`, and optionally the
/// per-position entropy [n, T] (never differentiable). The log-probs are differentiable when
/// grad mode is on.
at::Tensor token_logprobs(const ml::policy_model& model, const at::Tensor& ids,
                          const at::Tensor& attention, const at::Tensor& rows,
                          const at::Tensor& targets, double temperature,
                          at::Tensor* entropy = nullptr,
                          ml::policy_model::linear_capture* capture = nullptr) {
  // Logits of the response rows only: prompt positions never reach the LM head.
  at::Tensor picked = model.forward_rows(ids, attention, rows, capture); // [n, T, V]
  // In double, so that T counts as the user wrote it (torch would round a scalar divisor to
  // the tensor's fp32), then rounded once to fp32.
  if (temperature != 1.0)
    picked = (picked.to(at::kDouble) / temperature).to(at::kFloat);
  const at::Tensor lsm = at::log_softmax(picked, -1);
  if (entropy != nullptr) {
    at::NoGradGuard no_grad; // a metric only
    *entropy = -(lsm.exp() * lsm).sum(-1);
  }
  return lsm.gather(2, targets.unsqueeze(-1)).squeeze(-1);
}

/// token_logprobs of the batch rows `rows` (in that order) by one packed forward without padding
/// and the chunked LM head (learner_options::packed_forward): [k, T] fp32, row j holding
/// rows[j]'s response log-probs in its first response-length columns and 0 beyond; entropy
/// likewise (never differentiable). Differentiable when grad mode is on. With `share`, rows
/// whose prompts are equal token for token (a group's rollouts) read one copy of the prompt
/// (learner_options::share_prompts, policy_model::forward_shared_hidden).
at::Tensor packed_logprobs(const ml::policy_model& model, const packed_batch& p,
                           const std::vector<std::int64_t>& rows, std::int64_t T, double temperature,
                           at::Tensor* entropy, bool share) {
  std::vector<std::int64_t> ids, seq_lens, logit_rows, targets, dest;
  std::vector<std::vector<std::int64_t>> seq_rows;
  std::map<std::vector<std::int64_t>, std::int64_t> prompt_row; // a prompt's tokens -> its first row
  for (std::size_t j = 0; j < rows.size(); ++j) {
    const auto i = static_cast<std::size_t>(rows[j]);
    const std::int64_t plen = p.seq_len[i] - p.resp_len[i];
    const auto first = p.flat_ids.begin() + p.offset[i];
    std::int64_t prompt_start = static_cast<std::int64_t>(ids.size());
    if (share) {
      const auto [it, fresh] = prompt_row.try_emplace(std::vector<std::int64_t>(first, first + plen), prompt_start);
      prompt_start = it->second;
      if (fresh)
        ids.insert(ids.end(), first, first + plen);
      const std::int64_t own_start = static_cast<std::int64_t>(ids.size());
      ids.insert(ids.end(), first + plen, first + p.seq_len[i]);
      std::vector<std::int64_t> seq(static_cast<std::size_t>(p.seq_len[i]));
      std::iota(seq.begin(), seq.begin() + plen, prompt_start);
      std::iota(seq.begin() + plen, seq.end(), own_start);
      seq_rows.push_back(std::move(seq));
    } else {
      ids.insert(ids.end(), first, first + p.seq_len[i]);
      seq_lens.push_back(p.seq_len[i]);
    }
    const std::vector<std::int64_t>* seq = share ? &seq_rows.back() : nullptr;
    for (std::int64_t t = 0; t < p.resp_len[i]; ++t) {
      // The logits at position j predict token j + 1.
      const std::int64_t pos = plen + t - 1;
      logit_rows.push_back(seq != nullptr ? (*seq)[static_cast<std::size_t>(pos)] : prompt_start + pos);
      targets.push_back(p.flat_ids[static_cast<std::size_t>(p.offset[i] + plen + t)]);
      dest.push_back(static_cast<std::int64_t>(j) * T + t);
    }
  }
  const c10::Device device = model.device();
  auto on_device = [&](const std::vector<std::int64_t>& v) { return at::tensor(v, at::kLong).to(device); };
  const at::Tensor hidden = share ? model.forward_shared_hidden(on_device(ids), seq_rows, on_device(logit_rows))
                                  : model.forward_packed_hidden(on_device(ids), seq_lens, on_device(logit_rows));
  const ml::token_logprob_result r = ml::token_logprobs_fused(hidden, model.lm_head_compute_weight(),
                                                              on_device(targets), temperature, entropy != nullptr);
  const auto k = static_cast<std::int64_t>(rows.size());
  const at::Tensor where = on_device(dest);
  const auto f32 = at::TensorOptions(at::kFloat).device(device);
  if (entropy != nullptr) {
    at::NoGradGuard no_grad;
    *entropy = at::zeros({k * T}, f32).index_copy_(0, where, r.entropy).view({k, T});
  }
  return at::zeros({k * T}, f32).index_copy(0, where, r.logprobs).view({k, T});
}

/// How a log-prob forward lays out its sequences (learner_options::packed_forward and
/// share_prompts).
enum class forward_layout { padded, packed, shared };

/// Log-probs [k, T] of a micro-batch's rows (every row of the batch when `mb` is null), laid
/// out as `layout` says; a forward that records linear layers is always padded.
at::Tensor batch_logprobs(const ml::policy_model& model, const packed_batch& p, const micro_batch* mb,
                          double temperature, forward_layout layout, at::Tensor* entropy,
                          ml::policy_model::linear_capture* capture = nullptr) {
  if (layout != forward_layout::padded && capture == nullptr) {
    const bool share = layout == forward_layout::shared;
    if (mb != nullptr)
      return packed_logprobs(model, p, mb->rows, mb->T, temperature, entropy, share);
    std::vector<std::int64_t> all(p.seq_len.size());
    std::iota(all.begin(), all.end(), std::int64_t{0});
    return packed_logprobs(model, p, all, p.rows.size(1), temperature, entropy, share);
  }
  if (mb == nullptr)
    return token_logprobs(model, p.ids, p.attention, p.rows, p.targets, temperature, entropy, capture);
  return token_logprobs(model, mb->rows_of(p.ids, mb->L), mb->rows_of(p.attention, mb->L), mb->rows_of(p.rows, mb->T),
                        mb->rows_of(p.targets, mb->T), temperature, entropy, capture);
}

/// token_logprobs over `groups` of rows, one forward each, each trimmed to its own longest
/// row; scattered back into [N, T] (zeros beyond each row's response). One group that is the
/// whole batch in order is the plain single forward, bit for bit.
at::Tensor chunked_logprobs(const ml::policy_model& model, const packed_batch& p,
                            const std::vector<std::vector<std::int64_t>>& groups,
                            double temperature, forward_layout layout, at::Tensor* entropy) {
  if (groups.size() == 1 && static_cast<std::int64_t>(groups[0].size()) == p.ids.size(0))
    return batch_logprobs(model, p, nullptr, temperature, layout, entropy);
  at::Tensor out = at::zeros(p.rows.sizes(), at::TensorOptions(at::kFloat).device(p.ids.device()));
  if (entropy != nullptr)
    *entropy = at::zeros_like(out);
  for (const auto& group : groups) {
    const micro_batch mb = slice(p, group, p.ids.device(), false);
    at::Tensor ent;
    const at::Tensor logp = batch_logprobs(model, p, &mb, temperature, layout, entropy != nullptr ? &ent : nullptr);
    out.narrow(1, 0, mb.T).index_copy_(0, mb.idx, logp);
    if (entropy != nullptr)
      entropy->narrow(1, 0, mb.T).index_copy_(0, mb.idx, ent);
  }
  return out;
}

/// Running sums of the mismatch figures of step_metrics over the tokens measured so far.
struct mismatch_sums {
  double tokens = 0.0, abs = 0.0, max = 0.0, k3 = 0.0, mult = 0.0, equal = 0.0, entropy = 0.0;

  /// Adds the trained tokens (mask ≠ 0) of `learner` [k, T] fp32 against `rollout` [k, T]
  /// fp32 and, when defined, their entropy [k, T]. Differences are taken in fp64: k3 of a
  /// 1e-6 nat gap is ~5e-13, far below fp32's resolution of exp(Δ) − 1.
  void add(const at::Tensor& learner, const at::Tensor& rollout, const at::Tensor& mask, const at::Tensor& ent) {
    at::NoGradGuard no_grad;
    const at::Tensor trained = mask.ne(0);
    const double n = trained.sum().item<double>();
    if (n == 0.0)
      return;
    const at::Tensor lp = learner.detach();
    const at::Tensor zeros = at::zeros(lp.sizes(), lp.options().dtype(at::kDouble));
    // Untrained positions may hold anything; where() keeps them out.
    const at::Tensor d = at::where(trained, lp.to(at::kDouble) - rollout.to(at::kDouble), zeros);
    const at::Tensor a = d.abs();
    tokens += n;
    abs += a.sum().item<double>();
    max = std::max(max, a.max().item<double>());
    k3 += (at::expm1(d) - d).sum().item<double>();
    mult += at::where(trained, a.exp(), zeros).sum().item<double>();
    equal += lp.eq(rollout).logical_and(trained).sum().item<double>();
    if (ent.defined())
      entropy += at::where(trained, ent.to(at::kDouble), zeros).sum().item<double>();
  }

  void write(step_metrics& m) const {
    if (tokens == 0.0)
      return;
    m.mismatch_tokens = static_cast<std::int64_t>(tokens);
    m.mismatch_mean = abs / tokens;
    m.mismatch_max = max;
    m.mismatch_k3 = k3 / tokens;
    m.token_mult_prob_error = mult / tokens;
    m.mismatch_bitwise = equal / tokens;
    m.entropy = entropy / tokens;
  }
};

// ---------------------------------------------------------------------------------------------
// SALT's Gram matrix

/// Per-token weights [k, T] fp32 of the policy objective as the loss normalises it over a whole
/// minibatch (policy_loss per micro-batch, times the micro-batch's weight in train_step):
/// 1 / trained tokens of the minibatch (token), or 1 / (trained sequences · the row's trained
/// tokens) (sequence). Untrained positions weigh 0.
at::Tensor objective_weights(const micro_batch& mb, loss_norm norm, double tokens_total, double seqs_total) {
  if (norm == loss_norm::token)
    return mb.mask / tokens_total;
  const at::Tensor per_row = mb.mask.sum(1, /*keepdim=*/true).clamp_min(1.0) * seqs_total;
  return mb.mask / per_row;
}

/// A forward already run with its linear layers recorded, reused by salt_gram for the only
/// part of a minibatch instead of a second forward; its graph is kept for the update.
struct recorded_pass {
  at::Tensor logp;
  ml::policy_model::linear_capture capture;
};

/// K [N, N] fp64 of the minibatch `parts` (rows in part order): g_i is the gradient of rollout
/// i's term Σ_t w_t log π(y_t) of the objective (at ratio 1, without its advantage), over the
/// weights `o.salt_layers` selects. Each part costs a recorded forward and the gradients of the
/// objective with respect to the recorded layers' outputs (no weight gradient). When
/// `recorded` is non-null (a minibatch of one part) that part's forward is not run again and
/// its graph is kept, so the update's loss backpropagates through the same forward.
at::Tensor salt_gram(const ml::policy_model& model, const packed_batch& p, const std::vector<micro_batch>& parts,
                     double tokens_total, double seqs_total, const learner_options& o,
                     const recorded_pass* recorded) {
  std::vector<std::vector<layer_pass>> passes;  // [layer][part]
  for (const micro_batch& mb : parts) {
    ml::policy_model::linear_capture own;
    own.last_blocks = o.salt_layers;
    const at::Tensor logp =
      recorded != nullptr
        ? recorded->logp
        : token_logprobs(model, mb.rows_of(p.ids, mb.L), mb.rows_of(p.attention, mb.L), mb.rows_of(p.rows, mb.T),
                         mb.rows_of(p.targets, mb.T), o.temperature, nullptr, &own);
    const auto& layers = recorded != nullptr ? recorded->capture.layers : own.layers;
    const at::Tensor objective = (logp * objective_weights(mb, o.loss.norm, tokens_total, seqs_total)).sum();
    std::vector<at::Tensor> outputs;
    for (const auto& rec : layers)
      outputs.push_back(rec.output);
    const auto grads = torch::autograd::grad({objective}, outputs, {}, /*retain_graph=*/recorded != nullptr,
                                             /*create_graph=*/false, /*allow_unused=*/true);
    if (passes.empty())
      passes.resize(layers.size());
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const at::Tensor e = grads[l].defined() ? grads[l] : at::zeros_like(layers[l].output);
      passes[l].push_back({layers[l].input, e, layers[l].has_bias});
    }
  }
  std::int64_t n = 0;
  for (const micro_batch& mb : parts)
    n += mb.idx.defined() ? mb.idx.size(0) : p.ids.size(0);
  at::Tensor K = at::zeros({n, n}, at::kDouble);
  for (const auto& layer : passes)
    K.add_(layer_gram(layer, o.salt_gram).to(at::kCPU));  // eigh and the coefficients run on the host
  return K;
}

/// The batch rows of `parts`, in part order: the order of salt_gram's K.
at::Tensor part_rows(const std::vector<micro_batch>& parts, std::int64_t batch_rows, c10::Device device) {
  std::vector<at::Tensor> idx;
  for (const micro_batch& mb : parts)
    idx.push_back(mb.idx.defined() ? mb.idx : at::arange(batch_rows, at::TensorOptions(at::kLong).device(device)));
  return at::cat(idx);
}

// ---------------------------------------------------------------------------------------------
// Shuffling: a generator of our own, so that minibatch order is the same on every platform
// (std::shuffle and the std distributions are implementation-defined).

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Uniform in [0, bound], rejection-sampled so that there is no modulo bias.
std::uint64_t uniform_upto(std::uint64_t& state, std::uint64_t bound) {
  const std::uint64_t range = bound + 1;
  const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % range);
  std::uint64_t x = splitmix64(state);
  while (x >= limit)
    x = splitmix64(state);
  return x % range;
}

std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed, std::int64_t step,
                                      int epoch) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    order[static_cast<std::size_t>(i)] = i;
  std::uint64_t state = seed;
  state ^= splitmix64(state) + static_cast<std::uint64_t>(step);
  state ^= splitmix64(state) + static_cast<std::uint64_t>(epoch);
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(uniform_upto(state, static_cast<std::uint64_t>(i)));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

constexpr const char* adam_step_name = "adam.step";
const std::string exp_avg_prefix = "adam.exp_avg.";
const std::string exp_avg_sq_prefix = "adam.exp_avg_sq.";
const std::string reference_prefix = "reference.";

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

bool finite_in(double v, double lo, double hi) {
  return std::isfinite(v) && v >= lo && v < hi;
}

} // namespace

// ---------------------------------------------------------------------------------------------
// learner_options

learner_options learner_options_from(const experiment_config& cfg) {
  const auto& a = cfg.algorithm;
  learner_options o;
  o.lr = a.lr;
  o.weight_decay = a.weight_decay;
  o.max_grad_norm = a.max_grad_norm;
  o.loss.clip_eps_low = a.clip_eps_low;
  o.loss.clip_eps_high = a.clip_eps_high;
  o.loss.kl_coef = a.kl_coef;
  o.loss.norm = a.loss_norm == loss_norm_kind::sequence ? loss_norm::sequence : loss_norm::token;
  o.scale_advantages = a.scale_advantages;
  switch (a.overlong) {
    case overlong_kind::none:
      o.overlong = overlong_mode::none;
      break;
    case overlong_kind::filter:
      o.overlong = overlong_mode::filter;
      break;
    case overlong_kind::shape:
      o.overlong = overlong_mode::shape;
      break;
  }
  o.overlong_max_len = cfg.task.max_new_tokens;
  o.overlong_cache_len = std::min<int64_t>(a.overlong_cache, cfg.task.max_new_tokens);
  o.temperature = a.temperature > 0 ? a.temperature : 1.0;
  o.epochs = static_cast<int>(a.epochs);
  o.minibatches = static_cast<int>(a.minibatches);
  o.group_minibatches = a.group_minibatches;
  o.micro_batch_tokens = a.micro_batch_tokens;
  o.salt_enabled = cfg.salt.enabled;
  o.salt.eta = cfg.salt.eta;
  o.salt.beta = cfg.salt.beta;
  o.salt.c0 = cfg.salt.c0;
  o.salt.gamma_max = cfg.salt.gamma_max;
  o.salt_layers = cfg.salt.layers;
  o.salt_gram = cfg.salt.gram == salt_gram_kind::ghost          ? gram_method::ghost
                : cfg.salt.gram == salt_gram_kind::materialized ? gram_method::materialized
                                                                : gram_method::automatic;
  o.weights = a.learner_weights == learner_weights_kind::fp32 ? forward_weights::fp32 : forward_weights::bf16;
  o.old_logprobs =
    a.old_logprobs == old_logprobs_kind::recompute ? old_logprob_source::recompute : old_logprob_source::rollout;
  o.tis_cap = a.tis_cap;
  return o;
}

void learner_options::validate() const {
  auto fail = [](const char* field, double v, const char* rule) {
    throw std::invalid_argument(
      fmt::format("learner_options.{} must be {}, got {}", field, rule, v));
  };
  if (!(std::isfinite(lr) && lr >= 0.0))
    fail("lr", lr, ">= 0 and finite");
  if (!finite_in(adam_beta1, 0.0, 1.0))
    fail("adam_beta1", adam_beta1, "in [0, 1)");
  if (!finite_in(adam_beta2, 0.0, 1.0))
    fail("adam_beta2", adam_beta2, "in [0, 1)");
  if (!(std::isfinite(adam_eps) && adam_eps > 0.0))
    fail("adam_eps", adam_eps, "> 0 and finite");
  if (!(std::isfinite(weight_decay) && weight_decay >= 0.0 && lr * weight_decay < 1.0))
    fail("weight_decay", weight_decay, ">= 0 with lr * weight_decay < 1");
  if (std::isnan(max_grad_norm))
    fail("max_grad_norm", max_grad_norm, "a number (<= 0 disables clipping)");
  loss.validate();
  if (!(std::isfinite(advantage_eps) && advantage_eps >= 0.0))
    fail("advantage_eps", advantage_eps, ">= 0 and finite");
  if (overlong == overlong_mode::shape &&
      (overlong_max_len <= 0 || overlong_cache_len < 0 || overlong_cache_len > overlong_max_len))
    throw std::invalid_argument(fmt::format(
      "learner_options: overlong shaping needs overlong_max_len > 0 and 0 <= overlong_cache_len "
      "<= overlong_max_len, got {} and {}",
      overlong_max_len, overlong_cache_len));
  if (!(std::isfinite(temperature) && temperature >= ml::min_temperature))
    fail("temperature", temperature, "finite and >= ml::min_temperature (0.01)");
  if (epochs < 1)
    fail("epochs", epochs, ">= 1");
  if (minibatches < 1)
    fail("minibatches", minibatches, ">= 1");
  if (max_idle_steps < 0)
    fail("max_idle_steps", max_idle_steps, ">= 0");
  if (micro_batch_tokens < 0)
    fail("micro_batch_tokens", static_cast<double>(micro_batch_tokens), ">= 0");
  salt.validate();
  if (!(std::isfinite(tis_cap) && (tis_cap == 0.0 || tis_cap >= 1.0)))
    fail("tis_cap", tis_cap, "0 (off) or finite and >= 1");
  if (tis_cap > 0.0 && old_logprobs == old_logprob_source::rollout)
    throw std::invalid_argument(
      "learner_options.tis_cap needs old_logprobs = recompute: with the rollout's log-probs as "
      "pi_old every truncated-IS weight is 1");
  if (salt_layers < -1)
    fail("salt_layers", static_cast<double>(salt_layers), ">= -1 (-1 = every decoder layer)");
}

// ---------------------------------------------------------------------------------------------
// Free functions

std::vector<std::vector<std::int64_t>> minibatch_rows(const std::vector<std::vector<std::int64_t>>& units,
                                                      int minibatches, std::uint64_t seed,
                                                      std::int64_t step, int epoch) {
  if (minibatches < 1)
    throw std::invalid_argument(fmt::format("minibatch_rows: minibatches must be >= 1, got {}", minibatches));
  const auto n = static_cast<std::int64_t>(units.size());
  const std::int64_t n_mb = std::min<std::int64_t>(minibatches, std::max<std::int64_t>(n, 1));
  // One minibatch needs no shuffle: the order would only change summation order.
  const std::vector<std::int64_t> order = n_mb > 1 ? permutation(n, seed, step, epoch) : std::vector<std::int64_t>();
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(n_mb));
  for (std::int64_t b = 0; b < n_mb; ++b)
    for (std::int64_t k = b * n / n_mb; k < (b + 1) * n / n_mb; ++k) {
      const auto& unit = units[static_cast<std::size_t>(n_mb > 1 ? order[static_cast<std::size_t>(k)] : k)];
      out[static_cast<std::size_t>(b)].insert(out[static_cast<std::size_t>(b)].end(), unit.begin(), unit.end());
    }
  return out;
}

std::vector<std::vector<std::int64_t>> plan_micro_batches(const std::vector<std::int64_t>& rows,
                                                          const std::vector<std::int64_t>& seq_len,
                                                          std::int64_t budget) {
  if (budget < 0)
    throw std::invalid_argument(
      fmt::format("plan_micro_batches: budget must be >= 0 tokens, got {}", budget));
  std::int64_t longest = 0;
  for (const std::int64_t r : rows) {
    if (r < 0 || r >= static_cast<std::int64_t>(seq_len.size()))
      throw std::invalid_argument(fmt::format(
        "plan_micro_batches: row {} is outside the batch of {} rows", r, seq_len.size()));
    longest = std::max(longest, seq_len[static_cast<std::size_t>(r)]);
  }
  if (rows.empty())
    return {};
  if (budget == 0 || static_cast<std::int64_t>(rows.size()) * longest <= budget)
    return {rows};
  std::vector<std::int64_t> order = rows;
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return seq_len[static_cast<std::size_t>(a)] > seq_len[static_cast<std::size_t>(b)];
  });
  std::vector<std::vector<std::int64_t>> groups;
  std::int64_t group_longest = 0; // the first row's length: rows come longest first
  for (const std::int64_t r : order) {
    const std::int64_t len = seq_len[static_cast<std::size_t>(r)];
    if (groups.empty()
        || (static_cast<std::int64_t>(groups.back().size()) + 1) * group_longest > budget) {
      groups.emplace_back();
      group_longest = len;
    }
    groups.back().push_back(r);
  }
  return groups;
}

std::vector<float> batch_advantages(const std::vector<rollout_sample>& batch,
                                    const learner_options& options) {
  options.validate();
  return compute_advantages(batch, options).advantages;
}

at::Tensor rollout_gradient_gram(const ml::policy_model& model, const std::vector<rollout_sample>& batch,
                                 const learner_options& options) {
  options.validate();
  validate_batch(batch, model.dims());
  const bool filter = options.overlong == overlong_mode::filter;
  const c10::Device device = model.device();
  const packed_batch p = pack(batch, device, [&](std::size_t i) {
    return !batch[i].reward_failed && !(filter && batch[i].truncated);
  });
  std::vector<std::int64_t> all_rows(batch.size());
  std::iota(all_rows.begin(), all_rows.end(), std::int64_t{0});
  const auto groups = plan_micro_batches(all_rows, p.seq_len, options.micro_batch_tokens);
  std::vector<micro_batch> parts;
  double tokens_total = 0.0, seqs_total = 0.0;
  for (const auto& group : groups) {
    micro_batch mb = slice(p, group, device, groups.size() == 1);
    count_trained(mb);
    tokens_total += mb.tokens;
    seqs_total += mb.seqs;
    parts.push_back(std::move(mb));
  }
  const at::Tensor K = salt_gram(model, p, parts, std::max(tokens_total, 1.0), std::max(seqs_total, 1.0), options,
                                 nullptr);
  // Back into batch order.
  const at::Tensor order = part_rows(parts, p.ids.size(0), device).to(at::kCPU);
  at::Tensor out = at::zeros_like(K);
  out.index_put_({order.unsqueeze(1), order.unsqueeze(0)}, K);
  return out;
}

at::Tensor response_logprobs_tensor(const ml::policy_model& model,
                                    const std::vector<rollout_sample>& batch, double temperature, bool packed,
                                    bool share_prompts) {
  validate_batch(batch, model.dims());
  if (!(std::isfinite(temperature) && temperature >= ml::min_temperature))
    throw std::invalid_argument(fmt::format(
      "response_logprobs: temperature must be >= {}, got {}", ml::min_temperature, temperature));
  const packed_batch p = pack(batch, model.device(), [](std::size_t) { return true; });
  return batch_logprobs(model, p, nullptr, temperature,
                        !packed ? forward_layout::padded : share_prompts ? forward_layout::shared : forward_layout::packed,
                        nullptr);
}

std::vector<std::vector<float>> response_logprobs(const ml::policy_model& model,
                                                  const std::vector<rollout_sample>& batch,
                                                  double temperature) {
  at::NoGradGuard no_grad;
  const at::Tensor logp = response_logprobs_tensor(model, batch, temperature).to(at::kCPU).contiguous();
  std::vector<std::vector<float>> out(batch.size());
  const float* src = logp.data_ptr<float>();
  const std::int64_t T = logp.size(1);
  for (std::size_t i = 0; i < batch.size(); ++i)
    out[i].assign(src + static_cast<std::int64_t>(i) * T,
                  src + static_cast<std::int64_t>(i) * T + static_cast<std::int64_t>(batch[i].response.size()));
  return out;
}

// ---------------------------------------------------------------------------------------------
// learner_core

learner_core::learner_core(ml::policy_model& model, learner_options options, std::uint64_t seed)
  : model_(model), options_(std::move(options)), seed_(seed) {
  options_.validate();
  if (model_.weight_dtype() != at::kFloat)
    throw std::invalid_argument(fmt::format("learner_core: the training model must hold fp32 "
                                            "weights, got {}",
                                            c10::toString(model_.weight_dtype())));
  model_.set_requires_grad(true);
  model_.set_bf16_compute(options_.weights == forward_weights::bf16);
  if (options_.loss.kl_coef > 0.0)
    reference_ = std::make_unique<ml::policy_model>(model_.clone(at::kFloat));
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : model_.parameters()) {
    exp_avg_.push_back(at::zeros_like(p));
    exp_avg_sq_.push_back(at::zeros_like(p));
  }
}

learner_core::~learner_core() = default;

step_metrics learner_core::train_step(const std::vector<rollout_sample>& batch) {
  const auto t0 = std::chrono::steady_clock::now();
  validate_batch(batch, model_.dims());
  step_metrics m;
  m.samples = static_cast<std::int64_t>(batch.size());

  // 1. Advantages (after shaping). Everything that can throw on bad input happens before any
  //    state changes.
  const advantage_result adv = compute_advantages(batch, options_);
  m.groups = adv.groups;
  m.zero_signal_groups = adv.zero_signal_groups;
  m.reward_failures = adv.reward_failures;
  m.overlong_shaped = adv.shaped;
  const auto scored = static_cast<double>(m.samples - m.reward_failures);
  m.overlong_penalty_mean = scored > 0 ? adv.penalty_sum / scored : 0.0;
  double reward_sum = 0.0, adv_abs_sum = 0.0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    reward_sum += batch[i].reward_failed ? 0.0 : batch[i].reward;
    adv_abs_sum += std::fabs(adv.advantages[i]);
  }
  m.reward_mean = scored > 0 ? reward_sum / scored : 0.0;
  m.advantage_abs_mean = adv_abs_sum / static_cast<double>(batch.size());

  // 2. Pack. Overlong filtering zeroes the whole loss mask of a truncated sample; it still
  //    counted in its group's statistics above. A sample whose reward failed is never trained.
  const bool filter = options_.overlong == overlong_mode::filter;
  for (const auto& s : batch)
    if (filter && s.truncated && !s.reward_failed)
      ++m.overlong_filtered;
  const c10::Device device = model_.device();
  const packed_batch p = pack(batch, device, [&](std::size_t i) {
    return !batch[i].reward_failed && !(filter && batch[i].truncated);
  });
  const at::Tensor advantages = at::tensor(adv.advantages, at::kFloat).to(device);

  // 3./4. Old log-probs (and entropy, mismatch) with the current weights, reference log-probs.
  const auto n = static_cast<std::int64_t>(batch.size());
  // What a minibatch is cut from: single rollouts, or whole groups, whose advantages sum to 0
  // inside every minibatch as they do over the batch (SALT's cancellation is measured within
  // a minibatch, actors/learner/salt.hpp).
  std::vector<std::vector<std::int64_t>> units;
  if (options_.group_minibatches) {
    for (const auto& g : group_indices(batch))
      units.emplace_back(g.begin(), g.end());
  } else {
    for (std::int64_t i = 0; i < n; ++i)
      units.push_back({i});
  }
  const auto n_units = static_cast<std::int64_t>(units.size());
  const std::int64_t n_mb = std::min<std::int64_t>(options_.minibatches, n_units);
  std::vector<std::int64_t> all_rows(static_cast<std::size_t>(n));
  std::iota(all_rows.begin(), all_rows.end(), std::int64_t{0});
  const auto whole = plan_micro_batches(all_rows, p.seq_len, options_.micro_batch_tokens);
  // With one epoch of one minibatch in one forward, the only update's forward runs on the
  // pre-update weights and the very same tensors: its log-probs *are* the recomputed old
  // ones, bit for bit, so the separate no-grad pass is skipped (a quarter of the step's
  // compute). With the rollout's log-probs as π_old that pass never runs.
  const bool single_pass = options_.epochs == 1 && n_mb == 1 && whole.size() == 1;
  const bool from_rollout = options_.old_logprobs == old_logprob_source::rollout;
  // SALT's recorded forwards need whole logits (its LM-head term is each rollout's [tokens,
  // vocab] output gradient), so with SALT on every forward stays padded: the update that
  // reuses a recorded forward then rounds as one that does not, and SALT idle is the padded
  // plain step bit for bit.
  const forward_layout packed = !options_.packed_forward || options_.salt_enabled ? forward_layout::padded
                                : options_.share_prompts                       ? forward_layout::shared
                                                                               : forward_layout::packed;
  // One update over several micro-batches: each micro-batch's update forward runs on the
  // pre-update weights over the very rows (and micro-batch) the recompute pass would, so its
  // log-probs, detached, are π_old of its rows bit for bit, and that pass is skipped too.
  // Truncated IS weighs the whole batch from π_old before the first update, so it keeps it.
  const bool old_from_update =
    !single_pass && !from_rollout && options_.epochs == 1 && n_mb == 1 && options_.tis_cap == 0.0;
  mismatch_sums mismatch;
  at::Tensor old_logp, ref_logp, first_new_logp, entropy, tis_w;
  // SALT reads the single pass's forward too, with its linear layers recorded (the same logits).
  std::unique_ptr<recorded_pass> recorded;
  if (single_pass) {
    if (options_.salt_enabled) {
      recorded = std::make_unique<recorded_pass>();
      recorded->capture.last_blocks = options_.salt_layers;
    }
    const auto tf = std::chrono::steady_clock::now();
    first_new_logp = batch_logprobs(model_, p, nullptr, options_.temperature, packed, &entropy,
                                    recorded ? &recorded->capture : nullptr);
    m.forward_seconds += seconds_since(tf);
    ++m.forwards;
    old_logp = from_rollout ? p.sampling : first_new_logp.detach();
    mismatch.add(first_new_logp, p.sampling, p.mask, entropy);
    if (recorded)
      recorded->logp = first_new_logp;
  }
  {
    at::NoGradGuard no_grad;
    if (!single_pass && from_rollout) {
      old_logp = p.sampling;
    } else if (!single_pass && !old_from_update) {
      const auto tf = std::chrono::steady_clock::now();
      old_logp = chunked_logprobs(model_, p, whole, options_.temperature, packed, &entropy);
      m.forward_seconds += seconds_since(tf);
      m.forwards += static_cast<std::int64_t>(whole.size());
      mismatch.add(old_logp, p.sampling, p.mask, entropy);
    }
    if (reference_) {
      const auto tf = std::chrono::steady_clock::now();
      ref_logp = chunked_logprobs(*reference_, p, whole, options_.temperature, packed, nullptr);
      m.forward_seconds += seconds_since(tf);
      m.forwards += static_cast<std::int64_t>(whole.size());
    }
    const at::Tensor trained = p.mask.ne(0);
    m.tokens_trained = static_cast<std::int64_t>(p.mask.sum().item<double>());
    if (options_.tis_cap > 0.0) {
      tis_w = tis_weights(old_logp, p.sampling, options_.tis_cap);
      if (m.tokens_trained > 0) {
        const auto n_tok = static_cast<double>(m.tokens_trained);
        m.tis_weight_mean = at::where(trained, tis_w, at::zeros_like(tis_w)).sum().item<double>() / n_tok;
        // The ratio passed the cap where its log passed log(cap), compared in fp64.
        const at::Tensor log_ratio = old_logp.to(at::kDouble) - p.sampling.to(at::kDouble);
        m.tis_capped_frac =
          log_ratio.gt(std::log(options_.tis_cap)).logical_and(trained).sum().item<double>() / n_tok;
      }
    }
  }

  // 5. Epochs × minibatches of updates, each the sum of its micro-batches' gradients.
  const auto& params = model_.parameters();
  double loss_sum = 0.0, pg_sum = 0.0, kl_sum = 0.0, clip_lo_sum = 0.0, clip_hi_sum = 0.0;
  double ratio_sum = 0.0, gnorm_sum = 0.0;
  for (int epoch = 0; epoch < options_.epochs; ++epoch) {
    const auto minibatches = minibatch_rows(units, static_cast<int>(n_mb), seed_, step_, epoch);
    for (std::int64_t b = 0; b < n_mb; ++b) {
      const std::vector<std::int64_t>& rows_idx = minibatches[static_cast<std::size_t>(b)];
      // Each micro-batch's rows, trimmed to its own longest sequence (shorter forwards); the
      // whole batch as it is in the single pass.
      std::vector<micro_batch> parts;
      double tokens_total = 0.0, seqs_total = 0.0;
      for (const auto& group :
           single_pass ? whole : plan_micro_batches(rows_idx, p.seq_len, options_.micro_batch_tokens)) {
        micro_batch mb = slice(p, group, device, single_pass);
        count_trained(mb);
        tokens_total += mb.tokens;
        seqs_total += mb.seqs;
        parts.push_back(std::move(mb));
      }
      if (tokens_total == 0.0) {
        ++m.skipped_updates;
        continue;
      }
      // With the rollout's log-probs as π_old, the forwards that run before the step's first
      // update are the learner's view of the rollout's weights: they give the mismatch figures
      // (and the entropy) that a recompute pass would have.
      // So are those of the update that doubles as the recompute (old_from_update).
      const bool measure = (from_rollout || old_from_update) && !single_pass && epoch == 0 && m.updates == 0;
      // Every coefficient of the minibatch exactly 0 and no KL term: the policy gradient is
      // exactly 0 (each token's term is A times a finite factor), so the backward pass, about
      // two thirds of the update's compute, would only produce zeros. The forward still runs
      // for the loss, ratio and clip figures and the non-finite check; AdamW then steps with
      // zero gradients, as it would after the backward (its moments decay and the weights keep
      // moving on their momentum). SALT maps all-zero advantages to themselves (salt.hpp), so
      // its K, N² per minibatch, is not computed either.
      const bool no_signal =
        options_.skip_zero_signal && !ref_logp.defined()
        && std::all_of(rows_idx.begin(), rows_idx.end(),
                       [&](std::int64_t k) { return adv.advantages[static_cast<std::size_t>(k)] == 0.0f; });
      // SALT: this minibatch's coefficients from its rollouts' gradient geometry. A no-op (or
      // γ = 1) leaves the advantages' very tensor in place, so the update is the plain one.
      at::Tensor mb_advantages = advantages;
      // A minibatch of one micro-batch runs its forward once, recorded: SALT reads its layers
      // and the update's loss its log-probs (the same values a second forward would give).
      std::unique_ptr<recorded_pass> mb_recorded;
      if (options_.salt_enabled && no_signal) {
        // What salt_coefficients returns for all-zero coefficients over any finite K.
        ++m.salt_updates;
        ++m.salt_noops;
        m.salt_gamma += 1.0;
      } else if (options_.salt_enabled) {
        if (!single_pass && parts.size() == 1) {
          const micro_batch& mb = parts.front();
          mb_recorded = std::make_unique<recorded_pass>();
          mb_recorded->capture.last_blocks = options_.salt_layers;
          at::Tensor ent;
          mb_recorded->logp = token_logprobs(model_, mb.rows_of(p.ids, mb.L), mb.rows_of(p.attention, mb.L),
                                             mb.rows_of(p.rows, mb.T), mb.rows_of(p.targets, mb.T),
                                             options_.temperature, measure ? &ent : nullptr, &mb_recorded->capture);
          ++m.forwards;
          if (measure)
            mismatch.add(mb_recorded->logp, mb.rows_of(p.sampling, mb.T), mb.mask, ent);
        } else if (!single_pass) {
          m.forwards += static_cast<std::int64_t>(parts.size()); // salt_gram's own forwards
        }
        // SALT's own time: a forward the update reuses is the update's, not SALT's.
        const auto ts = std::chrono::steady_clock::now();
        const at::Tensor K = salt_gram(model_, p, parts, tokens_total, seqs_total, options_,
                                       single_pass ? recorded.get() : mb_recorded.get());
        const at::Tensor k_rows = part_rows(parts, n, device);
        const salt_result sr = salt_coefficients(K, advantages.index_select(0, k_rows).to(at::kCPU), options_.salt);
        if (sr.noop == salt_noop::none && sr.gamma != 1.0) {
          mb_advantages = advantages.clone();
          mb_advantages.index_copy_(0, k_rows, sr.coefficients.to(at::kFloat).to(device));
        }
        ++m.salt_updates;
        if (sr.noop != salt_noop::none)
          ++m.salt_noops;
        m.salt_cancellation += sr.cancellation;
        m.salt_rank += static_cast<double>(sr.rank);
        m.salt_gamma += sr.gamma;
        m.salt_norm_before += sr.norm_before;
        m.salt_norm_after += sr.norm_after;
        m.salt_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
      }
      for (const auto& np : params)
        np.second.mutable_grad() = at::Tensor();
      // Every aggregate is a weighted sum over micro-batches that equals the minibatch's own:
      // token-normalised terms weigh by trained tokens, sequence-normalised ones by trained
      // sequences. One micro-batch has weight exactly 1.
      double loss_value = 0.0, pg = 0.0, kl = 0.0, clip_lo = 0.0, clip_hi = 0.0, ratio = 0.0;
      double ratio_max = 0.0;
      bool finite = true;
      for (const micro_batch& mb : parts) {
        if (mb.tokens == 0.0)
          continue; // no trained token: its gradient is exactly zero
        std::optional<at::NoGradGuard> no_graph;
        if (no_signal)
          no_graph.emplace();
        // The step's first update without signal runs on the weights and micro-batches of the
        // old-log-prob pass: its forward would recompute those very values.
        const bool reuse_old = !from_rollout && !old_from_update && no_signal && epoch == 0 && b == 0 && n_mb == 1;
        at::Tensor new_logp;
        if (single_pass) {
          new_logp = first_new_logp;
        } else if (mb_recorded) {
          new_logp = mb_recorded->logp;
        } else if (reuse_old) {
          new_logp = mb.rows_of(old_logp, mb.T);
        } else {
          at::Tensor ent;
          const auto tf = std::chrono::steady_clock::now();
          new_logp = batch_logprobs(model_, p, &mb, options_.temperature, packed,
                                    measure ? &ent : nullptr);
          m.forward_seconds += seconds_since(tf);
          ++m.forwards;
          if (measure)
            mismatch.add(new_logp, mb.rows_of(p.sampling, mb.T), mb.mask, ent);
        }
        const loss_terms terms = policy_loss(
          new_logp, old_from_update ? new_logp.detach() : mb.rows_of(old_logp, mb.T),
          mb.idx.defined() ? mb_advantages.index_select(0, mb.idx) : mb_advantages, mb.mask,
          ref_logp.defined() ? mb.rows_of(ref_logp, mb.T) : at::Tensor(), options_.loss,
          tis_w.defined() ? mb.rows_of(tis_w, mb.T) : at::Tensor());
        const double value = terms.loss.item<double>();
        if (!std::isfinite(value)) {
          finite = false;
          break;
        }
        const double share = mb.tokens / tokens_total;
        const double w = options_.loss.norm == loss_norm::token ? share : mb.seqs / seqs_total;
        if (!no_signal) { // without signal the gradient is set to its exact value, zero, below
          const auto tb = std::chrono::steady_clock::now();
          if (parts.size() == 1)
            terms.loss.backward();
          else
            (terms.loss * w).backward();
          m.backward_seconds += seconds_since(tb);
        }
        loss_value += value * w;
        pg += terms.pg_loss * w;
        kl += terms.kl * w;
        clip_lo += terms.clip_frac_low * share;
        clip_hi += terms.clip_frac_high * share;
        ratio += terms.ratio_mean * share;
        ratio_max = std::max(ratio_max, terms.ratio_max);
      }
      if (!finite) {
        for (const auto& np : params)
          np.second.mutable_grad() = at::Tensor();
        ++m.skipped_updates;
        ++m.nonfinite_updates;
        continue;
      }
      if (no_signal) {
        at::NoGradGuard no_grad;
        for (const auto& np : params)
          np.second.mutable_grad() = at::zeros_like(np.second);
        ++m.zero_signal_updates;
      }

      // Global L2 norm over every gradient, as torch.nn.utils.clip_grad_norm_ computes it.
      double grad_norm = 0.0;
      {
        at::NoGradGuard no_grad;
        std::vector<at::Tensor> norms;
        for (const auto& np : params)
          if (np.second.grad().defined())
            norms.push_back(np.second.grad().norm());
        grad_norm = norms.empty() ? 0.0 : at::stack(norms).norm().item<double>();
        if (!std::isfinite(grad_norm)) {
          for (const auto& np : params)
            np.second.mutable_grad() = at::Tensor();
          ++m.skipped_updates;
          ++m.nonfinite_updates;
          continue;
        }
        if (options_.max_grad_norm > 0.0) {
          const double coef = options_.max_grad_norm / (grad_norm + 1e-6);
          if (coef < 1.0)
            for (const auto& np : params)
              if (np.second.grad().defined())
                np.second.mutable_grad().mul_(coef);
        }
      }
      adamw_update();
      for (const auto& np : params)
        np.second.mutable_grad() = at::Tensor(); // free the gradients between steps

      ++m.updates;
      loss_sum += loss_value;
      pg_sum += pg;
      kl_sum += kl;
      clip_lo_sum += clip_lo;
      clip_hi_sum += clip_hi;
      ratio_sum += ratio;
      m.ratio_max = std::max(m.ratio_max, ratio_max);
      gnorm_sum += grad_norm;
      m.grad_norm_max = std::max(m.grad_norm_max, grad_norm);
    }
  }
  if (m.updates > 0) {
    const auto u = static_cast<double>(m.updates);
    m.loss = loss_sum / u;
    m.pg_loss = pg_sum / u;
    m.kl = kl_sum / u;
    m.clip_frac_low = clip_lo_sum / u;
    m.clip_frac_high = clip_hi_sum / u;
    m.ratio_mean = ratio_sum / u;
    m.grad_norm = gnorm_sum / u;
  }
  mismatch.write(m);
  if (m.salt_updates > 0) {
    const auto u = static_cast<double>(m.salt_updates);
    m.salt_cancellation /= u;
    m.salt_rank /= u;
    m.salt_gamma /= u;
    m.salt_norm_before /= u;
    m.salt_norm_after /= u;
  }
  ++step_;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  idle_steps_ = m.updates > 0 ? 0 : idle_steps_ + 1;
  if (m.updates == 0 && m.nonfinite_updates > 0)
    throw training_stalled(fmt::format(
      "every update of the step ({} of them) had a non-finite loss or gradient norm and was "
      "dropped, so the weights no longer change; the likely causes are a learning rate that "
      "made the weights diverge, or non-finite weights in the loaded checkpoint",
      m.nonfinite_updates));
  if (options_.max_idle_steps > 0 && idle_steps_ >= options_.max_idle_steps)
    throw training_stalled(fmt::format(
      "{} consecutive steps had no trained token and applied no update: every response was "
      "masked out of the loss",
      idle_steps_));
  return m;
}

void learner_core::adamw_update() {
  // AdamW (Loshchilov & Hutter 2019, Algorithm 2) in torch.optim.AdamW's form: decoupled decay
  // p ← p·(1 − lr·λ), then m ← β1·m + (1 − β1)·g, v ← β2·v + (1 − β2)·g²,
  // p ← p − (lr / (1 − β1^t)) · m / (sqrt(v) / sqrt(1 − β2^t) + eps).
  // Written out rather than using torch::optim so that the state is ours to save bit-exactly
  // and identical across libtorch versions.
  at::NoGradGuard no_grad;
  ++adam_step_;
  const double lr = options_.lr, b1 = options_.adam_beta1, b2 = options_.adam_beta2;
  const double t = static_cast<double>(adam_step_);
  const double bias1 = 1.0 - std::pow(b1, t);
  const double bias2_sqrt = std::sqrt(1.0 - std::pow(b2, t));
  const double step_size = lr / bias1;
  const auto& params = model_.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i].second;
    const at::Tensor& g = p.grad();
    if (!g.defined())
      continue; // as torch: a parameter without a gradient is not stepped (nor decayed)
    exp_avg_[i].mul_(b1).add_(g, 1.0 - b1);
    exp_avg_sq_[i].mul_(b2).addcmul_(g, g, 1.0 - b2);
    // lr = 0 (a frozen baseline) must keep every bit: adding a zero step would still turn a
    // -0.0 weight into +0.0.
    if (lr == 0.0)
      continue;
    if (options_.weight_decay != 0.0)
      p.mul_(1.0 - lr * options_.weight_decay);
    const at::Tensor denom = (exp_avg_sq_[i].sqrt() / bias2_sqrt).add_(options_.adam_eps);
    p.addcdiv_(exp_avg_[i], denom, -step_size);
  }
}

optimizer_state learner_core::save_optimizer_state() const {
  optimizer_state s;
  s.step = step_;
  at::NoGradGuard no_grad;
  s.tensors.emplace_back(adam_step_name, at::full({1}, adam_step_, at::kLong));
  const auto& params = model_.parameters();
  for (std::size_t i = 0; i < params.size(); ++i)
    s.tensors.emplace_back(exp_avg_prefix + params[i].first, exp_avg_[i].to(at::kCPU).clone());
  for (std::size_t i = 0; i < params.size(); ++i)
    s.tensors.emplace_back(exp_avg_sq_prefix + params[i].first,
                           exp_avg_sq_[i].to(at::kCPU).clone());
  if (reference_)
    for (const auto& [name, t] : reference_->parameters())
      s.tensors.emplace_back(reference_prefix + name, t.detach().to(at::kCPU).clone());
  return s;
}

void learner_core::load_optimizer_state(const optimizer_state& state) {
  if (state.step < 0)
    throw std::invalid_argument(
      fmt::format("load_optimizer_state: step must be >= 0, got {}", state.step));
  std::unordered_map<std::string, const at::Tensor*> by_name;
  for (const auto& [name, t] : state.tensors) {
    if (!by_name.emplace(name, &t).second)
      throw std::invalid_argument(
        fmt::format("load_optimizer_state: tensor '{}' appears twice", name));
  }
  auto take = [&](const std::string& name, const at::Tensor& like,
                  at::ScalarType dtype) -> const at::Tensor& {
    const auto it = by_name.find(name);
    if (it == by_name.end())
      throw std::invalid_argument(
        fmt::format("load_optimizer_state: tensor '{}' is missing", name));
    const at::Tensor& t = *it->second;
    if (!t.defined() || t.scalar_type() != dtype || t.sizes() != like.sizes())
      throw std::invalid_argument(
        fmt::format("load_optimizer_state: tensor '{}' must be {} [{}], got {} [{}]", name,
                    c10::toString(dtype), fmt::join(like.sizes(), ", "),
                    t.defined() ? c10::toString(t.scalar_type()) : "undefined",
                    t.defined() ? fmt::format("{}", fmt::join(t.sizes(), ", ")) : ""));
    by_name.erase(it);
    return t;
  };

  // Check everything first, copy after: a bad state leaves the learner as it was.
  const at::Tensor step_like = at::zeros({1}, at::kLong);
  const at::Tensor& step_t = take(adam_step_name, step_like, at::kLong);
  const std::int64_t adam_step = step_t.to(at::kCPU).data_ptr<std::int64_t>()[0];
  if (adam_step < 0)
    throw std::invalid_argument(
      fmt::format("load_optimizer_state: adam.step must be >= 0, got {}", adam_step));
  const auto& params = model_.parameters();
  std::vector<const at::Tensor*> m, v, ref;
  for (const auto& [name, p] : params)
    m.push_back(&take(exp_avg_prefix + name, p, at::kFloat));
  for (const auto& [name, p] : params)
    v.push_back(&take(exp_avg_sq_prefix + name, p, at::kFloat));
  if (reference_)
    for (const auto& [name, p] : reference_->parameters())
      ref.push_back(&take(reference_prefix + name, p, at::kFloat));
  if (!by_name.empty())
    throw std::invalid_argument(
      fmt::format("load_optimizer_state: unexpected tensor '{}'{}", by_name.begin()->first,
                  reference_ ? "" : " (a reference model is kept only when kl_coef > 0)"));

  at::NoGradGuard no_grad;
  for (std::size_t i = 0; i < params.size(); ++i) {
    exp_avg_[i].copy_(*m[i]);
    exp_avg_sq_[i].copy_(*v[i]);
  }
  if (reference_) {
    const auto& rp = reference_->parameters();
    for (std::size_t i = 0; i < rp.size(); ++i)
      rp[i].second.copy_(*ref[i]);
  }
  adam_step_ = adam_step;
  step_ = state.step;
}

} // namespace sorl::learner
