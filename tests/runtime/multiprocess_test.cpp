// Real `sorl node` processes on loopback (port 0), every wait bounded.

#include <catch2/catch.hpp>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <thread>

#include <unistd.h>

#include "tests/support/process.hpp"

using namespace std::chrono_literals;
using sorl::test::child_process;
namespace fs = std::filesystem;

namespace {

std::string write_config(const std::string& name, const std::string& text) {
  return sorl::test::write_test_file(SORL_TEST_DATA_DIR, name, text);
}

std::string three_nodes(int rounds, int interval_ms, int connect_timeout_ms = 10000) {
  return "[smoke]\nrounds = " + std::to_string(rounds)
         + "\ninterval_ms = " + std::to_string(interval_ms)
         + "\n[network]\nheartbeat_ms = 100\nconnection_timeout_ms = 1000\n"
           "join_timeout_ms = 20000\nconnect_timeout_ms = "
         + std::to_string(connect_timeout_ms) + R"(
[[node]]
name = "main"
listen = "127.0.0.1:0"
actors = ["ping"]
[[node]]
name = "rollout-a"
actors = ["pong"]
[[node]]
name = "rollout-b"
actors = ["pong"]
)";
}

/// Starts the hub and reads the port the OS gave it.
std::unique_ptr<child_process> start_hub(const std::string& config, std::string& port) {
  auto hub = std::make_unique<child_process>(
    std::vector<std::string>{SORL_BIN, "node", config, "--node", "main"});
  REQUIRE(hub->wait_for("listening on 127.0.0.1:", 10s));
  port = sorl::test::listening_port(hub->output());
  REQUIRE_FALSE(port.empty());
  return hub;
}

std::unique_ptr<child_process> start_node(const std::string& config, const std::string& name,
                                          const std::string& port) {
  return std::make_unique<child_process>(std::vector<std::string>{
    SORL_BIN, "node", config, "--node", name, "--connect", "127.0.0.1:" + port});
}

struct running_job {
  std::unique_ptr<child_process> hub, a, b;
  std::string port;
};

/// Hub and both pong nodes of `config`, once the roster is out and pings flow.
running_job start_running(const std::string& config) {
  running_job j;
  j.hub = start_hub(config, j.port);
  j.a = start_node(config, "rollout-a", j.port);
  j.b = start_node(config, "rollout-b", j.port);
  REQUIRE(j.hub->wait_for("roster complete", 15s));
  REQUIRE(j.b->wait_for("first ping received", 5s));
  return j;
}

double ms_between(child_process::clock::time_point a, child_process::clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

} // namespace

TEST_CASE("three sorl node processes exchange envelopes and exit cleanly") {
  auto cfg = write_config("mp_clean.toml", three_nodes(100, 1));
  std::string port;
  auto hub = start_hub(cfg, port);
  auto a = start_node(cfg, "rollout-a", port);
  auto b = start_node(cfg, "rollout-b", port);
  auto hub_rc = hub->wait_exit(30s);
  INFO(hub->output());
  REQUIRE(hub_rc == 0);
  CHECK(hub->wait_for("job finished: 100 rounds, 200 answers from 2 pongers", 1s));
  CHECK(a->wait_exit(10s) == 0);
  CHECK(b->wait_exit(10s) == 0);
  CHECK(a->wait_for("job finished: 100 rounds", 1s));
}

TEST_CASE("a killed node is noticed by every other node at once and the rest finish") {
  auto cfg = write_config("mp_kill.toml", three_nodes(300, 10));
  auto [hub, a, b, port] = start_running(cfg);
  std::this_thread::sleep_for(200ms);
  auto killed_at = child_process::clock::now();
  b->signal(SIGKILL);
  auto hub_saw = hub->wait_for("peer down: pong#1@rollout-b (node lost", 5s);
  auto a_saw = a->wait_for("peer down: pong#1@rollout-b (node lost", 5s);
  INFO(hub->output() << a->output());
  REQUIRE(hub_saw);
  REQUIRE(a_saw);
  auto hub_ms = ms_between(killed_at, *hub_saw);
  auto a_ms = ms_between(killed_at, *a_saw);
  // Documented bound for a dead process: its sockets close at once; allow 1 s for a busy CI.
  CHECK(hub_ms < 1000.0);
  CHECK(a_ms < 1000.0);
  WARN("kill detection: hub " << hub_ms << " ms, other node " << a_ms << " ms");
  CHECK(hub->wait_exit(30s) == 0);
  CHECK(a->wait_exit(10s) == 0);
  CHECK(hub->wait_for("job finished: 300 rounds", 1s));
  CHECK(b->wait_exit(5s) == 128 + SIGKILL);
}

TEST_CASE("a node restarted into a running job is sent away with the reason") {
  auto cfg = write_config("mp_rejoin.toml", three_nodes(300, 10));
  auto [hub, a, b, port] = start_running(cfg);
  b->signal(SIGKILL);
  REQUIRE(hub->wait_for("peer down: pong#1@rollout-b", 5s));
  auto again = start_node(cfg, "rollout-b", port);
  auto rc = again->wait_exit(30s);
  INFO(again->output());
  CHECK(rc == 1);
  CHECK(again->wait_for("a node cannot join it midway", 1s));
  CHECK(hub->wait_exit(30s) == 0); // the job goes on without it
  CHECK(a->wait_exit(10s) == 0);
}

TEST_CASE("a frozen node is dropped after the connection timeout") {
  auto cfg = write_config("mp_freeze.toml", three_nodes(400, 10));
  std::string port;
  auto hub = start_hub(cfg, port);
  auto a = start_node(cfg, "rollout-a", port);
  auto b = start_node(cfg, "rollout-b", port);
  REQUIRE(hub->wait_for("roster complete", 15s));
  REQUIRE(b->wait_for("first ping received", 5s));
  auto frozen_at = child_process::clock::now();
  b->signal(SIGSTOP);
  auto hub_saw = hub->wait_for("peer down: pong#1@rollout-b (node lost", 10s);
  INFO(hub->output());
  REQUIRE(hub_saw);
  auto ms = ms_between(frozen_at, *hub_saw);
  // connection_timeout_ms = 1000 with heartbeats every 100 ms: dropped after ~1 s, and
  // never before the timeout could have run out.
  CHECK(ms > 500.0);
  CHECK(ms < 3000.0);
  WARN("frozen-node detection: " << ms << " ms (connection_timeout_ms = 1000)");
  CHECK(a->wait_for("peer down: pong#1@rollout-b", 5s));
  CHECK(hub->wait_exit(30s) == 0);
  CHECK(a->wait_exit(10s) == 0);
  b->signal(SIGKILL);
}

TEST_CASE("sorl refuses a non-loopback listen address without TLS") {
  auto text = R"(
[[node]]
name = "main"
listen = "0.0.0.0:0"
actors = ["ping", "pong"]
)";
  auto cfg = write_config("mp_tls.toml", text);
  for (auto cmd : {"node", "train"}) {
    std::vector<std::string> argv{SORL_BIN, cmd, cfg};
    if (std::string{cmd} == "node") {
      argv.push_back("--node");
      argv.push_back("main");
    }
    child_process p{argv};
    CHECK(p.wait_exit(10s) == 2);
    INFO(p.output());
    CHECK(p.wait_for("mp_tls.toml:4:10: key 'node[1].listen': refusing to listen on "
                     "non-loopback address 0.0.0.0:0 without TLS",
                     1s));
    CHECK(p.wait_for("nothing started", 1s));
  }
}

TEST_CASE("sorl check reports a file name that is too long as a config error, exit 2") {
  const std::string longname(300, 'x');
  auto cfg = write_config("mp_long_path.toml", "[task]\nname = \"jsonl\"\npath = \"" + longname
                                                 + ".jsonl\"\n[network]\ntls_certificate = \""
                                                 + longname + "\"\n" + R"(
[[node]]
name = "main"
actors = ["ping", "pong"]
)");
  child_process p{{SORL_BIN, "check", cfg}};
  CHECK(p.wait_exit(10s) == 2);
  INFO(p.output());
  CHECK(p.wait_for("mp_long_path.toml:3:8: key 'task.path': ", 1s));
  CHECK(p.wait_for("mp_long_path.toml:5:19: key 'network.tls_certificate': ", 1s));
  CHECK(p.wait_for("is 300 bytes long; a file name may have at most 255", 1s));
  CHECK(p.wait_for("nothing started", 1s));
  CHECK(p.output().find("terminate called") == std::string::npos);
}

TEST_CASE("the warm start's weights are those of an AVX2 machine whatever the CPU") {
  // sorl pins libtorch's, oneDNN's and OpenBLAS's kernels to AVX2 (runtime/ml/cpu_kernels.hpp);
  // run b sets by hand what an AVX2-only machine would choose by itself.
  // On an AVX-512 machine, run a without the pin differs in the last bits of every weight.
  auto run = [](const std::string& name, bool as_avx2_machine, const char* blas_dir = nullptr) {
    auto dir = fs::path{SORL_TEST_DATA_DIR} / ("isa_" + name + "_" + std::to_string(getpid()));
    fs::remove_all(dir);
    auto cfg = write_config("isa_" + name + ".toml",
                            "[model]\ncheckpoint = \"" + dir.string() + "\"\n"
                            "[task]\nmax_new_tokens = 6\n[sft]\nsteps = 8\nbatch_size = 8\n"
                            "eval_count = 0\n[[node]]\nname = \"m\"\nactors = [\"ping\"]\n");
    // This process's environment is the child's: set for the one spawn, then put back.
    std::vector<std::pair<const char*, std::optional<std::string>>> saved;
    for (auto v : {"ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE", "LD_LIBRARY_PATH"}) {
      const char* old = std::getenv(v);
      saved.emplace_back(v, old ? std::optional<std::string>{old} : std::nullopt);
    }
    if (as_avx2_machine) {
      setenv("ATEN_CPU_CAPABILITY", "avx2", 1);
      setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
      setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    }
    if (blas_dir)
      setenv("LD_LIBRARY_PATH", blas_dir, 1);
    child_process p{{SORL_BIN, "sft", cfg}};
    for (const auto& [v, old] : saved)
      old ? setenv(v, old->c_str(), 1) : unsetenv(v);
    auto rc = p.wait_exit(120s);
    INFO(p.output());
    REQUIRE(rc == 0);
    std::ifstream in{dir / "step-0000000008" / "model.safetensors", std::ios::binary};
    std::string bytes{std::istreambuf_iterator<char>{in}, {}};
    fs::remove_all(dir);
    return bytes;
  };
  auto pinned = run("pinned", false);
  auto avx2 = run("avx2", true);
  REQUIRE(pinned.size() > 1000);
  CHECK(pinned == avx2);
  // A machine whose BLAS alternative is the reference BLAS (where Debian has it): sorl loads
  // OpenBLAS instead.
  const char* reference_blas = "/usr/lib/x86_64-linux-gnu/blas";
  if (fs::exists(fs::path{reference_blas} / "libblas.so.3"))
    CHECK(run("reference_blas", false, reference_blas) == pinned);
  else
    WARN("no reference BLAS in " << reference_blas << ": the BLAS-alternative case is skipped");
}

TEST_CASE("sorl train keeps the resolved configuration and reports what a resume changed") {
  auto out = fs::path{SORL_TEST_DATA_DIR} / ("resolved_run_" + std::to_string(getpid()));
  fs::remove_all(out);
  auto text = [&](const std::string& steps_and_lr) {
    return "[run]\nname = \"r\"\noutput_dir = \"" + out.string() + "\"\n" + steps_and_lr
           + "checkpoint_every = 1\n[task]\nmax_new_tokens = 2\neval_prompts = 0\n"
             "[algorithm]\nname = \"dapo\"\nprompts_per_step = 1\ndynamic_sampling = false\n"
             "[sagc]\ngroup_size = 2\n[[node]]\nname = \"main\"\nactors = [\"trainer\", "
             "\"learner\", \"sync_publisher\", \"sagc_controller\", \"scheduler\", "
             "\"rollout_worker\"]\n";
  };
  auto read = [](const fs::path& p) {
    std::ifstream in{p};
    return std::string{std::istreambuf_iterator<char>{in}, {}};
  };
  auto first = write_config("resolved_run.toml", text("steps = 1\n"));
  {
    child_process p{{SORL_BIN, "train", first}};
    CHECK(p.wait_exit(120s) == 0);
    INFO(p.output());
    CHECK(p.wait_for("resolved_run.toml: algorithm = dapo sets clip_eps_high = 0.28 (default "
                     "0.2), overlong = \"shape\" (default \"none\")",
                     1s));
  }
  auto resolved = out / "r" / "config.resolved.toml";
  auto kept = out / "r" / "config.resolved.1.toml";
  auto before = read(resolved);
  CHECK_THAT(before, Catch::Contains("\n[algorithm]\nname = \"dapo\"\n"));
  CHECK_THAT(before, Catch::Contains("\nclip_eps_high = 0.28\n"));
  CHECK_THAT(before, Catch::Contains("\nlr = 0.0001\n"));
  // The resolved file is an experiment file: the same run from it changes nothing.
  {
    child_process p{{SORL_BIN, "train", resolved.string(), "--resume"}};
    CHECK(p.wait_exit(120s) == 0);
    INFO(p.output());
    CHECK_FALSE(p.wait_for("differ from the run's previous session", 1s));
  }
  CHECK_FALSE(fs::exists(kept));
  auto changed = text("steps = 2\n");
  changed.insert(changed.find("prompts_per_step"), "lr = 2e-4\n");
  auto second = write_config("resolved_run2.toml", changed);
  {
    child_process p{{SORL_BIN, "train", second, "--resume"}};
    CHECK(p.wait_exit(120s) == 0);
    INFO(p.output());
    CHECK(p.wait_for("(its resolved configuration is kept as " + kept.string() + ")", 1s));
    CHECK(p.wait_for("  run.steps: 1 → 2", 1s));
    CHECK(p.wait_for("  algorithm.lr: 0.0001 → 0.0002", 1s));
  }
  CHECK(read(kept) == before);
  CHECK_THAT(read(resolved), Catch::Contains("\nlr = 0.0002\n"));
  fs::remove_all(out);
}

TEST_CASE("a node that cannot reach its hub gives up after the connect timeout") {
  auto cfg = write_config("mp_unreachable.toml", three_nodes(1, 1, 300));
  // Port 1 on loopback: nothing listens there.
  child_process p{{SORL_BIN, "node", cfg, "--node", "rollout-a", "--connect", "127.0.0.1:1"}};
  CHECK(p.wait_exit(10s) == 2);
  INFO(p.output());
  CHECK(p.wait_for("cannot reach the hub at 127.0.0.1:1 within 300 ms", 1s));
}

namespace {

/// Runs a command to completion (bounded) and requires exit status 0.
void run_ok(std::vector<std::string> argv) {
  child_process p{std::move(argv)};
  auto rc = p.wait_exit(60s);
  INFO(p.output());
  REQUIRE(rc == 0);
}

/// Makes a CA and a certificate signed by it under `dir` (ca.pem, node.pem, node.key).
void make_pki(const fs::path& dir) {
  fs::create_directories(dir);
  auto d = dir.string();
  run_ok({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
          d + "/ca.key", "-out", d + "/ca.pem", "-days", "2", "-subj", "/CN=sorl-test-ca"});
  run_ok({"/usr/bin/openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout",
          d + "/node.key", "-out", d + "/node.csr", "-subj", "/CN=localhost"});
  run_ok({"/usr/bin/openssl", "x509", "-req", "-in", d + "/node.csr", "-CA", d + "/ca.pem",
          "-CAkey", d + "/ca.key", "-CAcreateserial", "-out", d + "/node.pem", "-days", "2"});
}

std::string tls_config(const std::string& pki, int connect_timeout_ms) {
  return "[smoke]\nrounds = 30\ninterval_ms = 1\n[network]\nconnect_timeout_ms = "
         + std::to_string(connect_timeout_ms) + "\ntls_certificate = \"" + pki
         + "/node.pem\"\ntls_key = \"" + pki + "/node.key\"\ntls_ca_file = \"" + pki
         + "/ca.pem\"\n" + R"(
[[node]]
name = "main"
listen = "127.0.0.1:0"
actors = ["ping"]
[[node]]
name = "w"
actors = ["pong"]
)";
}

} // namespace

TEST_CASE("nodes with certificates from the hub's CA run the job over TLS and others are refused") {
  if (!fs::exists("/usr/bin/openssl"))
    FAIL("openssl is needed to make test certificates (scripts/install-deps installs it)");
  auto root = fs::path{SORL_TEST_DATA_DIR} / "pki";
  fs::remove_all(root);
  make_pki(root / "good");
  make_pki(root / "other");
  auto good = write_config("mp_tls_good.toml", tls_config((root / "good").string(), 10000));
  auto other = write_config("mp_tls_other.toml", tls_config((root / "other").string(), 1500));

  auto hub = std::make_unique<child_process>(
    std::vector<std::string>{SORL_BIN, "node", good, "--node", "main"});
  REQUIRE(hub->wait_for("(TLS)", 10s));
  std::string port = sorl::test::listening_port(hub->output());
  REQUIRE_FALSE(port.empty());

  // A certificate from another CA: the handshake fails, the node gives up, the hub goes on.
  child_process stranger{{SORL_BIN, "node", other, "--node", "w", "--connect",
                          "127.0.0.1:" + port}};
  CHECK(stranger.wait_exit(20s) == 2);
  INFO(stranger.output());
  CHECK(stranger.wait_for("cannot reach the hub", 1s));

  child_process friend_node{{SORL_BIN, "node", good, "--node", "w", "--connect",
                             "127.0.0.1:" + port}};
  CHECK(friend_node.wait_exit(30s) == 0);
  CHECK(hub->wait_exit(30s) == 0);
  INFO(hub->output());
  CHECK(hub->wait_for("job finished: 30 rounds, 30 answers from 1 pongers", 1s));
}
