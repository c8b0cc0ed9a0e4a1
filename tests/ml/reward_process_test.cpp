#include "runtime/ml/tasks/reward_process.hpp"

#include "tests/support/scratch_dir.hpp"

#include <catch2/catch.hpp>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace sorl::ml;
namespace fs = std::filesystem;

namespace {

using clock_type = std::chrono::steady_clock;

fs::path write_file(const fs::path& dir, const std::string& name, const std::string& text) {
  const fs::path path = dir / name;
  std::ofstream(path) << text;
  return path;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A Python scorer: `body` computes `rewards` (and may set `errors`, or write `out` itself)
// from `items` and `req` for each request line.
std::string python_scorer(const std::string& body) {
  return "import json, os, signal, sys, time\n"
         "while True:\n"
         "    line = sys.stdin.readline()\n"
         "    if not line:\n"
         "        break\n"
         "    req = json.loads(line)\n"
         "    items = req['items']\n"
         "    errors = None\n"
         "    out = None\n"
         + body
         + "    if out is None:\n"
           "        reply = {'id': req['id'], 'rewards': rewards}\n"
           "        if errors is not None:\n"
           "            reply['errors'] = errors\n"
           "        out = json.dumps(reply) + '\\n'\n"
           "    sys.stdout.write(out)\n"
           "    sys.stdout.flush()\n";
}

reward_process_options python_options(const fs::path& script) {
  reward_process_options o;
  o.argv = {"python3", script.string()};
  return o;
}

reward_request item(std::string completion, std::string answer = "", std::string entry = "") {
  reward_request r;
  r.prompt = "p";
  r.completion = std::move(completion);
  r.answer = std::move(answer);
  r.entry_json = std::move(entry);
  return r;
}

// The length-based scorer most cases use: reward = len(completion) / 100.
const std::string length_body = "    rewards = [len(it['completion']) / 100 for it in items]\n";

// Whether `pid` is no longer a child of this process (reaped, or never ours).
bool reaped(int pid) {
  int status = 0;
  return ::waitpid(pid, &status, WNOHANG) < 0 && errno == ECHILD;
}

// Whether this process has no children at all, running or unreaped.
bool no_children() {
  int status = 0;
  return ::waitpid(-1, &status, WNOHANG) < 0 && errno == ECHILD;
}

// Whether process `pid` is gone or a zombie (an orphan waits for its reaper).
bool dead(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return true;
  const auto paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'Z';
}

long long ms_since(clock_type::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start).count();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("reward_process: rewards from a correct scorer, in order", "[reward_process]") {
  const sorl::test::scratch_dir scratch("reward_process_correct");
  const fs::path& dir = scratch.path;
  // The reward shows that completion, answer and entry all arrive intact.
  const fs::path script = write_file(
    dir, "scorer.py",
    python_scorer("    rewards = [len(it['completion']) / 100 + (0.5 if it['answer'] == 'yes' else 0)\n"
                  "               + (it['entry']['bonus'] if it['entry'] else 0) for it in items]\n"));
  {
    reward_process rp(python_options(script));
    CHECK_FALSE(rp.pid().has_value());
    const std::vector<reward_outcome> out
      = rp.score({item("abc"), item(""), item("abcdefghij", "yes"), item("a", "", R"({"bonus": 0.25})"),
                  item("line\nbreak \xff\"quoted\"")});
    REQUIRE(out.size() == 5);
    for (const reward_outcome& o : out) {
      CHECK(o.ok());
      CHECK(o.failure == reward_failure::none);
      CHECK(o.reason.empty());
    }
    CHECK(*out[0].reward == 0.03);
    CHECK(*out[1].reward == 0.0);
    CHECK(*out[2].reward == 0.1 + 0.5);
    CHECK(*out[3].reward == 0.01 + 0.25);
    // Invalid UTF-8 is sent as U+FFFD, one character.
    CHECK(*out[4].reward == 0.2);
    CHECK(rp.pid().has_value());
    CHECK(rp.score({}).empty());
    CHECK(*rp.score({item("abcd")})[0].reward == 0.04);
    const reward_process_failures f = rp.failures();
    CHECK(f.starts == 1);
    CHECK(f.timeouts + f.crashes + f.malformed + f.invalid_rewards + f.scorer_errors == 0);
  }
  CHECK(no_children());
}

TEST_CASE("reward_process: requests are cut at max_batch items", "[reward_process]") {
  const sorl::test::scratch_dir scratch("reward_process_batches");
  const fs::path& dir = scratch.path;
  // Each item's reward is its batch's size, its note the request id.
  const fs::path script = write_file(
    dir, "scorer.py",
    python_scorer("    rewards = [len(items) / 10 for it in items]\n"
                  "    errors = [str(req['id']) for it in items]\n"));
  reward_process_options o = python_options(script);
  o.max_batch = 3;
  reward_process rp(o);
  std::vector<reward_request> items(10, item("x"));
  const std::vector<reward_outcome> out = rp.score(items);
  REQUIRE(out.size() == 10);
  for (std::size_t i = 0; i < out.size(); ++i) {
    INFO("item " << i);
    REQUIRE(out[i].ok());
    CHECK(*out[i].reward == (i < 9 ? 0.3 : 0.1));
    CHECK(out[i].reason == std::to_string(i / 3 + 1));
  }
  const std::vector<reward_outcome> next = rp.score({item("x"), item("y")});
  CHECK(*next[0].reward == 0.2);
  CHECK(next[1].reason == "5");
  CHECK(rp.failures().starts == 1);
}

TEST_CASE("reward_process: a crash fails its batch, says why, and the next batch restarts",
          "[reward_process]") {
  const sorl::test::scratch_dir scratch("reward_process_crash");
  const fs::path& dir = scratch.path;
  const fs::path script = write_file(
    dir, "scorer.py",
    python_scorer("    for it in items:\n"
                  "        if it['completion'] == 'crash':\n"
                  "            sys.stderr.write('about to fail\\nValueError: cannot score crash\\n')\n"
                  "            sys.stderr.flush()\n"
                  "            sys.exit(3)\n"
                  "        if it['completion'] == 'segv':\n"
                  "            os.kill(os.getpid(), signal.SIGSEGV)\n"
                  + length_body));
  reward_process_options o = python_options(script);
  o.max_batch = 2;
  reward_process rp(o);

  const std::vector<reward_outcome> out
    = rp.score({item("a"), item("bb"), item("crash"), item("ccc"), item("dddd"), item("e")});
  REQUIRE(out.size() == 6);
  CHECK(*out[0].reward == 0.01);
  CHECK(*out[1].reward == 0.02);
  for (int i : {2, 3}) {
    INFO(out[i].reason);
    CHECK_FALSE(out[i].ok());
    CHECK(out[i].failure == reward_failure::crash);
    CHECK(contains(out[i].reason, "reward process exited with status 3"));
    CHECK(contains(out[i].reason, "stderr: "));
    CHECK(contains(out[i].reason, "ValueError: cannot score crash"));
  }
  // The batch after the crash ran in a new process.
  CHECK(*out[4].reward == 0.04);
  CHECK(*out[5].reward == 0.01);
  CHECK(rp.failures().crashes == 1);
  CHECK(rp.failures().starts == 2);
  CHECK(rp.consecutive_failures() == 0);

  const int before = *rp.pid();
  const std::vector<reward_outcome> segv = rp.score({item("segv")});
  CHECK(segv[0].failure == reward_failure::crash);
  CHECK(contains(segv[0].reason, "reward process was killed by signal 11 (SIGSEGV)"));
  CHECK(reaped(before));
  CHECK_FALSE(rp.pid().has_value());

  const std::vector<reward_outcome> again = rp.score({item("four")});
  REQUIRE(again[0].ok());
  CHECK(*again[0].reward == 0.04);
  CHECK(rp.failures().crashes == 2);
  CHECK(rp.failures().starts == 3);
}

TEST_CASE("reward_process: a hung scorer times out, is killed with its children, and is restarted",
          "[reward_process]") {
  const sorl::test::scratch_dir scratch("reward_process_hang");
  const fs::path& dir = scratch.path;
  // sh starts in a few ms, so the short timeout measures the hang and not a start-up. A
  // request holding "hang" puts a sleeping child of its own in the group, and waits for it.
  // nlohmann writes keys in order, so a request starts with {"id":<id>,.
  const fs::path sleeper_pid = dir / "sleeper.pid";
  const fs::path script = write_file(dir, "scorer.sh",
                                     "while IFS= read -r line; do\n"
                                     "  case \"$line\" in *hang*) sleep 100 & echo $! > '"
                                       + sleeper_pid.string()
                                       + "'; wait;; esac\n"
                                         "  id=${line#'{\"id\":'}; id=${id%%,*}\n"
                                         "  printf '{\"id\":%s,\"rewards\":[0.5]}\\n' \"$id\"\n"
                                         "done\n");
  reward_process_options o;
  o.argv = {"/bin/sh", script.string()};
  o.timeout_ms = 300;
  reward_process rp(o);

  REQUIRE(*rp.score({item("fine")})[0].reward == 0.5);
  const int child = *rp.pid();
  const auto start = clock_type::now();
  const std::vector<reward_outcome> out = rp.score({item("hang")});
  const long long took = ms_since(start);
  CHECK(took >= 300);
  CHECK(took < 300 + 700);
  CHECK(out[0].failure == reward_failure::timeout);
  CHECK(out[0].reason == "reward process timed out after 300 ms");
  CHECK(rp.failures().timeouts == 1);
  CHECK(reaped(child));
  const int sleeper = std::stoi(read_file(sleeper_pid));
  // SIGKILL to the group reaches the sleeper too; its reaper may take a moment.
  const auto wait_start = clock_type::now();
  while (!dead(sleeper) && ms_since(wait_start) < 2000)
    ::usleep(10000);
  CHECK(dead(sleeper));

  const std::vector<reward_outcome> again = rp.score({item("fine")});
  REQUIRE(again[0].ok());
  CHECK(*again[0].reward == 0.5);
  CHECK(rp.failures().starts == 2);
}

TEST_CASE("reward_process: a batch past the deadline is not sent", "[reward_process]") {
  const sorl::test::scratch_dir scratch("reward_process_deadline");
  const fs::path& dir = scratch.path;
  const fs::path script = write_file(dir, "scorer.sh",
                                     "while IFS= read -r line; do\n"
                                     "  case \"$line\" in *slow*) sleep 100;; esac\n"
                                     "  id=${line#'{\"id\":'}; id=${id%%,*}\n"
                                     "  printf '{\"id\":%s,\"rewards\":[0.5]}\\n' \"$id\"\n"
                                     "done\n");
  reward_process_options o;
  o.argv = {"/bin/sh", script.string()};
  o.timeout_ms = 200;
  o.max_batch = 1;
  reward_process rp(o);
  const std::vector<reward_outcome> out = rp.score({item("a"), item("slow"), item("b")});
  CHECK(*out[0].reward == 0.5);
  CHECK(out[1].reason == "reward process timed out after 200 ms");
  CHECK(out[2].failure == reward_failure::timeout);
  CHECK(out[2].reason == "reward process timed out after 200 ms, before this batch was sent");
  CHECK(rp.failures().timeouts == 1);
  CHECK(rp.failures().starts == 1);
}

TEST_CASE("reward_process: malformed replies fail the whole batch and restart the scorer",
          "[reward_process]") {
  const sorl::test::scratch_dir scratch("reward_process_malformed");
  const fs::path& dir = scratch.path;
  struct scenario {
    const char* name;
    std::string body;
    std::string reason; // a part of the expected reason
  };
  const std::vector<scenario> scenarios = {
    {"debug output before the reply",
     "    print('debug: scoring', len(items), 'items')\n" + length_body,
     "malformed reply: not JSON: \"debug: scoring 2 items\""},
    {"wrong id", length_body + "    out = json.dumps({'id': req['id'] + 1, 'rewards': rewards}) + '\\n'\n",
     "malformed reply: id 2, expected 1"},
    {"too few rewards", length_body + "    rewards = rewards[1:]\n",
     "malformed reply: rewards has 1 entries for 2 items"},
    {"too many rewards", length_body + "    rewards = rewards + [0.5]\n",
     "malformed reply: rewards has 3 entries for 2 items"},
    {"NaN", "    rewards = [float('nan') for it in items]\n",
     "(NaN and Infinity are not JSON: send null with a reason in errors)"},
    {"no rewards", "    out = json.dumps({'id': req['id']}) + '\\n'\n", "malformed reply: no rewards array"},
    {"not an object", "    out = '[1, 2]\\n'\n", "malformed reply: an array, not an object"},
    {"errors of the wrong length", length_body + "    errors = ['x']\n",
     "malformed reply: errors has 1 entries for 2 items"},
    {"errors holding a number", length_body + "    errors = [None, 3]\n",
     "malformed reply: errors holds a non-string"},
  };
  for (const scenario& sc : scenarios) {
    SECTION(sc.name) {
      const fs::path script = write_file(dir, "scorer.py", python_scorer(sc.body));
      reward_process rp(python_options(script));
      const std::vector<reward_outcome> out = rp.score({item("a"), item("bb")});
      REQUIRE(out.size() == 2);
      for (const reward_outcome& o : out) {
        INFO(o.reason);
        CHECK(o.failure == reward_failure::malformed);
        CHECK_FALSE(o.reward.has_value());
        CHECK(contains(o.reason, sc.reason));
      }
      CHECK(rp.failures().starts == 1);
      CHECK(rp.failures().malformed == 1);
      CHECK_FALSE(rp.pid().has_value()); // killed and reaped, to be started by the next batch
      rp.score({item("a")});
      CHECK(rp.failures().starts == 2);
    }
  }
  CHECK(no_children());
}

TEST_CASE("reward_process: output after a reply counts as malformed before the next request",
          "[reward_process]") {
  const sorl::test::scratch_dir scratch("reward_process_stray");
  const fs::path& dir = scratch.path;
  // One write, so that the stray line arrives with the reply.
  const fs::path script = write_file(
    dir, "scorer.py",
    python_scorer(length_body + "    out = json.dumps({'id': req['id'], 'rewards': rewards}) + '\\nstray\\n'\n"));
  reward_process rp(python_options(script));
  CHECK(*rp.score({item("a")})[0].reward == 0.01);
  CHECK(rp.failures().malformed == 0);
  // The stray line is found before the next request, which a fresh process answers.
  CHECK(*rp.score({item("ab")})[0].reward == 0.02);
  CHECK(rp.failures().malformed == 1);
  CHECK(rp.failures().starts == 2);
}

TEST_CASE("reward_process: a reply line longer than max_line_bytes is malformed", "[reward_process]") {
  const sorl::test::scratch_dir scratch("reward_process_long");
  const fs::path& dir = scratch.path;
  const fs::path script = write_file(
    dir, "scorer.py",
    python_scorer(length_body
                  + "    out = json.dumps({'id': req['id'], 'rewards': rewards, 'pad': 'x' * 5000}) + '\\n'\n"));
  reward_process_options o = python_options(script);
  o.max_line_bytes = 1000;
  reward_process rp(o);
  const reward_outcome out = rp.score({item("a")})[0];
  CHECK(out.failure == reward_failure::malformed);
  CHECK(out.reason == "malformed reply: line longer than 1000 bytes");

  o.max_line_bytes = 6000;
  reward_process wide(o);
  CHECK(*wide.score({item("a")})[0].reward == 0.01);
}

TEST_CASE("reward_process: per-item errors and invalid rewards fail only their items", "[reward_process]") {
  const sorl::test::scratch_dir scratch("reward_process_items");
  const fs::path& dir = scratch.path;
  // Written by hand, to hold values json.dumps would not write for a scorer's floats.
  const fs::path script = write_file(
    dir, "scorer.py",
    python_scorer("    out = '{\"id\": %d, \"rewards\": [null, 0.25, null, \"0.5\", 1.5, -0.1, [], true, 1],"
                  " \"errors\": [\"no <answer> tag\\\\nfound\", \"partial credit\", null, null, null, null,"
                  " null, null, null]}\\n' % req['id']\n"));
  reward_process rp(python_options(script));
  const std::vector<reward_outcome> out = rp.score(std::vector<reward_request>(9, item("x")));
  REQUIRE(out.size() == 9);
  CHECK(out[0].failure == reward_failure::scorer);
  CHECK(out[0].reason == "scorer: no <answer> tag\\nfound");
  REQUIRE(out[1].ok());
  CHECK(*out[1].reward == 0.25);
  CHECK(out[1].reason == "partial credit");
  CHECK(out[2].failure == reward_failure::invalid);
  CHECK(out[2].reason == "malformed reply: rewards[2] is null without a reason in errors");
  CHECK(out[3].reason == "malformed reply: rewards[3] is a string, not a number");
  CHECK(out[4].reason == "malformed reply: rewards[4] = 1.5 is outside [0.0, 1.0]");
  CHECK(out[5].reason == "malformed reply: rewards[5] = -0.1 is outside [0.0, 1.0]");
  CHECK(out[6].failure == reward_failure::invalid);
  CHECK(out[6].reason == "malformed reply: rewards[6] is an array, not a number");
  CHECK(out[7].reason == "malformed reply: rewards[7] is a boolean, not a number");
  REQUIRE(out[8].ok());
  CHECK(*out[8].reward == 1.0);
  const reward_process_failures f = rp.failures();
  CHECK(f.scorer_errors == 1);
  CHECK(f.invalid_rewards == 6);
  CHECK(f.malformed == 0);
  CHECK(f.starts == 1);
  CHECK(rp.pid().has_value()); // the process keeps running

  SECTION("a wider range accepts the out-of-range numbers") {
    reward_process_options o = python_options(script);
    o.min_reward = -1.0;
    o.max_reward = 2.0;
    reward_process wide(o);
    const std::vector<reward_outcome> w = wide.score(std::vector<reward_request>(9, item("x")));
    CHECK(*w[4].reward == 1.5);
    CHECK(*w[5].reward == -0.1);
    CHECK(w[6].failure == reward_failure::invalid);
  }
}

TEST_CASE("reward_process: a scorer flooding stderr does not deadlock", "[reward_process]") {
  const sorl::test::scratch_dir scratch("reward_process_flood");
  const fs::path& dir = scratch.path;
  // 2 MB of stderr before reading the first request, and 2 MB more before each reply,
  // while sorl writes a request too big for the stdin pipe.
  const fs::path script = write_file(
    dir, "scorer.py",
    "import sys\n"
    "sys.stderr.write('start ' + 'e' * 2000000 + '\\n')\n"
    "sys.stderr.flush()\n"
    + python_scorer("    sys.stderr.write('noise ' * 350000 + 'last words\\n')\n"
                    "    sys.stderr.flush()\n"
                    + length_body));
  reward_process_options o = python_options(script);
  o.timeout_ms = 20000;
  o.max_reward = 1e9;
  reward_process rp(o);
  const std::string big(1 << 20, 'c');
  for (int call = 0; call < 2; ++call) {
    const std::vector<reward_outcome> out = rp.score({item(big), item("ab")});
    REQUIRE(out[0].ok());
    CHECK(*out[0].reward == (1 << 20) / 100.0);
    CHECK(*out[1].reward == 0.02);
  }
  const std::string tail = rp.stderr_tail();
  CHECK(tail.size() <= o.stderr_tail_bytes);
  CHECK(tail.size() > 1000);
  CHECK(contains(tail, "noise last words\n"));
  CHECK(rp.failures().starts == 1);
}

TEST_CASE("reward_process: a scorer that cannot start is given up after max_restarts",
          "[reward_process]") {
  const sorl::test::scratch_dir scratch("reward_process_exits");
  const fs::path& dir = scratch.path;
  const fs::path starts = dir / "starts";
  reward_process_options o;
  o.argv = {"/bin/sh", "-c",
            "echo started >> '" + starts.string() + "'; echo 'fatal: no config' >&2; exit 2"};
  o.max_restarts = 2;
  reward_process rp(o);
  // Larger than a pipe: the write meets a closed stdin, and SIGPIPE must not end the test.
  const std::vector<reward_request> items = {item(std::string(1 << 20, 'x')), item("y")};
  for (int call = 1; call <= 3; ++call) {
    INFO("call " << call);
    const std::vector<reward_outcome> out = rp.score(items);
    for (const reward_outcome& r : out) {
      INFO(r.reason);
      CHECK(r.failure == reward_failure::crash);
      CHECK(contains(r.reason, "reward process exited with status 2"));
      CHECK(contains(r.reason, "fatal: no config"));
    }
    CHECK(rp.consecutive_failures() == call);
  }
  CHECK(rp.disabled());
  const auto start = clock_type::now();
  const std::vector<reward_outcome> fast = rp.score(items);
  CHECK(ms_since(start) < 50);
  for (const reward_outcome& r : fast) {
    INFO(r.reason);
    CHECK(r.failure == reward_failure::disabled);
    CHECK(contains(r.reason, "reward process disabled after 3 failures in a row (max_restarts = 2); last: "
                             "reward process exited with status 2"));
  }
  CHECK(read_file(starts) == "started\nstarted\nstarted\n");
  CHECK(rp.failures().crashes == 3);
  CHECK(rp.failures().starts == 3);
  CHECK(no_children());

  rp.reset();
  CHECK_FALSE(rp.disabled());
  CHECK(rp.score({item("z")})[0].failure == reward_failure::crash);
  CHECK(read_file(starts) == "started\nstarted\nstarted\nstarted\n");
}

TEST_CASE("reward_process: writing to a scorer that closed its stdin does not raise SIGPIPE",
          "[reward_process]") {
  // stdin closed first while the rest stays up a moment, so that the write after the full
  // pipe meets EPIPE (with SIGPIPE at its default, the signal would end this test).
  reward_process_options o;
  o.argv = {"/bin/sh", "-c", "exec 0<&-; echo 'closing stdin' >&2; sleep 0.3; exit 4"};
  reward_process rp(o);
  const auto start = clock_type::now();
  const std::vector<reward_outcome> out = rp.score({item(std::string(1 << 20, 'x'))});
  CHECK(ms_since(start) < 2000);
  CHECK(out[0].failure == reward_failure::crash);
  CHECK(out[0].reason == "reward process exited with status 4; stderr: \"closing stdin\"");
  CHECK(no_children());
}

TEST_CASE("reward_process: a command that does not exist fails with the reason", "[reward_process]") {
  reward_process_options o;
  o.argv = {"/nonexistent/sorl-scorer"};
  o.max_restarts = 0;
  reward_process rp(o);
  const reward_outcome out = rp.score({item("a")})[0];
  CHECK(out.failure == reward_failure::crash);
  CHECK(out.reason == "cannot start reward process \"/nonexistent/sorl-scorer\": No such file or directory");
  CHECK(rp.disabled());
  CHECK(rp.score({item("a")})[0].failure == reward_failure::disabled);

  o.argv = {"true"};
  o.working_dir = "/nonexistent/dir";
  reward_process in_missing_dir(o);
  CHECK(contains(in_missing_dir.score({item("a")})[0].reason, "in \"/nonexistent/dir\": No such file"));
}

TEST_CASE("reward_process: the working directory is the one asked for", "[reward_process]") {
  const sorl::test::scratch_dir scratch("reward_process_cwd");
  const fs::path& dir = scratch.path;
  write_file(dir, "weight.txt", "0.75");
  const fs::path script = write_file(
    dir, "scorer.py", python_scorer("    rewards = [float(open('weight.txt').read()) for it in items]\n"));
  reward_process_options o = python_options(script);
  o.working_dir = dir.string();
  reward_process rp(o);
  CHECK(*rp.score({item("a")})[0].reward == 0.75);
}

TEST_CASE("reward_process: shutdown waits for a clean exit, kills a scorer that does not exit",
          "[reward_process]") {
  const sorl::test::scratch_dir scratch("reward_process_shutdown");
  const fs::path& dir = scratch.path;
  SECTION("exits at end of input") {
    const fs::path script = write_file(dir, "scorer.py", python_scorer(length_body));
    auto rp = std::make_unique<reward_process>(python_options(script));
    rp->score({item("a")});
    const auto start = clock_type::now();
    rp = nullptr;
    CHECK(ms_since(start) < 900);
  }
  SECTION("ignores end of input") {
    const fs::path script = write_file(
      dir, "scorer.py", python_scorer(length_body) + "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                                      "time.sleep(100)\n");
    reward_process_options o = python_options(script);
    o.exit_grace_ms = 200;
    auto rp = std::make_unique<reward_process>(o);
    rp->score({item("a")});
    const int child = *rp->pid();
    const auto start = clock_type::now();
    rp = nullptr;
    const long long took = ms_since(start);
    CHECK(took >= 200);
    CHECK(took < 200 + 700);
    CHECK(reaped(child));
  }
  CHECK(no_children());
}

TEST_CASE("reward_process: options and entries are checked", "[reward_process]") {
  reward_process_options o;
  CHECK_THROWS_AS(reward_process(o), std::invalid_argument);
  o.argv = {""};
  CHECK_THROWS_AS(reward_process(o), std::invalid_argument);
  o.argv = {"python3"};
  o.timeout_ms = 0;
  CHECK_THROWS_WITH(reward_process(o), Catch::Contains("timeout_ms must be > 0"));
  o.timeout_ms = 1000;
  o.max_batch = 0;
  CHECK_THROWS_WITH(reward_process(o), Catch::Contains("max_batch"));
  o.max_batch = 4;
  o.max_restarts = -1;
  CHECK_THROWS_WITH(reward_process(o), Catch::Contains("max_restarts"));
  o.max_restarts = 1;
  o.min_reward = 2.0;
  CHECK_THROWS_WITH(reward_process(o), Catch::Contains("min_reward"));
  o.min_reward = 0.0;

  // A caller's malformed entry throws before anything is started.
  reward_process rp(o);
  CHECK_THROWS_WITH(rp.score({item("a"), item("b", "", "{not json")}),
                    Catch::Contains("item 1: entry_json is not valid JSON"));
  CHECK_FALSE(rp.pid().has_value());
  CHECK(rp.failures().starts == 0);
}

TEST_CASE("reward_process: outcomes as reward_result", "[reward_process]") {
  reward_outcome ok;
  ok.reward = 0.75;
  reward_result r = to_reward_result(ok);
  CHECK(r.reward == 0.75);
  CHECK(r.reason == "reward process");
  ok.reason = "partial credit";
  CHECK(to_reward_result(ok).reason == "partial credit");

  reward_outcome failed;
  failed.failure = reward_failure::timeout;
  failed.reason = "reward process timed out after 300 ms";
  // A failure is never a reward of 0: it throws, which the worker records as reward_failed.
  try {
    (void)to_reward_result(failed);
    FAIL("a failed outcome converted to a reward");
  } catch (const reward_failed_error& e) {
    CHECK(e.kind() == reward_failure::timeout);
    CHECK(std::string(e.what()) == "reward process timed out after 300 ms");
  }

  CHECK(to_string(reward_failure::malformed) == "malformed");
  CHECK(to_string(reward_failure::disabled) == "disabled");
}

TEST_CASE("reward_process: no child is left behind", "[reward_process]") {
  const sorl::test::scratch_dir scratch("reward_process_zombies");
  const fs::path& dir = scratch.path;
  const fs::path script = write_file(
    dir, "scorer.py",
    python_scorer("    if items[0]['completion'] == 'exit':\n"
                  "        sys.exit(1)\n"
                  "    if items[0]['completion'] == 'garbage':\n"
                  "        print('garbage', flush=True)\n"
                  + length_body));
  {
    reward_process rp(python_options(script));
    std::vector<int> children;
    for (const char* what : {"ok", "exit", "garbage", "ok", "exit"}) {
      rp.score({item(what)});
      if (rp.pid()) children.push_back(*rp.pid());
    }
    CHECK(rp.failures().starts == 3);
    CHECK(children.size() == 2);
    for (int pid : children)
      CHECK(reaped(pid));
  }
  CHECK(no_children());
}
