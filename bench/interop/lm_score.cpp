// sorl_lm_score: next-token log-likelihood of token sequences under a Hugging Face model
// directory (runtime/ml/formats/hf_model.hpp), for checking a converted or exported model: an
// intact model gives ordinary text a low perplexity and shuffled words a high one.
//
//   sorl_lm_score MODEL_DIR [logits=OUT.safetensors] < ids.txt
//
// ids.txt: one sequence per line, token ids separated by spaces. Prints per line the token
// count, the mean negative log-likelihood of tokens 2..n (nats) and its perplexity, and the
// greedy next token after the last one. logits=FILE also writes each line's full-forward
// logits ([n, vocab] fp32, named "logits.<line>") for comparison with another implementation.

#include "runtime/ml/formats/hf_model.hpp"

#include "runtime/ml/policy/torch_compat.hpp"

#include <cmath>
#include <cstdio>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

using namespace sorl::ml;

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: sorl_lm_score MODEL_DIR [logits=OUT.safetensors] < ids.txt\n");
    return 2;
  }
  std::string logits_out;
  if (argc == 3) {
    const std::string a = argv[2];
    if (a.rfind("logits=", 0) != 0) {
      std::fprintf(stderr, "sorl_lm_score: unknown argument '%s'\n", argv[2]);
      return 2;
    }
    logits_out = a.substr(7);
  }
  try {
    hf_load_options o;
    o.max_seq = 4096;
    const hf_loaded_model m = load_hf_model(argv[1], o);
    at::NoGradGuard no_grad;
    named_tensors dumped;
    std::string line;
    int n_line = 0;
    while (std::getline(std::cin, line)) {
      std::istringstream in(line);
      std::vector<std::int64_t> ids;
      for (std::int64_t id; in >> id;) ids.push_back(id);
      if (ids.empty()) continue;
      const at::Tensor t = at::tensor(ids, at::kLong).unsqueeze(0);
      const at::Tensor logits = m.model.forward(t).squeeze(0);  // [n, vocab]
      const at::Tensor logp = at::log_softmax(logits, -1);
      double nll = 0.0;
      for (std::size_t i = 1; i < ids.size(); ++i)
        nll -= logp[static_cast<std::int64_t>(i) - 1][ids[i]].item<double>();
      const double mean = ids.size() > 1 ? nll / static_cast<double>(ids.size() - 1) : 0.0;
      std::printf("line %d: %zu tokens  mean nll %.4f  perplexity %.2f  next %lld\n", n_line, ids.size(), mean,
                  std::exp(mean), static_cast<long long>(logits[-1].argmax().item<std::int64_t>()));
      if (!logits_out.empty()) dumped.emplace_back("logits." + std::to_string(n_line), logits.contiguous());
      ++n_line;
    }
    if (!logits_out.empty()) save_safetensors(logits_out, dumped);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sorl_lm_score: %s\n", e.what());
    return 1;
  }
  return 0;
}
