#include "bench/record.hpp"

#include "runtime/version.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

using namespace sorl::bench;
using json = nlohmann::json;

namespace {

/// Sets an environment variable for one scope and restores what was there.
struct scoped_env {
  std::string name;
  bool had = false;
  std::string old;
  scoped_env(std::string n, const char* value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) {
      had = true;
      old = v;
    }
    if (value != nullptr)
      setenv(name.c_str(), value, 1);
    else
      unsetenv(name.c_str());
  }
  ~scoped_env() {
    if (had)
      setenv(name.c_str(), old.c_str(), 1);
    else
      unsetenv(name.c_str());
  }
};

bench_record sample_record() {
  static char a0[] = "bench/example", a1[] = "--size", a2[] = "two words";
  static char* argv[] = {a0, a1, a2};
  bench_record rec("example", 3, argv);
  rec.set_threads(2);
  rec.set_parameter("size", 2);
  rec.set_parameter("model", "models/tiny");
  rec.set_parameter("size", 3); // replaces
  record_table& t = rec.add_table("speed", "tokens/s per batch",
                                  {{"batch", "batch", "", -1, false},
                                   {"sorl", "sorl", "tokens/s", 1, false},
                                   {"peer", "peer", "tokens/s", 1, true}});
  t.add_row({1, 27.44, 20.5});
  t.add_row({64, std::numeric_limits<double>::quiet_NaN(), record_cell{}});
  t.baseline_rows.push_back(1);
  return rec;
}

} // namespace

TEST_CASE("a record holds the binary's commit, the command, the machine and the tables") {
  scoped_env command("SORL_BENCH_COMMAND", nullptr);
  scoped_env start("SORL_BENCH_START", nullptr);
  const json j = json::parse(sample_record().to_json());
  CHECK(j["format"] == "sorl-bench-record");
  CHECK(j["format_version"] == 1);
  CHECK(j["bench"] == "example");
  CHECK(j["command"] == "bench/example --size 'two words'");
  CHECK(j["argv"] == json::array({"bench/example", "--size", "two words"}));
  CHECK(j["sorl"]["version"] == std::string(sorl::version()));
  CHECK(j["sorl"]["commit"] == std::string(sorl::build_commit()));
  CHECK(j["sorl"]["dirty"] == sorl::build_dirty());
  CHECK(j["machine"]["threads_used"] == 2);
  CHECK(j["machine"]["cores_available"].get<int>() >= 1);
  CHECK(j["machine"]["cores_available"].get<int>() <= j["machine"]["cores_online"].get<int>());
  CHECK(j["machine"]["load_1min_at_start"].get<double>() >= 0.0);
  CHECK(j["runtime"]["libtorch"].is_null());
  CHECK(j["parameters"] == json({{"size", 3}, {"model", "models/tiny"}}));
  CHECK(j["parameters"]["size"].is_number_integer());
  const std::string date = j["date_utc"];
  REQUIRE(date.size() == 20);
  CHECK(date[4] == '-');
  CHECK(date[10] == 'T');
  CHECK(date[19] == 'Z');

  REQUIRE(j["tables"].size() == 1);
  const json& t = j["tables"][0];
  CHECK(t["name"] == "speed");
  CHECK(t["columns"][0] == json({{"key", "batch"}, {"label", "batch"}, {"unit", ""}}));
  CHECK(t["columns"][1] ==
        json({{"key", "sorl"}, {"label", "sorl"}, {"unit", "tokens/s"}, {"digits", 1}}));
  CHECK(t["columns"][2]["baseline"] == true);
  CHECK(t["rows"] == json::parse("[[1, 27.44, 20.5], [64, null, null]]"));
  CHECK(t["baseline_rows"] == json::array({1}));
}

TEST_CASE("a driver's command line replaces the process's own") {
  scoped_env command("SORL_BENCH_COMMAND", "bench/decode_model.sh models/x --batches 1");
  const json j = json::parse(sample_record().to_json());
  CHECK(j["command"] == "bench/decode_model.sh models/x --batches 1");
  CHECK(j["argv"][0] == "bench/example");
}

TEST_CASE("a driver's start gives the record's date and load, and a malformed one is ignored") {
  scoped_env start("SORL_BENCH_START", "2026-01-02T03:04:05Z 0.42");
  const json j = json::parse(sample_record().to_json());
  CHECK(j["date_utc"] == "2026-01-02T03:04:05Z");
  CHECK(j["machine"]["load_1min_at_start"] == 0.42);
  CHECK(j["duration_s"].get<double>() > 1000.0); // counted from that (past) start
  scoped_env bad("SORL_BENCH_START", "yesterday 0.42");
  const json k = json::parse(sample_record().to_json());
  CHECK(k["date_utc"] != "2026-01-02T03:04:05Z");
}

TEST_CASE("a row of the wrong width and a repeated or odd key are refused") {
  bench_record rec = sample_record();
  record_table& t = rec.add_table("other", "", {{"a", "a"}, {"b", "b"}});
  CHECK_THROWS_WITH(t.add_row({1}), "bench record table 'other': a row of 1 cells for 2 columns");
  CHECK_THROWS_WITH(rec.add_table("other", "", {}), "bench record: a second table named 'other'");
  CHECK_THROWS_WITH(rec.add_table("third", "", {{"a", "a"}, {"a", "b"}}),
                    "bench record table 'third': column key 'a' repeated");
  CHECK_THROWS_WITH(rec.add_table("fourth", "", {{"two words", "a"}}),
                    "bench record table 'fourth': column key 'two words' must be letters, "
                    "digits, '_', '.' or '-'");
}

TEST_CASE("arguments are quoted as a shell reads them back") {
  CHECK(shell_quote("--batches") == "--batches");
  CHECK(shell_quote("1,8,32") == "1,8,32");
  CHECK(shell_quote("") == "''");
  CHECK(shell_quote("a b") == "'a b'");
  CHECK(shell_quote("it's") == "'it'\"'\"'s'");
}

TEST_CASE("the record goes where the flag, then the environment, then runs/bench/ say") {
  scoped_env env("SORL_BENCH_RECORD", "/tmp/from-env.json");
  CHECK(record_path("decode", "/tmp/flag.json") == "/tmp/flag.json");
  CHECK(record_path("decode", "") == "/tmp/from-env.json");
  scoped_env unset("SORL_BENCH_RECORD", nullptr);
  const std::string p = record_path("decode", "");
  CHECK(p.rfind("runs/bench/decode-", 0) == 0);
  CHECK(p.size() == std::string("runs/bench/decode-20261207T101112Z.json").size());
  CHECK(p.substr(p.size() - 5) == ".json");
}

TEST_CASE("the GPUs are the models the NVIDIA driver lists, or none") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(SORL_TEST_DATA_DIR) / "bench_record_gpus";
  fs::remove_all(dir);
  for (const auto& [bus, model] : {std::pair{"0000:01:00.0", "NVIDIA H200"},
                                   std::pair{"0000:02:00.0", "NVIDIA H100 80GB HBM3"}}) {
    fs::create_directories(dir / bus);
    std::ofstream(dir / bus / "information") << "Model: \t\t " << model << "\nIRQ:   \t\t 34\n";
  }
  CHECK(record_gpu_models(dir.string()) == "NVIDIA H100 80GB HBM3, NVIDIA H200");
  CHECK(record_gpu_models((dir / "missing").string()) == "none");
}

TEST_CASE("write creates the folder and writes the JSON, and none writes nothing") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(SORL_TEST_DATA_DIR) / "bench_record_test";
  fs::remove_all(dir);
  const bench_record rec = sample_record();
  const fs::path file = dir / "sub" / "r.json";
  REQUIRE(rec.write(file.string()));
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str());
  CHECK(j["tables"][0]["rows"][0][1] == 27.44);
  CHECK(j["duration_s"].get<double>() >= 0.0);
  CHECK_FALSE(rec.write("none"));
  CHECK_FALSE(fs::exists("none"));
}
