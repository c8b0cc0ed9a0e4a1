// sorl_episode_lengths: the episode-length distribution of a multi-turn task, in turns and
// transcript tokens (byte tokenizer: <|bos|>, then per turn its marker, its bytes and
// <|end_turn|>, as encode_chat lays out a chat), from the scripted warm-start
// demonstrations or from a checkpoint's sampled episodes.
//
//   sorl_episode_lengths [key=value ...]
//
// Keys (all optional): task=file_search|number_guess  n=N (episodes, default 1000)
// seed=N (task seed, default 1)  max_turns=N (default: the task's)  depth=N, dirs=N,
// files=N, detour=X (file_search's depth, max_dirs, max_files, detour_rate; defaults 2, 2,
// 2, 0.1)  wrong=X (share of wrong demonstrations, default 0.3)
// wrong_episodes=wander|give_up (what they do, default wander)  wander_share=X (with give_up,
// the share of wrong ones that wander instead, default 0)  checkpoint=ROOT (sample episodes from the latest
// checkpoint under ROOT instead, at temperature 1)  preset=NAME (default tiny-2k)
// max_new=N (tokens per action, default 16)  split=train|eval (default train)
// out=FILE (also write each episode's length to FILE: a header line "tokens,turns", then one
// episode per line, in episode order; bench/sagc/replay_agent.sh turns it into a duration
// trace for the SAGC simulator). With checkpoint=: greedy=1 decodes greedily instead of
// sampling; show=N prints the first N episodes (first observation, the actions joined with
// " | ", reward and its reason).
// Prints one line per statistic to stdout.

#include "actors/sagc/timing.hpp"
#include "runtime/ml/formats/checkpoint.hpp"
#include "runtime/ml/formats/tokenizer.hpp"
#include "runtime/ml/policy/model.hpp"
#include "runtime/ml/tasks/tasks.hpp"
#include "runtime/ml/train/evaluate.hpp"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

using namespace sorl::ml;

namespace {

// Nearest-rank percentile, p in [0, 1], as the run metrics compute theirs.
long percentile(const std::vector<long>& v, double p) {
  return static_cast<long>(
    sorl::sagc::nearest_rank_percentile(std::vector<int64_t>(v.begin(), v.end()), 100 * p));
}

void print(const char* what, const std::vector<long>& v) {
  std::printf("%-7s p50 %ld  p90 %ld  p99 %ld  max %ld  (p99/p50 %.2f)\n", what, percentile(v, 0.5),
              percentile(v, 0.9), percentile(v, 0.99), percentile(v, 1.0),
              static_cast<double>(percentile(v, 0.99)) / static_cast<double>(percentile(v, 0.5)));
}

} // namespace

int main(int argc, char** argv) try {
  std::string task_name = "file_search", checkpoint, preset_name = "tiny-2k", out;
  task_options to;
  to.seed = 1;
  long n = 1000, max_new = 16, show = 0;
  bool greedy = false;
  double wrong = 0.3;
  task_split split = task_split::train;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "expected key=value, got '%s'\n", arg.c_str());
      return 2;
    }
    const std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
    if (key == "task") task_name = value;
    else if (key == "n") n = std::stol(value);
    else if (key == "seed") to.seed = std::stoull(value);
    else if (key == "max_turns") to.file_search.max_turns = to.number_guess.max_turns = std::stoi(value);
    else if (key == "wrong") wrong = std::stod(value);
    else if (key == "checkpoint") checkpoint = value;
    else if (key == "preset") preset_name = value;
    else if (key == "max_new") max_new = std::stol(value);
    else if (key == "out") out = value;
    else if (key == "show") show = std::stol(value);
    else if (key == "depth") to.file_search.depth = std::stoi(value);
    else if (key == "dirs") to.file_search.max_dirs = std::stoi(value);
    else if (key == "files") to.file_search.max_files = std::stoi(value);
    else if (key == "detour") to.file_search.detour_rate = std::stod(value);
    else if (key == "wrong_episodes") to.file_search.wrong_episodes = value;
    else if (key == "wander_share") to.file_search.wander_share = std::stod(value);
    else if (key == "greedy") greedy = value == "1" || value == "true";
    else if (key == "split") split = value == "eval" ? task_split::eval : task_split::train;
    else {
      std::fprintf(stderr, "unknown key '%s'\n", key.c_str());
      return 2;
    }
  }
  const any_task task = make_task(task_name, to);
  if (!task.is_multi_turn()) {
    std::fprintf(stderr, "task %s is not multi-turn\n", task_name.c_str());
    return 2;
  }
  const multi_turn_task& mt = *task.multi_turn;
  std::vector<long> turns, tokens;
  long right = 0;
  // Replays `actions` of episode `index` and records its length.
  auto record = [&](std::uint64_t index, const std::vector<std::string>& actions) {
    auto env = mt.make_environment();
    long t = 1 + 2 + static_cast<long>(env->reset(mt.episode_seed(split, index)).size());
    for (std::size_t a = 0; a < actions.size(); ++a) {
      t += 2 + static_cast<long>(actions[a].size());
      const env_step s = env->step(actions[a]);
      right += s.reward == 1.0;
      if (s.done || a + 1 == actions.size())
        break;
      t += 2 + static_cast<long>(s.observation.size());
    }
    turns.push_back(static_cast<long>(actions.size()));
    tokens.push_back(t);
  };
  if (checkpoint.empty()) {
    const auto demos = make_episode_demonstrations(mt, split, 0, static_cast<std::size_t>(n), wrong, to.seed);
    for (std::size_t i = 0; i < demos.size(); ++i) {
      std::vector<std::string> actions;
      for (const auto& m : demos[i].chat)
        if (m.role == chat_role::assistant) actions.push_back(m.content);
      record(i, actions);
    }
    std::printf("%s demonstrations: %ld episodes, wrong_fraction %.2f, task seed %llu\n",
                task_name.c_str(), n, wrong, static_cast<unsigned long long>(to.seed));
  } else {
    at::set_num_threads(1);
    const auto dir = latest_checkpoint(checkpoint);
    if (!dir) {
      std::fprintf(stderr, "no checkpoint under %s\n", checkpoint.c_str());
      return 2;
    }
    policy_model model(preset(preset_name), 0);
    load_checkpoint(*dir, model.parameters());
    model.refresh_compute_weights();
    byte_tokenizer tok;
    eval_options eo;
    eo.split = split;
    eo.count = n;
    eo.max_new_tokens = max_new;
    eo.greedy = greedy;
    eo.temperature = 1.0;
    eo.keep_samples = n;
    const eval_report rep = evaluate(model, tok, mt, eo);
    for (const eval_sample& s : rep.samples) {
      std::vector<std::string> actions;
      for (std::size_t from = 0;;) { // eval_sample joins the actions with " | "
        const auto bar = s.completion.find(" | ", from);
        actions.push_back(s.completion.substr(from, bar - from));
        if (bar == std::string::npos) break;
        from = bar + 3;
      }
      record(s.index, actions);
      if (static_cast<long>(s.index) < show)
        std::printf("episode %llu: %s\n  actions: %s\n  reward %.0f: %s\n",
                    static_cast<unsigned long long>(s.index), s.prompt.c_str(),
                    s.completion.c_str(), s.reward, s.reason.c_str());
    }
    std::printf("%s %s from %s: %ld episodes, accuracy %.3f\n", task_name.c_str(),
                greedy ? "decoded greedily" : "sampled at temperature 1", dir->string().c_str(), n,
                rep.accuracy);
  }
  std::printf("success %.3f\n", static_cast<double>(right) / static_cast<double>(turns.size()));
  print("turns", turns);
  print("tokens", tokens);
  if (!out.empty()) {
    std::FILE* f = std::fopen(out.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "sorl_episode_lengths: cannot write %s\n", out.c_str());
      return 1;
    }
    std::fprintf(f, "tokens,turns\n");
    for (std::size_t i = 0; i < tokens.size(); ++i)
      std::fprintf(f, "%ld,%ld\n", tokens[i], turns[i]);
    if (std::fclose(f) != 0) {
      std::fprintf(stderr, "sorl_episode_lengths: cannot write %s\n", out.c_str());
      return 1;
    }
    std::printf("wrote %zu episodes to %s\n", tokens.size(), out.c_str());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "sorl_episode_lengths: %s\n", e.what());
  return 1;
}
