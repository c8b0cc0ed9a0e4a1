// The sorl command line: `sorl train`, `sorl sft`, `sorl node`, `sorl check`,
// `sorl convert-gguf`, `sorl export-hf`, `sorl eval`, `sorl roles`, `sorl metrics`,
// `sorl config`. Every command that reads an experiment file takes `--set TABLE.KEY=VALUE`
// overrides (runtime/config.hpp parse_config); `check`, `roles` and `metrics` print JSON with
// `--json`.

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <vector>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "actors/cli_reference.hpp"
#include "actors/common/train_setup.hpp"
#include "actors/roles.hpp"
#include "runtime/ml/formats/checkpoint.hpp"
#include "runtime/ml/policy/device.hpp"
#include "runtime/ml/formats/gguf_import.hpp"
#include "runtime/ml/train/hf_eval.hpp"
#include "runtime/ml/train/sft.hpp"
#include "runtime/config.hpp"
#include "runtime/config_reference.hpp"
#include "runtime/config_resolved.hpp"
#include "runtime/ml/policy/cpu_kernels.hpp"
#include "runtime/interrupt.hpp"
#include "runtime/log.hpp"
#include "runtime/version.hpp"
#include "runtime/metrics.hpp"
#include "runtime/role_names.hpp"
#include "runtime/topology.hpp"

namespace {

namespace fs = std::filesystem;

/// The default job's config: next to the working directory first, then in the source tree
/// this binary was built from, so `build/sorl train` works from anywhere in a checkout.
std::string default_config() {
  const char* name = "configs/default.toml";
  std::error_code ec;
  if (fs::exists(name, ec))
    return name;
  auto in_tree = fs::path{SORL_SOURCE_DIR} / name;
  if (fs::exists(in_tree, ec))
    return in_tree.string();
  return name;
}

/// CONFIG with the `--set` overrides applied (runtime/config.hpp parse_config), its training
/// topology, model and task checked; exits 2 after printing every error.
sorl::experiment_config load_or_exit(const std::string& path,
                                     const std::vector<std::string>& overrides) {
  try {
    auto cfg = sorl::load_config(path, sorl::role_names(sorl::builtin_roles()), overrides);
    // A training topology needs every training role; say so before anything starts.
    const auto missing = sorl::role::missing_for_training(
      [&](std::string_view role) { return cfg.count_role(role); });
    if (!missing.empty()) {
      std::cerr << path << ": [[node]]: a topology with a trainer also needs: " << missing
                << '\n';
      std::cerr << "sorl: " << path << ": nothing started\n";
      std::exit(2);
    }
    // A training topology builds its task now, so a malformed dataset stops everything
    // before any actor (or the warm start) runs.
    for (const auto& n : cfg.nodes)
      for (const auto& a : n.actors)
        if (a.role == sorl::role::trainer || a.role == sorl::role::rollout_worker
            || a.role == sorl::role::learner) {
          try {
            // A model directory's config.json and tokenizer are read here, so their errors
            // come before anything runs too.
            sorl::model_dims_from(cfg);
            sorl::prompt_format_from(cfg);
          } catch (const std::exception& e) {
            std::cerr << path << ": [model] hf_dir: " << e.what() << '\n';
            std::cerr << "sorl: " << path << ": nothing started\n";
            std::exit(2);
          }
          try {
            sorl::make_task_from(cfg);
          } catch (const std::exception& e) {
            std::cerr << path << ": [task]: " << e.what() << '\n';
            std::cerr << "sorl: " << path << ": nothing started\n";
            std::exit(2);
          }
          return cfg;
        }
    return cfg;
  } catch (const sorl::config_exception& e) {
    for (const auto& err : e.errors())
      std::cerr << err.to_string() << '\n';
    std::cerr << "sorl: " << path << ": " << e.errors().size()
              << (e.errors().size() == 1 ? " error" : " errors") << ", nothing started\n";
    std::exit(2);
  }
}

/// Says how an interrupted run ends and how to continue it; returns 128 + the signal.
int report_interrupted(const char* what, const sorl::run_result& r, int signo,
                       const sorl::experiment_config& cfg, const std::string& resume_hint) {
  fmt::print(stderr, "sorl {}: interrupted by {}: {}\n", what, sorl::signal_name(signo), r.why);
  std::error_code ec;
  auto latest = fs::path{cfg.run.run_dir()} / "checkpoints" / "latest";
  if (!resume_hint.empty() && fs::exists(latest, ec))
    fmt::print(stderr, "sorl {}: continue the run with: {}\n", what, resume_hint);
  return sorl::interrupted_exit_code(signo);
}

/// ` --set 'KEY=VALUE'` for each override, quoted for a POSIX shell, so that a printed
/// command (how to resume) runs with the same settings.
std::string set_arguments(const std::vector<std::string>& overrides) {
  std::string out;
  for (const auto& o : overrides) {
    const bool plain = std::all_of(o.begin(), o.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("._-=/:,+", c);
    });
    std::string quoted = "'";
    for (char c : o)
      quoted += c == '\'' ? std::string{"'\\''"} : std::string(1, c);
    out += " --set " + (plain ? o : quoted + "'");
  }
  return out;
}

int report(const char* what, const sorl::run_result& r) {
  if (r.exit_code == 0)
    fmt::print("sorl {}: job finished: {}\n", what, r.why);
  else
    fmt::print(stderr, "sorl {}: job failed: {}\n", what, r.why);
  return r.exit_code;
}

/// Runs the supervised warm start of `cfg` and prints a progress line per step.
int run_warm_start(const sorl::experiment_config& cfg) {
  auto opts = sorl::sft_options_from(cfg);
  if (opts.output_dir.empty()) {
    std::cerr << "sorl sft: " << cfg.file << ": set model.checkpoint, the directory the warm "
              << "start writes\n";
    return 2;
  }
  fmt::print("sorl sft: {} preset, task {}, {} steps of {} demonstrations ({:.0f}% drawn wrong) "
             "→ {}\n",
             opts.preset, opts.task, opts.steps, opts.batch_size, 100 * opts.wrong_fraction,
             opts.output_dir);
  std::fflush(stdout);
  try {
    auto report = sorl::ml::run_sft(opts, [](const sorl::ml::sft_progress& p) {
      if (p.eval) {
        fmt::print("  step {:>5}/{}  held-out accuracy {:.3f} (greedy, {} prompts)\n", p.step,
                   p.steps, p.eval->accuracy, p.eval->count);
      } else if (p.step % 25 == 0 || p.step == p.steps) {
        fmt::print("  step {:>5}/{}  loss {:.4f}  lr {:.2e}  {:.0f} tok/s  {:.0f} s\n", p.step,
                   p.steps, p.loss, p.lr, p.tokens_per_second, p.elapsed_seconds);
      }
      std::fflush(stdout);
    });
    fmt::print("sorl sft: accuracy {} → {} in {:.1f} s; {} of {} pool demonstrations wrong; "
               "checkpoint {}\n",
               report.before ? fmt::format("{:.3f}", report.before->accuracy) : "n/a",
               report.after ? fmt::format("{:.3f}", report.after->accuracy) : "n/a",
               report.total_seconds, report.wrong_in_pool, report.pool_size,
               report.checkpoint.string());
    for (const auto& dir : report.removed_stale)
      fmt::print("sorl sft: removed {}, left by a checkpoint write that did not finish\n", dir.string());
    std::fflush(stdout); // ahead of the log lines (stderr) of what runs next
  } catch (const std::exception& e) {
    std::cerr << "sorl sft: " << e.what() << '\n';
    return 1;
  }
  return 0;
}

/// `sorl check`: where the warm-start checkpoint is, or that `sorl train` will make it there
/// (the path is relative to the config file, so a copied config gets its own).
void print_warm_start(const sorl::experiment_config& cfg) {
  if (!cfg.model.warm_start || cfg.count_role(sorl::role::learner) == 0)
    return;
  try {
    if (auto p = sorl::ml::latest_checkpoint(cfg.model.checkpoint)) {
      fmt::print("warm start: {}\n", p->string());
      return;
    }
    fmt::print("warm start: none under {} yet; `sorl train` makes it first with `sorl sft`\n",
               cfg.model.checkpoint);
    // The warm start that one starts from must exist before it can be made.
    if (cfg.sft.init_checkpoint.empty())
      return;
    if (auto p = sorl::ml::latest_checkpoint(cfg.sft.init_checkpoint))
      fmt::print("warm start from: {}\n", p->string());
    else
      fmt::print("warm start from: none under {} yet (sft.init_checkpoint); write it first\n",
                 cfg.sft.init_checkpoint);
  } catch (const std::exception& e) {
    fmt::print("warm start: {}: {}\n", cfg.model.checkpoint, e.what());
  }
}

/// `sorl check --json`'s "warm_start": null when the topology needs none, else
/// {"checkpoint": model.checkpoint, "latest": the checkpoint there or null (`sorl train` makes
/// it first)}.
nlohmann::ordered_json warm_start_json(const sorl::experiment_config& cfg) {
  if (!cfg.model.warm_start || cfg.count_role(sorl::role::learner) == 0)
    return nullptr;
  nlohmann::ordered_json latest = nullptr;
  try {
    if (auto p = sorl::ml::latest_checkpoint(cfg.model.checkpoint))
      latest = p->string();
  } catch (const std::exception&) {
    // Unreadable now: reported as not there; `sorl train` names the problem when it starts.
  }
  return {{"checkpoint", cfg.model.checkpoint}, {"latest", latest}};
}

/// With model.warm_start, creates the warm-start checkpoint when there is none yet.
int ensure_warm_start(const sorl::experiment_config& cfg) {
  if (!cfg.model.warm_start)
    return 0;
  try {
    if (sorl::ml::latest_checkpoint(cfg.model.checkpoint))
      return 0;
  } catch (const std::exception& e) {
    std::cerr << "sorl: model.checkpoint " << cfg.model.checkpoint << ": " << e.what() << '\n';
    return 2;
  }
  fmt::print("sorl: no warm-start checkpoint under {} yet: running `sorl sft` first\n",
             cfg.model.checkpoint);
  // The warm start keeps no checkpoints of its own: a signal ends it at once, saying so, and
  // the next `sorl train` starts it over (its output directory is only written at the end).
  sorl::interrupt_watch interrupts;
  interrupts.on_first([](int signo) {
    std::fprintf(stderr,
                 "sorl: interrupted by %s during the warm start; nothing was saved, and the "
                 "same command starts the warm start over\n",
                 sorl::signal_name(signo).c_str());
    std::fflush(stderr);
    std::_Exit(sorl::interrupted_exit_code(signo));
  });
  return run_warm_start(cfg);
}

/// Refuses to start a fresh run over an existing one unless asked to.
int check_run_dir(const sorl::experiment_config& cfg, bool resume, bool overwrite) {
  if (cfg.count_role(sorl::role::trainer) == 0)
    return 0;
  auto dir = fs::path{cfg.run.run_dir()};
  // error_code overloads: the config loader vetted the path, but a permission can change.
  std::error_code ec;
  if (!fs::exists(dir, ec) && ec) {
    std::cerr << "sorl: run directory " << dir.string() << ": " << ec.message() << '\n';
    return 2;
  }
  auto exists = [&](const fs::path& p) { return fs::exists(p, ec); };
  if (resume && !exists(dir / "checkpoints")) {
    std::cerr << "sorl: --resume: " << (dir / "checkpoints").string()
              << " does not exist: nothing to resume (start the run without --resume)\n";
    return 2;
  }
  if (resume || overwrite)
    return 0;
  if (!exists(dir / "metrics.jsonl") && !exists(dir / "checkpoints"))
    return 0;
  std::cerr << "sorl: " << dir.string() << " already holds a run; continue it with --resume, "
            << "replace it with --overwrite, or choose another run.name / run.output_dir\n";
  return 2;
}

/// Writes run_dir/config.resolved.toml; on resume, says what differs from the last session.
int save_resolved_config(const sorl::experiment_config& cfg, bool resume) {
  try {
    auto w = sorl::write_resolved_config(cfg, resume);
    if (!w.changes.empty()) {
      std::string list;
      for (const auto& c : w.changes)
        list += "\n  " + c;
      spdlog::warn("--resume with settings that differ from the run's previous session (its "
                   "resolved configuration is kept as {}):{}",
                   w.previous.string(), list);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "sorl: " << e.what() << '\n';
    return 2;
  }
}

/// True when `node` (or, without one, any node) hosts the learner.
bool hosts_role(const sorl::experiment_config& cfg, const std::string& node, std::string_view role) {
  for (const auto& n : cfg.nodes)
    if (node.empty() || n.name == node)
      for (const auto& a : n.actors)
        if (a.role == role)
          return true;
  return false;
}

bool hosts_learner(const sorl::experiment_config& cfg, const std::string& node) {
  return hosts_role(cfg, node, sorl::role::learner);
}

/// The devices of the roles `node` hosts (all nodes when empty) are ones this libtorch has,
/// checked before anything starts: a CUDA device in a build against Debian's CPU-only
/// libtorch is a clear error here, not a role failing mid-start. Returns 2 after printing
/// why, else 0.
int check_devices(const sorl::experiment_config& cfg, const std::string& node) {
  try {
    if (hosts_learner(cfg, node))
      sorl::ml::device_from(cfg.run.device, "run.device");
    if (hosts_role(cfg, node, sorl::role::rollout_worker)) {
      const auto& d = cfg.rollout.device;
      sorl::ml::device_from(d.empty() ? cfg.run.device : d, d.empty() ? "run.device" : "rollout.device");
    }
  } catch (const std::invalid_argument& ex) {
    std::cerr << "sorl: " << cfg.file << ": " << ex.what() << "; nothing started\n";
    return 2;
  }
  return 0;
}

void print_topology(const sorl::experiment_config& cfg) {
  fmt::print("{}: run \"{}\", {} node{}\n", cfg.file, cfg.run.name, cfg.nodes.size(),
             cfg.nodes.size() == 1 ? "" : "s");
  for (const auto& n : cfg.nodes) {
    std::string roles;
    for (const auto& a : n.actors)
      roles += fmt::format("{}{}×{}", roles.empty() ? "" : ", ", a.role, a.count);
    fmt::print("  node {:<12} {:<24} {}\n", n.name,
               n.listen                ? "listen " + n.listen->to_string()
               : cfg.nodes.size() == 1 ? std::string{"single node"}
                                       : std::string{"connects to the hub"},
               roles);
  }
}

/// Says what a preset changed (after pin_cpu_kernels, which may start the process again).
void print_presets(const sorl::experiment_config& cfg) {
  if (auto presets = sorl::preset_summary(cfg); !presets.empty())
    fmt::print("{}: {}\n", cfg.file, presets);
}

/// Pins the CPU kernels (runtime/ml/policy/cpu_kernels.hpp) when `cfg` asks for portable ones, in a
/// process that trains or decodes (`node` names it: only its own roles count; `sft`: it is
/// `sorl sft`, which trains whatever roles the file names), and logs them; the others skip
/// the restart.
void pin_cpu_kernels(char** argv, const sorl::experiment_config& cfg, const std::string& node,
                     bool sft = false) {
  bool ml = sft;
  for (const auto& n : cfg.nodes)
    if (node.empty() || n.name == node)
      for (const auto& a : n.actors)
        ml = ml || a.role == sorl::role::trainer || a.role == sorl::role::learner
             || a.role == sorl::role::rollout_worker;
  if (!ml)
    return;
  const bool portable =
    cfg.run.kernels == sorl::kernels_kind::portable && !std::getenv("SORL_NATIVE_KERNELS");
  if (portable)
    sorl::pin_cpu_kernels(argv);
  spdlog::info("CPU kernels: {}", sorl::cpu_kernels_summary());
  if (portable && sorl::loaded_blas().find("openblas") == std::string::npos)
    spdlog::warn("the BLAS is not OpenBLAS: results differ from those of machines with it "
                 "(scripts/install-deps installs libopenblas0-pthread)");
}

/// The checkpoint step directory `export-hf` and `eval` read for CONFIG: `explicit_dir` (a step
/// directory or a checkpoint root) when given, else the run's latest checkpoint, else the
/// latest under model.checkpoint. nullopt for a model.hf_dir config with no checkpoint at all
/// (its own weights are the policy). Throws std::runtime_error saying what is missing.
std::optional<fs::path> policy_checkpoint(const sorl::experiment_config& cfg,
                                          const std::string& explicit_dir) {
  auto step_dir = [](const fs::path& p) -> std::optional<fs::path> {
    if (fs::exists(p / "state.json"))
      return p;
    return sorl::ml::latest_checkpoint(p);
  };
  if (!explicit_dir.empty()) {
    auto d = step_dir(explicit_dir);
    if (!d)
      throw std::runtime_error(fmt::format("--checkpoint {}: no checkpoint there", explicit_dir));
    return d;
  }
  if (auto run = step_dir(fs::path{cfg.run.run_dir()} / "checkpoints"))
    return run;
  if (!cfg.model.checkpoint.empty()) {
    if (auto warm = step_dir(cfg.model.checkpoint))
      return warm;
    throw std::runtime_error(fmt::format("no checkpoint under {}/checkpoints or model.checkpoint {} "
                                         "(run `sorl train` or `sorl sft` first)",
                                         cfg.run.run_dir(), cfg.model.checkpoint));
  }
  if (!cfg.model.hf_dir.empty())
    return std::nullopt;
  throw std::runtime_error(
    fmt::format("no checkpoint under {}/checkpoints and no model.checkpoint", cfg.run.run_dir()));
}

/// CONFIG's policy as the rollout workers serve it: the weights of policy_checkpoint (or
/// model.hf_dir's own) rounded to bf16 (round to nearest even, as the sync publishes them),
/// held in fp32, and where they came from. A checkpoint's fp32 master carries bits below
/// bf16 that no rollout ever sampled with (ARCHITECTURE.md §6, "Exactly on-policy"), so
/// `export-hf` and `eval` leave them out, whatever `export-hf --dtype` writes.
std::pair<sorl::ml::policy_model, std::string> load_config_policy(const sorl::experiment_config& cfg,
                                                                  const std::string& explicit_dir) {
  const auto dir = policy_checkpoint(cfg, explicit_dir);
  const auto dims = sorl::model_dims_from(cfg);
  auto served = [](sorl::ml::policy_model m) {
    at::NoGradGuard no_grad;
    for (const auto& [name, t] : m.parameters())
      t.copy_(t.to(at::kBFloat16).to(at::kFloat));
    return m;
  };
  if (!dir) {
    sorl::ml::hf_load_options lo;
    lo.max_seq = dims.max_seq;
    return {served(std::move(sorl::ml::load_hf_model(cfg.model.hf_dir, lo).model)), cfg.model.hf_dir};
  }
  sorl::ml::policy_model model(dims, cfg.run.seed);
  sorl::ml::load_checkpoint(*dir, model.parameters());
  return {served(std::move(model)), dir->string()};
}

/// Prepares OUT for `convert-gguf` / `export-hf`: a directory that already holds a Hugging Face
/// model is refused unless `overwrite`, and then that model's files go first, so that none of
/// them (a shard index, special_tokens_map.json) is left to change the new model when
/// transformers loads it. Other files (scripts/fetch-model's `original/`) are kept.
/// Returns 0, or 2 after saying why.
int prepare_hf_out_dir(const fs::path& out, bool overwrite, const char* command) {
  static const char* const model_files[] = {
    "config.json",       "generation_config.json", "model.safetensors", "model.safetensors.index.json",
    "tokenizer.json",    "tokenizer_config.json",  "special_tokens_map.json", "added_tokens.json",
    "vocab.json",        "merges.txt",             "tokenizer.model"};
  std::error_code ec;
  std::vector<fs::path> present;
  if (fs::is_directory(out, ec))
    for (const auto& entry : fs::directory_iterator(out, ec)) {
      const std::string name = entry.path().filename().string();
      bool ours = name.rfind("model-", 0) == 0 && name.size() > 12
                  && name.compare(name.size() - 12, 12, ".safetensors") == 0;
      for (const char* f : model_files)
        ours = ours || name == f;
      if (ours)
        present.push_back(entry.path());
    }
  if (present.empty())
    return 0;
  if (!overwrite) {
    std::cerr << "sorl " << command << ": " << out.string() << " already holds a model ("
              << present.front().filename().string() << ", ...); pass --overwrite to replace it\n";
    return 2;
  }
  for (const auto& p : present) {
    fs::remove(p, ec);
    if (ec) {
      std::cerr << "sorl " << command << ": cannot remove " << p.string() << ": " << ec.message() << '\n';
      return 2;
    }
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"sorl: synchronous on-policy RL of language models, as an actor system.\n"
               "One TOML file describes the experiment and which actors run on which node."};
  app.require_subcommand(1);
  app.fallthrough(); // --log-level may follow the subcommand too
  // Each subcommand has a footer of its own (CLI11 would copy this one into every one).
  const std::string exit_codes =
    "Exit codes: 0 job finished, 1 job failed, 2 nothing started, 130 / 143 stopped by\n"
    "SIGINT / SIGTERM (after a checkpoint; a second signal exits at once).";
  app.footer("Examples (`sorl COMMAND --help` shows each command's own):\n"
             "  sorl train                       the default job (configs/default.toml)\n"
             "  sorl check configs/smoke.toml    validate a file and print its topology\n"
             "  sorl train configs/smoke.toml    topology smoke run, no ML\n"
             + exit_codes);
  app.set_version_flag("--version", sorl::version_line(), "print the version and the commit built from");
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical, off")
    ->capture_default_str();

  // Only one subcommand runs, so they share these.
  std::vector<std::string> overrides;
  auto add_set = [&](CLI::App* cmd) {
    cmd->add_option("--set", overrides,
                    "set a key of CONFIG after reading it, checked as the file's own line would\n"
                    "be; repeatable, the last of a key wins. VALUE is TOML (20, 1e-5, true, \"x\"),\n"
                    "or a bare word taken as a string; node.NAME.KEY=VALUE sets a [[node]]'s key")
      ->type_name("TABLE.KEY=VALUE")
      ->allow_extra_args(false); // one value per --set: a CONFIG after it stays CONFIG
  };
  bool json_output = false;
  auto add_json = [&](CLI::App* cmd, const char* what) { cmd->add_flag("--json", json_output, what); };

  std::string train_config;
  bool resume = false;
  auto* train = app.add_subcommand(
    "train", "Run every node of CONFIG in this one process (debugging, CI, the default job)");
  train->footer("Examples:\n"
                "  sorl train                                   the default job (configs/default.toml)\n"
                "  sorl train configs/default.toml --set run.steps=20 --set run.name=short\n"
                "                                               the same job for 20 steps, in runs/short\n"
                "  sorl train configs/default.toml --resume     continue the default job after a stop\n"
                + exit_codes);
  train->add_option("config", train_config,
                    "experiment + topology TOML (default: configs/default.toml)");
  add_set(train);
  bool overwrite = false;
  train->add_flag("--overwrite", overwrite,
                  "start afresh even if the run directory already holds a run (its metrics "
                  "and checkpoints are replaced)");
  auto* train_overwrite = train->get_option("--overwrite");
  train->add_flag("--resume", resume,
                  "continue from the latest checkpoint in the run directory (run.output_dir/"
                  "run.name/checkpoints): model, optimizer, step, trainer counters, "
                  "group-size controller and scheduler state")
    ->excludes(train_overwrite);

  std::string sft_config;
  auto* sft = app.add_subcommand(
    "sft", "Supervised warm start: train CONFIG's [model] on demonstrations of its [task]\n"
           "(with a share of wrong ones, [sft]) and write a checkpoint to model.checkpoint");
  sft->footer("Examples:\n"
              "  sorl sft configs/default.toml      the default job's warm start\n"
              "                                     (runs/warm-start/arithmetic-tiny-carry)\n"
              "  sorl sft configs/default.toml --set sft.steps=300 --set model.checkpoint=/tmp/warm\n"
              "                                     a shorter one, written elsewhere");
  sft->add_option("config", sft_config, "experiment TOML")->required();
  add_set(sft);

  std::string node_config;
  sorl::node_options node_opts;
  std::string connect;
  auto* node = app.add_subcommand(
    "node", "Run one node of CONFIG as this process; the node with `listen` is the hub,\n"
            "the others connect to it. Start one `sorl node` per [[node]] of the file.");
  node->footer("Examples:\n"
               "  sorl node configs/default-3proc.toml --node main        the hub, first\n"
               "  sorl node configs/default-3proc.toml --node rollout-a   a worker node; it finds the hub\n"
               "  sorl node configs/smoke.toml --node main --set node.main.listen=127.0.0.1:0 \\\n"
               "      --port-file hub.port            the hub on a free port, written to hub.port\n"
               + exit_codes);
  node->add_option("config", node_config, "experiment + topology TOML")->required();
  node->add_option("--node", node_opts.node, "name of the [[node]] to run")->required();
  node->add_option("--connect", connect,
                   "HOST:PORT of the hub, overriding its `listen` (e.g. when it used port 0)");
  node->add_option("--port-file", node_opts.port_file,
                   "hub only: write the bound port to this file once listening");
  add_set(node);
  auto* node_resume =
    node->add_flag("--resume", resume, "continue from the run directory's latest checkpoint");
  node->add_flag("--overwrite", overwrite, "start afresh over an existing run (hub)")
    ->excludes(node_resume);

  std::string check_config;
  auto* check = app.add_subcommand(
    "check", "Dry run: validate CONFIG (and --set) as `train` and `node` would, print its\n"
             "topology and warm start, without starting anything (no actor, socket, model\n"
             "or run directory)");
  check->footer("Examples:\n"
                "  sorl check configs/default-3proc.toml                  the nodes and their actors\n"
                "  sorl check configs/default.toml --set algorithm.name=dapo\n"
                "                                     what DAPO's preset changes, before a run\n"
                "  sorl check configs/smoke.toml --json                   the same as one JSON document\n"
                "Exit codes: 0 the file is valid, 2 it is not (every error printed).");
  check->add_option("config", check_config, "experiment + topology TOML")->required();
  add_set(check);
  add_json(check, "print the topology and every resolved setting as one JSON document\n"
                  "instead (runtime/config_resolved.hpp check_json)");

  std::string gguf_in, hf_out, hf_dtype = "bf16";
  auto* convert_gguf = app.add_subcommand(
    "convert-gguf", "Convert a llama.cpp GGUF model (Llama or Qwen2; F32, F16, BF16, Q4_0, Q4_1\n"
                    "or Q8_0 tensors, dequantised) into a Hugging Face model directory");
  convert_gguf->footer(
    "Example:\n"
    "  sorl convert-gguf models/smollm2-135m-instruct/original/SmolLM2-135M-Instruct.Q4_1.gguf \\\n"
    "      models/smollm2-q4_1                  scripts/fetch-model's GGUF, as bf16 safetensors");
  convert_gguf->add_option("gguf", gguf_in, "the .gguf file")->required();
  convert_gguf->add_option("out", hf_out, "output directory (config.json, model.safetensors, ...)")
    ->required();
  convert_gguf->add_option("--dtype", hf_dtype, "weights' dtype in the output: bf16 or fp32")
    ->check(CLI::IsMember({"bf16", "fp32"}))
    ->capture_default_str();
  bool hf_overwrite = false;
  convert_gguf->add_flag("--overwrite", hf_overwrite,
                         "replace a model already in OUT (its files are removed first)");

  std::string export_config, export_out, export_checkpoint, export_dtype = "bf16";
  auto* export_hf = app.add_subcommand(
    "export-hf", "Write CONFIG's policy from a checkpoint as a Hugging Face model directory\n"
                 "(config.json, model.safetensors, tokenizer.json, tokenizer_config.json)");
  export_hf->footer("Examples:\n"
                    "  sorl export-hf configs/default.toml runs/default/hf\n"
                    "                                     the default run's latest checkpoint\n"
                    "  sorl export-hf configs/default.toml runs/default/hf-step10 \\\n"
                    "      --checkpoint runs/default/checkpoints/step-0000000010");
  export_hf->add_option("config", export_config, "experiment TOML (its [model] preset or hf_dir)")->required();
  export_hf->add_option("out", export_out, "output directory")->required();
  add_set(export_hf);
  export_hf->add_option("--checkpoint", export_checkpoint,
                        "a checkpoint step directory or root (default: the run's latest "
                        "checkpoint, else model.checkpoint)");
  export_hf->add_option("--dtype", export_dtype,
                        "weights' dtype in the output: bf16 or fp32 (either way the bf16 weights the\n"
                        "rollout workers serve; fp32 widens them exactly)")
    ->check(CLI::IsMember({"bf16", "fp32"}))
    ->capture_default_str();
  export_hf->add_flag("--overwrite", hf_overwrite,
                      "replace a model already in OUT (its files are removed first)");

  std::string eval_model, eval_data, eval_checker = "first_number", eval_out, eval_system,
    eval_checkpoint;
  sorl::ml::hf_eval_options eval_opts;
  auto* eval = app.add_subcommand(
    "eval", "Score a Hugging Face model directory, or a run's policy, on a JSONL held-out set\n"
            "(scripts/fetch-data): accuracy, pass@k, mean length; each prompt is one user message\n"
            "of the model's chat template (sorl's byte format for a preset and for the export of a\n"
            "single-turn sorl policy), answers scored by a built-in checker");
  eval->footer("Examples:\n"
               "  sorl eval models/smollm2-135m-instruct data/chain_sum/eval.jsonl --limit 50\n"
               "                                     the pretrained model, greedy\n"
               "  sorl eval configs/smollm2-chain_sum.toml data/chain_sum/eval.jsonl --k 4\n"
               "                                     that run's latest policy, pass@4");
  eval->add_option("model", eval_model,
                   "Hugging Face model directory (sorl export-hf writes one), or an experiment TOML:\n"
                   "its run's latest checkpoint (else model.checkpoint, else model.hf_dir) in its\n"
                   "prompt format")
    ->required();
  eval->add_option("--checkpoint", eval_checkpoint,
                   "with an experiment TOML: a checkpoint step directory or root to score instead");
  eval->add_option("data", eval_data, "JSONL: prompt, answer (and entry, for countdown)")->required();
  add_set(eval);
  auto* eval_checker_opt =
    eval->add_option("--checker", eval_checker,
                     "exact, first_number, last_number or countdown (default: an experiment "
                     "TOML's task.match when it is one of these, else first_number)")
      ->check(CLI::IsMember({"exact", "first_number", "last_number", "countdown"}));
  eval->add_option("--k", eval_opts.k, "completions per prompt: 1 = greedy, more = sampled (pass@k)")
    ->check(CLI::Range(1, 64))
    ->capture_default_str();
  eval->add_option("--temperature", eval_opts.temperature, "sampling temperature when k > 1")
    ->capture_default_str();
  eval->add_option("--max-new-tokens", eval_opts.max_new_tokens, "completion budget, tokens")
    ->check(CLI::Range(1, 1 << 20))
    ->capture_default_str();
  eval->add_option("--limit", eval_opts.limit, "score the first N items only (0 = all)")
    ->check(CLI::NonNegativeNumber);
  eval->add_option("--system", eval_system, "a system message before each prompt");
  eval->add_option("--seed", eval_opts.seed, "sampling seed")->capture_default_str();
  eval->add_option("--out", eval_out, "write the report (and every completion) to this JSON file");

  auto* roles = app.add_subcommand("roles", "List the roles a [[node]] can run");
  roles->footer("Examples:\n"
                "  sorl roles           one line per role: its name and what it does\n"
                "  sorl roles --json    {\"roles\": [{\"name\", \"description\"}, ...]}");
  add_json(roles, "print {\"roles\": [{\"name\", \"description\"}, ...]} instead, in the same order");
  auto* metrics =
    app.add_subcommand("metrics", "Print the keys of metrics.jsonl as a markdown table");
  metrics->footer("Examples:\n"
                  "  sorl metrics           the table docs/run-directory.md holds\n"
                  "  sorl metrics --json    {\"metrics\": [{\"key\", \"group\", \"type\", \"unit\", "
                  "\"meaning\"}, ...]}");
  add_json(metrics, "print the same keys as JSON: {\"metrics\": [{\"key\", \"group\", \"type\", "
                    "\"unit\", \"meaning\"}, ...]}");
  std::string config_format = "markdown";
  bool config_cli = false;
  auto* config = app.add_subcommand(
    "config", "Print the configuration reference: every key of the experiment file with its\n"
              "type, default, range and meaning (docs/config.md); with --cli, the command line's");
  config->add_option("--format", config_format,
                     "markdown, json, or toml (a file with every key at its default; not with --cli)")
    ->check(CLI::IsMember({"markdown", "json", "toml"}))
    ->capture_default_str();
  config->add_flag("--cli", config_cli,
                   "the command-line reference instead: every subcommand, argument and option, read "
                   "off this parser (docs/cli.md)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11's own codes (106, 109, ...) would contradict the documented 0 / 1 / 2.
    return app.exit(e) == 0 ? 0 : 2;
  }

  try {
    sorl::setup_logging(log_level, node->parsed() ? node_opts.node : "");
  } catch (const std::exception& e) {
    std::cerr << "sorl: " << e.what() << '\n';
    return 2;
  }

  if (config->parsed()) {
    if (config_cli && config_format == "toml") {
      std::cerr << "sorl config: --cli prints markdown or json\n";
      return 2;
    }
    // `app` is the parser that read this command line: the reference walks it, not a copy.
    if (config_cli)
      fmt::print("{}", config_format == "json" ? sorl::cli_reference_json(app, "sorl")
                                               : sorl::cli_reference_markdown(app, "sorl"));
    else if (config_format == "json")
      fmt::print("{}", sorl::config_reference_json(sorl::config_keys()));
    else if (config_format == "toml")
      fmt::print("{}", sorl::config_reference_toml(sorl::config_keys()));
    else
      fmt::print("{}", sorl::config_reference_markdown(sorl::config_keys()));
    return 0;
  }
  if (roles->parsed()) {
    if (json_output) {
      auto list = nlohmann::ordered_json::array();
      for (const auto& r : sorl::builtin_roles())
        list.push_back({{"name", r.name}, {"description", r.summary}});
      fmt::print("{}\n", nlohmann::ordered_json{{"roles", std::move(list)}}.dump(2));
      return 0;
    }
    for (const auto& r : sorl::builtin_roles())
      fmt::print("{:<20} {}\n", r.name, r.summary);
    return 0;
  }
  if (convert_gguf->parsed()) {
    if (int rc = prepare_hf_out_dir(hf_out, hf_overwrite, "convert-gguf"))
      return rc;
    try {
      const auto start = std::chrono::steady_clock::now();
      const auto conv = sorl::ml::convert_gguf_to_hf(
        gguf_in, hf_out, hf_dtype == "bf16" ? at::kBFloat16 : at::kFloat);
      const auto& c = conv.config;
      const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      fmt::print("{}: {} model, {} layers, d_model {}, {} query / {} key-value heads, vocab {}, "
                 "{} parameters "
                 "({:.1f} s){}\n",
                 hf_out, sorl::ml::hf_model_type(c.family), c.dims.n_layers, c.dims.d_model,
                 c.dims.n_heads, c.dims.n_kv_heads, c.dims.vocab, c.dims.parameter_count(), s,
                 conv.tokenizer ? "" : "; the file has no tokenizer, none written");
      return 0;
    } catch (const std::exception& e) {
      std::cerr << "sorl convert-gguf: " << e.what() << '\n';
      return 1;
    }
  }
  if (export_hf->parsed()) {
    auto cfg = load_or_exit(export_config, overrides);
    if (int rc = prepare_hf_out_dir(export_out, hf_overwrite, "export-hf"))
      return rc;
    try {
      auto [model, from] = load_config_policy(cfg, export_checkpoint);
      const auto dtype = export_dtype == "bf16" ? at::kBFloat16 : at::kFloat;
      std::string trained_in; // the prompt format recorded; an hf_dir's export keeps its source's
      if (cfg.model.hf_dir.empty()) {
        // The format the policy was trained in, so that `sorl eval OUT` and `[model] hf_dir =
        // OUT` prompt it as its checkpoint is prompted (runtime/ml/formats/prompt_format.hpp).
        const auto trained_as = sorl::ml::is_multi_turn_task(cfg.task.name)
                                  ? sorl::ml::sorl_prompt_format::chat
                                  : sorl::ml::sorl_prompt_format::byte;
        sorl::ml::save_hf_byte_model(model, export_out, trained_as, dtype);
        trained_in = fmt::format(", prompt format '{}'", sorl::ml::to_string(trained_as));
      } else {
        // The source directory's tokenizer and token ids, with the trained weights.
        const auto src = sorl::ml::read_hf_config(cfg.model.hf_dir);
        sorl::ml::hf_save_options o;
        o.family = src.family;
        o.dtype = dtype;
        o.bos_token_id = src.bos_token_id;
        o.eos_token_ids = src.eos_token_ids;
        o.pad_token_id = src.pad_token_id;
        o.max_position_embeddings = src.max_position_embeddings;
        sorl::ml::save_hf_model(model, export_out, o);
        for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
          if (fs::exists(fs::path{cfg.model.hf_dir} / f))
            fs::copy_file(fs::path{cfg.model.hf_dir} / f, fs::path{export_out} / f,
                          fs::copy_options::overwrite_existing);
      }
      fmt::print("{}: {} model from {} ({} parameters, {}: the bf16 weights the rollout workers "
                 "serve{}{})\n",
                 export_out, cfg.model.hf_dir.empty() ? cfg.model.preset : cfg.model.hf_dir, from,
                 model.dims().parameter_count(), export_dtype, dtype == at::kFloat ? ", widened exactly" : "",
                 trained_in);
      return 0;
    } catch (const std::exception& e) {
      std::cerr << "sorl export-hf: " << e.what() << '\n';
      return 1;
    }
  }
  if (eval->parsed()) {
    try {
      std::optional<sorl::experiment_config> eval_cfg;
      std::error_code ec;
      if (fs::is_regular_file(eval_model, ec))
        eval_cfg = load_or_exit(eval_model, overrides);
      else if (!overrides.empty())
        throw std::runtime_error("--set needs an experiment TOML as the model");
      if (eval_cfg && eval_checker_opt->count() == 0) {
        // Score as the run does where a built-in checker can.
        const auto match = eval_cfg->task.match;
        if (match == sorl::match_kind::integer)
          throw std::runtime_error("task.match \"integer\" has no eval checker; pass --checker");
        if (!eval_cfg->task.reward_command.empty())
          std::cerr << "sorl eval: the run scores with task.reward_command; eval scores with the "
                       "built-in checker '" << sorl::to_string(match) << "' (task.match)\n";
        eval_checker = std::string(sorl::to_string(match));
      }
      eval_opts.checker = sorl::ml::parse_answer_checker(eval_checker);
      eval_opts.max_batch = std::max<std::int64_t>(16, eval_opts.k);
      const auto items = sorl::ml::load_eval_items(eval_data, eval_opts.checker);
      std::optional<sorl::ml::policy_model> model;
      std::optional<sorl::ml::prompt_format> format;
      std::string from = eval_model;
      if (eval_cfg) {
        auto& cfg = *eval_cfg;
        if (!eval_system.empty()) {
          if (cfg.model.hf_dir.empty())
            throw std::runtime_error("--system: sorl's byte format has no system turn");
          cfg.task.system_prompt = eval_system;
        }
        auto loaded = load_config_policy(cfg, eval_checkpoint);
        model.emplace(std::move(loaded.first));
        from = loaded.second;
        format.emplace(sorl::prompt_format_from(cfg));
      } else {
        if (!eval_checkpoint.empty())
          throw std::runtime_error("--checkpoint needs an experiment TOML as the model");
        sorl::ml::hf_load_options lo;
        lo.max_seq = 4096;
        auto m = sorl::ml::load_hf_model(eval_model, lo);
        format.emplace(sorl::ml::prompt_format::hugging_face(eval_model, m.config.eos_token_ids, eval_system));
        model.emplace(std::move(m.model));
      }
      std::cerr << fmt::format("sorl eval: {} in prompt format '{}'\n", from, format->name());
      auto last = std::chrono::steady_clock::now();
      const auto start = last;
      eval_opts.progress = [&](std::int64_t done, std::int64_t all) {
        const auto now = std::chrono::steady_clock::now();
        if (done < all && now - last < std::chrono::seconds(5))
          return;
        last = now;
        std::cerr << fmt::format("sorl eval: {}/{} prompts, {:.0f} s\n", done, all,
                                 std::chrono::duration<double>(now - start).count());
      };
      const auto r = sorl::ml::evaluate_hf_model(*model, *format, items, eval_opts);
      fmt::print("{} ({}): {} prompts x {}  accuracy {:.3f}  pass@{} {:.3f}  mean score {:.3f}  mean length "
                 "{:.1f} tokens  truncated {:.3f}  {:.1f} s  {:.0f} tok/s\n",
                 eval_data, eval_checker, r.prompts, r.k, r.accuracy, r.k, r.pass_at_k, r.mean_score, r.mean_length,
                 r.truncated, r.seconds, r.tokens_per_second);
      if (!eval_out.empty()) {
        nlohmann::ordered_json j;
        j["model"] = eval_model;
        j["weights"] = from;
        j["prompt_format"] = std::string(format->name());
        j["data"] = eval_data;
        j["checker"] = eval_checker;
        j["k"] = r.k;
        j["prompts"] = r.prompts;
        j["accuracy"] = r.accuracy;
        j["pass_at_k"] = r.pass_at_k;
        j["mean_score"] = r.mean_score;
        j["mean_length_tokens"] = r.mean_length;
        j["truncated"] = r.truncated;
        j["seconds"] = r.seconds;
        j["tokens_per_second"] = r.tokens_per_second;
        j["items"] = nlohmann::ordered_json::array();
        for (const auto& it : r.items)
          j["items"].push_back({{"line", it.line}, {"scores", it.scores}, {"lengths", it.lengths},
                                {"completions", it.completions}});
        sorl::ml::write_file_atomically(
          eval_out, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
      }
      return 0;
    } catch (const std::exception& e) {
      std::cerr << "sorl eval: " << e.what() << '\n';
      return 1;
    }
  }
  if (metrics->parsed()) {
    fmt::print("{}", json_output ? sorl::metric::schema_json() : sorl::metric::markdown());
    return 0;
  }
  if (check->parsed()) {
    auto cfg = load_or_exit(check_config, overrides);
    if (json_output) {
      auto j = nlohmann::ordered_json::parse(sorl::check_json(cfg));
      j["warm_start"] = warm_start_json(cfg);
      fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
      return 0;
    }
    print_presets(cfg);
    print_topology(cfg);
    print_warm_start(cfg);
    fmt::print("sorl check: {} is valid; nothing was started (the dry run)\n", check_config);
    return 0;
  }
  if (sft->parsed()) {
    auto cfg = load_or_exit(sft_config, overrides);
    pin_cpu_kernels(argv, cfg, "", true);
    return run_warm_start(cfg);
  }
  if (train->parsed()) {
    if (train_config.empty())
      train_config = default_config();
    auto cfg = load_or_exit(train_config, overrides);
    pin_cpu_kernels(argv, cfg, "");
    print_presets(cfg);
    cfg.run.resume = resume;
    if (cfg.run.threads > 0)
      at::set_num_threads(static_cast<int>(cfg.run.threads));
    if (int rc = check_devices(cfg, ""))
      return rc;
    if (int rc = check_run_dir(cfg, resume, overwrite))
      return rc;
    if (overwrite) {
      std::error_code ec;
      fs::remove_all(fs::path{cfg.run.run_dir()} / "checkpoints", ec);
      if (ec) {
        std::cerr << "sorl: --overwrite: cannot remove " << cfg.run.run_dir()
                  << "/checkpoints: " << ec.message() << '\n';
        return 2;
      }
    }
    if (cfg.count_role(sorl::role::trainer) > 0)
      if (int rc = save_resolved_config(cfg, resume))
        return rc;
    if (hosts_learner(cfg, "") && !resume)
      if (int rc = ensure_warm_start(cfg))
        return rc;
    spdlog::info("sorl train: {} ({} node{} in one process)", cfg.file, cfg.nodes.size(),
                 cfg.nodes.size() == 1 ? "" : "s");
    sorl::interrupt_watch interrupts;
    auto r = sorl::run_in_process(cfg, sorl::builtin_roles(), nullptr, &interrupts);
    if (int sig = interrupts.received(); sig != 0 && r.exit_code != 0)
      return report_interrupted("train", r, sig, cfg,
                                fmt::format("{} train {}{} --resume", argv[0], train_config,
                                            set_arguments(overrides)));
    return report("train", r);
  }
  if (node->parsed()) {
    auto cfg = load_or_exit(node_config, overrides);
    // The address is checked before anything starts (no restart, no socket), like a
    // `listen` address in the file.
    if (!connect.empty()) {
      std::string why;
      auto ep = sorl::endpoint::parse(connect, &why);
      if (ep)
        why = cfg.network.plaintext_refusal(*ep, "connect to");
      if (!why.empty()) {
        std::cerr << "sorl node: --connect \"" << connect << "\": " << why
                  << "; nothing started\n";
        return 2;
      }
      node_opts.connect = *ep;
    }
    pin_cpu_kernels(argv, cfg, node_opts.node);
    print_presets(cfg);
    cfg.run.resume = resume;
    if (cfg.run.threads > 0)
      at::set_num_threads(static_cast<int>(cfg.run.threads));
    if (int rc = check_devices(cfg, node_opts.node))
      return rc;
    auto* self_node = cfg.find_node(node_opts.node);
    if (self_node && self_node->listen && !connect.empty()) {
      std::cerr << "sorl node: --connect is for the nodes that connect; " << node_opts.node
                << " is the hub and listens on " << self_node->listen->to_string() << '\n';
      return 2;
    }
    bool has_trainer = false;
    if (self_node)
      for (const auto& a : self_node->actors)
        has_trainer = has_trainer || a.role == sorl::role::trainer;
    if (has_trainer) {
      if (int rc = check_run_dir(cfg, resume, overwrite))
        return rc;
      if (int rc = save_resolved_config(cfg, resume))
        return rc;
    }
    if (hosts_learner(cfg, node_opts.node) && !resume)
      if (int rc = ensure_warm_start(cfg))
        return rc;
    sorl::interrupt_watch interrupts;
    node_opts.interrupts = &interrupts;
    auto r = sorl::run_node(cfg, sorl::builtin_roles(), node_opts);
    if (int sig = interrupts.received(); sig != 0 && r.exit_code != 0)
      return report_interrupted(
        "node", r, sig, cfg,
        has_trainer ? fmt::format("{} node {} --node NAME{} --resume, for every node of the file",
                                  argv[0], node_config, set_arguments(overrides))
                    : "");
    return report("node", r);
  }
  return 0;
}
