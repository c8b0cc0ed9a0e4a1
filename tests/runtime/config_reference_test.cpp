#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "runtime/config.hpp"
#include "runtime/config_reference.hpp"
#include "runtime/config_resolved.hpp"

using namespace sorl;
namespace fs = std::filesystem;

namespace {

const config_key& find_key(const std::string& table, const std::string& key) {
  for (const auto& k : config_keys())
    if (k.table == table && k.key == key)
      return k;
  FAIL("no key " << table << "." << key << " in config_keys()");
  throw std::logic_error("unreachable");
}

std::string read_all(const fs::path& p) {
  std::ifstream in{p};
  REQUIRE(in);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool word_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

/// A file name's extension, which follows a table's name in `salt.hpp` or `model.safetensors`
/// without naming a key.
bool file_extension(const std::string& s) {
  static const std::set<std::string> extensions{"capnp",       "cpp",   "csv", "gguf", "h",   "hpp",
                                                "json",        "jsonl", "log", "md",   "png", "py",
                                                "safetensors", "sh",    "svg", "toml", "txt"};
  return extensions.count(s) != 0;
}

struct mention {
  std::string table;
  std::string key;
  int line;
};

/// Every `table.key` inside a backtick span of `text` whose `table` is one of `tables`: the
/// table name starts a word (not after a letter, '.', '/' or '-', so `runs/default.toml`
/// is no mention) and the key ends one (not before '.', so `model.safetensors.index.json`
/// is none either).
std::vector<mention> key_mentions(const std::string& text, const std::set<std::string>& tables) {
  std::vector<mention> out;
  size_t open = 0;
  while ((open = text.find('`', open)) != std::string::npos) {
    const size_t close = text.find('`', open + 1);
    if (close == std::string::npos)
      break;
    const std::string span = text.substr(open + 1, close - open - 1);
    const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + open, '\n'));
    open = close + 1;
    if (span.find('\n') != std::string::npos)
      continue;
    for (size_t i = 0; i < span.size(); ++i) {
      if (i > 0 &&
          (word_char(span[i - 1]) || std::string{"./-"}.find(span[i - 1]) != std::string::npos))
        continue;
      size_t dot = i;
      while (dot < span.size() && word_char(span[dot]))
        ++dot;
      if (dot == i || dot >= span.size() || span[dot] != '.' ||
          !tables.count(span.substr(i, dot - i)))
        continue;
      size_t end = dot + 1;
      while (end < span.size() && word_char(span[end]))
        ++end;
      if (end == dot + 1 || (end < span.size() && span[end] == '.'))
        continue;
      auto key = span.substr(dot + 1, end - dot - 1);
      if (!file_extension(key))
        out.push_back({span.substr(i, dot - i), key, line});
    }
  }
  return out;
}

} // namespace

TEST_CASE("the reference lists every section, then its keys, in the order the parser reads them") {
  const auto& keys = config_keys();
  REQUIRE(keys.size() >= 4);
  CHECK(keys[0].table.empty());
  CHECK(keys[0].key == "run");
  CHECK(keys[0].type == config_type::table);
  CHECK(keys[1].table == "run");
  CHECK(keys[1].key == "name");
  CHECK(keys[2].key == "seed");
  CHECK(keys.back().table == "node.actors");
  CHECK(keys.back().key == "count");
  std::vector<std::string> sections;
  for (const auto& k : keys)
    if (k.table.empty())
      sections.push_back(k.key);
  CHECK(sections == std::vector<std::string>{"run", "model", "task", "sft", "algorithm", "sagc",
                                             "salt", "sync", "rollout", "scheduler", "network",
                                             "smoke", "node"});
  // Each (table, key) once: the probe runs each reader call once.
  std::set<std::pair<std::string, std::string>> unique;
  for (const auto& k : keys)
    CHECK(unique.emplace(k.table, k.key).second);
}

TEST_CASE("every key has a one-line meaning") {
  for (const auto& k : config_keys()) {
    INFO(k.table << "." << k.key);
    CHECK_FALSE(k.meaning.empty());
    CHECK(k.meaning.find('\n') == std::string::npos);
    // A key without a default says what to write instead.
    if (std::holds_alternative<std::monostate>(k.default_value) && !k.table.empty())
      CHECK_FALSE(k.example.empty());
  }
}

TEST_CASE("each key records its reader's type, default, bounds and choices") {
  const auto& group_size = find_key("sagc", "group_size");
  CHECK(group_size.type == config_type::integer);
  CHECK(group_size.default_value == config_value{int64_t{8}});
  CHECK(group_size.lo == config_value{int64_t{2}});
  CHECK(group_size.hi == config_value{int64_t{1} << 16});
  CHECK_FALSE(group_size.lo_open);
  CHECK(config_accepts(group_size) == "[2, 2^16]");

  const auto& eta = find_key("salt", "eta");
  CHECK(eta.type == config_type::number);
  CHECK(eta.default_value == config_value{0.9});
  CHECK(eta.lo_open);
  CHECK(config_accepts(eta) == "(0, 1]");
  CHECK(config_accepts(find_key("algorithm", "max_grad_norm")) == "[0, inf]");
  CHECK(config_accepts(find_key("sagc", "v")) == "[1e-9, 1e12]");
  CHECK(config_accepts(find_key("run", "seed")) == "[0, 2^63-1]");
  CHECK(config_accepts(find_key("task", "lo")) == "[-2^61, 2^61-1]");
  CHECK(config_accepts(find_key("network", "join_timeout_ms")) == "[1, 86_400_000]");

  const auto& policy = find_key("sagc", "policy");
  CHECK(policy.type == config_type::choice);
  CHECK(policy.default_value == config_value{std::string{"static"}});
  CHECK(policy.choices == std::vector<std::string>{"static", "sagc", "deadline"});
  CHECK(find_key("rollout", "speculative").choices ==
        std::vector<std::string>{"off", "on", "auto"});

  CHECK(find_key("task", "reward_command").type == config_type::string_list);
  CHECK(find_key("task", "reward_command").default_value ==
        config_value{std::vector<std::string>{}});
  CHECK(find_key("sync", "bucket_bytes").default_value == config_value{int64_t{64} << 20});
  CHECK(find_key("algorithm", "scale_advantages").default_value == config_value{true});

  // Keys read by hand, and those without a default.
  CHECK(find_key("", "node").type == config_type::table_array);
  CHECK(find_key("node", "actors").type == config_type::role_list);
  const auto& name = find_key("node", "name");
  CHECK(name.required);
  CHECK(std::holds_alternative<std::monostate>(name.default_value));
  CHECK(name.example == "\"main\"");
  const auto& listen = find_key("node", "listen");
  CHECK_FALSE(listen.required);
  CHECK(std::holds_alternative<std::monostate>(listen.default_value));
  CHECK(find_key("node.actors", "role").required);
  CHECK(find_key("node.actors", "count").default_value == config_value{int64_t{1}});
}

TEST_CASE("the known keys are the reference's keys by table") {
  std::map<std::string, std::set<std::string>> by_table;
  for (const auto& k : config_keys())
    by_table[k.table].insert(k.key);
  CHECK(known_config_keys() == by_table);
}

TEST_CASE("TOML values are written so that they read back") {
  CHECK(config_value_toml(config_value{}) == "");
  CHECK(config_value_toml(config_value{int64_t{67108864}}) == "67_108_864");
  CHECK(config_value_toml(config_value{int64_t{-1234}}) == "-1234");
  CHECK(config_value_toml(config_value{int64_t{-12345}}) == "-12_345");
  CHECK(config_value_toml(config_value{1.0}) == "1.0");
  CHECK(config_value_toml(config_value{1e-4}) == "0.0001");
  CHECK(config_value_toml(config_value{std::string{"a \"b\"\\"}}) == R"("a \"b\"\\")");
  CHECK(config_value_toml(config_value{std::vector<std::string>{"x", "y"}}) == R"(["x", "y"])");
  CHECK(config_value_toml(config_value{false}) == "false");
}

TEST_CASE("the markdown reference is a table per TOML table") {
  std::vector<config_key> keys(5);
  keys[0].key = "demo";
  keys[0].type = config_type::table;
  keys[0].meaning = "a demonstration table";
  keys[1].table = "demo";
  keys[1].key = "size";
  keys[1].type = config_type::integer;
  keys[1].default_value = int64_t{1} << 20;
  keys[1].lo = int64_t{0};
  keys[1].hi = int64_t{1} << 40;
  keys[1].meaning = "bytes | or less";
  keys[2].table = "demo";
  keys[2].key = "mode";
  keys[2].type = config_type::choice;
  keys[2].default_value = std::string{"a"};
  keys[2].choices = {"a", "b"};
  keys[2].meaning = "which mode";
  keys[3].table = "demo";
  keys[3].key = "peer";
  keys[3].example = "\"host:1\"";
  keys[3].meaning = "where to go";
  keys[4].table = "demo.items";
  keys[4].key = "id";
  keys[4].required = true;
  keys[4].example = "\"x\"";
  keys[4].meaning = "the item";
  const auto md = config_reference_markdown(keys);
  const std::string tables = R"(
## [demo]

A demonstration table.

| key | type | default | accepts | meaning |
| --- | --- | --- | --- | --- |
| `size` | integer | `1_048_576` | [0, 2^40] | bytes \| or less |
| `mode` | choice | `"a"` | "a", "b" | which mode |
| `peer` | string | none (e.g. `"host:1"`) |  | where to go |

## [demo] items entries

The entries of [demo] `items` written as tables.

| key | type | default | accepts | meaning |
| --- | --- | --- | --- | --- |
| `id` | string | required |  | the item |
)";
  REQUIRE(md.size() > tables.size());
  CHECK(md.substr(md.size() - tables.size()) == tables);
  CHECK(md.rfind("<!-- Generated by `sorl config --format markdown`", 0) == 0);
}

TEST_CASE("the JSON reference holds every key with typed values") {
  const auto j = nlohmann::json::parse(config_reference_json(config_keys()));
  REQUIRE(j.is_array());
  REQUIRE(j.size() == config_keys().size());
  nlohmann::json group_size;
  for (const auto& e : j)
    if (e["table"] == "sagc" && e["key"] == "group_size")
      group_size = e;
  CHECK(group_size == nlohmann::json::parse(R"({
    "table": "sagc", "key": "group_size", "type": "integer", "default": 8, "example": null,
    "required": false, "min": 2, "max": 65536, "min_open": false, "choices": [],
    "meaning": "rollouts per prompt (G) of the static policy and of the first step"})"));
  for (const auto& e : j)
    if (e["table"] == "algorithm" && e["key"] == "max_grad_norm")
      CHECK(e["max"].is_null()); // inf has no JSON number: unbounded
  for (const auto& e : j)
    if (e["table"] == "node" && e["key"] == "name")
      CHECK(e["default"].is_null());
}

TEST_CASE("the TOML template reads back as the defaults") {
  const auto text = config_reference_toml(config_keys());
  // The template's one [[node]] is named by the example of its required name and runs no
  // actors: the same file as this minimal one, every other key at its default.
  const auto from_template = parse_config(text, "template.toml", {"ping"});
  const auto defaults = parse_config("[[node]]\nname = \"main\"\n", "minimal.toml", {"ping"});
  const auto a = resolved_entries(from_template);
  const auto b = resolved_entries(defaults);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(b[i].table << "." << b[i].key);
    CHECK(a[i].table == b[i].table);
    CHECK(a[i].key == b[i].key);
    CHECK(a[i].value == b[i].value);
  }
  // Every key with a default is written, uncommented; listen, which has none, is commented.
  for (const auto& k : config_keys())
    if (!k.table.empty() && k.table.find('.') == std::string::npos) {
      INFO(k.table << "." << k.key);
      const bool written = text.find("\n" + k.key + " = ") != std::string::npos;
      CHECK(written == (k.required || !std::holds_alternative<std::monostate>(k.default_value)));
    }
  CHECK(text.find("\n# listen = \"127.0.0.1:4242\"\n") != std::string::npos);
  CHECK(text.find("\n# steps = ") == std::string::npos);
  CHECK(text.find("# libtorch intra-op threads per process; 0 = libtorch's default (one per "
                  "core); accepts\n# [0, 1024]\nthreads = 1\n") != std::string::npos);
}

TEST_CASE("every table.key that README.md and docs/ write in backticks is a key") {
  const auto& known = known_config_keys();
  const auto& sections = known.at("");
  std::vector<fs::path> files{fs::path{SORL_SOURCE_DIR} / "README.md",
                              fs::path{SORL_SOURCE_DIR} / "ARCHITECTURE.md"};
  for (const auto& entry : fs::directory_iterator(fs::path{SORL_SOURCE_DIR} / "docs"))
    if (entry.path().extension() == ".md")
      files.push_back(entry.path());
  size_t checked = 0;
  for (const auto& f : files)
    for (const auto& m : key_mentions(read_all(f), sections)) {
      INFO(f.filename().string() << ":" << m.line << ": `" << m.table << "." << m.key << "`");
      CHECK(known.at(m.table).count(m.key) == 1);
      ++checked;
    }
  CHECK(checked > 50); // README.md alone names some 90 keys this way
}

TEST_CASE("a mention is a table name, a dot and a key, not a file name") {
  const std::set<std::string> tables{"run", "salt", "model"};
  const auto found = key_mentions("a `run.steps = 3` b `salt.hpp` `model.safetensors.index.json` "
                                  "`runs/run.name` `x.run.y` `dry-run.z`\n`salt.eta`",
                                  tables);
  REQUIRE(found.size() == 2);
  CHECK(found[0].table == "run");
  CHECK(found[0].key == "steps");
  CHECK(found[0].line == 1);
  CHECK(found[1].key == "eta");
  CHECK(found[1].line == 2);
}
