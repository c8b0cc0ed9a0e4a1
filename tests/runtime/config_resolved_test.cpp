#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/config.hpp"
#include "runtime/config_resolved.hpp"
#include "tests/support/scratch_dir.hpp"

using namespace sorl;
using sorl::parse_config;
using sorl::test::scratch_dir;

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

const std::set<std::string> roles{"ping", "pong"};

std::string without_comments(const std::string& text) {
  std::istringstream in{text};
  std::string line;
  std::string out;
  while (std::getline(in, line))
    if (line.rfind("#", 0) != 0)
      out += line + "\n";
  return out;
}

std::string read(const fs::path& p) {
  std::ifstream in{p};
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Settings away from their defaults in every table, with strings and floats that need care.
std::string full_config(const fs::path& dir) {
  return R"([run]
name = "quote\"back\\slash"
seed = 7
kernels = "portable"
output_dir = ")" + (dir / "runs").string() + R"("
[model]
checkpoint = "ckpt"
warm_start = true
[task]
name = "jsonl"
path = "tasks.jsonl"
match = "integer"
[algorithm]
name = "dapo"
overlong = "filter"
lr = 1e-4
top_p = 0.8
temperature = 0.7
kl_coef = 1e-40
max_grad_norm = inf
[sagc]
policy = "sagc"
g_min = 4
[network]
heartbeat_ms = 100
connection_timeout_ms = 300
[[node]]
name = "hub"
listen = "127.0.0.1:0"
actors = ["ping"]
[[node]]
name = "worker"
connect = "hub"
actors = [{ role = "pong", count = 3 }]
)";
}

} // namespace

TEST_CASE("the resolved configuration reads back to the same settings") {
  scratch_dir dir{"resolved_roundtrip"};
  std::ofstream{dir.path / "tasks.jsonl"} << R"({"prompt": "1+1=", "answer": "2"})" << '\n';
  auto cfg = parse_config(full_config(dir.path), "exp.toml", roles, dir.path.string());
  auto text = sorl::resolved_toml(cfg);
  // Loaded from elsewhere: absolute paths mean the same from any directory.
  auto back = parse_config(text, "config.resolved.toml", roles, "/");
  auto again = sorl::resolved_toml(back);
  CHECK(sorl::resolved_differences(text, again).empty());
  CHECK(without_comments(text) == without_comments(again));

  CHECK(back.run.name == "quote\"back\\slash");
  CHECK(back.run.seed == 7);
  CHECK(back.run.kernels == kernels_kind::portable);
  CHECK(back.run.output_dir == (dir.path / "runs").string());
  CHECK(back.model.checkpoint == (dir.path / "ckpt").string());
  CHECK(back.task.path == (dir.path / "tasks.jsonl").string());
  CHECK(back.task.match == match_kind::integer);
  CHECK(back.algorithm.clip_eps_high == 0.28);
  CHECK(back.algorithm.dynamic_sampling);
  CHECK(back.algorithm.overlong == overlong_kind::filter);
  CHECK(back.algorithm.lr == 1e-4);
  CHECK(back.algorithm.top_p == 0.8);
  CHECK(back.algorithm.temperature == 0.7);
  CHECK(back.algorithm.kl_coef == 1e-40);
  CHECK(back.algorithm.max_grad_norm == std::numeric_limits<double>::infinity());
  CHECK(back.sagc.g_min == 4);
  CHECK(back.sagc.g_max == 16);
  CHECK(back.network.heartbeat_ms == 100);
  REQUIRE(back.nodes.size() == 2);
  CHECK(back.nodes[0].listen->to_string() == "127.0.0.1:0");
  CHECK(back.nodes[1].connect == "hub");
  REQUIRE(back.nodes[1].actors.size() == 1);
  CHECK(back.nodes[1].actors[0].role == "pong");
  CHECK(back.nodes[1].actors[0].count == 3);
  // Every key is explicit in the resolved file, so no preset default is left to report.
  CHECK(back.algorithm.preset_keys.empty());
  CHECK(sorl::preset_summary(back).empty());
}

TEST_CASE("the resolved configuration holds every key the parser knows") {
  scratch_dir dir{"resolved_keys"};
  std::ofstream{dir.path / "tasks.jsonl"} << "{}\n";
  auto cfg = parse_config(full_config(dir.path), "exp.toml", roles, dir.path.string());
  std::map<std::string, std::set<std::string>> written;
  for (const auto& e : sorl::resolved_entries(cfg)) {
    auto kind = e.table.rfind("node[", 0) == 0 ? std::string{"node"} : e.table;
    written[""].insert(kind);
    written[kind].insert(e.key);
    if (e.key == "actors")
      CHECK(e.value == (e.table == "node[2]" ? R"([{ role = "pong", count = 3 }])"
                                             : R"([{ role = "ping", count = 1 }])"));
  }
  auto known = sorl::known_config_keys();
  known["network"].erase("tls_passphrase"); // a secret, deliberately not copied
  known.erase("node.actors");               // written inline in `actors`, checked above
  CHECK(written == known);
}

TEST_CASE("the TLS passphrase is not copied into the run directory") {
  auto cfg = parse_config("[network]\ntls_passphrase = \"hunter2\"\n[[node]]\nname = \"m\"\n"
                          "actors = [\"ping\"]\n",
                          "exp.toml", roles);
  CHECK(cfg.network.tls_passphrase == "hunter2");
  CHECK(sorl::resolved_toml(cfg).find("hunter2") == std::string::npos);
}

TEST_CASE("algorithm dapo names the defaults it changed that the file does not set") {
  const std::string node = "[[node]]\nname = \"m\"\nactors = [\"ping\"]\n";
  auto dapo = parse_config("[algorithm]\nname = \"dapo\"\n" + node, "exp.toml", roles);
  CHECK(dapo.algorithm.preset_keys
        == std::vector<std::string>{"clip_eps_high", "dynamic_sampling", "overlong", "loss_norm"});
  // loss_norm "token" is the plain default too: not a change.
  CHECK(sorl::preset_summary(dapo)
        == "algorithm = dapo sets clip_eps_high = 0.28 (default 0.2), dynamic_sampling = true "
           "(default false), overlong = \"shape\" (default \"none\")");
  auto partly = parse_config("[algorithm]\nname = \"dapo\"\noverlong = \"filter\"\n"
                             "clip_eps_high = 0.3\n" + node,
                             "exp.toml", roles);
  CHECK(sorl::preset_summary(partly)
        == "algorithm = dapo sets dynamic_sampling = true (default false)");
  auto grpo = parse_config(node, "exp.toml", roles);
  CHECK(grpo.algorithm.preset_keys.empty());
  CHECK(sorl::preset_summary(grpo).empty());
}

TEST_CASE("a resumed run keeps the previous resolved configuration when settings change") {
  scratch_dir dir{"resolved_write"};
  const std::string node = "[[node]]\nname = \"m\"\nactors = [\"ping\"]\n";
  auto head = "[run]\nname = \"r\"\noutput_dir = \"" + dir.path.string() + "\"\n";
  auto cfg = parse_config(head + node, "exp.toml", roles);
  const auto file = dir.path / "r" / "config.resolved.toml";
  const auto kept = dir.path / "r" / "config.resolved.1.toml";

  auto fresh = sorl::write_resolved_config(cfg, false);
  CHECK(fresh.path == file);
  CHECK(fresh.changes.empty());
  CHECK(read(file) == sorl::resolved_toml(cfg));

  // Same settings (even from another file name): nothing kept, nothing rewritten.
  auto same_cfg = parse_config(head + node, "elsewhere.toml", roles);
  auto same = sorl::write_resolved_config(same_cfg, true);
  CHECK(same.changes.empty());
  CHECK(same.previous.empty());
  CHECK(read(file) == sorl::resolved_toml(cfg));
  CHECK_FALSE(fs::exists(kept));

  auto changed_cfg = parse_config(head + "[algorithm]\nlr = 2e-4\n" + node, "exp.toml", roles);
  auto changed = sorl::write_resolved_config(changed_cfg, true);
  CHECK(changed.changes == std::vector<std::string>{"algorithm.lr: 0.0001 → 0.0002"});
  CHECK(changed.previous == kept);
  CHECK(read(kept) == sorl::resolved_toml(cfg));
  CHECK(read(file) == sorl::resolved_toml(changed_cfg));

  // A fresh start over the run replaces it all.
  sorl::write_resolved_config(cfg, false);
  CHECK_FALSE(fs::exists(kept));
  CHECK(read(file) == sorl::resolved_toml(cfg));
}

TEST_CASE("a resolved configuration that cannot be written is an error naming the path") {
  scratch_dir dir{"resolved_unwritable"};
  std::ofstream{dir.path / "plain"} << "x";
  sorl::experiment_config cfg;
  cfg.run.output_dir = (dir.path / "plain").string();
  try {
    sorl::write_resolved_config(cfg, false);
    FAIL("no error");
  } catch (const std::runtime_error& e) {
    CHECK(std::string{e.what()}
          == (dir.path / "plain" / "sorl").string()
               + ": cannot create the run directory: Not a directory");
  }
}

TEST_CASE("differences between resolved files name each changed, added and removed key") {
  auto before = "# c\n[run]\nname = \"a\"\nsteps = 3\n\n[[node]]\nname = \"m\"\n";
  auto after = "[run]\nname = \"b\"\nseed = 1\n\n[[node]]\nname = \"m\"\n";
  CHECK(sorl::resolved_differences(before, after)
        == std::vector<std::string>{"run.name: \"a\" → \"b\"", "run.seed: (absent) → 1",
                                    "run.steps: 3 → (absent)"});
  CHECK(sorl::resolved_differences(before, before).empty());
}

TEST_CASE("the resolved configuration holds the --set overrides and names them in its comment") {
  const std::string node = "[[node]]\nname = \"m\"\nactors = [\"ping\"]\n";
  auto cfg = parse_config("[algorithm]\nlr = 1e-4\n" + node, "exp.toml", roles, ".",
                          {"algorithm.lr=2e-4", "run.name=a\tb", "network.tls_passphrase=hunter2",
                           "run.name=\"x\"\n"});
  const auto text = sorl::resolved_toml(cfg);
  CHECK(text.find("\nlr = 0.0002\n") != std::string::npos);
  CHECK(text.find("\nname = \"x\"\n") != std::string::npos);
  CHECK(text.find("# Set on the command line after the file was read, in this order (the values "
                  "below\n# include them):\n"
                  "#   --set algorithm.lr=2e-4\n"
                  "#   --set run.name=a\tb\n"
                  "#   --set network.tls_passphrase=(not copied)\n"
                  "#   --set run.name=\"x\"\\x0A\n")
        != std::string::npos);
  CHECK(text.find("hunter2") == std::string::npos);
  // The comment is TOML: the file reads back to the same settings.
  auto back = parse_config(text, "config.resolved.toml", roles, "/");
  CHECK(back.algorithm.lr == 2e-4);
  CHECK(back.run.name == "x");
  CHECK(sorl::resolved_differences(text, sorl::resolved_toml(back)).empty());
}

TEST_CASE("a resumed run compares its --set overrides with the previous session's settings") {
  scratch_dir dir{"resolved_set_resume"};
  const std::string file = "[run]\nname = \"r\"\noutput_dir = \"" + dir.path.string()
                           + "\"\n[[node]]\nname = \"m\"\nactors = [\"ping\"]\n";
  sorl::write_resolved_config(parse_config(file, "exp.toml", roles), false);
  // The same value through --set is no change, even though the comment differs.
  auto same = sorl::write_resolved_config(
    parse_config(file, "exp.toml", roles, ".", {"algorithm.lr=1e-4"}), true);
  CHECK(same.changes.empty());
  CHECK(same.previous.empty());
  auto changed = sorl::write_resolved_config(
    parse_config(file, "exp.toml", roles, ".", {"algorithm.lr=2e-4", "sagc.group_size=4"}), true);
  CHECK(changed.changes
        == std::vector<std::string>{"algorithm.lr: 0.0001 → 0.0002", "sagc.group_size: 8 → 4"});
  CHECK(changed.previous == dir.path / "r" / "config.resolved.1.toml");
  CHECK(read(dir.path / "r" / "config.resolved.toml").find("#   --set sagc.group_size=4\n")
        != std::string::npos);
}

TEST_CASE("check_json holds the topology and every resolved setting") {
  scratch_dir dir{"resolved_check_json"};
  std::ofstream{dir.path / "tasks.jsonl"} << R"({"prompt": "1+1=", "answer": "2"})" << '\n';
  auto cfg = parse_config(full_config(dir.path), "exp.toml", roles, dir.path.string(),
                          {"node.worker.actors=[{ role = \"pong\", count = 2 }, \"ping\"]"});
  const auto j = json::parse(sorl::check_json(cfg));
  CHECK(j.at("file") == "exp.toml");
  CHECK(j.at("overrides") == json{"node.worker.actors=[{ role = \"pong\", count = 2 }, \"ping\"]"});
  CHECK(j.at("run_dir") == (dir.path / "runs").string() + "/quote\"back\\slash");
  CHECK(j.at("hub") == "127.0.0.1:0");
  const auto& nodes = j.at("nodes");
  REQUIRE(nodes.size() == 2);
  CHECK(nodes[0] == json::parse(R"({"name": "hub", "listen": "127.0.0.1:0",
    "connects_to": null, "actors": [{"role": "ping", "count": 1}]})"));
  CHECK(nodes[1] == json::parse(R"({"name": "worker", "listen": null,
    "connects_to": "hub", "actors": [{"role": "pong", "count": 2}, {"role": "ping", "count": 1}]})"));
  CHECK(j.at("roles") == json::parse(R"({"ping": 2, "pong": 2})"));
  CHECK(j.at("presets")
        == "algorithm = dapo sets clip_eps_high = 0.28 (default 0.2), dynamic_sampling = true "
           "(default false)");
  CHECK(j.at("started") == false);

  // "config" is resolved_entries, table by table in their order, with JSON's types.
  const auto& c = j.at("config");
  CHECK(c.at("run").at("seed") == 7);
  CHECK(c.at("run").at("kernels") == "portable");
  CHECK(c.at("model").at("checkpoint") == (dir.path / "ckpt").string());
  CHECK(c.at("algorithm").at("lr") == 1e-4);
  CHECK(c.at("algorithm").at("dynamic_sampling") == true);
  CHECK(c.at("algorithm").at("max_grad_norm") == "inf");
  CHECK(c.at("node").size() == 2);
  CHECK(c.at("node")[1].at("connect") == "hub");
  CHECK(c.at("node")[1].at("actors")[0] == json::parse(R"({"role": "pong", "count": 2})"));
  size_t entries = 0;
  std::vector<std::string> tables;
  for (const auto& e : sorl::resolved_entries(cfg)) {
    ++entries;
    const bool node = e.table.rfind("node[", 0) == 0;
    if (!node && (tables.empty() || tables.back() != e.table))
      tables.push_back(e.table);
  }
  size_t in_json = 0;
  std::vector<std::string> json_tables;
  for (const auto& [table, keys] : c.items()) {
    if (table == "node") {
      for (const auto& n : keys)
        in_json += n.size();
      continue;
    }
    json_tables.push_back(table);
    in_json += keys.size();
  }
  CHECK(in_json == entries);
  CHECK(json_tables == tables);
}
