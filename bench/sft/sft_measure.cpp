// sorl_sft_measure: runs the supervised warm start with its default options
// (runtime/ml/train/sft.hpp) and prints what it achieved: held-out greedy accuracy before and
// after, sampled (temperature 1) accuracy after — the competence RL starts from —, wall minutes
// and training tokens/s.
//
//   sorl_sft_measure [key=value ...]
//
// Keys (all optional): task=arithmetic|number_guess  steps=N  batch=N  lr=X  wrong=X
// warmup=N  pool=N  seed=N  eval=N  threads=N (default 1: on a shared 2-core machine two
// OpenMP threads wait on each other, see sft_options::threads; never more than 2 here)
// out=DIR (write the checkpoint there)  every=N (evaluate every N steps)
// preset=NAME (runtime/ml/policy/model.hpp)  operators=+-  negative=0|1
// wrong_answers=near|dropped_carry (arithmetic options)
// depth=N  dirs=N  files=N  detour=X  max_turns=N  wrong_episodes=wander|give_up  wander_share=X
// (file_search options; runtime/ml/tasks/tasks.hpp)  d_model=N (d_ff = 3 d_model)
// layers=N: the preset's shape with these changed.
// A live progress line goes to stderr, the summary to stdout.

#include "runtime/ml/formats/tokenizer.hpp"
#include "runtime/ml/policy/cpu_kernels.hpp"
#include "runtime/ml/train/evaluate.hpp"
#include "runtime/ml/train/sft.hpp"

#include <ATen/Parallel.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

using namespace sorl::ml;

int main(int argc, char** argv) try {
  // The same kernels as `sorl sft`, so that the accuracy measured is the one sorl gets.
  sorl::pin_cpu_kernels(argv);
  std::fprintf(stderr, "CPU kernels: %s\n", sorl::cpu_kernels_summary().c_str());
  sft_options o;
  o.threads = 1;
  std::int64_t d_model = 0, layers = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "expected key=value, got '%s'\n", arg.c_str());
      return 2;
    }
    const std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
    if (key == "task") o.task = value;
    else if (key == "steps") o.steps = std::stoll(value);
    else if (key == "batch") o.batch_size = std::stoll(value);
    else if (key == "lr") o.lr = std::stod(value);
    else if (key == "wrong") o.wrong_fraction = std::stod(value);
    else if (key == "warmup") o.warmup_steps = std::stoll(value);
    else if (key == "pool") o.pool_size = std::stoll(value);
    else if (key == "seed") o.seed = std::stoull(value);
    else if (key == "eval") o.eval_count = std::stoll(value);
    else if (key == "threads") o.threads = std::stoi(value);
    else if (key == "out") o.output_dir = value;
    else if (key == "every") o.eval_every = std::stoll(value);
    else if (key == "preset") o.preset = value;
    else if (key == "operators") o.task_config.arithmetic.operators = value;
    else if (key == "negative") o.task_config.arithmetic.allow_negative = value == "1";
    else if (key == "wrong_answers") o.task_config.arithmetic.wrong_answers = value;
    else if (key == "d_model") d_model = std::stoll(value);
    else if (key == "layers") layers = std::stoll(value);
    else if (key == "depth") o.task_config.file_search.depth = std::stoi(value);
    else if (key == "dirs") o.task_config.file_search.max_dirs = std::stoi(value);
    else if (key == "files") o.task_config.file_search.max_files = std::stoi(value);
    else if (key == "detour") o.task_config.file_search.detour_rate = std::stod(value);
    else if (key == "max_turns") o.task_config.file_search.max_turns = std::stoi(value);
    else if (key == "wrong_episodes") o.task_config.file_search.wrong_episodes = value;
    else if (key == "wander_share") o.task_config.file_search.wander_share = std::stod(value);
    else {
      std::fprintf(stderr, "unknown key '%s'\n", key.c_str());
      return 2;
    }
  }

  if (d_model > 0 || layers > 0) {
    model_dims d = preset(o.preset);
    if (d_model > 0) {
      d.d_model = d_model;
      d.d_ff = 3 * d_model;
    }
    if (layers > 0)
      d.n_layers = layers;
    o.dims = d;
  }

  // The live line a CLI would print: step, loss, tokens/s, elapsed; evaluations on their own line.
  auto progress = [&](const sft_progress& p) {
    if (p.eval) {
      std::fprintf(stderr, "\r[eval @ step %lld] accuracy %.3f  mean reward %.3f  (%lld prompts, %.1f s)\n",
                   static_cast<long long>(p.step), p.eval->accuracy, p.eval->mean_reward,
                   static_cast<long long>(p.eval->count), p.eval->seconds);
      return;
    }
    if (p.step % 10 == 0 || p.step == p.steps)
      std::fprintf(stderr, "\rstep %5lld/%lld  loss %.4f  lr %.2e  |g| %.3f  %7.0f tok/s  %6.1f s", static_cast<long long>(p.step),
                   static_cast<long long>(p.steps), p.loss, p.lr, p.grad_norm, p.tokens_per_second,
                   p.elapsed_seconds);
  };

  const sft_report r = run_sft(o, progress);
  std::fprintf(stderr, "\n");

  // Sampled accuracy: what GRPO rollouts at temperature 1 would score from this start.
  const any_task task = make_task(o.task, o.task_config);
  eval_options sampled;
  sampled.count = o.eval_count;
  sampled.max_new_tokens = o.eval_max_new_tokens;
  sampled.batch = o.eval_batch;
  sampled.greedy = false;
  sampled.temperature = 1.0f;
  sampled.seed = 1;
  sampled.keep_samples = 5;
  const eval_report s = evaluate(*r.model, byte_tokenizer{}, task, sampled);

  std::printf("sft: task %s, preset %s (%lld parameters), %d threads\n", r.task.c_str(),
              r.preset.c_str(), static_cast<long long>(r.dims.parameter_count()), at::get_num_threads());
  std::printf("  steps %lld x batch %lld, lr %g, wrong_fraction %g (%lld of %lld pool examples wrong)\n",
              static_cast<long long>(r.steps), static_cast<long long>(o.batch_size), o.lr,
              o.wrong_fraction, static_cast<long long>(r.wrong_in_pool),
              static_cast<long long>(r.pool_size));
  std::printf("  loss first %.4f  last %.4f\n", r.losses.front(), r.losses.back());
  if (r.before)
    std::printf("  held-out greedy accuracy before: %.3f (%lld/%lld)\n", r.before->accuracy,
                static_cast<long long>(r.before->correct), static_cast<long long>(r.before->count));
  if (r.after)
    std::printf("  held-out greedy accuracy after:  %.3f (%lld/%lld), mean reward %.3f, mean turns %.2f, "
                "mean response %.1f tokens\n",
                r.after->accuracy, static_cast<long long>(r.after->correct),
                static_cast<long long>(r.after->count), r.after->mean_reward, r.after->mean_turns,
                r.after->mean_response_tokens);
  std::printf("  held-out sampled accuracy after (temperature 1): %.3f (%lld/%lld)\n", s.accuracy,
              static_cast<long long>(s.correct), static_cast<long long>(s.count));
  for (const eval_sample& e : s.samples)
    std::printf("    e.g. %-14s -> %-24s reward %.0f (%s)\n", e.prompt.c_str(), e.completion.c_str(),
                e.reward, e.reason.c_str());
  std::printf("  training %.2f min, total %.2f min, %.0f training tokens/s\n", r.train_seconds / 60.0,
              r.total_seconds / 60.0, r.tokens_per_second);
  if (!r.checkpoint.empty()) std::printf("  checkpoint: %s\n", r.checkpoint.string().c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "sorl_sft_measure: %s\n", e.what());
  return 1;
}
