// The `sorl` command line as scripts use it: `--set` overrides, `--json` documents, `check` as
// the dry run, and each command's help. Runs the real binary; no job here measures time.

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/metrics.hpp"
#include "tests/support/process.hpp"
#include "tests/support/scratch_dir.hpp"

using namespace std::chrono_literals;
using sorl::test::child_process;
using sorl::test::scratch_dir;
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

/// Bounds a command that reads a small file and prints; it never decides a check.
constexpr auto slack = 60s;

const std::string smoke_config = std::string{SORL_SOURCE_DIR} + "/configs/smoke.toml";

/// Runs `sorl ARGS...` to its end; returns its exit status and everything it printed.
std::pair<int, std::string> run_sorl(std::vector<std::string> args) {
  args.insert(args.begin(), SORL_BIN);
  child_process p{args};
  auto rc = p.wait_exit(slack);
  REQUIRE(rc);
  return {*rc, p.output()};
}

/// The lines of `text`.
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in{text};
  for (std::string line; std::getline(in, line);)
    out.push_back(line);
  return out;
}

} // namespace

TEST_CASE("sorl check --json prints the topology with the overrides applied") {
  auto [rc, out] = run_sorl({"check", smoke_config, "--json", "--set", "smoke.rounds=3", "--set",
                             "node.main.listen=127.0.0.1:0", "--set", "run.name=\"checked\""});
  INFO(out);
  REQUIRE(rc == 0);
  const auto j = json::parse(out); // nothing but the document on stdout and stderr
  CHECK(j.at("file") == smoke_config);
  CHECK(j.at("overrides")
        == json{"smoke.rounds=3", "node.main.listen=127.0.0.1:0", "run.name=\"checked\""});
  CHECK(j.at("run_dir") == "runs/checked");
  CHECK(j.at("hub") == "127.0.0.1:0");
  CHECK(j.at("nodes") == json::parse(R"([
    {"name": "main", "listen": "127.0.0.1:0", "connects_to": null,
     "actors": [{"role": "ping", "count": 1}]},
    {"name": "rollout-a", "listen": null, "connects_to": "main",
     "actors": [{"role": "pong", "count": 1}]},
    {"name": "rollout-b", "listen": null, "connects_to": "main",
     "actors": [{"role": "pong", "count": 1}]}])"));
  CHECK(j.at("roles") == json::parse(R"({"ping": 1, "pong": 2})"));
  CHECK(j.at("presets") == "");
  CHECK(j.at("started") == false);
  CHECK(j.at("warm_start") == nullptr);
  const auto& c = j.at("config");
  CHECK(c.at("smoke") == json::parse(R"({"rounds": 3, "interval_ms": 5, "payload_bytes": 256})"));
  CHECK(c.at("run").at("name") == "checked");
  CHECK(c.at("network").at("heartbeat_ms") == 250);
  CHECK(c.at("node").at(0).at("listen") == "127.0.0.1:0");
}

TEST_CASE("sorl check says it is the dry run and that nothing was started") {
  auto [help_rc, help] = run_sorl({"check", "--help"});
  CHECK(help_rc == 0);
  CHECK(help.find("Dry run: validate CONFIG") != std::string::npos);
  CHECK(help.find("without starting anything") != std::string::npos);

  auto [rc, out] = run_sorl({"check", smoke_config, "--set", "smoke.rounds=3"});
  INFO(out);
  CHECK(rc == 0);
  const auto lines = lines_of(out);
  REQUIRE(lines.size() == 5);
  CHECK(lines[0] == smoke_config + ": run \"smoke\", 3 nodes");
  CHECK(lines[1].find("node main") != std::string::npos);
  CHECK(lines[4]
        == "sorl check: " + smoke_config + " is valid; nothing was started (the dry run)");
}

TEST_CASE("a bad --set stops every command before anything starts, naming the override") {
  for (const char* command : {"check", "train"}) {
    INFO(command);
    auto [rc, out] = run_sorl({command, smoke_config, "--set", "smoke.rounds=abc", "--set",
                               "smoke.intervl_ms=1"});
    INFO(out);
    CHECK(rc == 2);
    CHECK(lines_of(out) == std::vector<std::string>{
      "--set smoke.rounds=abc: key 'smoke.rounds': expected an integer, got a string",
      "--set smoke.intervl_ms=1: key 'smoke.intervl_ms': unknown key; did you mean `interval_ms`?",
      "sorl: " + smoke_config + ": 2 errors, nothing started"});
  }
  auto [rc, out] = run_sorl({"node", smoke_config, "--node", "main", "--set", "node.mian.listen=x"});
  CHECK(rc == 2);
  CHECK(out.find("--set node.mian.listen=x: key 'node.mian.listen': " + smoke_config
                 + " has no [[node]] named \"mian\" (its nodes: \"main\", \"rollout-a\", "
                   "\"rollout-b\"); did you mean \"main\"?")
        != std::string::npos);
}

TEST_CASE("sorl train runs with its --set overrides, given before or after CONFIG") {
  // The smoke job in one process: its pinger says how many rounds it ran.
  auto [rc, out] = run_sorl({"train", "--set", "smoke.rounds=3", smoke_config, "--set",
                             "smoke.interval_ms=1", "--set", "node.main.listen=127.0.0.1:0"});
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("3 of 3 rounds done") != std::string::npos);
  CHECK(out.find("of 200 rounds") == std::string::npos);
}

TEST_CASE("sorl eval refuses --set without an experiment TOML") {
  scratch_dir dir{"cli_eval_set"};
  auto [rc, out] = run_sorl({"eval", dir.path.string(), (dir.path / "none.jsonl").string(), "--set",
                             "run.steps=1"});
  CHECK(rc == 1);
  CHECK(out == "sorl eval: --set needs an experiment TOML as the model\n");
}

TEST_CASE("sorl roles --json lists the roles of `sorl roles`, in its order") {
  auto [rc, out] = run_sorl({"roles", "--json"});
  REQUIRE(rc == 0);
  const auto j = json::parse(out);
  auto [text_rc, text] = run_sorl({"roles"});
  REQUIRE(text_rc == 0);
  const auto lines = lines_of(text);
  const auto& roles = j.at("roles");
  REQUIRE(roles.size() == lines.size());
  for (size_t i = 0; i < lines.size(); ++i)
    CHECK(fmt::format("{:<20} {}", roles[i].at("name").get<std::string>(),
                      roles[i].at("description").get<std::string>())
          == lines[i]);
  CHECK(roles[0].at("name") == "trainer");
  CHECK(roles[0].at("description") == "runs the synchronous GRPO / DAPO step loop, logs and checkpoints");
  CHECK(roles[roles.size() - 1].at("name") == "pong");
}

TEST_CASE("sorl metrics --json holds every key of the schema with its unit and meaning") {
  auto [rc, out] = run_sorl({"metrics", "--json"});
  REQUIRE(rc == 0);
  CHECK(out == sorl::metric::schema_json());
  const auto doc = json::parse(out);
  const auto& rows = doc.at("metrics");
  const auto& schema = sorl::metric::schema();
  REQUIRE(rows.size() == schema.size());
  for (size_t i = 0; i < schema.size(); ++i) {
    CHECK(rows[i].at("key") == schema[i].key);
    CHECK(rows[i].at("unit") == schema[i].unit);
    CHECK(rows[i].at("meaning") == schema[i].meaning);
  }
  CHECK(rows[0] == json::parse(R"({"key": "step", "group": "step", "type": "int", "unit": "",
    "meaning": "1-based step number; = steps completed so far"})"));
  CHECK(rows[1].at("unit") == "s");
}

TEST_CASE("each command's help shows its own examples") {
  auto [rc, top] = run_sorl({"--help"});
  CHECK(rc == 0);
  CHECK(top.find("sorl check configs/smoke.toml    validate a file and print its topology")
        != std::string::npos);
  auto [train_rc, train] = run_sorl({"train", "--help"});
  CHECK(train.find("sorl train configs/default.toml --set run.steps=20 --set run.name=short")
        != std::string::npos);
  CHECK(train.find("sorl node") == std::string::npos);
  auto [node_rc, node] = run_sorl({"node", "--help"});
  CHECK(node.find("sorl node configs/default-3proc.toml --node main") != std::string::npos);
  CHECK(node.find("sorl train") == std::string::npos);
  auto [roles_rc, roles] = run_sorl({"roles", "--help"});
  CHECK(roles.find("sorl roles --json") != std::string::npos);
  CHECK(roles.find("sorl train") == std::string::npos);
}
