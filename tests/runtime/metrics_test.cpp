#include "runtime/metrics.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using sorl::metrics_open_mode;
using sorl::metrics_record;
using sorl::metrics_sink;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::path(SORL_TEST_DATA_DIR) / "metrics_test" / name;
  fs::remove_all(dir);
  return dir;
}

std::vector<std::string> lines_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

std::string read_all(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

metrics_record rec(int64_t step) {
  metrics_record r;
  r.step = step;
  r.reward_mean = 0.25 * static_cast<double>(step);
  return r;
}

metrics_record example() {
  metrics_record r;
  r.step = 12;
  r.reward_mean = 0.43;
  r.group_size = 8;
  r.wall_s = 3.1;
  r.rollout_s = 2.2;
  r.learn_s = 0.7;
  r.sync_s = 0.2;
  r.tokens_per_s = 412.3;
  return r;
}

} // namespace

TEST_CASE("the progress line of a full record reads exactly as documented", "[metrics]") {
  CHECK(sorl::progress_line(example(), 100)
        == "step 12/100  reward 0.43  G 8  step 3.1s (rollout 2.2 | learn 0.7 | sync 0.2)  "
           "412 tok/s");
}

TEST_CASE("the progress line leaves out missing fields", "[metrics]") {
  metrics_record r;
  r.step = 3;
  CHECK(sorl::progress_line(r, 0) == "step 3");
  r.reward_mean = -0.5;
  CHECK(sorl::progress_line(r, 10) == "step 3/10  reward -0.50");
  r.rollout_s = 1.04;
  r.sync_s = 0.46;
  CHECK(sorl::progress_line(r, 10) == "step 3/10  reward -0.50  (rollout 1.0 | sync 0.5)");
  r.wall_s = 12.0;
  r.stragglers = 0;
  CHECK(sorl::progress_line(r, 10)
        == "step 3/10  reward -0.50  step 12.0s (rollout 1.0 | sync 0.5)");
  r.stragglers = 2;
  CHECK(sorl::progress_line(r, 10)
        == "step 3/10  reward -0.50  step 12.0s (rollout 1.0 | sync 0.5)  stragglers 2");
}

TEST_CASE("the trailing reward mean averages the last window of steps, fewer at the start",
          "[metrics]") {
  using sorl::reward_trailing_mean;
  CHECK_FALSE(reward_trailing_mean({}).has_value());
  CHECK_FALSE(reward_trailing_mean({0.5}, 0).has_value());
  CHECK(*reward_trailing_mean({0.5}) == 0.5);
  // (0.25 + 0.5 + 1) / 3 = 0.58333...: all three when the window is wider.
  CHECK(*reward_trailing_mean({0.25, 0.5, 1.0}) == Approx(1.75 / 3).epsilon(1e-15));
  // Window 2 keeps only the last two: (0.5 + 1) / 2.
  CHECK(*reward_trailing_mean({0.25, 0.5, 1.0}, 2) == 0.75);
  // Twelve steps 0.1, 0.2, ..., 1.2: the default window of 10 averages 0.3 .. 1.2 = 0.75.
  std::vector<double> twelve;
  for (int i = 1; i <= 12; ++i)
    twelve.push_back(0.1 * i);
  CHECK(*reward_trailing_mean(twelve) == Approx(0.75).epsilon(1e-12));
}

TEST_CASE("the progress line puts the trailing mean after the step's reward", "[metrics]") {
  metrics_record r;
  r.step = 3;
  CHECK(sorl::progress_line(r, 10, 0.3) == "step 3/10"); // no reward, no mean
  r.reward_mean = 0.5;
  r.group_size = 8;
  CHECK(sorl::progress_line(r, 10, 0.3) == "step 3/10  reward 0.50 (mean10 0.30)  G 8");
  CHECK(sorl::progress_line(r, 10) == "step 3/10  reward 0.50  G 8");
}

TEST_CASE("a record becomes one JSON line in schema order with missing fields omitted",
          "[metrics]") {
  metrics_record r;
  r.step = 1;
  r.tokens_per_s = 100.5;
  r.wall_s = 2.5;
  r.group_size = 4;
  r.reward_per_group = {0.5, 1.0};
  r.set(sorl::metric::utility, 1.5);
  r.set(sorl::metric::deadline_cut, true);
  r.set(sorl::metric::checksum, "ok");
  CHECK(sorl::to_json_line(r)
        == R"({"step":1,"wall_s":2.5,"G":4,"reward_per_group":[0.5,1.0],"tokens_per_s":100.5,)"
           R"("deadline_cut":1.0,"utility":1.5,"checksum":"ok"})");
}

TEST_CASE("non-finite numbers are written as null and read back as missing", "[metrics]") {
  metrics_record r;
  r.step = 2;
  r.reward_mean = std::nan("");
  r.learn_s = INFINITY;
  r.reward_per_group = {1.0, std::nan("")};
  const auto line = sorl::to_json_line(r);
  CHECK(line == R"({"step":2,"learn_s":null,"reward_mean":null,"reward_per_group":[1.0,null]})");
  auto back = sorl::parse_metrics_line(line);
  CHECK(back.step == 2);
  CHECK_FALSE(back.reward_mean);
  CHECK_FALSE(back.learn_s);
  REQUIRE(back.reward_per_group.size() == 2);
  CHECK(std::isnan(back.reward_per_group[1]));
}

TEST_CASE("a record survives a round trip through its JSON line", "[metrics]") {
  auto r = example();
  r.resp_len_p50 = 17;
  r.resp_len_p99 = 64;
  r.resp_len_max = 64;
  r.stragglers = 1;
  r.reward_per_group = {0.0, 0.75};
  r.extra["sync_bytes"] = 1024;
  auto back = sorl::parse_metrics_line(sorl::to_json_line(r));
  CHECK(sorl::to_json_line(back) == sorl::to_json_line(r));
  CHECK(back.group_size == std::optional<int64_t>(8));
  CHECK(back.resp_len_p99 == std::optional<int64_t>(64));
  CHECK(back.extra.at("sync_bytes") == 1024);
}

TEST_CASE("the speculation keys are written in key order and read back", "[metrics]") {
  // The sums of two rollouts: (verify 3, plain 1, drafted 12, accepted 9, calls 4, 8000 ns)
  // and (1, 3, 4, 1, 4, 4000 ns).
  metrics_record r;
  r.step = 3;
  r.set(sorl::metric::spec_verify_steps, 4);
  r.set(sorl::metric::spec_plain_steps, 4);
  r.set(sorl::metric::spec_drafted_tokens, 16);
  r.set(sorl::metric::spec_accepted_tokens, 10);
  r.set(sorl::metric::spec_draft_calls, 8);
  r.set(sorl::metric::spec_acceptance, 10.0 / 16.0);
  r.set(sorl::metric::spec_mean_accepted, 10.0 / 4.0);
  r.set(sorl::metric::spec_draft_us, 12000.0 / 8.0 / 1000.0);
  r.set(sorl::metric::spec_share, 4.0 / 8.0);
  const auto line = sorl::to_json_line(r);
  CHECK(line == R"({"step":3,"spec_acceptance":0.625,"spec_accepted_tokens":10.0,)"
                R"("spec_draft_calls":8.0,"spec_draft_us":1.5,"spec_drafted_tokens":16.0,)"
                R"("spec_mean_accepted":2.5,"spec_plain_steps":4.0,"spec_share":0.5,)"
                R"("spec_verify_steps":4.0})");
  const auto back = sorl::parse_metrics_line(line);
  CHECK(back.extra == r.extra);
  for (const auto& [key, value] : r.extra)
    CHECK(sorl::metric::find(key)->group == sorl::metric::group::speculation);
}

TEST_CASE("bad records and lines are rejected with the reason", "[metrics]") {
  metrics_record r;
  r.step = 1;
  r.extra["G"] = 3;
  CHECK_THROWS_WITH(sorl::to_json_line(r), Catch::Contains("\"G\" repeats a schema key"));
  r.extra.clear();
  r.extra[""] = 1;
  CHECK_THROWS_AS(sorl::to_json_line(r), std::invalid_argument);
  r.extra.clear();
  r.extra["z_custom"] = 1.5;
  CHECK_THROWS_WITH(sorl::to_json_line(r),
                    Catch::Contains("\"z_custom\" has no such row in the metric schema"));
  r.extra.clear();
  r.extra["checksum"] = 1; // a text key written as a number
  CHECK_THROWS_WITH(sorl::to_json_line(r), Catch::Contains("numeric key \"checksum\""));
  r.extra.clear();
  r.extra_text["loss"] = "low"; // a numeric key written as text
  CHECK_THROWS_WITH(sorl::to_json_line(r), Catch::Contains("text key \"loss\""));
  r.extra_text.clear();
  CHECK_THROWS_WITH(r.set_numeric("lossy", 1), Catch::Contains("\"lossy\" is not a numeric key"));
  CHECK_THROWS_WITH(r.set_numeric("model_hash", 1), Catch::Contains("\"model_hash\""));
  CHECK(r.extra.empty());
  CHECK_THROWS_WITH(sorl::parse_metrics_line("{\"step\":1,"), Catch::Contains("not valid JSON"));
  CHECK_THROWS_WITH(sorl::parse_metrics_line("[1]"), Catch::Contains("not a JSON object"));
  CHECK_THROWS_WITH(sorl::parse_metrics_line("{\"wall_s\":1}"), Catch::Contains("\"step\""));
  CHECK_THROWS_WITH(sorl::parse_metrics_line(R"({"step":1,"G":"eight"})"),
                    Catch::Contains("\"G\" must be an integer"));
}

TEST_CASE("the sink writes one flushed line per step and refuses repeated steps",
          "[metrics]") {
  const auto dir = fresh_dir("write");
  metrics_sink sink(dir / "nested");
  CHECK(sink.path() == dir / "nested" / "metrics.jsonl");
  sink.write(rec(1));
  // Flushed per record: visible to a reader while the sink is still open.
  CHECK(lines_of(sink.path()) == std::vector<std::string>{R"({"step":1,"reward_mean":0.25})"});
  sink.write(rec(2));
  sink.write(rec(5)); // a gap is allowed (e.g. a skipped step), going back is not
  CHECK(lines_of(sink.path()).size() == 3);
  CHECK_THROWS_WITH(sink.write(rec(5)), Catch::Contains("does not follow the last recorded"));
  CHECK_THROWS_WITH(sink.write(rec(0)), Catch::Contains("1-based"));
  CHECK(sink.records() == 3);
  CHECK(sink.last_step() == std::optional<int64_t>(5));
}

TEST_CASE("a fresh sink replaces an old file", "[metrics]") {
  const auto dir = fresh_dir("fresh");
  {
    metrics_sink sink(dir);
    sink.write(rec(1));
    sink.write(rec(2));
  }
  metrics_sink again(dir, metrics_open_mode::fresh);
  CHECK(again.records() == 0);
  CHECK(read_all(again.path()).empty());
}

TEST_CASE("resume appends after the existing records", "[metrics]") {
  const auto dir = fresh_dir("resume");
  {
    metrics_sink sink(dir);
    for (int64_t s = 1; s <= 3; ++s)
      sink.write(rec(s));
  }
  metrics_sink sink(dir, metrics_open_mode::resume);
  CHECK(sink.records() == 3);
  CHECK(sink.last_step() == std::optional<int64_t>(3));
  CHECK(sink.dropped_on_open() == 0);
  CHECK_THROWS_AS(sink.write(rec(3)), std::invalid_argument);
  sink.write(rec(4));
  auto lines = lines_of(sink.path());
  REQUIRE(lines.size() == 4);
  CHECK(sorl::parse_metrics_line(lines[3]).step == 4);
}

TEST_CASE("resume from a checkpoint drops the records after its step", "[metrics]") {
  const auto dir = fresh_dir("truncate");
  {
    metrics_sink sink(dir);
    for (int64_t s = 1; s <= 5; ++s)
      sink.write(rec(s));
  }
  metrics_sink sink(dir, metrics_open_mode::resume, /*keep_through_step=*/3);
  CHECK(sink.records() == 3);
  CHECK(sink.dropped_on_open() == 2);
  CHECK(sink.last_step() == std::optional<int64_t>(3));
  sink.write(rec(4));
  auto lines = lines_of(sink.path());
  REQUIRE(lines.size() == 4);
  CHECK(lines[2] == R"({"step":3,"reward_mean":0.75})");
  CHECK(lines[3] == R"({"step":4,"reward_mean":1.0})");
  CHECK_FALSE(fs::exists(dir / "metrics.jsonl.tmp"));
}

TEST_CASE("resume drops a line torn by a crash mid-write", "[metrics]") {
  const auto dir = fresh_dir("torn");
  {
    metrics_sink sink(dir);
    sink.write(rec(1));
    sink.write(rec(2));
  }
  {
    std::ofstream out(dir / "metrics.jsonl", std::ios::app | std::ios::binary);
    out << R"({"step":3,"wall_)"; // no newline: the crash hit inside the write
  }
  metrics_sink sink(dir, metrics_open_mode::resume);
  CHECK(sink.records() == 2);
  CHECK(sink.dropped_on_open() == 1);
  sink.write(rec(3));
  CHECK(read_all(sink.path())
        == "{\"step\":1,\"reward_mean\":0.25}\n{\"step\":2,\"reward_mean\":0.5}\n"
           "{\"step\":3,\"reward_mean\":0.75}\n");
}

TEST_CASE("resume over a damaged complete line fails and names the line", "[metrics]") {
  const auto dir = fresh_dir("damaged");
  fs::create_directories(dir);
  {
    std::ofstream out(dir / "metrics.jsonl", std::ios::binary);
    out << "{\"step\":1}\n{\"step\":oops}\n{\"step\":3}\n";
  }
  CHECK_THROWS_WITH(metrics_sink(dir, metrics_open_mode::resume),
                    Catch::Contains("metrics.jsonl:2: metrics record: not valid JSON"));
  {
    std::ofstream out(dir / "metrics.jsonl", std::ios::binary);
    out << "{\"step\":2}\n{\"step\":1}\n";
  }
  CHECK_THROWS_WITH(metrics_sink(dir, metrics_open_mode::resume),
                    Catch::Contains("metrics.jsonl:2: step 1 does not follow step 2"));
}

TEST_CASE("resume without a file starts one", "[metrics]") {
  const auto dir = fresh_dir("resume_empty");
  metrics_sink sink(dir, metrics_open_mode::resume, 7);
  CHECK(sink.records() == 0);
  CHECK_FALSE(sink.last_step());
  sink.write(rec(1));
  CHECK(lines_of(sink.path()).size() == 1);
}

TEST_CASE("the metric schema names every key once and the typed setters store by kind",
          "[metrics]") {
  std::set<std::string> keys;
  for (const auto& row : sorl::metric::schema()) {
    CHECK(keys.insert(row.key).second);
    CHECK(sorl::metric::find(row.key) == &row);
    CHECK(std::string(row.meaning).size() > 0);
  }
  CHECK(keys.size() == sorl::metric::schema().size());
  CHECK(sorl::metric::find("G")->kind == sorl::metric::kind::member_int);
  CHECK(sorl::metric::find("no_such_key") == nullptr);
  metrics_record r;
  r.step = 1;
  r.set(sorl::metric::trained_rollouts, size_t{5});
  r.set(sorl::metric::straggler_event, false);
  r.set_numeric("loss", -0.25);
  CHECK(r.extra == std::map<std::string, double>{
                     {"loss", -0.25}, {"straggler_event", 0.0}, {"trained_rollouts", 5.0}});
  CHECK(sorl::to_json_line(r) == R"({"step":1,"loss":-0.25,"straggler_event":0.0,"trained_rollouts":5.0})");
}

TEST_CASE("the metrics table of docs/run-directory.md is the one generated from the schema",
          "[metrics]") {
  // Regenerate with `build/sorl metrics` and paste between the markers.
  const std::string readme = read_all(fs::path(SORL_SOURCE_DIR) / "docs" / "run-directory.md");
  const std::string begin = "<!-- metrics table: generated by `sorl metrics` -->\n";
  const std::string end = "<!-- end of metrics table -->";
  const auto b = readme.find(begin);
  REQUIRE(b != std::string::npos);
  const auto e = readme.find(end, b);
  REQUIRE(e != std::string::npos);
  const std::string table = sorl::metric::markdown();
  CHECK(readme.substr(b + begin.size(), e - b - begin.size()) == table);
  // A pipe inside a meaning is escaped, so that each row keeps its five cells.
  CHECK(table.find("\\|learner log-prob - rollout sampling log-prob\\|") != std::string::npos);
  CHECK(table.find("| `sync_bytes` | sync | number | bytes | payload per worker (averaged over "
                   "workers) |\n")
        != std::string::npos);
}
