// CPU-versus-device parity of the policy (logits), the rollout path (a bf16 rollout copy's
// greedy tokens and their log-probs), the learner's old log-probs and one learner step, on
// the tiny preset or a Hugging Face model directory. gpu/check_device.sh runs it on a lent
// GPU machine; with --device cpu it compares the CPU with itself (every difference 0).
//
//   device_parity --device cuda [--hf-dir DIR] [--json FILE]
//
// Prints one line per check, "name value (tolerance) ok|FAIL"; exits 1 when a check fails,
// 2 on bad arguments. The tolerances are stated per check below: fp32 GEMMs on the GPU
// accumulate in another order than the CPU's BLAS (TF32 is off in libtorch by default).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "actors/learner/learner_core.hpp"
#include "runtime/ml/formats/hf_model.hpp"
#include "runtime/ml/policy/device.hpp"
#include "runtime/ml/policy/generate.hpp"
#include "runtime/ml/policy/model.hpp"
#include "runtime/ml/policy/torch_compat.hpp"

namespace {

using namespace sorl;

struct check_line {
  std::string name;
  double value, tolerance;
  bool ok() const { return std::isfinite(value) && value <= tolerance; }
};

ml::policy_model make_model(const std::string& hf_dir, c10::Device device) {
  if (hf_dir.empty())
    return ml::policy_model(ml::preset("tiny"), /*seed=*/7, /*init_std=*/0.02, device);
  ml::hf_load_options o;
  o.device = device;
  o.max_seq = 512;
  return ml::load_hf_model(hf_dir, o).model;
}

double max_abs(const at::Tensor& a) {
  return a.numel() == 0 ? 0.0 : a.abs().max().item<double>();
}

std::vector<std::vector<int32_t>> prompts_of(int64_t vocab) {
  std::vector<std::vector<int32_t>> out;
  uint64_t x = 12345;
  for (int p = 0; p < 4; ++p) {
    std::vector<int32_t> ids;
    for (int t = 0; t < 12 + 5 * p; ++t) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      ids.push_back(static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab)));
    }
    out.push_back(std::move(ids));
  }
  return out;
}

/// Greedy completions of `prompts` by `model`'s bf16 rollout copy, in prompt order.
std::vector<ml::generation_result> rollouts(const ml::policy_model& model,
                                            const std::vector<std::vector<int32_t>>& prompts) {
  const ml::policy_model copy = model.clone(at::kBFloat16);
  ml::generator gen(copy);
  ml::sampling_params sp;
  sp.temperature = 0.0;
  sp.max_new_tokens = 32;
  for (const auto& p : prompts)
    gen.submit(p, sp);
  auto results = gen.run_until_idle();
  std::sort(results.begin(), results.end(),
            [](const auto& a, const auto& b) { return a.request_id < b.request_id; });
  return results;
}

} // namespace

int main(int argc, char** argv) {
  std::string device_name = "cuda", hf_dir, json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "device_parity: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--device") device_name = value();
    else if (a == "--hf-dir") hf_dir = value();
    else if (a == "--json") json = value();
    else {
      std::fprintf(stderr, "usage: device_parity [--device cpu|cuda|cuda:N] [--hf-dir DIR] [--json FILE]\n");
      return 2;
    }
  }
  c10::Device device = c10::kCPU;
  try {
    device = ml::device_from(device_name, "--device");
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "device_parity: %s\n", ex.what());
    return 2;
  }
  at::manual_seed(0);
  const std::string model_name = hf_dir.empty() ? "tiny" : hf_dir;
  fmt::print("device_parity: {} on cpu and {}\n", model_name, ml::describe(device));
  ml::policy_model cpu = make_model(hf_dir, c10::kCPU);
  ml::policy_model dev = make_model(hf_dir, device);
  std::vector<check_line> checks;

  // Logits of a right-padded batch: the scale of the logits sets the tolerance.
  const auto prompts = prompts_of(cpu.dims().vocab);
  const int64_t L = static_cast<int64_t>(prompts.back().size());
  at::Tensor ids = at::zeros({static_cast<int64_t>(prompts.size()), L}, at::kLong);
  at::Tensor mask = at::zeros_like(ids);
  for (size_t i = 0; i < prompts.size(); ++i)
    for (size_t t = 0; t < prompts[i].size(); ++t) {
      ids[i][t] = prompts[i][t];
      mask[i][t] = 1;
    }
  {
    at::NoGradGuard no_grad;
    const at::Tensor a = cpu.forward(ids, mask), b = dev.forward(ids, mask).to(at::kCPU);
    const at::Tensor real = mask.to(at::kBool).unsqueeze(-1);
    const double scale = std::max(1.0, max_abs(a.masked_select(real)));
    checks.push_back({"logits: max |cpu - device| / max(1, max |logit|)",
                      max_abs((a - b).masked_select(real)) / scale, 1e-4});
  }

  // The rollout path: greedy tokens of the bf16 copies, and the log-probs over the common
  // prefix of each pair (a near tie may pick another token on each side; from there on the
  // two continue different sequences).
  const auto ra = rollouts(cpu, prompts), rb = rollouts(dev, prompts);
  int64_t same = 0, total = 0;
  double lp = 0.0;
  for (size_t i = 0; i < ra.size(); ++i) {
    const auto& x = ra[i].tokens;
    const auto& y = rb[i].tokens;
    size_t k = 0;
    while (k < x.size() && k < y.size() && x[k] == y[k]) {
      lp = std::max(lp, static_cast<double>(std::fabs(ra[i].logprobs[k] - rb[i].logprobs[k])));
      ++k;
    }
    same += static_cast<int64_t>(k);
    total += static_cast<int64_t>(std::max(x.size(), y.size()));
  }
  checks.push_back({"rollout: greedy tokens differing (fraction)",
                    1.0 - static_cast<double>(same) / static_cast<double>(std::max<int64_t>(total, 1)), 0.1});
  checks.push_back({"rollout: sampled-token log-prob max |cpu - device|", lp, 2e-3});

  // The learner on the CPU's rollouts: old log-probs, then one step on both devices.
  std::vector<learner::rollout_sample> batch;
  for (size_t i = 0; i < ra.size(); ++i) {
    learner::rollout_sample s;
    s.group_id = i / 2;
    s.prompt = prompts[i];
    s.response = ra[i].tokens;
    s.loss_mask.assign(s.response.size(), 1);
    s.sampling_logprobs = ra[i].logprobs;
    s.reward = static_cast<float>(i % 2);
    batch.push_back(std::move(s));
  }
  const auto la = learner::response_logprobs(cpu, batch, 1.0), lb = learner::response_logprobs(dev, batch, 1.0);
  double old_lp = 0.0;
  for (size_t i = 0; i < la.size(); ++i)
    for (size_t t = 0; t < la[i].size(); ++t)
      old_lp = std::max(old_lp, static_cast<double>(std::fabs(la[i][t] - lb[i][t])));
  checks.push_back({"learner: old log-prob max |cpu - device|", old_lp, 1e-3});

  std::vector<at::Tensor> before;
  for (const auto& [name, t] : cpu.parameters())
    before.push_back(t.detach().clone());
  learner::learner_options lo;
  lo.lr = 1e-3;
  cpu.set_requires_grad(true);
  dev.set_requires_grad(true);
  learner::learner_core ca(cpu, lo, 1), cb(dev, lo, 1);
  const auto ma = ca.train_step(batch), mb = cb.train_step(batch);
  checks.push_back({"learner step: |loss cpu - device| / max(1e-3, |loss|)",
                    std::fabs(ma.loss - mb.loss) / std::max(1e-3, std::fabs(ma.loss)), 1e-3});
  checks.push_back({"learner step: |grad norm cpu - device| / grad norm",
                    std::fabs(ma.grad_norm - mb.grad_norm) / std::max(1e-12, ma.grad_norm), 1e-3});
  // Adam's first step is close to lr · sign(g): elements whose gradient is ~0 on one side can
  // move the other way on the other, so the update is compared as a whole, not per element.
  double diff2 = 0.0, norm2 = 0.0;
  for (size_t i = 0; i < before.size(); ++i) {
    const at::Tensor da = cpu.parameters()[i].second.detach() - before[i];
    const at::Tensor db = dev.parameters()[i].second.detach().to(at::kCPU) - before[i];
    diff2 += (da - db).pow(2).sum().item<double>();
    norm2 += da.pow(2).sum().item<double>();
  }
  checks.push_back({"learner step: ||update cpu - update device|| / ||update cpu||",
                    std::sqrt(diff2) / std::max(1e-30, std::sqrt(norm2)), 5e-2});

  bool ok = true;
  std::string out = "[";
  for (const auto& c : checks) {
    fmt::print("  {:<62} {:.3e}  (<= {:.0e})  {}\n", c.name, c.value, c.tolerance, c.ok() ? "ok" : "FAIL");
    ok = ok && c.ok();
    out += fmt::format("{}{{\"check\": \"{}\", \"model\": \"{}\", \"device\": \"{}\", \"value\": {}, "
                       "\"tolerance\": {}, \"ok\": {}}}",
                       out.size() > 1 ? ",\n " : "", c.name, model_name, device.str(), c.value,
                       c.tolerance, c.ok() ? "true" : "false");
  }
  if (!json.empty())
    std::ofstream(json) << out << "]\n";
  fmt::print("device_parity: {}\n", ok ? "every check within its tolerance" : "a check FAILED");
  return ok ? 0 : 1;
}
