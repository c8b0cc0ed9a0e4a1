#pragma once

// The warm start the end-to-end training runs start from, so that their groups get mixed
// rewards and the policy-gradient path (advantages, update, sync) runs with real signal.
//
// A fresh tiny policy never answers a task right: every reward is 0, every advantage 0, and
// a training run only exercises weight decay. `sorl sft` on a four-prompt JSON-lines task
// fixes that in a few seconds: prompts "A", "B", "C", "D" (each its own last token, which the
// tiny model conditions on at once) with answers "5", "8", "7", "9", half of the
// demonstrations deliberately wrong (another prompt's answer). Sampled at temperature 1 the
// warm start answers about half of the prompts right (0.28–0.69 per step of 32 rollouts,
// frozen runs with seeds 1–8), so a group of G = 4 has signal with probability
// ≈ 1 − 2·0.5⁴ = 0.875.
//
// The records repeat the four prompts in order, eight times: the trainer draws prompts
// sequentially, so every step with prompts_per_step = 4 asks each prompt once.
//
// The checkpoint is made once per `ctest` run by the fixture `e2e_warm_start`
// (tests/actors/CMakeLists.txt: the hidden case "[warm_start]" of train_run_test) under the
// test data directory; no weights are committed.

#include <filesystem>
#include <fstream>
#include <string>

namespace sorl::test {

/// The warm-start checkpoint root under the test data directory `data`.
inline std::filesystem::path warm_start_dir(const std::filesystem::path& data) {
  return data / "warm-start";
}

/// The JSON-lines prompts both the warm start and the runs from it use.
inline std::filesystem::path warm_start_prompts(const std::filesystem::path& data) {
  return data / "warm-start.jsonl";
}

/// Writes warm_start_prompts(data): 32 records, the four prompts in order, eight times.
inline void write_warm_start_prompts(const std::filesystem::path& data) {
  std::filesystem::create_directories(data);
  std::ofstream out{warm_start_prompts(data)};
  for (int copy = 0; copy < 8; ++copy)
    out << "{\"prompt\": \"A\", \"answer\": \"5\"}\n{\"prompt\": \"B\", \"answer\": \"8\"}\n"
           "{\"prompt\": \"C\", \"answer\": \"7\"}\n{\"prompt\": \"D\", \"answer\": \"9\"}\n";
}

/// The [model] table and the start of the [task] table of a run from the warm start (the
/// caller may add [task] keys right after it). Nothing is held out (eval_fraction 0): the
/// prompts are the task.
inline std::string warm_start_tables(const std::filesystem::path& data) {
  return "[model]\npreset = \"tiny\"\ncheckpoint = \"" + warm_start_dir(data).string()
         + "\"\n[task]\nname = \"jsonl\"\npath = \"" + warm_start_prompts(data).string()
         + "\"\neval_fraction = 0.0\n";
}

/// The experiment file `sorl sft` makes the warm start from: 80 steps of 16 demonstrations
/// (about 3 s of CPU time), half of them wrong.
inline std::string warm_start_config(const std::filesystem::path& data) {
  return "[run]\nseed = 1\n" + warm_start_tables(data)
         + "max_new_tokens = 4\n[sft]\nsteps = 80\nbatch_size = 16\nlr = 6e-3\n"
           "warmup_steps = 10\nwrong_fraction = 0.5\neval_count = 0\n"
           "[[node]]\nname = \"main\"\nactors = [\"ping\"]\n";
}

} // namespace sorl::test
