// Real `sorl node` processes on loopback (port 0), every wait bounded.

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <thread>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/version.hpp"
#include "tests/support/process.hpp"

using namespace std::chrono_literals;
using sorl::test::child_process;
namespace fs = std::filesystem;

namespace {

std::string write_config(const std::string& name, const std::string& text) {
  return sorl::test::write_test_file(SORL_TEST_DATA_DIR, name, text);
}

// The [network] settings of every job below, and the bounds the waits and checks derive
// from them. A bound that is not a sorl timeout (starting a process, a loaded machine
// scheduling the hub and this test late) is `slack`: generous, it only keeps a broken run
// from hanging the suite and is never what a check measures.
constexpr int heartbeat_ms = 100;
constexpr int connection_timeout_ms = 1000;
constexpr int join_timeout_ms = 20000;
constexpr auto slack = 30s;

constexpr std::chrono::milliseconds ms(int n) {
  return std::chrono::milliseconds{n};
}

/// A silent link is dropped at the first heartbeat tick after `connection_timeout_ms`
/// without traffic; a closed one at once. Either way the other nodes hear of a lost node
/// within this.
constexpr auto drop_bound = ms(connection_timeout_ms + heartbeat_ms) + slack;

/// A smoke job of `rounds` rounds `interval_ms` apart ends within this after its roster,
/// even if one node is lost on the way (dropped within connection_timeout + heartbeat).
std::chrono::milliseconds job_bound(int rounds, int interval_ms) {
  return ms(rounds * interval_ms + connection_timeout_ms + heartbeat_ms) + slack;
}

std::string three_nodes(int rounds, int interval_ms, int connect_timeout_ms = 10000) {
  return "[smoke]\nrounds = " + std::to_string(rounds)
         + "\ninterval_ms = " + std::to_string(interval_ms)
         + "\n[network]\nheartbeat_ms = " + std::to_string(heartbeat_ms)
         + "\nconnection_timeout_ms = " + std::to_string(connection_timeout_ms)
         + "\njoin_timeout_ms = " + std::to_string(join_timeout_ms)
         + "\nconnect_timeout_ms = " + std::to_string(connect_timeout_ms) + R"(
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
  REQUIRE(hub->wait_for("listening on 127.0.0.1:", slack));
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
  // The hub completes the roster, or fails the job, within join_timeout_ms.
  REQUIRE(j.hub->wait_for("roster complete", ms(join_timeout_ms) + slack));
  REQUIRE(j.b->wait_for("first ping received", slack)); // the first round starts at once
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
  auto hub_rc = hub->wait_exit(ms(join_timeout_ms) + job_bound(100, 1));
  INFO(hub->output());
  REQUIRE(hub_rc == 0);
  CHECK(hub->wait_for("job finished: 100 rounds, 200 answers from 2 pongers", 1s));
  CHECK(a->wait_exit(slack) == 0); // told by the hub as it ends the job
  CHECK(b->wait_exit(slack) == 0);
  CHECK(a->wait_for("job finished: 100 rounds", 1s));
}

TEST_CASE("a killed node is noticed by every other node at once and the rest finish") {
  auto cfg = write_config("mp_kill.toml", three_nodes(300, 10));
  auto [hub, a, b, port] = start_running(cfg);
  std::this_thread::sleep_for(200ms);
  auto killed_at = child_process::clock::now();
  b->signal(SIGKILL);
  auto hub_saw = hub->wait_for("peer down: pong#1@rollout-b (node lost", drop_bound);
  auto a_saw = a->wait_for("peer down: pong#1@rollout-b (node lost", drop_bound);
  INFO(hub->output() << a->output());
  REQUIRE(hub_saw);
  REQUIRE(a_saw);
  auto hub_ms = ms_between(killed_at, *hub_saw);
  auto a_ms = ms_between(killed_at, *a_saw);
  // A dead process's sockets are closed by the kernel, and that is noticed as it happens:
  // before connection_timeout_ms, the earliest a silent link could be dropped. Later would
  // mean the kill was only seen as silence (the frozen node's case below).
  CHECK(hub_ms < connection_timeout_ms);
  CHECK(a_ms < connection_timeout_ms);
  WARN("kill detection: hub " << hub_ms << " ms, other node " << a_ms << " ms");
  CHECK(hub->wait_exit(job_bound(300, 10)) == 0);
  CHECK(a->wait_exit(slack) == 0);
  CHECK(hub->wait_for("job finished: 300 rounds", 1s));
  CHECK(b->wait_exit(slack) == 128 + SIGKILL);
}

TEST_CASE("a node restarted into a running job is sent away with the reason") {
  auto cfg = write_config("mp_rejoin.toml", three_nodes(300, 10));
  auto [hub, a, b, port] = start_running(cfg);
  b->signal(SIGKILL);
  REQUIRE(hub->wait_for("peer down: pong#1@rollout-b", drop_bound));
  auto again = start_node(cfg, "rollout-b", port);
  auto rc = again->wait_exit(slack);
  INFO(again->output());
  CHECK(rc == 1);
  CHECK(again->wait_for("a node cannot join it midway", 1s));
  CHECK(hub->wait_exit(job_bound(300, 10)) == 0); // the job goes on without it
  CHECK(a->wait_exit(slack) == 0);
}

TEST_CASE("a frozen node is dropped after the connection timeout") {
  auto cfg = write_config("mp_freeze.toml", three_nodes(400, 10));
  std::string port;
  auto hub = start_hub(cfg, port);
  auto a = start_node(cfg, "rollout-a", port);
  auto b = start_node(cfg, "rollout-b", port);
  REQUIRE(hub->wait_for("roster complete", ms(join_timeout_ms) + slack));
  REQUIRE(b->wait_for("first ping received", slack));
  auto frozen_at = child_process::clock::now();
  b->freeze();
  auto hub_saw = hub->wait_for("peer down: pong#1@rollout-b (node lost", drop_bound);
  INFO(hub->output());
  REQUIRE(hub_saw);
  auto waited = ms_between(frozen_at, *hub_saw);
  // Up to the freeze b answered a ping every 10 ms and sent a heartbeat every heartbeat_ms,
  // so the hub last heard from it less than heartbeat_ms before; it drops a link at the first
  // heartbeat tick after connection_timeout_ms of silence. Hence the drop comes between
  // connection_timeout_ms − heartbeat_ms and connection_timeout_ms + heartbeat_ms after the
  // freeze; the upper bound allows one more connection_timeout_ms for the hub and this test
  // to be scheduled late. Earlier would be a drop that ignores the timeout, later one that
  // waits for another (CAF's default is 30 s).
  CHECK(waited >= connection_timeout_ms - heartbeat_ms);
  CHECK(waited <= 2 * connection_timeout_ms + heartbeat_ms);
  WARN("frozen-node detection: " << waited << " ms (connection_timeout_ms = "
                                 << connection_timeout_ms << ")");
  CHECK(a->wait_for("peer down: pong#1@rollout-b", drop_bound));
  CHECK(hub->wait_exit(job_bound(400, 10)) == 0);
  CHECK(a->wait_exit(slack) == 0);
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
    CHECK(p.wait_exit(slack) == 2);
    INFO(p.output());
    CHECK(p.wait_for("mp_tls.toml:4:10: key 'node[1].listen': refusing to listen on "
                     "non-loopback address 0.0.0.0:0 without TLS",
                     1s));
    CHECK(p.wait_for("nothing started", 1s));
  }
}

namespace {

/// An IPv4 address of this machine that is not loopback ("" when it has none).
std::string non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0)
    return "";
  std::string found;
  for (auto* i = list; i && found.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK))
      continue;
    char text[INET_ADDRSTRLEN];
    auto* in = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)))
      found = text;
  }
  freeifaddrs(list);
  return found;
}

/// A TCP socket listening on `host`, port chosen by the OS; closed on destruction.
struct tcp_listener {
  int fd = -1;
  uint16_t port = 0;
  explicit tcp_listener(const std::string& host) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    REQUIRE(inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(listen(fd, 8) == 0);
    socklen_t len = sizeof(a);
    REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~tcp_listener() {
    close(fd);
  }
  /// Whether a connection has arrived (the kernel completes handshakes before accept).
  bool was_connected() const {
    int c = accept(fd, nullptr, nullptr);
    if (c < 0)
      return false;
    close(c);
    return true;
  }
};

} // namespace

TEST_CASE("sorl node refuses to connect to a non-loopback address without TLS, before any "
          "connection attempt") {
  // The same rule as for `listen` (docs/machines.md, "TLS"), for an address given on the command line.
  auto cfg = write_config("mp_connect_plain.toml", three_nodes(1, 1, 600000));
  auto host = non_loopback_ipv4();
  std::optional<tcp_listener> listener;
  std::string target = "192.0.2.1:4242"; // TEST-NET-1: never a reachable host
  if (host.empty()) {
    WARN("no non-loopback IPv4 address here: the refusal is checked without a listener");
  } else {
    listener.emplace(host);
    target = host + ":" + std::to_string(listener->port);
  }
  child_process p{{SORL_BIN, "node", cfg, "--node", "rollout-a", "--connect", target}};
  // Well within connect_timeout_ms (10 minutes): a node that tried to connect would still be
  // trying, or would have connected to the listener.
  CHECK(p.wait_exit(slack) == 2);
  INFO(p.output());
  CHECK(p.wait_for("sorl node: --connect \"" + target + "\": refusing to connect to "
                   "non-loopback address " + target + " without TLS: set "
                   "network.tls_certificate, tls_key and tls_ca_file, or network.insecure = "
                   "true to accept plaintext; nothing started",
                   1s));
  if (listener)
    CHECK_FALSE(listener->was_connected());
}

TEST_CASE("sorl --version prints the version and the commit the binary was built from") {
  // The test links the same generated build info as the binary (cmake/BuildInfo.cmake).
  std::string commit = sorl::build_commit();
  REQUIRE(std::regex_match(commit, std::regex{"[0-9a-f]{40}"})); // tests run from a checkout
  std::string expected = fmt::format("sorl {} (commit {}{})", sorl::version(), commit.substr(0, 12),
                                     sorl::build_dirty() ? ", dirty" : "");
  CHECK(sorl::version_line() == expected);
  CHECK(std::regex_match(expected, std::regex{R"(sorl \d+\.\d+\.\d+ \(commit [0-9a-f]{12}(, dirty)?\))"}));
  child_process p{{SORL_BIN, "--version"}};
  CHECK(p.wait_exit(slack) == 0);
  CHECK(p.output() == expected + "\n");
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
  CHECK(p.wait_exit(slack) == 2);
  INFO(p.output());
  CHECK(p.wait_for("mp_long_path.toml:3:8: key 'task.path': ", 1s));
  CHECK(p.wait_for("mp_long_path.toml:5:19: key 'network.tls_certificate': ", 1s));
  CHECK(p.wait_for("is 300 bytes long; a file name may have at most 255", 1s));
  CHECK(p.wait_for("nothing started", 1s));
  CHECK(p.output().find("terminate called") == std::string::npos);
}

TEST_CASE("export-hf and convert-gguf refuse to write over a model without --overwrite (exit 2)") {
  // The refusal comes before anything is read: no checkpoint or GGUF file is needed to see it.
  const fs::path out = fs::path{SORL_TEST_DATA_DIR} / ("hf_out_" + std::to_string(getpid()));
  fs::remove_all(out);
  fs::create_directories(out / "original");
  std::ofstream(out / "special_tokens_map.json") << "{}";
  auto cfg = write_config("hf_export.toml", "[[node]]\nname = \"m\"\nactors = [\"ping\", \"pong\"]\n");
  child_process e{{SORL_BIN, "export-hf", cfg, out.string()}};
  CHECK(e.wait_exit(slack) == 2);
  CHECK(e.wait_for("already holds a model (special_tokens_map.json, ...); pass --overwrite to replace it", 1s));
  child_process c{{SORL_BIN, "convert-gguf", (out / "none.gguf").string(), out.string()}};
  CHECK(c.wait_exit(slack) == 2);
  CHECK(c.wait_for("pass --overwrite", 1s));
  // With --overwrite the old model's files go before the (here failing) conversion; other
  // files stay.
  child_process o{{SORL_BIN, "convert-gguf", "--overwrite", (out / "none.gguf").string(), out.string()}};
  CHECK(o.wait_exit(slack) == 1);
  CHECK(o.wait_for("none.gguf", 1s));
  CHECK_FALSE(fs::exists(out / "special_tokens_map.json"));
  CHECK(fs::exists(out / "original"));
  fs::remove_all(out);
}

namespace {

/// Sets environment variables (a null value unsets one), which the children started meanwhile
/// inherit from this process, and puts them back when it goes.
class scoped_env {
public:
  explicit scoped_env(const std::vector<std::pair<const char*, const char*>>& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>{old} : std::nullopt);
      value ? setenv(name, value, 1) : unsetenv(name);
    }
  }
  ~scoped_env() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it)
      it->second ? setenv(it->first, it->second->c_str(), 1) : unsetenv(it->first);
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

private:
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

/// The kernel variables a test of the pin decides itself: none set, as on a fresh machine.
std::vector<std::pair<const char*, const char*>> no_kernel_variables() {
  return {{"ATEN_CPU_CAPABILITY", nullptr}, {"ONEDNN_MAX_CPU_ISA", nullptr},
          {"OPENBLAS_CORETYPE", nullptr},   {"SORL_NATIVE_KERNELS", nullptr},
          {"SORL_KERNELS_PINNED", nullptr}};
}

} // namespace

TEST_CASE("the warm start's weights are those of an AVX2 machine whatever the CPU") {
  // run.kernels = "portable" pins libtorch's, oneDNN's and OpenBLAS's kernels to AVX2
  // (runtime/ml/policy/cpu_kernels.hpp); run b sets by hand what an AVX2-only machine would choose
  // by itself. On an AVX-512 machine, run a without the pin differs in the last bits of every
  // weight.
  auto run = [](const std::string& name, bool as_avx2_machine, const char* blas_dir = nullptr) {
    auto dir = fs::path{SORL_TEST_DATA_DIR} / ("isa_" + name + "_" + std::to_string(getpid()));
    fs::remove_all(dir);
    auto cfg = write_config("isa_" + name + ".toml",
                            "[run]\nkernels = \"portable\"\n"
                            "[model]\ncheckpoint = \"" + dir.string() + "\"\n"
                            "[task]\nmax_new_tokens = 6\n[sft]\nsteps = 8\nbatch_size = 8\n"
                            "eval_count = 0\n[[node]]\nname = \"m\"\nactors = [\"ping\"]\n");
    auto vars = no_kernel_variables();
    if (as_avx2_machine)
      vars.insert(vars.end(), {{"ATEN_CPU_CAPABILITY", "avx2"},
                               {"ONEDNN_MAX_CPU_ISA", "AVX2"},
                               {"OPENBLAS_CORETYPE", "Haswell"}});
    if (blas_dir)
      vars.emplace_back("LD_LIBRARY_PATH", blas_dir);
    scoped_env env{vars};
    child_process p{{SORL_BIN, "sft", cfg}};
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

TEST_CASE("run.kernels pins the kernels only when portable, and SORL_NATIVE_KERNELS overrides it") {
#if defined(__x86_64__)
  const bool pins = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  const bool pins = false;
#endif
  // With no model.checkpoint `sorl sft` stops at once, after choosing and logging its kernels.
  auto kernels = [](const std::string& name, const char* value, bool native_variable) {
    auto cfg = write_config("kernels_" + name + ".toml",
                            std::string{"[run]\nkernels = \""} + value
                              + "\"\n[[node]]\nname = \"m\"\nactors = [\"ping\"]\n");
    auto vars = no_kernel_variables();
    if (native_variable)
      vars.emplace_back("SORL_NATIVE_KERNELS", "1");
    scoped_env env{vars};
    child_process p{{SORL_BIN, "sft", cfg}};
    CHECK(p.wait_exit(slack) == 2);
    INFO(p.output());
    CHECK(p.wait_for("set model.checkpoint", 1s));
    for (size_t i = 0; i < p.line_count(); ++i)
      if (auto at = p.line(i).find("CPU kernels: "); at != std::string::npos)
        return p.line(i).substr(at);
    FAIL("no \"CPU kernels:\" line");
    return std::string{};
  };
  auto native = kernels("native", "native", false);
  CHECK_THAT(native, Catch::EndsWith("ATen native, oneDNN native"));
  CHECK_THAT(native, !Catch::Contains("core Haswell"));
  auto portable = kernels("portable", "portable", false);
  if (pins) {
    CHECK_THAT(portable, Catch::EndsWith("ATen avx2, oneDNN AVX2"));
    if (portable.find("OpenBLAS") != std::string::npos) // else a warning says it is missing
      CHECK_THAT(portable, Catch::Contains("(OpenBLAS core Haswell)"));
  } else {
    CHECK(portable == native);
    WARN("no x86-64 CPU with AVX2 and FMA: portable kernels are native here");
  }
  CHECK(kernels("overridden", "portable", true) == native);
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
  CHECK(p.wait_exit(ms(300) + slack) == 2);
  INFO(p.output());
  CHECK(p.wait_for("cannot reach the hub at 127.0.0.1:1 within 300 ms", 1s));
}

namespace {

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
  sorl::test::make_pki((root / "good").string());
  sorl::test::make_pki((root / "other").string());
  auto good = write_config("mp_tls_good.toml", tls_config((root / "good").string(), 10000));
  auto other = write_config("mp_tls_other.toml", tls_config((root / "other").string(), 1500));

  auto hub = std::make_unique<child_process>(
    std::vector<std::string>{SORL_BIN, "node", good, "--node", "main"});
  REQUIRE(hub->wait_for("(TLS)", slack));
  std::string port = sorl::test::listening_port(hub->output());
  REQUIRE_FALSE(port.empty());

  // A certificate from another CA: the handshake fails, the node gives up after its
  // connect_timeout_ms (1500), the hub goes on.
  child_process stranger{{SORL_BIN, "node", other, "--node", "w", "--connect",
                          "127.0.0.1:" + port}};
  CHECK(stranger.wait_exit(ms(1500) + slack) == 2);
  INFO(stranger.output());
  CHECK(stranger.wait_for("cannot reach the hub", 1s));

  child_process friend_node{{SORL_BIN, "node", good, "--node", "w", "--connect",
                             "127.0.0.1:" + port}};
  CHECK(friend_node.wait_exit(job_bound(30, 1)) == 0);
  CHECK(hub->wait_exit(slack) == 0);
  INFO(hub->output());
  CHECK(hub->wait_for("job finished: 30 rounds, 30 answers from 1 pongers", 1s));
}
