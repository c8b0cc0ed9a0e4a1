// war_bench: suffix speculative decoding measured on recorded and live rollouts of an
// experiment's workload (ARCHITECTURE.md §6 WAR). Every figure comes with its baseline from the
// same run.
//
//   war_bench record CONFIG OUT.jsonl [--groups N] [--group-size G] [--first N]
//       Runs N groups of G rollouts (default 32 x 4, task indices from --first, default 0) of
//       CONFIG's task with its model (model.checkpoint's latest, or model.hf_dir) on one
//       rollout worker, without speculation, and writes each policy turn as a JSON line
//       {"group", "prompt", "response"}: the context the turn was decoded from and the
//       tokens it sampled, in the order the rollouts finished (a multi-turn rollout gives one
//       line per action, its context being the transcript so far).
//   war_bench draft TRAJ.jsonl [--max-depth 32] [--max-spec-tokens 16] [--spec-factor 1]
//       [--min-token-prob 0.1]
//       Replays the lines through the suffix drafter (actors/suffix_index/suffix_drafter.hpp)
//       as bench/war/arctic_replay.py replays them through ArcticInference: per line, the
//       prompt starts a request; at each position a draft of at most min(max, tokens left - 1)
//       tokens is proposed (timed), its longest prefix equal to the recorded tokens counts as
//       accepted, and those plus one more token are emitted; the finished response enters the
//       global tree. Prints one JSON object (µs per call, acceptance, tokens per step).
//   war_bench throughput CONFIG [--batches 1,4,16,64] [--modes off,on,auto] [--rollouts N]
//       [--warm N] [--repeats R] [--json FILE]
//       For each batch size B and mode: a fresh worker with the config's weights first runs
//       --warm rollouts (default 32, other prompts) so that the global tree holds earlier
//       responses, as it would after earlier steps; then N rollouts (default max(4B, 64)) with
//       at most B in flight are timed. Rollouts are the same tokens in every mode (exact
//       verification), so the modes decode the same work. The modes run in turn, R rounds
//       (default 3); prints the median tokens/s, the median over rounds of the speed-up over
//       that round's "off", acceptance and mean accepted draft tokens per verifying step.
// draft and throughput write the run's record (bench/record.hpp: table "draft" or
// "throughput") to --record PATH, else $SORL_BENCH_RECORD, else runs/bench/.

#include "actors/common/train_setup.hpp"
#include "actors/roles.hpp"
#include "actors/rollout/worker_core.hpp"
#include "actors/sagc/timing.hpp"
#include "actors/suffix_index/suffix_drafter.hpp"
#include "bench/record_ml.hpp"
#include "bench/war/flag_values.hpp"
#include "bench/war/source_weights.hpp"
#include "runtime/config.hpp"
#include "runtime/ml/policy/torch_compat.hpp"
#include "runtime/role_names.hpp"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

using namespace sorl;
using json = nlohmann::json;
using sorl::bench::integer;
using sorl::bench::number;
using sorl::bench::source_weights;
using sorl::bench::split;

namespace {

// Flags of one subcommand: --key value pairs, every key among `known` (a typo is an error, not
// a silently ignored option).
std::map<std::string, std::string> flags(int argc, char** argv, int from, const std::vector<std::string>& known) {
  std::map<std::string, std::string> out;
  for (int i = from; i < argc; ++i) {
    const std::string k = argv[i];
    if (k.rfind("--", 0) != 0 || i + 1 >= argc) throw std::invalid_argument("expected --key value, got " + k);
    if (std::find(known.begin(), known.end(), k.substr(2)) == known.end())
      throw std::invalid_argument("unknown option " + k);
    out[k.substr(2)] = argv[++i];
  }
  return out;
}

std::string flag(const std::map<std::string, std::string>& f, const std::string& k, const std::string& dflt) {
  const auto it = f.find(k);
  return it == f.end() ? dflt : it->second;
}

std::unique_ptr<rollout::worker_core> make_worker(const experiment_config& cfg, const ml::named_tensors& weights,
                                                  rollout::worker_options o) {
  auto w = std::make_unique<rollout::worker_core>(model_dims_from(cfg), make_task_from(cfg), o,
                                                  prompt_format_from(cfg));
  std::map<std::string, at::Tensor> src(weights.begin(), weights.end());
  at::NoGradGuard no_grad;
  for (auto& [name, t] : w->model().parameters()) t.copy_(src.at(name));
  w->weights_changed();
  return w;
}

rollout::rollout_request request(const experiment_config& cfg, std::uint64_t id, std::uint64_t group,
                                 std::uint32_t sample, std::uint64_t task_index) {
  rollout::rollout_request r;
  r.request_id = id;
  r.group_id = group;
  r.sample_index = sample;
  r.task_index = task_index;
  r.seed = cfg.run.seed * 1000003 + group;
  r.max_new_tokens = static_cast<std::uint32_t>(cfg.task.max_new_tokens);
  r.temperature = cfg.algorithm.temperature;
  r.top_p = cfg.algorithm.top_p;
  r.top_k = static_cast<std::uint32_t>(cfg.algorithm.top_k);
  return r;
}

int record(const experiment_config& cfg, const std::string& out_path, const std::map<std::string, std::string>& f) {
  const auto groups = static_cast<std::uint64_t>(integer("groups", flag(f, "groups", "32"), 1, 1'000'000));
  const auto g = static_cast<std::uint32_t>(integer("group-size", flag(f, "group-size", "4"), 1, 4096));
  const auto first = static_cast<std::uint64_t>(integer("first", flag(f, "first", "0"), 0, 1ll << 40));
  rollout::worker_options o = rollout::worker_options_from(cfg);
  o.speculative = rollout::speculation_mode::off;
  auto w = make_worker(cfg, source_weights(cfg), o);
  std::uint64_t id = 1;
  for (std::uint64_t k = 0; k < groups; ++k)
    for (std::uint32_t i = 0; i < g; ++i) w->enqueue(request(cfg, id++, k, i, first + k));
  std::ofstream out(out_path);
  if (!out) throw std::runtime_error("cannot write " + out_path);
  std::uint64_t lines = 0, tokens = 0, later_turn = std::uint64_t{1} << 40;
  while (!w->idle()) {
    for (const auto& r : w->step()) {
      if (r.status == rollout::rollout_status::failed) continue;
      // Each run of policy tokens (mask 1) is a turn decoded from everything before it.
      for (std::size_t s = 0; s < r.response.size();) {
        if (r.loss_mask[s] == 0) {
          ++s;
          continue;
        }
        std::size_t e = s;
        while (e < r.response.size() && r.loss_mask[e] == 1) ++e;
        std::vector<std::int32_t> ctx = r.prompt;
        ctx.insert(ctx.end(), r.response.begin(), r.response.begin() + static_cast<std::ptrdiff_t>(s));
        const std::vector<std::int32_t> resp(r.response.begin() + static_cast<std::ptrdiff_t>(s),
                                             r.response.begin() + static_cast<std::ptrdiff_t>(e));
        out << json{{"group", s == 0 ? r.request.group_id : later_turn++}, {"prompt", ctx}, {"response", resp}}.dump()
            << '\n';
        ++lines;
        tokens += resp.size();
        s = e;
      }
    }
  }
  std::fprintf(stderr, "wrote %llu turns, %llu response tokens to %s\n", static_cast<unsigned long long>(lines),
               static_cast<unsigned long long>(tokens), out_path.c_str());
  return 0;
}

// The columns of a drafter's row: war_bench draft's record and bench/war/run.sh's, which adds
// ArcticInference's row to it.
std::vector<bench::record_column> draft_columns() {
  return {{"drafter", "drafter"},
          {"us_per_call", "per call", "µs", 2},
          {"us_per_call_p50", "p50 per call", "µs", 2},
          {"acceptance", "acceptance", "", 4},
          {"tokens_per_step", "tokens per step", "", 4},
          {"accepted", "accepted"},
          {"proposed", "proposed"}};
}

int draft(const std::string& path, const std::map<std::string, std::string>& f, bench::bench_record& rec) {
  suffix_index::drafter_options o;
  o.max_depth = static_cast<std::int32_t>(integer("max-depth", flag(f, "max-depth", "32"), 2, 256));
  o.draft.max_tokens = static_cast<std::int32_t>(integer("max-spec-tokens", flag(f, "max-spec-tokens", "16"), 1, 256));
  o.draft.spec_factor = number("spec-factor", flag(f, "spec-factor", "1.0"), 0.0, 64.0);
  o.draft.min_token_prob = number("min-token-prob", flag(f, "min-token-prob", "0.1"), 0.0, 1.0);
  o.global_bytes = static_cast<std::size_t>(
      integer("global-bytes", flag(f, "global-bytes", std::to_string(std::size_t{1} << 30)), 0, 1ll << 40));
  if (!std::filesystem::is_regular_file(path)) throw std::runtime_error(path + ": not a readable file");
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>>> lines;
  std::size_t lineno = 0;
  for (std::string line; std::getline(in, line);) {
    ++lineno;
    if (line.empty()) continue;
    try {
      const json j = json::parse(line);
      auto prompt = j.at("prompt").get<std::vector<std::int32_t>>();
      auto resp = j.at("response").get<std::vector<std::int32_t>>();
      for (const auto* v : {&prompt, &resp})
        for (const std::int32_t t : *v)
          if (t < 0) throw std::invalid_argument(fmt::format("negative token id {}", t));
      lines.emplace_back(std::move(prompt), std::move(resp));
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("{}:{}: {}", path, lineno, e.what()));
    }
  }
  if (lines.empty()) throw std::runtime_error(path + ": no trajectories");
  suffix_index::suffix_drafter dr(o);
  std::int64_t calls = 0, skipped = 0, proposed = 0, accepted = 0, steps = 0, tokens = 0;
  std::vector<std::int64_t> ns;
  const auto wall0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto& [prompt, resp] = lines[i];
    dr.start(i, 0, prompt.data(), prompt.size());
    const auto n = static_cast<std::int64_t>(resp.size());
    tokens += n;
    for (std::int64_t t = 0; t < n;) {
      const std::int64_t room = std::min<std::int64_t>(o.draft.max_tokens, n - t - 1);
      std::int64_t a = 0;
      if (room <= 0) {
        ++skipped;
      } else {
        const auto t0 = std::chrono::steady_clock::now();
        const suffix_index::draft& d = dr.propose(i, 0, static_cast<std::int32_t>(room));
        ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
        ++calls;
        proposed += static_cast<std::int64_t>(d.tokens.size());
        while (a < static_cast<std::int64_t>(d.tokens.size()) && d.tokens[static_cast<std::size_t>(a)] == resp[static_cast<std::size_t>(t + a)])
          ++a;
        accepted += a;
      }
      ++steps;
      dr.extend(i, 0, resp.data() + t, static_cast<std::size_t>(a + 1));
      t += a + 1;
    }
    dr.finish(i, 0, true);
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  std::int64_t total = 0;
  for (const auto x : ns) total += x;
  const auto stats = dr.take_stats();
  json j{{"trajectories", lines.size()},
         {"tokens", tokens},
         {"calls", calls},
         {"skipped_calls", skipped},
         {"us_per_call", calls ? static_cast<double>(total) / static_cast<double>(calls) / 1000.0 : 0.0},
         {"us_per_call_p50", ns.empty() ? 0.0 : static_cast<double>(sagc::nearest_rank_percentile(ns, 50)) / 1000.0},
         {"proposed", proposed},
         {"accepted", accepted},
         {"acceptance_rate", proposed ? json(static_cast<double>(accepted) / static_cast<double>(proposed)) : json()},
         {"steps", steps},
         {"tokens_per_step", steps ? static_cast<double>(tokens) / static_cast<double>(steps) : 0.0},
         {"mean_accepted_per_call", calls ? static_cast<double>(accepted) / static_cast<double>(calls) : 0.0},
         {"global_tree_bytes", stats.global_bytes},
         {"wall_s", wall}};
  std::printf("%s\n", j.dump().c_str());
  rec.set_parameter("trajectories", path);
  rec.set_parameter("max_depth", o.max_depth);
  rec.set_parameter("max_spec_tokens", o.draft.max_tokens);
  rec.set_parameter("spec_factor", o.draft.spec_factor);
  rec.set_parameter("min_token_prob", o.draft.min_token_prob);
  rec.add_table("draft", "the suffix drafter replayed on recorded turns", draft_columns())
    .add_row({"sorl", j["us_per_call"].get<double>(), j["us_per_call_p50"].get<double>(),
              proposed ? bench::record_cell(static_cast<double>(accepted) / static_cast<double>(proposed))
                       : bench::record_cell{},
              j["tokens_per_step"].get<double>(), accepted, proposed});
  return 0;
}

struct measured {
  double tokens_per_s = 0, wall_s = 0;
  rollout::speculation_counts counts;
};

// One timed run of `n` rollouts at most `b` in flight, after `warm` untimed rollouts of other
// prompts on the same worker.
measured measure(const experiment_config& cfg, const ml::named_tensors& weights, std::int64_t b, std::uint64_t n,
                 std::uint64_t warm, const std::string& mode) {
  const auto group = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(cfg.sagc.group_size));
  rollout::worker_options o = rollout::worker_options_from(cfg);
  o.max_batch = std::max<std::int64_t>(b, static_cast<std::int64_t>(group));
  o.speculative = mode == "on"     ? rollout::speculation_mode::on
                  : mode == "auto" ? rollout::speculation_mode::automatic
                                   : rollout::speculation_mode::off;
  auto w = make_worker(cfg, weights, o);
  std::uint64_t id = 1;
  // Earlier responses in the global tree: other prompts (task indices from 100000).
  for (std::uint64_t k = 0; k < warm; ++k) w->enqueue(request(cfg, id++, 1'000'000 + k, 0, 100000 + k));
  while (!w->idle()) w->step();
  // The timed rollouts: groups of up to G siblings, at most B rollouts in flight.
  std::uint64_t next = 0, tokens = 0;
  measured m;
  const auto t0 = std::chrono::steady_clock::now();
  while (next < n || !w->idle()) {
    while (next < n && static_cast<std::int64_t>(w->in_flight()) < b) {
      const std::uint64_t k = next / group;
      const auto take =
          std::min<std::uint64_t>({group - next % group, n - next, static_cast<std::uint64_t>(b) - w->in_flight()});
      for (std::uint64_t i = 0; i < take; ++i, ++next)
        w->enqueue(request(cfg, id++, k, static_cast<std::uint32_t>(next % group), k));
    }
    for (const auto& r : w->step()) {
      for (const auto x : r.loss_mask) tokens += x;
      m.counts += r.speculation;
    }
  }
  m.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.tokens_per_s = static_cast<double>(tokens) / m.wall_s;
  for (const auto& line : w->take_log()) std::fprintf(stderr, "  %s\n", line.c_str());
  return m;
}

// The middle of a mode's rounds (nearest rank, as the step metrics' percentiles).
double median(std::vector<double> v) { return sagc::nearest_rank_percentile(std::move(v), 50); }

int throughput(const experiment_config& cfg, const std::map<std::string, std::string>& f, bench::bench_record& rec) {
  const auto warm = static_cast<std::uint64_t>(integer("warm", flag(f, "warm", "32"), 0, 1'000'000));
  const int repeats = static_cast<int>(integer("repeats", flag(f, "repeats", "3"), 1, 100));
  const auto modes = split(flag(f, "modes", "off,on,auto"));
  if (modes.empty() || modes[0] != "off") throw std::invalid_argument("--modes must start with off (the baseline)");
  for (std::size_t i = 0; i < modes.size(); ++i) {
    if (modes[i] != "off" && modes[i] != "on" && modes[i] != "auto")
      throw std::invalid_argument("--modes: unknown mode \"" + modes[i] + "\" (off, on, auto)");
    if (std::find(modes.begin(), modes.begin() + static_cast<std::ptrdiff_t>(i), modes[i]) !=
        modes.begin() + static_cast<std::ptrdiff_t>(i))
      throw std::invalid_argument("--modes: " + modes[i] + " given twice");
  }
  std::vector<long long> batches;
  for (const auto& bs : split(flag(f, "batches", "1,4,16,64"))) batches.push_back(integer("batches", bs, 1, 4096));
  if (f.count("rollouts")) integer("rollouts", f.at("rollouts"), 1, 1'000'000);
  std::ofstream json_out;
  if (f.count("json")) {
    json_out.open(f.at("json"));
    if (!json_out) throw std::runtime_error("--json " + f.at("json") + ": cannot write");
  }
  const auto weights = source_weights(cfg);
  std::printf("%6s %5s %10s %8s %9s %10s %9s %8s\n", "batch", "mode", "tokens/s", "speedup", "accepted",
              "mean_acc", "spec_share", "wall_s");
  json rows = json::array();
  rec.set_parameter("warm", static_cast<double>(warm));
  rec.set_parameter("repeats", repeats);
  bench::record_table& table = rec.add_table(
    "throughput", "rollouts of the workload with speculation off (the baseline), on and auto; medians of the rounds",
    {{"batch", "batch"},
     {"mode", "mode"},
     {"rollouts", "rollouts"},
     {"tokens_per_s", "decode", "tokens/s", 1},
     {"speedup", "over off", "x", 2},
     {"acceptance", "acceptance", "", 3},
     {"mean_accepted", "accepted per verify step", "tokens", 2},
     {"spec_share", "verifying steps", "share", 2},
     {"wall_s", "wall", "s", 2}});
  for (const long long b : batches) {
    const auto n = static_cast<std::uint64_t>(
        integer("rollouts", flag(f, "rollouts", std::to_string(std::max<long long>(4 * b, 64))), 1, 1'000'000));
    // Rounds of every mode in turn, so that a slow spell of the machine hits all modes alike;
    // the speed-up is the median of the rounds' ratios to that round's "off".
    std::map<std::string, std::vector<double>> rate, ratio, wall;
    std::map<std::string, rollout::speculation_counts> counts;
    for (int r = 0; r < repeats; ++r) {
      double base = 0;
      for (const auto& mode : modes) {
        const measured m = measure(cfg, weights, b, n, warm, mode);
        if (mode == "off") base = m.tokens_per_s;
        rate[mode].push_back(m.tokens_per_s);
        ratio[mode].push_back(m.tokens_per_s / base);
        wall[mode].push_back(m.wall_s);
        counts[mode] += m.counts;
      }
    }
    for (const auto& mode : modes) {
      const auto& sc = counts[mode];
      const double acc = sc.drafted_tokens ? double(sc.accepted_tokens) / sc.drafted_tokens : 0.0;
      const double mean_acc = sc.verify_steps ? double(sc.accepted_tokens) / sc.verify_steps : 0.0;
      const double share =
          sc.verify_steps + sc.plain_steps ? double(sc.verify_steps) / double(sc.verify_steps + sc.plain_steps) : 0.0;
      std::printf("%6lld %5s %10.1f %7.2fx %9.3f %10.2f %9.2f %8.2f\n", static_cast<long long>(b), mode.c_str(),
                  median(rate[mode]), median(ratio[mode]), acc, mean_acc, share, median(wall[mode]));
      if (mode == "off")
        table.baseline_rows.push_back(table.rows.size());
      table.add_row({b, mode, n, median(rate[mode]), median(ratio[mode]), acc, mean_acc, share, median(wall[mode])});
      rows.push_back({{"batch", b}, {"mode", mode}, {"rollouts", n}, {"repeats", repeats},
                      {"tokens_per_s", rate[mode]}, {"speedup", ratio[mode]}, {"wall_s", wall[mode]},
                      {"acceptance", acc}, {"mean_accepted", mean_acc}, {"spec_share", share}});
    }
    std::fflush(stdout);
  }
  if (json_out.is_open()) json_out << rows.dump(1) << '\n';
  return 0;
}

}  // namespace

const char* usage =
    "usage: war_bench record CONFIG OUT.jsonl [--groups N] [--group-size G] [--first N]\n"
    "       war_bench draft TRAJ.jsonl [--max-depth 32] [--max-spec-tokens 16] [--spec-factor 1]\n"
    "                 [--min-token-prob 0.1] [--global-bytes 1073741824] [--record PATH]\n"
    "       war_bench throughput CONFIG [--batches 1,4,16,64] [--modes off,on,auto] [--rollouts N]\n"
    "                 [--warm 32] [--repeats 3] [--json FILE] [--record PATH]\n"
    "(bench/war/war_bench.cpp explains each figure)\n";

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(usage, stdout);
    return 0;
  }
  const bool known = cmd == "record" || cmd == "draft" || cmd == "throughput";
  if (!known || argc < (cmd == "record" ? 4 : 3)) {
    if (!cmd.empty() && !known) std::fprintf(stderr, "war_bench: unknown command '%s'\n", cmd.c_str());
    else if (!cmd.empty()) std::fprintf(stderr, "war_bench %s: missing arguments\n", cmd.c_str());
    std::fputs(usage, stderr);
    return 2;
  }
  try {
    at::set_num_threads(1);
    bench::bench_record rec("war-" + cmd, argc, argv);
    rec.set_threads(1);
    rec.set_runtime(bench::ml_record_runtime());
    auto write_record = [&](int rc, const std::map<std::string, std::string>& f) {
      const std::string path = bench::record_path("war-" + cmd, flag(f, "record", ""));
      if (rec.write(path)) std::fprintf(stderr, "record: %s\n", path.c_str());
      return rc;
    };
    if (cmd == "draft") {
      const auto f = flags(argc, argv, 3, {"max-depth", "max-spec-tokens", "spec-factor", "min-token-prob",
                                           "global-bytes", "record"});
      return write_record(draft(argv[2], f, rec), f);
    }
    const auto f = cmd == "record" ? flags(argc, argv, 4, {"groups", "group-size", "first"})
                                   : flags(argc, argv, 3, {"batches", "modes", "rollouts", "warm", "repeats", "json",
                                                           "record"});
    const experiment_config cfg = load_config(argv[2], role_names(builtin_roles()));
    if (cmd == "record") return record(cfg, argv[3], f);
    rec.set_parameter("config", argv[2]);
    return write_record(throughput(cfg, f, rec), f);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "war_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "war_bench: %s\n", e.what());
    return 1;
  }
}
