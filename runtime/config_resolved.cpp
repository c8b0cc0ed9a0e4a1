#include "runtime/config_resolved.hpp"

#include "runtime/config_reference.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/toml.hpp"

namespace sorl {

namespace fs = std::filesystem;

namespace {

std::string absolute(const std::string& p) {
  if (p.empty())
    return p;
  std::error_code ec;
  auto a = fs::absolute(p, ec);
  return ec ? p : a.lexically_normal().string();
}

/// Collects entries table by table.
struct entry_list {
  std::vector<resolved_entry> entries;
  std::string table;

  void add(const char* key, std::string value) {
    entries.push_back({table, key, std::move(value)});
  }
  void str(const char* key, std::string_view v) {
    add(key, toml_quoted(v));
  }
  void path(const char* key, const std::string& v) {
    add(key, toml_quoted(absolute(v)));
  }
  void integer(const char* key, int64_t v) {
    add(key, fmt::format("{}", v));
  }
  void number(const char* key, double v) {
    add(key, toml_float(v));
  }
  void boolean(const char* key, bool v) {
    add(key, v ? "true" : "false");
  }
};

/// A TOML value as JSON: tables as objects, arrays as arrays; a non-finite float (which JSON
/// cannot hold) as its TOML spelling, "inf", "-inf" or "nan".
nlohmann::ordered_json to_json(const toml::node& n) {
  if (auto* t = n.as_table()) {
    auto out = nlohmann::ordered_json::object();
    for (auto&& [k, v] : *t)
      out[std::string{k.str()}] = to_json(v);
    return out;
  }
  if (auto* a = n.as_array()) {
    auto out = nlohmann::ordered_json::array();
    for (const auto& v : *a)
      out.push_back(to_json(v));
    return out;
  }
  if (auto* v = n.as_string())
    return v->get();
  if (auto* v = n.as_integer())
    return v->get();
  if (auto* v = n.as_boolean())
    return v->get();
  if (auto* v = n.as_floating_point()) {
    const double x = v->get();
    return std::isfinite(x) ? nlohmann::ordered_json(x) : nlohmann::ordered_json(toml_float(x));
  }
  // resolved_toml writes no dates or times.
  throw std::logic_error("resolved configuration: a value of an unexpected type");
}

} // namespace

std::vector<resolved_entry> resolved_entries(const experiment_config& c) {
  entry_list e;
  e.table = "run";
  e.str("name", c.run.name);
  e.integer("seed", static_cast<int64_t>(c.run.seed));
  e.integer("steps", c.run.steps);
  e.path("output_dir", c.run.output_dir);
  e.integer("checkpoint_every", c.run.checkpoint_every);
  e.integer("eval_every", c.run.eval_every);
  e.number("stop_at_accuracy", c.run.stop_at_accuracy);
  e.integer("threads", c.run.threads);
  e.str("kernels", to_string(c.run.kernels));
  e.str("device", c.run.device);

  e.table = "model";
  // A model from hf_dir has no preset, and naming both is an error.
  if (c.model.hf_dir.empty())
    e.str("preset", c.model.preset);
  e.path("hf_dir", c.model.hf_dir);
  e.integer("max_seq", c.model.max_seq);
  e.path("checkpoint", c.model.checkpoint);
  e.boolean("warm_start", c.model.warm_start);
  e.str("rollout_dtype", c.model.rollout_dtype);

  e.table = "task";
  e.str("name", c.task.name);
  e.path("path", c.task.path);
  e.path("eval_path", c.task.eval_path);
  e.str("match", to_string(c.task.match));
  e.integer("min_digits", c.task.min_digits);
  e.integer("max_digits", c.task.max_digits);
  e.str("operators", c.task.operators);
  e.boolean("allow_negative", c.task.allow_negative);
  e.str("wrong_answers", c.task.wrong_answers);
  e.integer("lo", c.task.lo);
  e.integer("hi", c.task.hi);
  e.integer("max_turns", c.task.max_turns);
  e.integer("depth", c.task.depth);
  e.integer("max_dirs", c.task.max_dirs);
  e.integer("max_files", c.task.max_files);
  e.integer("max_episode_tokens", c.task.max_episode_tokens);
  e.number("detour_rate", c.task.detour_rate);
  e.str("wrong_episodes", c.task.wrong_episodes);
  e.number("wander_share", c.task.wander_share);
  e.integer("preamble_bytes", c.task.preamble_bytes);
  e.integer("preamble_families", c.task.preamble_families);
  e.number("eval_fraction", c.task.eval_fraction);
  e.integer("max_new_tokens", c.task.max_new_tokens);
  e.integer("eval_prompts", c.task.eval_prompts);
  {
    std::string list = "[";
    for (const auto& a : c.task.reward_command)
      list += (list.size() > 1 ? ", " : "") + toml_quoted(a);
    e.add("reward_command", list + "]");
  }
  e.integer("reward_timeout_ms", c.task.reward_timeout_ms);
  e.str("system_prompt", c.task.system_prompt);

  e.table = "sft";
  e.integer("steps", c.sft.steps);
  e.integer("batch_size", c.sft.batch_size);
  e.number("lr", c.sft.lr);
  e.integer("warmup_steps", c.sft.warmup_steps);
  e.number("wrong_fraction", c.sft.wrong_fraction);
  e.integer("eval_count", c.sft.eval_count);
  e.integer("group_by_length", c.sft.group_by_length);
  e.str("init_checkpoint", c.sft.init_checkpoint);

  const auto& a = c.algorithm;
  e.table = "algorithm";
  e.str("name", to_string(a.name));
  e.integer("prompts_per_step", a.prompts_per_step);
  e.boolean("dynamic_sampling", a.dynamic_sampling);
  e.integer("max_refill_rounds", a.max_refill_rounds);
  e.str("overlong", to_string(a.overlong));
  e.integer("overlong_cache", a.overlong_cache);
  e.str("on_reward_failure", to_string(a.on_reward_failure));
  e.integer("epochs", a.epochs);
  e.integer("minibatches", a.minibatches);
  e.boolean("group_minibatches", a.group_minibatches);
  e.integer("micro_batch_tokens", a.micro_batch_tokens);
  e.number("lr", a.lr);
  e.number("clip_eps_low", a.clip_eps_low);
  e.number("clip_eps_high", a.clip_eps_high);
  e.number("kl_coef", a.kl_coef);
  e.str("loss_norm", to_string(a.loss_norm));
  e.boolean("scale_advantages", a.scale_advantages);
  e.number("max_grad_norm", a.max_grad_norm);
  e.number("weight_decay", a.weight_decay);
  e.number("temperature", a.temperature);
  e.number("top_p", a.top_p);
  e.integer("top_k", a.top_k);
  e.str("learner_weights", to_string(a.learner_weights));
  e.str("old_logprobs", to_string(a.old_logprobs));
  e.number("tis_cap", a.tis_cap);
  e.number("mismatch_warn", a.mismatch_warn);

  e.table = "sagc";
  e.str("policy", to_string(c.sagc.policy));
  e.integer("group_size", c.sagc.group_size);
  e.integer("g_min", c.sagc.g_min);
  e.integer("g_max", c.sagc.g_max);
  e.str("straggler_rule", to_string(c.sagc.straggler_rule));
  e.number("kappa", c.sagc.kappa);
  e.number("target_rate", c.sagc.target_rate);
  e.integer("window", c.sagc.window);
  e.number("v", c.sagc.v);
  e.number("deadline_kappa", c.sagc.deadline_kappa);

  e.table = "salt";
  e.boolean("enabled", c.salt.enabled);
  e.number("eta", c.salt.eta);
  e.number("beta", c.salt.beta);
  e.number("c0", c.salt.c0);
  e.number("gamma_max", c.salt.gamma_max);
  e.integer("layers", c.salt.layers);
  e.str("gram", to_string(c.salt.gram));

  e.table = "sync";
  e.str("mode", to_string(c.sync.mode));
  e.integer("bucket_bytes", c.sync.bucket_bytes);
  e.integer("full_every", c.sync.full_every);

  e.table = "rollout";
  e.integer("max_batch", c.rollout.max_batch);
  e.integer("chunk_tokens", c.rollout.chunk_tokens);
  e.integer("prefix_cache_bytes", c.rollout.prefix_cache_bytes);
  e.str("device", c.rollout.device.empty() ? c.run.device : c.rollout.device);
  e.str("speculative", c.rollout.speculative);
  e.integer("draft_max_tokens", c.rollout.draft_max_tokens);
  e.number("draft_min_token_prob", c.rollout.draft_min_token_prob);
  e.number("draft_spec_factor", c.rollout.draft_spec_factor);
  e.integer("suffix_max_depth", c.rollout.suffix_max_depth);
  e.integer("suffix_global_bytes", c.rollout.suffix_global_bytes);
  e.number("watchdog_s", c.rollout.watchdog_s);

  e.table = "scheduler";
  e.str("policy", to_string(c.scheduler.policy));
  e.number("imbalance_threshold", c.scheduler.imbalance_threshold);
  e.number("cache_threshold", c.scheduler.cache_threshold);
  e.number("cache_imbalance_threshold", c.scheduler.cache_imbalance_threshold);

  e.table = "network";
  e.integer("heartbeat_ms", c.network.heartbeat_ms);
  e.integer("connection_timeout_ms", c.network.connection_timeout_ms);
  e.integer("connect_timeout_ms", c.network.connect_timeout_ms);
  e.integer("join_timeout_ms", c.network.join_timeout_ms);
  e.integer("stop_grace_ms", c.network.stop_grace_ms);
  e.boolean("insecure", c.network.insecure);
  // The three TLS files go together: an empty one is the default (no TLS), not a path.
  e.path("tls_certificate", c.network.tls_certificate);
  e.path("tls_key", c.network.tls_key);
  e.path("tls_ca_file", c.network.tls_ca_file);

  e.table = "smoke";
  e.integer("rounds", c.smoke.rounds);
  e.integer("interval_ms", c.smoke.interval_ms);
  e.integer("payload_bytes", c.smoke.payload_bytes);

  for (size_t i = 0; i < c.nodes.size(); ++i) {
    const auto& n = c.nodes[i];
    e.table = fmt::format("node[{}]", i + 1);
    e.str("name", n.name);
    // Absent listen / connect have meanings of their own (not the hub; the only hub).
    if (n.listen)
      e.str("listen", n.listen->to_string());
    if (!n.connect.empty())
      e.str("connect", n.connect);
    std::string actors;
    for (const auto& r : n.actors)
      actors += fmt::format("{}{{ role = {}, count = {} }}", actors.empty() ? "" : ", ",
                            toml_quoted(r.role), r.count);
    e.add("actors", "[" + actors + "]");
  }
  return std::move(e.entries);
}

std::string resolved_toml(const experiment_config& cfg) {
  std::string out = fmt::format(
    "# The configuration this run used, from {}: every default filled in and every path\n"
    "# absolute. sorl reads it like any experiment file. network.tls_passphrase is not copied.\n",
    cfg.file);
  if (!cfg.overrides.empty()) {
    out += "# Set on the command line after the file was read, in this order (the values below\n"
           "# include them):\n";
    for (const auto& o : cfg.overrides) {
      // The passphrase stays out here too; a control character would end (or break) the comment.
      if (o.rfind("network.tls_passphrase=", 0) == 0) {
        out += "#   --set network.tls_passphrase=(not copied)\n";
        continue;
      }
      std::string line;
      for (char ch : o) {
        auto c = static_cast<unsigned char>(ch);
        line += (c < 0x20 && c != '\t') || c == 0x7f ? fmt::format("\\x{:02X}", c) : std::string(1, ch);
      }
      out += "#   --set " + line + "\n";
    }
  }
  std::string table;
  for (const auto& e : resolved_entries(cfg)) {
    if (e.table != table) {
      table = e.table;
      out += table.rfind("node[", 0) == 0 ? "\n[[node]]\n" : fmt::format("\n[{}]\n", table);
    }
    out += fmt::format("{} = {}\n", e.key, e.value);
  }
  return out;
}

std::string check_json(const experiment_config& cfg) {
  using json = nlohmann::ordered_json;
  const auto* hub = cfg.hub();
  json nodes = json::array();
  std::map<std::string, int64_t> roles;
  for (const auto& n : cfg.nodes) {
    json actors = json::array();
    for (const auto& a : n.actors) {
      actors.push_back({{"role", a.role}, {"count", a.count}});
      roles[a.role] += a.count;
    }
    json joins = nullptr;
    if (!n.listen && !n.connect.empty())
      joins = n.connect;
    else if (!n.listen && hub)
      joins = hub->name;
    nodes.push_back({{"name", n.name},
                     {"listen", n.listen ? json(n.listen->to_string()) : json(nullptr)},
                     {"connects_to", joins},
                     {"actors", std::move(actors)}});
  }
  json out;
  out["file"] = cfg.file;
  out["overrides"] = cfg.overrides;
  out["run_dir"] = cfg.run.run_dir();
  out["hub"] = hub && hub->listen ? json(hub->listen->to_string()) : json(nullptr);
  out["nodes"] = std::move(nodes);
  out["roles"] = roles;
  out["presets"] = preset_summary(cfg);
  // Entry by entry, so that the keys keep resolved_toml's order (a toml::table sorts them).
  json config = json::object();
  for (const auto& e : resolved_entries(cfg)) {
    const auto value = to_json(*parse_toml("v = " + e.value, resolved_config_name).get("v"));
    if (e.table.rfind("node[", 0) == 0) {
      auto& list = config["node"];
      const auto i = std::stoul(e.table.substr(5)) - 1;
      while (list.size() <= i)
        list.push_back(json::object());
      list[i][e.key] = value;
    } else {
      config[e.table][e.key] = value;
    }
  }
  // The same actors entries as "nodes", whose keys keep their order (role, count).
  for (size_t i = 0; i < cfg.nodes.size(); ++i)
    config["node"][i]["actors"] = out["nodes"][i]["actors"];
  out["config"] = std::move(config);
  out["started"] = false;
  return out.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string preset_summary(const experiment_config& cfg) {
  const auto& keys = cfg.algorithm.preset_keys;
  if (keys.empty())
    return "";
  auto value_of = [](const std::vector<resolved_entry>& entries, const std::string& key) {
    for (const auto& e : entries)
      if (e.table == "algorithm" && e.key == key)
        return e.value;
    return std::string{};
  };
  auto mine = resolved_entries(cfg);
  auto plain = resolved_entries(experiment_config{});
  std::string changes;
  for (const auto& k : keys) {
    auto v = value_of(mine, k);
    auto d = value_of(plain, k);
    if (v != d)
      changes += fmt::format("{}{} = {} (default {})", changes.empty() ? "" : ", ", k, v, d);
  }
  if (changes.empty())
    return "";
  return fmt::format("algorithm = {} sets {}", to_string(cfg.algorithm.name), changes);
}

std::vector<std::string> resolved_differences(const std::string& before,
                                              const std::string& after) {
  // "table.key" → value, in file order; [[node]] tables are numbered as resolved_entries does.
  auto read = [](const std::string& text) {
    std::vector<std::pair<std::string, std::string>> out;
    std::istringstream in{text};
    std::string line;
    std::string table;
    int nodes = 0;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#')
        continue;
      if (line == "[[node]]") {
        table = fmt::format("node[{}]", ++nodes);
      } else if (line.front() == '[' && line.back() == ']') {
        table = line.substr(1, line.size() - 2);
      } else if (auto eq = line.find(" = "); eq != std::string::npos) {
        out.emplace_back(table + "." + line.substr(0, eq), line.substr(eq + 3));
      }
    }
    return out;
  };
  auto old_values = read(before);
  auto new_values = read(after);
  std::map<std::string, std::string> old_map(old_values.begin(), old_values.end());
  std::vector<std::string> changes;
  for (const auto& [key, value] : new_values) {
    auto it = old_map.find(key);
    if (it == old_map.end())
      changes.push_back(fmt::format("{}: (absent) → {}", key, value));
    else if (it->second != value)
      changes.push_back(fmt::format("{}: {} → {}", key, it->second, value));
    if (it != old_map.end())
      old_map.erase(it);
  }
  for (const auto& [key, value] : old_values)
    if (old_map.count(key))
      changes.push_back(fmt::format("{}: {} → (absent)", key, value));
  return changes;
}

resolved_write write_resolved_config(const experiment_config& cfg, bool resume) {
  const fs::path dir{cfg.run.run_dir()};
  auto fail = [](const fs::path& p, const std::string& what, const std::error_code& ec) {
    throw std::runtime_error(fmt::format("{}: {}: {}", p.string(), what, ec.message()));
  };
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    fail(dir, "cannot create the run directory", ec);
  resolved_write out;
  out.path = dir / resolved_config_name;
  const auto text = resolved_toml(cfg);
  auto numbered = [&](int n) { return dir / fmt::format("config.resolved.{}.toml", n); };
  if (resume) {
    std::ifstream in{out.path, std::ios::binary};
    if (in) {
      std::stringstream old;
      old << in.rdbuf();
      out.changes = resolved_differences(old.str(), text);
      if (out.changes.empty())
        return out;
      for (int n = 1;; ++n) {
        bool taken = fs::exists(numbered(n), ec);
        if (ec)
          fail(numbered(n), "cannot check", ec);
        if (!taken) {
          out.previous = numbered(n);
          break;
        }
      }
      fs::rename(out.path, out.previous, ec);
      if (ec)
        fail(out.path, "cannot keep the previous resolved configuration", ec);
    }
  } else {
    // A fresh run: copies kept by the sessions of a replaced run no longer describe it.
    for (int n = 1; fs::remove(numbered(n), ec) && !ec; ++n) {
    }
  }
  const fs::path tmp = dir / (std::string{resolved_config_name} + ".tmp");
  {
    std::ofstream f{tmp, std::ios::binary | std::ios::trunc};
    f << text;
    f.flush();
    if (!f)
      fail(tmp, "cannot write", std::error_code{errno, std::generic_category()});
  }
  fs::rename(tmp, out.path, ec);
  if (ec)
    fail(out.path, "cannot write", ec);
  return out;
}

} // namespace sorl
