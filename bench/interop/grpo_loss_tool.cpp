// sorl_grpo_loss: the learner's GRPO / DAPO policy loss and its gradient on one batch given in
// a JSON file, for comparison with another implementation on the very same inputs
// (bench/interop/trl_loss_parity.py compares it with TRL's GRPOTrainer).
//
//   sorl_grpo_loss BATCH.json [--threads N]
//
// The model is a Hugging Face directory (runtime/ml/formats/hf_model.hpp), loaded in fp32. The new
// log-probs of the completion tokens are the learner's differentiable forward
// (learner::response_logprobs_tensor, actors/learner/learner_core.hpp: prompt then completion,
// the log-prob of completion token t read from the logits at position prompt_len + t - 1,
// logits divided by the temperature, log-softmax), checked against its no-grad
// response_logprobs. Then policy_loss (actors/learner/grpo.hpp) with kl_coef 0, one backward,
// and the global L2 gradient norm as train_step measures it (before clipping).
//
// BATCH.json:
//   {
//     "model_dir": "DIR",          absolute, or relative to the batch file's folder
//     "loss_norm": "token" | "sequence",
//     "clip_eps_low": 0.2,         ratio floor 1 - clip_eps_low where A < 0
//     "clip_eps_high": 0.28,       ratio ceiling 1 + clip_eps_high where A > 0
//     "temperature": 1.0,          optional, default 1
//     "rows": [
//       { "prompt_ids": [int, ...],        at least one token
//         "completion_ids": [int, ...],
//         "completion_mask": [0|1, ...],   one per completion token; 1 = trained
//         "old_logprobs": [number, ...],   one per completion token, natural log, the policy
//                                          that sampled the batch (any finite value where
//                                          the mask is 0)
//         "advantage": number }            one per row
//     ]
//   }
// Rows may have different prompt and completion lengths; completion tokens with mask 0 are
// still fed to the model (they condition later tokens), as environment tokens are in training.
//
// Prints one JSON object on stdout:
//   loss, pg_loss                 the scalar policy_loss returned (equal here: no KL term)
//   grad_norm                     global L2 norm over every parameter's gradient, the tied
//                                 embedding / LM head counted once (policy_model::parameters())
//   tokens, clip_frac_low, clip_frac_high, ratio_mean, ratio_max   as loss_terms
//   logprob_vs_learner_max_abs    max |Δ| between this tool's log-probs and response_logprobs
//   new_logprobs                  [rows][completion tokens], the log-probs the loss used
//   param_grad_norms              {name: L2 norm of that parameter's gradient}
//   seconds                       wall time of forward + loss + backward
// Exits 1 with a message naming the file and the field on bad input, 2 on bad usage.

#include "actors/learner/grpo.hpp"
#include "actors/learner/learner_core.hpp"
#include "actors/learner/rollout_sample.hpp"
#include "runtime/ml/formats/hf_model.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using nlohmann::json;
namespace fs = std::filesystem;
namespace learner = sorl::learner;

/// One row of the batch file.
struct batch_row {
  std::vector<std::int32_t> prompt;     ///< prompt token ids, non-empty
  std::vector<std::int32_t> completion; ///< completion token ids
  std::vector<std::uint8_t> mask;       ///< per completion token, 1 = trained
  std::vector<float> old_logprobs;      ///< per completion token, natural log, fp32
  float advantage = 0.0f;
};

/// A parsed batch file.
struct batch_file {
  fs::path model_dir;
  learner::loss_options loss; ///< kl_coef stays 0
  double temperature = 1.0;
  std::vector<batch_row> rows;
};

/// Errors name the batch file and the field: "<file>: rows[2].completion_mask: ...".
[[noreturn]] void fail(const std::string& file, const std::string& field, const std::string& what) {
  throw std::invalid_argument(fmt::format("{}: {}: {}", file, field, what));
}

/// obj[key]; throws naming `where`.key when obj is not an object or lacks the key.
const json& member(const json& obj, const char* key, const std::string& file,
                   const std::string& where) {
  const std::string field = where.empty() ? key : where + "." + key;
  if (!obj.is_object())
    fail(file, where.empty() ? "(top level)" : where, "expected a JSON object");
  const auto it = obj.find(key);
  if (it == obj.end())
    fail(file, field, "missing");
  return *it;
}

/// A finite JSON number; throws naming `field` otherwise.
double number(const json& v, const std::string& file, const std::string& field) {
  if (!v.is_number())
    fail(file, field, fmt::format("expected a number, got {}", v.type_name()));
  const double d = v.get<double>();
  if (!std::isfinite(d))
    fail(file, field, "must be finite");
  return d;
}

/// A JSON array of integers in [lo, hi); throws naming the field (and index) otherwise.
template <class Int>
std::vector<Int> int_array(const json& v, const std::string& file, const std::string& field,
                           std::int64_t lo, std::int64_t hi) {
  if (!v.is_array())
    fail(file, field, fmt::format("expected an array of integers, got {}", v.type_name()));
  std::vector<Int> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer())
      fail(file, fmt::format("{}[{}]", field, i),
           fmt::format("expected an integer, got {}", v[i].type_name()));
    const auto x = v[i].get<std::int64_t>();
    if (x < lo || x >= hi)
      fail(file, fmt::format("{}[{}]", field, i), fmt::format("{} is outside [{}, {})", x, lo, hi));
    out.push_back(static_cast<Int>(x));
  }
  return out;
}

/// Reads and validates BATCH.json; token ids are checked against `vocab` later, once the
/// model's config is known. Throws std::invalid_argument naming the file and the field.
batch_file read_batch(const fs::path& path) {
  const std::string file = path.string();
  std::ifstream in(path);
  if (!in)
    throw std::invalid_argument(fmt::format("{}: cannot open the file", file));
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::parse_error& e) {
    throw std::invalid_argument(fmt::format("{}: not valid JSON: {}", file, e.what()));
  }
  batch_file b;
  const json& dir = member(doc, "model_dir", file, "");
  if (!dir.is_string())
    fail(file, "model_dir", "expected a string");
  b.model_dir = fs::path(dir.get<std::string>());
  if (b.model_dir.is_relative())
    b.model_dir = path.parent_path() / b.model_dir;

  const json& norm = member(doc, "loss_norm", file, "");
  const std::string norm_s = norm.is_string() ? norm.get<std::string>() : "";
  if (norm_s == "token")
    b.loss.norm = learner::loss_norm::token;
  else if (norm_s == "sequence")
    b.loss.norm = learner::loss_norm::sequence;
  else
    fail(file, "loss_norm", fmt::format("expected \"token\" or \"sequence\", got {}", norm.dump()));
  b.loss.clip_eps_low = number(member(doc, "clip_eps_low", file, ""), file, "clip_eps_low");
  b.loss.clip_eps_high = number(member(doc, "clip_eps_high", file, ""), file, "clip_eps_high");
  b.loss.kl_coef = 0.0;
  try {
    b.loss.validate();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: {}", file, e.what()));
  }
  if (doc.contains("temperature")) {
    b.temperature = number(doc["temperature"], file, "temperature");
    if (b.temperature <= 0.0)
      fail(file, "temperature", fmt::format("must be > 0, got {}", b.temperature));
  }

  const json& rows = member(doc, "rows", file, "");
  if (!rows.is_array() || rows.empty())
    fail(file, "rows", "expected a non-empty array of row objects");
  std::int64_t completion_tokens = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::string where = fmt::format("rows[{}]", i);
    const json& r = rows[i];
    batch_row row;
    const std::int64_t any = std::int64_t{1} << 31;
    row.prompt = int_array<std::int32_t>(member(r, "prompt_ids", file, where), file,
                                         where + ".prompt_ids", 0, any);
    if (row.prompt.empty())
      fail(file, where + ".prompt_ids", "must hold at least one token");
    row.completion = int_array<std::int32_t>(member(r, "completion_ids", file, where), file,
                                             where + ".completion_ids", 0, any);
    row.mask = int_array<std::uint8_t>(member(r, "completion_mask", file, where), file,
                                       where + ".completion_mask", 0, 2);
    if (row.mask.size() != row.completion.size())
      fail(file, where + ".completion_mask",
           fmt::format("has {} entries, completion_ids has {}", row.mask.size(),
                       row.completion.size()));
    const json& old = member(r, "old_logprobs", file, where);
    if (!old.is_array() || old.size() != row.completion.size())
      fail(file, where + ".old_logprobs",
           fmt::format("expected an array of {} numbers (one per completion token)",
                       row.completion.size()));
    for (std::size_t t = 0; t < old.size(); ++t)
      row.old_logprobs.push_back(static_cast<float>(
        number(old[t], file, fmt::format("{}.old_logprobs[{}]", where, t))));
    row.advantage =
      static_cast<float>(number(member(r, "advantage", file, where), file, where + ".advantage"));
    completion_tokens += static_cast<std::int64_t>(row.completion.size());
    b.rows.push_back(std::move(row));
  }
  if (completion_tokens == 0)
    fail(file, "rows", "no row has a completion token");
  return b;
}

/// The batch as the learner's rollout samples (for response_logprobs).
std::vector<learner::rollout_sample> as_samples(const batch_file& b) {
  std::vector<learner::rollout_sample> out;
  for (std::size_t i = 0; i < b.rows.size(); ++i) {
    learner::rollout_sample s;
    s.group_id = i;
    s.prompt = b.rows[i].prompt;
    s.response = b.rows[i].completion;
    s.loss_mask = b.rows[i].mask;
    s.sampling_logprobs = b.rows[i].old_logprobs;
    out.push_back(std::move(s));
  }
  return out;
}

/// The loss inputs per completion token, [N, T] (T = longest completion, the columns of
/// learner::response_logprobs_tensor): mask fp32 0/1 and old log-probs fp32 (padding 0), and
/// the advantages [N] fp32.
struct loss_inputs {
  at::Tensor mask, old, advantages;
};

loss_inputs pack(const batch_file& b) {
  const auto n = static_cast<std::int64_t>(b.rows.size());
  std::int64_t T = 0;
  for (const auto& r : b.rows)
    T = std::max<std::int64_t>(T, static_cast<std::int64_t>(r.completion.size()));
  loss_inputs p;
  p.mask = at::zeros({n, T}, at::kFloat);
  p.old = at::zeros({n, T}, at::kFloat);
  p.advantages = at::zeros({n}, at::kFloat);
  auto mask = p.mask.accessor<float, 2>();
  auto old = p.old.accessor<float, 2>();
  auto adv = p.advantages.accessor<float, 1>();
  for (std::int64_t i = 0; i < n; ++i) {
    const batch_row& r = b.rows[static_cast<std::size_t>(i)];
    for (std::size_t t = 0; t < r.completion.size(); ++t) {
      const auto tt = static_cast<std::int64_t>(t);
      mask[i][tt] = r.mask[t] != 0 ? 1.0f : 0.0f;
      old[i][tt] = r.old_logprobs[t];
    }
    adv[i] = r.advantage;
  }
  return p;
}

/// Loads the batch and the model, computes the loss and its gradient, prints the JSON result.
int run(const fs::path& batch_path) {
  const batch_file b = read_batch(batch_path);
  sorl::ml::hf_loaded_model loaded = sorl::ml::load_hf_model(b.model_dir);
  sorl::ml::policy_model& model = loaded.model;
  const std::int64_t vocab = model.dims().vocab;
  for (std::size_t i = 0; i < b.rows.size(); ++i) {
    auto check = [&](const std::vector<std::int32_t>& ids, const char* field) {
      for (std::size_t t = 0; t < ids.size(); ++t)
        if (ids[t] >= vocab)
          fail(batch_path.string(), fmt::format("rows[{}].{}[{}]", i, field, t),
               fmt::format("token {} is outside the model's vocabulary [0, {})", ids[t], vocab));
    };
    check(b.rows[i].prompt, "prompt_ids");
    check(b.rows[i].completion, "completion_ids");
    const auto len = static_cast<std::int64_t>(b.rows[i].prompt.size() + b.rows[i].completion.size());
    if (len > model.dims().max_seq)
      fail(batch_path.string(), fmt::format("rows[{}]", i),
           fmt::format("prompt + completion = {} tokens exceed the model's max_seq {}", len,
                       model.dims().max_seq));
  }
  model.set_requires_grad(true);
  const loss_inputs p = pack(b);
  const std::vector<learner::rollout_sample> samples = as_samples(b);

  const auto t0 = std::chrono::steady_clock::now();
  // The learner's own differentiable forward (one right-padded batch, LM head at the
  // completion rows, logits / temperature, log-softmax).
  const at::Tensor new_logp = learner::response_logprobs_tensor(model, samples, b.temperature);
  const learner::loss_terms terms =
    learner::policy_loss(new_logp, p.old, p.advantages, p.mask, at::Tensor(), b.loss);
  terms.loss.backward();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  at::NoGradGuard no_grad;
  // The global norm exactly as learner_core::train_step measures it.
  std::vector<at::Tensor> norms;
  json per_param = json::object();
  for (const auto& [name, param] : model.parameters()) {
    if (!param.grad().defined())
      continue;
    norms.push_back(param.grad().norm());
    per_param[name] = norms.back().item<double>();
  }
  const double grad_norm = norms.empty() ? 0.0 : at::stack(norms).norm().item<double>();

  // The log-probs above must be the learner's: compare with its own no-grad recompute.
  const std::vector<std::vector<float>> reference =
    learner::response_logprobs(model, samples, b.temperature);
  const at::Tensor got = new_logp.detach().contiguous();
  const auto acc = got.accessor<float, 2>();
  double max_abs = 0.0;
  json logprobs = json::array();
  for (std::size_t i = 0; i < reference.size(); ++i) {
    json row = json::array();
    for (std::size_t t = 0; t < reference[i].size(); ++t) {
      const float v = acc[static_cast<std::int64_t>(i)][static_cast<std::int64_t>(t)];
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(v) - reference[i][t]));
      row.push_back(v);
    }
    logprobs.push_back(std::move(row));
  }

  json out;
  out["loss"] = terms.loss.item<double>();
  out["pg_loss"] = terms.pg_loss;
  out["grad_norm"] = grad_norm;
  out["tokens"] = terms.tokens;
  out["clip_frac_low"] = terms.clip_frac_low;
  out["clip_frac_high"] = terms.clip_frac_high;
  out["ratio_mean"] = terms.ratio_mean;
  out["ratio_max"] = terms.ratio_max;
  out["logprob_vs_learner_max_abs"] = max_abs;
  out["seconds"] = seconds;
  out["new_logprobs"] = std::move(logprobs);
  out["param_grad_norms"] = std::move(per_param);
  std::cout << out.dump() << "\n";
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  const char* usage = "usage: sorl_grpo_loss BATCH.json [--threads N]\n";
  if (argc != 2 && argc != 4) {
    std::fputs(usage, stderr);
    return 2;
  }
  if (argc == 4) {
    const std::string flag = argv[2];
    int threads = 0;
    std::istringstream in(argv[3]);
    if (flag != "--threads" || !(in >> threads) || threads < 1) {
      std::fputs(usage, stderr);
      return 2;
    }
    at::set_num_threads(threads);
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sorl_grpo_loss: %s\n", e.what());
    return 1;
  }
}
