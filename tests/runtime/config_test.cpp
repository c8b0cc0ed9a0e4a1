#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "runtime/config.hpp"
#include "tests/support/scratch_dir.hpp"

using sorl::config_error;
using sorl::config_exception;
using namespace sorl;
using sorl::parse_config;
using sorl::test::scratch_dir;
namespace fs = std::filesystem;

namespace {

const std::set<std::string> roles{"ping", "pong"};

const char* minimal = R"(
[[node]]
name = "main"
actors = ["ping", "pong"]
)";

/// Parses `text` expecting failure and returns the errors.
std::vector<config_error> errors_of(const std::string& text, const std::string& base = ".") {
  try {
    parse_config(text, "test.toml", roles, base);
  } catch (const config_exception& e) {
    return e.errors();
  }
  FAIL("expected a config_exception for:\n" << text);
  return {};
}

/// The one error of `text`, checked for file name; `base` is the config file's directory.
config_error only_error(const std::string& text, const std::string& base = ".") {
  auto errs = errors_of(text, base);
  REQUIRE(errs.size() == 1);
  CHECK(errs[0].file == "test.toml");
  return errs[0];
}

} // namespace

TEST_CASE("a minimal file gets every default") {
  auto cfg = parse_config(minimal, "test.toml", roles);
  CHECK(cfg.run.name == "sorl");
  CHECK(cfg.run.steps == 100);
  CHECK(cfg.sagc.group_size == 8);
  CHECK(cfg.sync.mode == sync_kind::sparse);
  CHECK(cfg.network.heartbeat_ms == 250);
  REQUIRE(cfg.nodes.size() == 1);
  CHECK(cfg.nodes[0].name == "main");
  REQUIRE(cfg.nodes[0].actors.size() == 2);
  CHECK(cfg.nodes[0].actors[1].role == "pong");
  CHECK(cfg.nodes[0].actors[1].count == 1);
  CHECK(cfg.hub() == nullptr);
}

TEST_CASE("typed values and role counts are read") {
  auto cfg = parse_config(R"(
[run]
seed = 7
steps = 3
[algorithm]
lr = 1          # an integer is accepted where a float is expected
clip_eps_high = 0.28
[sagc]
g_min = 4
g_max = 32
group_size = 16
[[node]]
name = "main"
listen = "127.0.0.1:0"
actors = ["ping"]
[[node]]
name = "w"
actors = [{ role = "pong", count = 3 }]
)",
                          "test.toml", roles);
  CHECK(cfg.run.seed == 7);
  CHECK(cfg.algorithm.lr == 1.0);
  CHECK(cfg.algorithm.clip_eps_high == Approx(0.28));
  CHECK(cfg.sagc.g_max == 32);
  CHECK(cfg.count_role("pong") == 3);
  REQUIRE(cfg.hub() != nullptr);
  CHECK(cfg.hub()->name == "main");
  CHECK(cfg.hub()->listen->port == 0);
}

TEST_CASE("an unknown key is reported with its line and dotted path") {
  auto e = only_error("[sagc]\ng_max = 8\ngmin = 2\n" + std::string{minimal});
  CHECK(e.line == 3);
  CHECK(e.key == "sagc.gmin");
  CHECK_THAT(e.message, Catch::Contains("unknown key"));
  CHECK_THAT(e.to_string(), Catch::StartsWith("test.toml:3:1: key 'sagc.gmin': unknown key"));
}

TEST_CASE("a temperature too small for fp32 is refused with its location and the allowed range") {
  auto e = only_error("[algorithm]\n\ntemperature = 1e-40\n" + std::string{minimal});
  CHECK(e.line == 3);
  CHECK(e.column == 15); // the value, as for every out-of-range value
  CHECK(e.key == "algorithm.temperature");
  CHECK_THAT(e.to_string(),
             Catch::StartsWith("test.toml:3:15: key 'algorithm.temperature': 1e-40 is out of "
                               "range: 0 (greedy) or [0.01, 100]"));
  // The floor and greedy are accepted, at full precision.
  CHECK(parse_config("[algorithm]\ntemperature = 0.01\n" + std::string{minimal}, "t.toml", roles)
          .algorithm.temperature == 0.01);
  CHECK(parse_config("[algorithm]\ntemperature = 0\n" + std::string{minimal}, "t.toml", roles)
          .algorithm.temperature == 0.0);
  CHECK(parse_config("[algorithm]\ntop_p = 0.8\n" + std::string{minimal}, "t.toml", roles)
          .algorithm.top_p == 0.8);
}

TEST_CASE("run.device and rollout.device take cpu, cuda or cuda:N, and refuse other spellings where they stand") {
  const auto cfg = parse_config(minimal, "test.toml", roles);
  CHECK(cfg.run.device == "cpu");
  CHECK(cfg.rollout.device.empty()); // = run.device
  for (const char* name : {"cpu", "cuda", "cuda:0", "cuda:7", "cuda:123"}) {
    const auto c = parse_config(fmt::format("[run]\ndevice = \"{}\"\n[rollout]\ndevice = \"{}\"\n", name, name)
                                  + minimal, "t.toml", roles);
    CHECK(c.run.device == name);
    CHECK(c.rollout.device == name);
  }
  for (const char* name : {"gpu", "CUDA", "cuda:", "cuda:-1", "cuda:1x", "cuda:1234", "cuda 0", ""}) {
    INFO(name);
    auto e = only_error(fmt::format("[run]\nseed = 1\ndevice = \"{}\"\n", name) + minimal);
    CHECK(e.line == 3);
    CHECK(e.key == "run.device");
    CHECK(e.message == fmt::format("\"{}\" is no device: expected \"cpu\", \"cuda\" or \"cuda:N\"", name));
  }
  auto e = only_error("[rollout]\ndevice = \"tpu\"\n" + std::string{minimal});
  CHECK(e.line == 2);
  CHECK(e.key == "rollout.device");
}

TEST_CASE("run.kernels is native unless the file asks for portable kernels") {
  CHECK(parse_config(minimal, "test.toml", roles).run.kernels == kernels_kind::native);
  CHECK(parse_config("[run]\nkernels = \"native\"\n" + std::string{minimal}, "t.toml", roles)
          .run.kernels == kernels_kind::native);
  CHECK(parse_config("[run]\nkernels = \"portable\"\n" + std::string{minimal}, "t.toml", roles)
          .run.kernels == kernels_kind::portable);
  auto e = only_error("[run]\nseed = 1\nkernels = \"avx2\"\n" + std::string{minimal});
  CHECK(e.line == 3);
  CHECK(e.key == "run.kernels");
  CHECK(e.to_string()
        == "test.toml:3:11: key 'run.kernels': \"avx2\" is not one of \"native\", \"portable\"");
  CHECK(only_error("[run]\nkernels = \"Portable\"\n" + std::string{minimal}).message
        == "\"Portable\" is not one of \"native\", \"portable\"; did you mean \"portable\"?");
}

TEST_CASE("settings the learner cannot run are refused at load: clip_eps_low 1, lr × weight_decay 1") {
  auto e = only_error("[algorithm]\nclip_eps_low = 1.0\n" + std::string{minimal});
  CHECK(e.line == 2);
  CHECK(e.key == "algorithm.clip_eps_low");
  CHECK_THAT(e.message, Catch::Contains("[0, 1)"));
  auto e2 = only_error("[algorithm]\nlr = 1.0\nweight_decay = 1.0\n" + std::string{minimal});
  CHECK(e2.line == 3);
  CHECK(e2.key == "algorithm.weight_decay");
  CHECK_THAT(e2.message, Catch::Contains("must be < 1"));
}

TEST_CASE("an unknown section is reported") {
  auto e = only_error("[sagcc]\ng_max = 8\n" + std::string{minimal});
  CHECK(e.line == 1);
  CHECK(e.key == "sagcc");
}

TEST_CASE("a wrong type names expected and actual types") {
  auto e = only_error("[run]\nname = \"x\"\nsteps = \"ten\"\n" + std::string{minimal});
  CHECK(e.line == 3);
  CHECK(e.key == "run.steps");
  CHECK(e.message == "expected an integer, got a string");
}

TEST_CASE("an out-of-range value names the range") {
  auto e = only_error("[algorithm]\n\ntop_p = 1.5\n" + std::string{minimal});
  CHECK(e.line == 3);
  CHECK(e.key == "algorithm.top_p");
  CHECK_THAT(e.message, Catch::Contains("out of range [0, 1]"));

  auto e2 = only_error("[sft]\nlr = 0.0\n" + std::string{minimal});
  CHECK(e2.key == "sft.lr");
  CHECK_THAT(e2.message, Catch::Contains("(0, 1]"));
}

TEST_CASE("run.eval_every is read and a negative value is an error located at the key") {
  CHECK(parse_config(minimal, "test.toml", roles).run.eval_every == 0);
  CHECK(parse_config("[run]\neval_every = 25\n" + std::string{minimal}, "test.toml", roles)
          .run.eval_every == 25);
  auto e = only_error("[run]\nsteps = 10\neval_every = -1\n" + std::string{minimal});
  CHECK(e.line == 3);
  CHECK(e.column == 14); // the value's column
  CHECK(e.key == "run.eval_every");
  CHECK(e.message == "-1 is out of range [0, 100000000]");
}

TEST_CASE("algorithm.group_minibatches is read, false by default") {
  CHECK_FALSE(parse_config(minimal, "test.toml", roles).algorithm.group_minibatches);
  CHECK(parse_config("[algorithm]\ngroup_minibatches = true\n" + std::string{minimal}, "test.toml", roles)
          .algorithm.group_minibatches);
  auto e = only_error("[algorithm]\ngroup_minibatches = 2\n" + std::string{minimal});
  CHECK(e.key == "algorithm.group_minibatches");
}

TEST_CASE("run.stop_at_accuracy is read, and refused at its key without evaluations to stop "
          "on") {
  CHECK(parse_config(minimal, "test.toml", roles).run.stop_at_accuracy == 0.0);
  CHECK(parse_config("[run]\neval_every = 5\nstop_at_accuracy = 0.35\n" + std::string{minimal},
                     "test.toml", roles)
          .run.stop_at_accuracy == 0.35);
  auto e = only_error("[run]\nstop_at_accuracy = 0.35\n" + std::string{minimal});
  CHECK(e.line == 2);
  CHECK(e.key == "run.stop_at_accuracy");
  CHECK_THAT(e.message, Catch::Contains("set run.eval_every > 0"));
  auto e2 = only_error("[run]\neval_every = 5\nstop_at_accuracy = 0.35\n[task]\n"
                       "eval_prompts = 0\n" + std::string{minimal});
  CHECK(e2.line == 3);
  CHECK_THAT(e2.message, Catch::Contains("task.eval_prompts is 0"));
  auto e3 = only_error("[run]\neval_every = 5\nstop_at_accuracy = 1.5\n" + std::string{minimal});
  CHECK(e3.key == "run.stop_at_accuracy");
  CHECK(e3.message == "1.5 is out of range [0, 1]");
}

TEST_CASE("the file_search keys are read and a malformed one is located at its value") {
  auto cfg = parse_config("[model]\npreset = \"tiny-2k\"\n[task]\nname = \"file_search\"\ndepth = 3\n"
                          "max_dirs = 4\nmax_files = 5\nmax_episode_tokens = 1000\n"
                          "detour_rate = 0.25\n" + std::string{minimal},
                          "test.toml", roles, ".");
  CHECK(cfg.model.preset == "tiny-2k");
  CHECK(cfg.task.name == "file_search");
  CHECK(cfg.task.depth == 3);
  CHECK(cfg.task.max_dirs == 4);
  CHECK(cfg.task.max_files == 5);
  CHECK(cfg.task.max_episode_tokens == 1000);
  CHECK(cfg.task.detour_rate == 0.25);

  auto e = only_error("[task]\nname = \"file_search\"\ndepth = 5\n" + std::string{minimal});
  CHECK(e.line == 3);
  CHECK(e.column == 9); // the value's column
  CHECK(e.key == "task.depth");
  CHECK_THAT(e.message, Catch::Contains("out of range [1, 4]"));
  e = only_error("[task]\nmax_episode_tokens = \"lots\"\n" + std::string{minimal});
  CHECK(e.line == 2);
  CHECK(e.key == "task.max_episode_tokens");
  CHECK(e.message == "expected an integer, got a string");
  e = only_error("[task]\n detour_rate = 1.5\n" + std::string{minimal});
  CHECK(e.line == 2);
  CHECK(e.key == "task.detour_rate");
}

TEST_CASE("task.wrong_answers is read and an unknown kind is located at its value") {
  auto cfg = parse_config("[task]\nwrong_answers = \"dropped_carry\"\n" + std::string{minimal},
                          "test.toml", roles, ".");
  CHECK(cfg.task.wrong_answers == "dropped_carry");
  CHECK(parse_config(std::string{minimal}, "test.toml", roles, ".").task.wrong_answers == "near");
  auto e = only_error("[task]\n wrong_answers = \"random\"\n" + std::string{minimal});
  CHECK(e.line == 2);
  CHECK(e.column == 18);
  CHECK(e.key == "task.wrong_answers");
  CHECK_THAT(e.message, Catch::Contains("dropped_carry"));
}

TEST_CASE("task.wrong_episodes is read and an unknown kind is located at its key") {
  auto cfg = parse_config("[task]\nname = \"file_search\"\nwrong_episodes = \"give_up\"\n"
                            + std::string{minimal},
                          "test.toml", roles, ".");
  CHECK(cfg.task.wrong_episodes == "give_up");
  CHECK(parse_config(std::string{minimal}, "test.toml", roles, ".").task.wrong_episodes == "wander");
  auto e = only_error("[task]\nwrong_episodes = \"quit\"\n" + std::string{minimal});
  CHECK(e.line == 2);
  CHECK(e.key == "task.wrong_episodes");
  CHECK_THAT(e.message, Catch::Contains("give_up"));
  CHECK(parse_config("[task]\nname = \"file_search\"\nwrong_episodes = \"give_up\"\nwander_share = 0.1\n"
                       + std::string{minimal},
                     "test.toml", roles, ".").task.wander_share == 0.1);
  // A share only makes sense next to give_up; with the default "wander" it is refused.
  e = only_error("[task]\nname = \"file_search\"\nwander_share = 0.1\n" + std::string{minimal});
  CHECK(e.line == 3);
  CHECK(e.key == "task.wander_share");
  CHECK_THAT(e.message, Catch::Contains("give_up"));
}

TEST_CASE("algorithm.lr = 0, a frozen-policy baseline, is accepted") {
  auto cfg = parse_config("[algorithm]\nlr = 0.0\n" + std::string{minimal}, "test.toml", roles, ".");
  CHECK(cfg.algorithm.lr == 0.0);
}

TEST_CASE("a value outside an enumeration lists the allowed ones") {
  auto e = only_error("[sync]\nmode = \"sparce\"\n" + std::string{minimal});
  CHECK(e.line == 2);
  CHECK(e.key == "sync.mode");
  CHECK(e.message == "\"sparce\" is not one of \"full\", \"sparse\"; did you mean \"sparse\"?");
  // Nothing near: no hint.
  CHECK(only_error("[sync]\nmode = \"dense\"\n" + std::string{minimal}).message
        == "\"dense\" is not one of \"full\", \"sparse\"");
}

TEST_CASE("the rollout watchdog and the reward-failure policy are read and checked") {
  auto cfg = parse_config(minimal, "test.toml", roles);
  CHECK(cfg.rollout.watchdog_s == 600.0);
  CHECK(cfg.algorithm.on_reward_failure == reward_failure_kind::mask);
  cfg = parse_config("[rollout]\nwatchdog_s = 2.5\n[algorithm]\non_reward_failure = \"fail\"\n" +
                       std::string{minimal},
                     "test.toml", roles);
  CHECK(cfg.rollout.watchdog_s == 2.5);
  CHECK(cfg.algorithm.on_reward_failure == reward_failure_kind::fail);
  auto e = only_error("[rollout]\nwatchdog_s = 0\n" + std::string{minimal});
  CHECK(e.key == "rollout.watchdog_s");
  CHECK_THAT(e.message, Catch::Contains("out of range (0,"));
  e = only_error("[algorithm]\non_reward_failure = \"zero\"\n" + std::string{minimal});
  CHECK(e.key == "algorithm.on_reward_failure");
  CHECK(e.message == "\"zero\" is not one of \"mask\", \"fail\"");
}

TEST_CASE("the learner's weights, pi_old, truncated IS and the mismatch threshold are read and checked") {
  auto cfg = parse_config(minimal, "test.toml", roles);
  CHECK(cfg.algorithm.learner_weights == learner_weights_kind::bf16);
  CHECK(cfg.algorithm.old_logprobs == old_logprobs_kind::recompute);
  CHECK(cfg.algorithm.tis_cap == 0.0);
  CHECK(cfg.algorithm.mismatch_warn == 1e-3);
  cfg = parse_config("[algorithm]\nlearner_weights = \"fp32\"\nold_logprobs = \"rollout\"\n"
                     "mismatch_warn = 0.01\n" + std::string{minimal},
                     "test.toml", roles);
  CHECK(cfg.algorithm.learner_weights == learner_weights_kind::fp32);
  CHECK(cfg.algorithm.old_logprobs == old_logprobs_kind::rollout);
  CHECK(cfg.algorithm.tis_cap == 0.0);
  CHECK(cfg.algorithm.mismatch_warn == 0.01);
  auto e = only_error("[algorithm]\nlearner_weights = \"fp16\"\n" + std::string{minimal});
  CHECK(e.key == "algorithm.learner_weights");
  CHECK_THAT(e.message, Catch::StartsWith("\"fp16\" is not one of \"bf16\", \"fp32\""));
  // Truncated IS weighs by pi_old / pi_rollout: with the rollout's own log-probs as pi_old
  // every weight would be 1.
  cfg = parse_config("[algorithm]\ntis_cap = 2\n" + std::string{minimal}, "test.toml", roles);
  CHECK(cfg.algorithm.tis_cap == 2.0);
  e = only_error("[algorithm]\nold_logprobs = \"rollout\"\ntis_cap = 2.0\n" + std::string{minimal});
  CHECK(e.line == 3);
  CHECK(e.key == "algorithm.tis_cap");
  CHECK_THAT(e.message, Catch::Contains("needs old_logprobs = \"recompute\""));
  e = only_error("[algorithm]\ntis_cap = 0.5\n" + std::string{minimal});
  CHECK(e.key == "algorithm.tis_cap");
  CHECK_THAT(e.message, Catch::Contains("0 (off) or [1, 1e6]"));
  e = only_error("[algorithm]\nmismatch_warn = 0\n" + std::string{minimal});
  CHECK(e.key == "algorithm.mismatch_warn");
}

TEST_CASE("inconsistent group bounds are an error") {
  auto e = only_error("[sagc]\ng_min = 16\ng_max = 8\n" + std::string{minimal});
  CHECK(e.key == "sagc.g_min");
  CHECK(e.line == 2); // at g_min's value, the key named, though the conflict is with g_max
  CHECK(e.column == 9);
  auto d = only_error("[sagc]\npolicy = \"sagc\"\ngroup_size = 32\n" + std::string{minimal});
  CHECK(d.key == "sagc.group_size");
  CHECK(d.line == 3);
  // A key left at its default has no line of its own: its table's line is reported.
  auto t = only_error("[sagc]\npolicy = \"sagc\"\ng_max = 4\n" + std::string{minimal});
  CHECK(t.key == "sagc.group_size"); // the default 8 is outside [2, 4]
  CHECK(t.line == 1);
}

TEST_CASE("a duplicate node name points at the second definition") {
  auto e = only_error(R"([[node]]
name = "main"
listen = "127.0.0.1:0"
actors = ["ping"]
[[node]]
name = "main"
actors = ["pong"]
)");
  CHECK(e.line == 6);
  CHECK(e.key == "node[2].name");
  CHECK_THAT(e.message, Catch::Contains("duplicate node name \"main\" (first defined on line 2)"));
}

TEST_CASE("a role that does not exist is reported at its line") {
  auto e = only_error(R"([[node]]
name = "main"
actors = ["ping",
          "learnr"]
)");
  CHECK(e.line == 4);
  CHECK(e.key == "node[1].actors[2]");
  CHECK_THAT(e.message, Catch::Contains("unknown role \"learnr\" (known roles: ping, pong)"));
  auto e2 = only_error(R"([[node]]
name = "main"
actors = [{ role = "pongg", count = 2 }]
)");
  CHECK(e2.line == 3);
  CHECK_THAT(e2.message, Catch::Contains("unknown role \"pongg\""));
}

TEST_CASE("a bad role count and unknown role-entry key are reported") {
  auto errs = errors_of(R"([[node]]
name = "main"
actors = [{ role = "pong", count = -1, cuont = 2 }]
)");
  REQUIRE(errs.size() == 2);
  CHECK(errs[0].key == "node[1].actors[1].count");
  CHECK(errs[1].key == "node[1].actors[1].cuont");
}

TEST_CASE("every error in a file is reported, not just the first") {
  auto errs = errors_of("[run]\nsteps = -1\n[sagc]\nkappa = \"x\"\nfoo = 1\n" + std::string{minimal});
  REQUIRE(errs.size() == 3);
  CHECK(errs[0].line == 2);
  CHECK(errs[1].line == 4);
  CHECK(errs[2].line == 5);
}

TEST_CASE("a TOML syntax error carries its line") {
  auto e = only_error("[run]\nname = \"x\"\nsteps = = 3\n");
  CHECK(e.line == 3);
  CHECK_THAT(e.message, Catch::StartsWith("TOML syntax error"));
}

TEST_CASE("a malformed listen address is rejected") {
  auto e = only_error("[[node]]\nname = \"main\"\nlisten = \"127.0.0.1\"\nactors = [\"ping\"]\n");
  CHECK(e.line == 3);
  CHECK(e.key == "node[1].listen");
  auto e2 = only_error("[[node]]\nname = \"main\"\nlisten = \"h:70000\"\nactors = [\"ping\"]\n");
  CHECK_THAT(e2.message, Catch::Contains("[0, 65535]"));
}

TEST_CASE("listening on a non-loopback address needs TLS or insecure = true") {
  auto text = R"([[node]]
name = "main"
listen = "0.0.0.0:4242"
actors = ["ping"]
)";
  auto e = only_error(text);
  CHECK(e.line == 3);
  CHECK(e.key == "node[1].listen");
  CHECK_THAT(e.message, Catch::Contains("refusing to listen on non-loopback address 0.0.0.0:4242 "
                                        "without TLS"));
  auto ok = parse_config("[network]\ninsecure = true\n" + std::string{text}, "test.toml", roles);
  CHECK(ok.network.insecure);
  // Loopback in all its spellings needs neither.
  for (auto addr : {"127.0.0.1:1", "127.1.2.3:1", "localhost:1", "[::1]:1"}) {
    auto cfg = parse_config(std::string{"[[node]]\nname = \"m\"\nlisten = \""} + addr
                              + "\"\nactors = [\"ping\"]\n",
                            "test.toml", roles);
    CHECK(cfg.hub()->listen->is_loopback());
  }
}

TEST_CASE("TLS settings must be complete and point at files that exist") {
  // Per process: test runners may start this case more than once at a time.
  auto dir = std::filesystem::path{SORL_TEST_DATA_DIR} / ("tls_files_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream{dir / "cert.pem"} << "x";
  std::ofstream{dir / "key.pem"} << "x";
  auto base = R"(
[[node]]
name = "main"
listen = "10.1.2.3:4242"
actors = ["ping"]
)";
  auto errs = errors_of("[network]\ntls_certificate = \"/dev/null\"\n" + std::string{base});
  REQUIRE(errs.size() == 2);
  CHECK(errs[0].key == "network.tls_key");
  CHECK(errs[1].key == "network.tls_ca_file");
  CHECK_THAT(errs[0].message, Catch::Contains("together"));
  try {
    parse_config("[network]\ntls_certificate = \"cert.pem\"\ntls_key = \"key.pem\"\n"
                 "tls_ca_file = \"ca.pem\"\n"
                   + std::string{base},
                 "test.toml", roles, dir.string());
    FAIL("missing CA file accepted");
  } catch (const config_exception& ex) {
    REQUIRE(ex.errors().size() == 1);
    CHECK(ex.errors()[0].key == "network.tls_ca_file");
    CHECK(ex.errors()[0].line == 4);
  }
  std::ofstream{dir / "ca.pem"} << "x";
  auto cfg = parse_config("[network]\ntls_certificate = \"cert.pem\"\ntls_key = \"key.pem\"\n"
                          "tls_ca_file = \"ca.pem\"\n"
                            + std::string{base},
                          "test.toml", roles, dir.string());
  CHECK(cfg.network.tls_enabled());
  CHECK(cfg.network.tls_ca_file == (dir / "ca.pem").string());
  std::filesystem::remove_all(dir);
}

TEST_CASE("several nodes need exactly one hub and valid connect targets") {
  auto e = only_error(R"([[node]]
name = "a"
actors = ["ping"]
[[node]]
name = "b"
actors = ["pong"]
)");
  CHECK(e.key == "node");
  auto e2 = only_error(R"([[node]]
name = "a"
listen = "127.0.0.1:1"
actors = ["ping"]
[[node]]
name = "b"
listen = "127.0.0.1:2"
actors = ["pong"]
)");
  CHECK(e2.key == "node[2].listen");
  CHECK(e2.line == 7);
  auto e3 = only_error(R"([[node]]
name = "a"
listen = "127.0.0.1:1"
actors = ["ping"]
[[node]]
name = "b"
connect = "c"
actors = ["pong"]
)");
  CHECK(e3.key == "node[2].connect");
  CHECK(e3.line == 7);
}

TEST_CASE("a file without nodes is an error") {
  auto e = only_error("[run]\nname = \"x\"\n");
  CHECK(e.key == "node");
}

TEST_CASE("a missing file is an error naming it") {
  try {
    sorl::load_config("/nonexistent/x.toml", roles);
    FAIL("no exception");
  } catch (const config_exception& e) {
    CHECK(e.errors().at(0).file == "/nonexistent/x.toml");
    CHECK_THAT(e.what(), Catch::Contains("cannot open"));
  }
}

TEST_CASE("algorithm dapo brings DAPO's defaults unless a key is set") {
  auto cfg = parse_config("[algorithm]\nname = \"dapo\"\noverlong = \"filter\"\n" + std::string{minimal},
                          "test.toml", roles);
  CHECK(cfg.algorithm.clip_eps_high == 0.28);
  CHECK(cfg.algorithm.dynamic_sampling);
  CHECK(cfg.algorithm.overlong == overlong_kind::filter);
  auto grpo = parse_config(minimal, "test.toml", roles);
  CHECK(grpo.algorithm.clip_eps_high == 0.2);
  CHECK_FALSE(grpo.algorithm.dynamic_sampling);
  CHECK(grpo.algorithm.overlong == overlong_kind::none);
}

TEST_CASE("speculative decoding settings are read and their ranges enforced") {
  auto cfg = parse_config("[rollout]\nspeculative = \"auto\"\ndraft_max_tokens = 8\n"
                          "draft_min_token_prob = 0.2\ndraft_spec_factor = 2.0\nsuffix_max_depth = 24\n"
                          "suffix_global_bytes = 0\n" + std::string{minimal},
                          "test.toml", roles);
  CHECK(cfg.rollout.speculative == "auto");
  CHECK(cfg.rollout.draft_max_tokens == 8);
  CHECK(cfg.rollout.draft_min_token_prob == 0.2);
  CHECK(cfg.rollout.draft_spec_factor == 2.0);
  CHECK(cfg.rollout.suffix_max_depth == 24);
  CHECK(cfg.rollout.suffix_global_bytes == 0);
  auto e = only_error("[rollout]\nspeculative = \"sometimes\"\n" + std::string{minimal});
  CHECK(e.key == "rollout.speculative");
  CHECK(e.line == 2);
  CHECK(only_error("[rollout]\ndraft_max_tokens = 0\n" + std::string{minimal}).key == "rollout.draft_max_tokens");
  CHECK(only_error("[rollout]\ndraft_min_token_prob = 1.5\n" + std::string{minimal}).key ==
        "rollout.draft_min_token_prob");
  CHECK(only_error("[rollout]\nsuffix_max_depth = 1\n" + std::string{minimal}).key == "rollout.suffix_max_depth");
}

TEST_CASE("[salt] parses its keys with their defaults and refuses values out of range") {
  const auto d = parse_config(minimal, "test.toml", roles);
  CHECK_FALSE(d.salt.enabled);
  CHECK(d.salt.eta == 0.9);
  CHECK(d.salt.beta == 1.0);
  CHECK(d.salt.c0 == 0.5);
  CHECK(d.salt.gamma_max == 3.0);
  CHECK(d.salt.layers == 0);
  CHECK(d.salt.gram == salt_gram_kind::automatic);
  const auto cfg = parse_config(
    "[salt]\nenabled = true\neta = 0.75\nbeta = 2.0\nc0 = 0.3\ngamma_max = 5.0\nlayers = 1\ngram = \"ghost\"\n" +
      std::string{minimal},
    "test.toml", roles);
  CHECK(cfg.salt.enabled);
  CHECK(cfg.salt.eta == 0.75);
  CHECK(cfg.salt.beta == 2.0);
  CHECK(cfg.salt.c0 == 0.3);
  CHECK(cfg.salt.gamma_max == 5.0);
  CHECK(cfg.salt.layers == 1);
  CHECK(cfg.salt.gram == salt_gram_kind::ghost);
  CHECK(only_error("[salt]\neta = 0.0\n" + std::string{minimal}).key == "salt.eta");
  CHECK(only_error("[salt]\neta = 1.5\n" + std::string{minimal}).key == "salt.eta");
  CHECK(only_error("[salt]\nbeta = -1.0\n" + std::string{minimal}).key == "salt.beta");
  CHECK(only_error("[salt]\nc0 = 0.0\n" + std::string{minimal}).key == "salt.c0");
  CHECK(only_error("[salt]\ngamma_max = 0.5\n" + std::string{minimal}).key == "salt.gamma_max");
  CHECK(only_error("[salt]\nlayers = -2\n" + std::string{minimal}).key == "salt.layers");
  const auto gram = only_error("[salt]\ngram = \"exact\"\n" + std::string{minimal});
  CHECK(gram.key == "salt.gram");
  CHECK(gram.line == 2);
  CHECK(only_error("[salt]\nrank = 2\n" + std::string{minimal}).key == "salt.rank");  // unknown key
}

TEST_CASE("settings that are not implemented yet are refused, not ignored") {
  CHECK(only_error("[sagc]\npolicy = \"sagc\"\ngroup_size = 32\n" + std::string{minimal}).key
        == "sagc.group_size"); // outside the default [g_min, g_max] = [2, 16]
  // A group of one carries no signal under group-relative advantages.
  auto one = only_error("[sagc]\ngroup_size = 1\n" + std::string{minimal});
  CHECK(one.key == "sagc.group_size");
  CHECK(one.message == "1 is out of range [2, 65536]");
}

TEST_CASE("a misspelled key is answered with the nearest known key of its table") {
  auto e = only_error("[algorithm]\ntemprature = 0.7\n" + std::string{minimal});
  CHECK(e.key == "algorithm.temprature");
  CHECK(e.line == 2);
  CHECK(e.column == 1);
  CHECK(e.message == "unknown key; did you mean `temperature`?");
  CHECK(only_error("[sagc]\ngroup_sz = 4\n" + std::string{minimal}).message
        == "unknown key; did you mean `group_size`?");
}

TEST_CASE("a key written in the wrong table is answered with the tables that have it") {
  // At the top level: the same name, or a near one, in any section.
  auto e = only_error("temprature = 0.7\n" + std::string{minimal});
  CHECK(e.key == "temprature");
  CHECK(e.message == "unknown section or key; did you mean `temperature` in [algorithm]?");
  CHECK(only_error("lr = 1e-3\n" + std::string{minimal}).message
        == "unknown section or key; did you mean `lr` in [algorithm] or [sft]?");
  // In another section.
  CHECK(only_error("[run]\nlr = 1e-3\n" + std::string{minimal}).message
        == "unknown key; did you mean `lr` in [algorithm] or [sft]?");
  CHECK(only_error("[algoritm]\nlr = 1e-3\n" + std::string{minimal}).message
        == "unknown section or key; did you mean [algorithm]?");
  CHECK(only_error("[[nodes]]\nname = \"x\"\n" + std::string{minimal}).message
        == "unknown section or key; did you mean [[node]]?");
}

TEST_CASE("a name other RL trainers use gets sorl's key as its hint") {
  // learning_rate is 6 edits from its nearest key (target_rate), over the typo limit of 4 for
  // 13 characters: only the table of peers' names can point at lr.
  auto e = only_error("learning_rate = 1e-3\n" + std::string{minimal});
  CHECK(e.key == "learning_rate");
  CHECK(e.message
        == "unknown section or key; did you mean `lr` in [algorithm] (sorl's name for "
           "learning_rate)?");
  CHECK(only_error("[algorithm]\nlearning_rate = 1e-3\n" + std::string{minimal}).message
        == "unknown key; did you mean `lr` (sorl's name for learning_rate)?");
  CHECK(only_error("[algorithm]\nnum_generations = 8\n" + std::string{minimal}).message
        == "unknown key; did you mean `group_size` in [sagc] (sorl's name for "
           "num_generations)?");
  // Every such hint names a key the parser knows.
  const auto& known = sorl::known_config_keys();
  for (const auto& [peer, target] : sorl::peer_config_names()) {
    INFO(peer << " -> " << target.first << "." << target.second);
    REQUIRE(known.count(target.first) == 1);
    CHECK(known.at(target.first).count(target.second) == 1);
    CHECK(known.at(target.first).count(peer) == 0);
  }
}

TEST_CASE("an unknown key with no known key near it gets no hint") {
  auto e = only_error("frobnicate_widgets = 1\n" + std::string{minimal});
  CHECK(e.key == "frobnicate_widgets");
  CHECK(e.message == "unknown section or key");
  CHECK(only_error("[algorithm]\nfrobnicate_widgets = 1\n" + std::string{minimal}).message
        == "unknown key");
}

TEST_CASE("node keys, actors entries and role names get hints too") {
  auto e = only_error(R"([[node]]
name = "main"
actor = ["ping"]
)");
  CHECK(e.key == "node[1].actor");
  CHECK(e.message == "unknown key; did you mean `actors`?");
  auto errs = errors_of(R"([[node]]
name = "main"
actors = [{ role = "pong", cuont = 2 }, "pongg"]
)");
  REQUIRE(errs.size() == 2);
  CHECK(errs[0].key == "node[1].actors[1].cuont");
  CHECK(errs[0].message == "unknown key; did you mean `count`?");
  CHECK(errs[1].key == "node[1].actors[2]");
  CHECK(errs[1].message
        == "unknown role \"pongg\" (known roles: ping, pong); did you mean \"pong\"?");
}

TEST_CASE("the known keys are read off the parser") {
  const auto& known = sorl::known_config_keys();
  CHECK(known.at("").count("algorithm") == 1);
  CHECK(known.at("").count("node") == 1);
  CHECK(known.at("algorithm").count("temperature") == 1);
  CHECK(known.at("sft").count("lr") == 1);
  CHECK(known.at("node") == std::set<std::string>{"actors", "connect", "listen", "name"});
  CHECK(known.at("node.actors") == std::set<std::string>{"count", "role"});
  CHECK(known.count("<known keys>") == 0);
}

TEST_CASE("a path component longer than 255 bytes is a config error at its key") {
  scratch_dir dir{"long_names"};
  const std::string longname(300, 'a');
  struct site {
    std::string text;
    std::string key;
    int line;
  };
  for (const auto& s : {
         site{"[task]\nname = \"jsonl\"\npath = \"" + longname + "/x.jsonl\"\n", "task.path", 3},
         site{"[task]\neval_path = \"" + longname + "\"\n", "task.eval_path", 2},
         site{"[model]\ncheckpoint = \"ckpt/" + longname + "\"\n", "model.checkpoint", 2},
         site{"[sft]\ninit_checkpoint = \"ckpt/" + longname + "\"\n", "sft.init_checkpoint", 2},
         site{"[run]\noutput_dir = \"" + longname + "\"\n", "run.output_dir", 2},
         site{"[run]\nname = \"" + longname + "\"\n", "run.name", 2},
         site{"[network]\ntls_certificate = \"" + longname + "\"\ntls_key = \"k\"\n"
              "tls_ca_file = \"c\"\n",
              "network.tls_certificate", 2},
       }) {
    INFO(s.key);
    try {
      parse_config(s.text + minimal, "test.toml", roles, dir.path.string());
      FAIL("accepted");
    } catch (const config_exception& e) {
      // TLS: the key and CA files are missing too; the long name is the first error.
      const auto& err = e.errors().at(0);
      CHECK(err.key == s.key);
      CHECK(err.line == s.line);
      CHECK(err.column > 0);
      CHECK_THAT(err.message, Catch::Contains("the component \"aaaaaaaaaaaaaaaaaaaaaaaa...\" "
                                              "is 300 bytes long; a file name may have at "
                                              "most 255"));
    }
  }
}

TEST_CASE("a path through a file, a symlink loop or a locked directory is a config error") {
  scratch_dir dir{"bad_paths"};
  std::ofstream{dir.path / "plain"} << "x";
  std::filesystem::create_symlink("loop_b", dir.path / "loop_a");
  std::filesystem::create_symlink("loop_a", dir.path / "loop_b");
  const auto base = dir.path.string();

  auto e = only_error("[task]\nname = \"jsonl\"\npath = \"plain/x.jsonl\"\n" + std::string{minimal}, base);
  CHECK(e.key == "task.path");
  CHECK(e.line == 3);
  CHECK(e.message == "cannot access \"" + base + "/plain/x.jsonl\": Not a directory");

  auto loop = only_error("[task]\nname = \"jsonl\"\npath = \"loop_a\"\n" + std::string{minimal}, base);
  CHECK(loop.key == "task.path");
  CHECK(loop.message == "cannot access \"" + base + "/loop_a\": Too many levels of symbolic links");
  CHECK(only_error("[model]\ncheckpoint = \"loop_a/ckpt\"\n" + std::string{minimal}, base).key
        == "model.checkpoint");
  auto tls = only_error("[network]\ntls_certificate = \"plain\"\ntls_key = \"plain\"\n"
                           "tls_ca_file = \"loop_b\"\n" + std::string{minimal}, base);
  CHECK(tls.key == "network.tls_ca_file");
  CHECK(tls.line == 4);
  CHECK_THAT(tls.message, Catch::EndsWith("Too many levels of symbolic links"));

  // A file where the run directory or the checkpoint root belongs.
  auto run = only_error("[run]\noutput_dir = \"" + base + "/plain\"\n" + std::string{minimal}, base);
  CHECK(run.key == "run.output_dir");
  CHECK(run.message == "\"" + base + "/plain\" exists and is not a directory");
  CHECK(only_error("[model]\ncheckpoint = \"plain\"\n" + std::string{minimal}, base).message
        == "\"" + base + "/plain\" exists and is not a directory");
  // A directory where a file belongs.
  std::filesystem::create_directory(dir.path / "adir");
  CHECK(only_error("[task]\neval_path = \"adir\"\n" + std::string{minimal}, base).message
        == "\"" + base + "/adir\" is a directory, not a file");

  std::filesystem::create_directory(dir.path / "locked");
  std::ofstream{dir.path / "locked" / "tasks.jsonl"} << "{}\n";
  std::ofstream{dir.path / "unreadable.jsonl"} << "{}\n";
  std::filesystem::permissions(dir.path / "unreadable.jsonl", std::filesystem::perms::none);
  std::filesystem::permissions(dir.path / "locked", std::filesystem::perms::none);
  if (geteuid() == 0) {
    WARN("running as root, which passes every permission check: the permission-denied "
         "cases are skipped (the not-a-directory case above covers the same error path)");
    return;
  }
  auto denied = only_error("[task]\nname = \"jsonl\"\npath = \"locked/tasks.jsonl\"\n" + std::string{minimal}, base);
  CHECK(denied.key == "task.path");
  CHECK(denied.message == "cannot access \"" + base + "/locked/tasks.jsonl\": Permission denied");
  CHECK(only_error("[task]\nname = \"jsonl\"\npath = \"unreadable.jsonl\"\n" + std::string{minimal}, base).message
        == "cannot read \"" + base + "/unreadable.jsonl\": Permission denied");
}

TEST_CASE("a config file that cannot be opened says why") {
  scratch_dir dir{"config_open"};
  auto check = [](const std::string& path, const std::string& why) {
    try {
      sorl::load_config(path, roles);
      FAIL("no exception for " << path);
    } catch (const config_exception& e) {
      REQUIRE(e.errors().size() == 1);
      CHECK(e.errors()[0].file == path);
      CHECK_THAT(e.errors()[0].message, Catch::StartsWith("cannot open the file: ")
                                          && Catch::EndsWith(why));
    }
  };
  check((dir.path / std::string(300, 'c')).string() + ".toml", "a file name may have at most 255");
  check(dir.path.string(), "is a directory, not a file");
  std::filesystem::create_symlink("self", dir.path / "self");
  check((dir.path / "self").string(), "Too many levels of symbolic links");
}

TEST_CASE("an enumerated setting outside its values names them all and the nearest") {
  // A designed value the build refuses is still listed among the accepted spellings.
  CHECK(only_error("[scheduler]\npolicy = \"random\"\n" + std::string{minimal}).message
        == "\"random\" is not one of \"round_robin\", \"least_loaded\", \"cache_aware\", "
           "\"sglang_cache_aware\"");
  CHECK(only_error("[sagc]\npolicy = \"Static\"\n" + std::string{minimal}).message
        == "\"Static\" is not one of \"static\", \"sagc\", \"deadline\"; did you mean "
           "\"static\"?");
}

TEST_CASE("every enumerated setting reads back as the value its spelling names") {
  auto cfg = parse_config("[algorithm]\nname = \"dapo\"\noverlong = \"filter\"\n"
                          "on_reward_failure = \"fail\"\nloss_norm = \"sequence\"\n"
                          "[sagc]\npolicy = \"deadline\"\n[sync]\nmode = \"full\"\n"
                          "[scheduler]\npolicy = \"least_loaded\"\n"
                          "[task]\nmatch = \"integer\"\n" + std::string{minimal},
                          "test.toml", roles);
  CHECK(cfg.algorithm.name == algorithm_kind::dapo);
  CHECK(cfg.algorithm.overlong == overlong_kind::filter);
  CHECK(cfg.algorithm.on_reward_failure == reward_failure_kind::fail);
  CHECK(cfg.algorithm.loss_norm == loss_norm_kind::sequence);
  CHECK(cfg.sagc.policy == group_policy_kind::deadline);
  CHECK(cfg.sync.mode == sync_kind::full);
  CHECK(cfg.scheduler.policy == placement_kind::least_loaded);
  CHECK(cfg.task.match == match_kind::integer);
  CHECK(to_string(group_policy_kind::fixed) == "static");
  CHECK(to_string(placement_kind::least_loaded) == "least_loaded");
}

TEST_CASE("scheduler.policy takes the cache-aware rules and cache_threshold is a share") {
  auto cfg = parse_config("[scheduler]\npolicy = \"cache_aware\"\ncache_threshold = 0.5\n"
                            + std::string{minimal},
                          "test.toml", roles);
  CHECK(cfg.scheduler.policy == placement_kind::cache_aware);
  CHECK(cfg.scheduler.cache_threshold == 0.5);
  CHECK(parse_config("[scheduler]\npolicy = \"sglang_cache_aware\"\n" + std::string{minimal},
                     "test.toml", roles)
          .scheduler.policy
        == placement_kind::sglang_cache_aware);
  CHECK(parse_config(minimal, "test.toml", roles).scheduler.cache_threshold == 0.3);
  auto e = only_error("[scheduler]\ncache_threshold = 1.5\n" + std::string{minimal});
  CHECK(e.key == "scheduler.cache_threshold");
  CHECK(e.line == 2);
}

TEST_CASE("the removed rollout.kv_cache_tokens is an unknown key") {
  auto e = only_error("[rollout]\nkv_cache_tokens = 1024\n" + std::string{minimal});
  CHECK(e.key == "rollout.kv_cache_tokens");
  CHECK(e.line == 2);
  CHECK_THAT(e.message, Catch::StartsWith("unknown key"));
  CHECK(known_config_keys().at("rollout").count("kv_cache_tokens") == 0);
}

TEST_CASE("model.hf_dir is resolved against the config file and must hold a config.json") {
  scratch_dir dir{"config_hf_dir"};
  fs::create_directories(dir.path / "m");
  std::ofstream{dir.path / "m" / "config.json"} << "{}";
  auto cfg = parse_config("[model]\nhf_dir = \"m\"\nmax_seq = 512\n[task]\nsystem_prompt = \"be brief\"\n"
                            + std::string{minimal},
                          "test.toml", roles, dir.path.string());
  CHECK(cfg.model.hf_dir == (dir.path / "m").string());
  CHECK(cfg.model.max_seq == 512);
  CHECK(cfg.task.system_prompt == "be brief");

  auto missing = only_error("[model]\nhf_dir = \"nothing\"\n" + std::string{minimal}, dir.path.string());
  CHECK(missing.key == "model.hf_dir");
  CHECK(missing.line == 2);
  CHECK(missing.message.find("config.json\" does not exist") != std::string::npos);
  CHECK(missing.message.find("scripts/fetch-model") != std::string::npos);
}

TEST_CASE("sft.init_checkpoint is resolved against the config file and need not exist yet") {
  scratch_dir dir{"config_sft_init"};
  CHECK(parse_config(minimal, "test.toml", roles, dir.path.string()).sft.init_checkpoint.empty());
  // Another config's warm start, written later by its own `sorl sft`.
  auto cfg = parse_config("[sft]\ninit_checkpoint = \"../warm/agent\"\n" + std::string{minimal},
                          "test.toml", roles, dir.path.string());
  CHECK(cfg.sft.init_checkpoint == (dir.path / ".." / "warm" / "agent").lexically_normal().string());
  std::ofstream{dir.path / "plain"} << "x";
  auto e = only_error("[sft]\nsteps = 5\ninit_checkpoint = \"plain/ckpt\"\n" + std::string{minimal},
                      dir.path.string());
  CHECK(e.key == "sft.init_checkpoint");
  CHECK(e.line == 3);
  CHECK(e.message == "cannot access \"" + dir.path.string() + "/plain/ckpt\": Not a directory");
}

TEST_CASE("a model from hf_dir conflicts with a preset, the warm start and multi-turn tasks") {
  scratch_dir dir{"config_hf_conflicts"};
  fs::create_directories(dir.path / "m");
  std::ofstream{dir.path / "m" / "config.json"} << "{}";
  const std::string base = dir.path.string();
  auto preset = only_error("[model]\nhf_dir = \"m\"\npreset = \"tiny\"\n" + std::string{minimal}, base);
  CHECK(preset.key == "model.preset");
  CHECK(preset.line == 3);
  CHECK(preset.message == "preset and hf_dir both name the model; keep one");
  auto warm = only_error("[model]\nhf_dir = \"m\"\ncheckpoint = \"w\"\nwarm_start = true\n"
                           + std::string{minimal},
                         base);
  CHECK(warm.key == "model.warm_start");
  auto turns = only_error("[model]\nhf_dir = \"m\"\n[task]\nname = \"number_guess\"\n" + std::string{minimal}, base);
  CHECK(turns.key == "model.hf_dir");
  CHECK(turns.line == 2);
  CHECK(turns.message.find("multi-turn") != std::string::npos);
  auto seq = only_error("[model]\nmax_seq = 64\n" + std::string{minimal});
  CHECK(seq.key == "model.max_seq");
  auto system = only_error("[task]\nsystem_prompt = \"hi\"\n" + std::string{minimal});
  CHECK(system.key == "task.system_prompt");
  CHECK(system.message.find("set model.hf_dir") != std::string::npos);
}

TEST_CASE("task.reward_command is an array of non-empty strings for the jsonl task") {
  scratch_dir dir{"config_reward_command"};
  std::ofstream{dir.path / "t.jsonl"} << "{}\n";
  const std::string jsonl = "[task]\nname = \"jsonl\"\npath = \"t.jsonl\"\nmatch = \"countdown\"\n";
  auto cfg = parse_config(jsonl + "reward_command = [\"python3\", \"score.py\"]\nreward_timeout_ms = 500\n"
                            + std::string{minimal},
                          "test.toml", roles, dir.path.string());
  CHECK(cfg.task.reward_command == std::vector<std::string>{"python3", "score.py"});
  CHECK(cfg.task.reward_timeout_ms == 500);
  CHECK(cfg.task.match == match_kind::countdown);
  auto first = parse_config("[task]\nmatch = \"first_number\"\n" + std::string{minimal}, "test.toml", roles);
  CHECK(first.task.match == match_kind::first_number);
  auto last = parse_config("[task]\nmatch = \"last_number\"\n" + std::string{minimal}, "test.toml", roles);
  CHECK(last.task.match == match_kind::last_number);

  auto not_array = only_error(jsonl + "reward_command = \"python3 score.py\"\n" + std::string{minimal},
                              dir.path.string());
  CHECK(not_array.key == "task.reward_command");
  CHECK(not_array.message == "expected an array of strings, got a string");
  auto number = only_error(jsonl + "reward_command = [\"python3\", 7]\n" + std::string{minimal},
                           dir.path.string());
  CHECK(number.message == "element 2 is an integer, not a string");
  auto empty = only_error(jsonl + "reward_command = [\"\"]\n" + std::string{minimal}, dir.path.string());
  CHECK(empty.message == "element 1 is an empty string");
  // A program that cannot be started is refused now, not after the model loads.
  auto missing = only_error(jsonl + "reward_command = [\"/nonexistent/scorer\"]\n" + std::string{minimal},
                            dir.path.string());
  CHECK(missing.key == "task.reward_command");
  CHECK(missing.message.find("cannot run \"/nonexistent/scorer\": No such file or directory") == 0);
  auto unknown = only_error(jsonl + "reward_command = [\"sorl-no-such-scorer\"]\n" + std::string{minimal},
                            dir.path.string());
  CHECK(unknown.message == "\"sorl-no-such-scorer\" is not a program in PATH");
  auto other = only_error("[task]\nreward_command = [\"python3\"]\n" + std::string{minimal});
  CHECK(other.key == "task.reward_command");
  CHECK(other.message.find("task \"arithmetic\" has its own verifier") != std::string::npos);
}

// -- --set overrides ----------------------------------------------------------------------------

namespace {

/// Parses `text` with `overrides`, expecting failure, and returns the errors.
std::vector<config_error> override_errors(const std::string& text,
                                          const std::vector<std::string>& overrides) {
  try {
    parse_config(text, "test.toml", roles, ".", overrides);
  } catch (const config_exception& e) {
    return e.errors();
  }
  FAIL("expected a config_exception for the overrides of:\n" << text);
  return {};
}

/// The one error `override` makes in `text`; it names the override, with no line.
config_error override_error(const std::string& override, const std::string& text = minimal) {
  auto errs = override_errors(text, {override});
  REQUIRE(errs.size() == 1);
  CHECK(errs[0].file == "--set " + override);
  CHECK(errs[0].line == 0);
  CHECK(errs[0].column == 0);
  return errs[0];
}

const char* three_nodes = R"(
[[node]]
name = "main"
listen = "127.0.0.1:4242"
actors = ["ping"]
[[node]]
name = "w.1"
actors = ["pong"]
[[node]]
name = "w-2"
actors = [{ role = "pong", count = 1 }]
)";

} // namespace

TEST_CASE("overrides from --set replace and add keys after the file is read") {
  const std::vector<std::string> sets{"run.steps=20",        "run.name=\"x y\"",
                                      "run.kernels=portable", "algorithm.lr=1e-5",
                                      "salt.enabled=true",    "task.operators=+-"};
  auto cfg = parse_config("[run]\nsteps = 5\nname = \"file\"\n" + std::string{minimal}, "test.toml",
                          roles, ".", sets);
  CHECK(cfg.run.steps == 20);
  CHECK(cfg.run.name == "x y");
  CHECK(cfg.run.kernels == kernels_kind::portable); // a bare word is a string
  CHECK(cfg.algorithm.lr == 1e-5);
  CHECK(cfg.salt.enabled); // [salt] is not in the file: the override makes it
  CHECK(cfg.task.operators == "+-");
  CHECK(cfg.overrides == sets);
  // Keys the overrides leave alone keep the file's values and the defaults.
  CHECK(cfg.run.seed == 0);
  CHECK(cfg.sagc.group_size == 8);
  CHECK(parse_config(minimal, "test.toml", roles).overrides.empty());
}

TEST_CASE("the last --set of a key wins, and a bare word that is TOML keeps its TOML type") {
  auto cfg = parse_config(minimal, "test.toml", roles, ".",
                          {"run.steps=3", "run.steps=4", "run.output_dir=/tmp/a b", "run.name=run-2"});
  CHECK(cfg.run.steps == 4);
  CHECK(cfg.run.output_dir == "/tmp/a b");
  CHECK(cfg.run.name == "run-2");
  // 2024 is a TOML integer: a string needs quotes, as in the file.
  CHECK(override_error("run.name=2024").to_string()
        == "--set run.name=2024: key 'run.name': expected a string, got an integer");
  CHECK(parse_config(minimal, "test.toml", roles, ".", {"run.name=\"2024\""}).run.name == "2024");
}

TEST_CASE("a bad --set value gets the file's error, naming the override") {
  auto e = override_error("algorithm.lr=abc");
  CHECK(e.key == "algorithm.lr");
  CHECK(e.message == "expected a number, got a string");
  CHECK(e.to_string() == "--set algorithm.lr=abc: key 'algorithm.lr': expected a number, got a string");
  CHECK(override_error("algorithm.lr=2").message == "2 is out of range [0, 1]");
  CHECK(override_error("run.steps=-1").message == "-1 is out of range [0, 100000000]");
  CHECK(override_error("sync.mode=sparce").message
        == "\"sparce\" is not one of \"full\", \"sparse\"; did you mean \"sparse\"?");
  // A rule between two keys is reported at the override that broke it.
  auto g = override_error("sagc.g_min=40", "[sagc]\npolicy = \"sagc\"\n" + std::string{minimal});
  CHECK(g.key == "sagc.g_min");
  CHECK(g.message == "g_min = 40 exceeds g_max = 16");
  // A missing key of a table the override made is reported at the override too.
  auto w = override_error("model.warm_start=true");
  CHECK(w.key == "model.checkpoint");
  CHECK(w.message == "warm_start = true needs a checkpoint directory to create");
}

TEST_CASE("an unknown key set by --set gets the file's hints") {
  CHECK(override_error("algorithm.temprature=0.7").to_string()
        == "--set algorithm.temprature=0.7: key 'algorithm.temprature': unknown key; did you mean "
           "`temperature`?");
  CHECK(override_error("algorithm.learning_rate=1e-5").message
        == "unknown key; did you mean `lr` (sorl's name for learning_rate)?");
  auto s = override_error("algoritm.lr=1e-3");
  CHECK(s.key == "algoritm");
  CHECK(s.message == "unknown section or key; did you mean [algorithm]?");
}

TEST_CASE("a malformed --set says what is expected") {
  const std::string form =
    "expected TABLE.KEY=VALUE (or node.NAME.KEY=VALUE), e.g. --set run.steps=20";
  CHECK(override_error("run.steps").message == form);
  CHECK(override_error("steps=3").message == form);
  CHECK(override_error("run.steps.x=3").message == form);
  CHECK(override_error("run.=3").message == form);
  CHECK(override_error("run.st eps=3").message == form);
  auto q = override_error("run.name=\"unterminated");
  CHECK(q.key == "run.name");
  CHECK(q.message.rfind("\"unterminated is not a TOML value: ", 0) == 0);
  CHECK(override_error("run.steps=[1, 2").message.rfind("[1, 2 is not a TOML value: ", 0) == 0);
  CHECK(override_error("run.steps=1\nseed = 3").message
        == "more TOML follows the value; give one value");
  CHECK(override_error("run.name=\"a\"\n[sagc]\ng_min = 3").message
        == "more TOML follows the value; give one value");
}

TEST_CASE("every bad --set and every error of the file are reported together") {
  auto errs = override_errors("[run]\nsteps = \"many\"\n" + std::string{minimal},
                              {"algorithm.lr=abc", "run.seed", "sagc.group_size=1"});
  REQUIRE(errs.size() == 4);
  CHECK(errs[0].to_string() == "--set run.seed: key 'run.seed': expected TABLE.KEY=VALUE (or "
                               "node.NAME.KEY=VALUE), e.g. --set run.steps=20");
  CHECK(errs[1].to_string() == "test.toml:2:9: key 'run.steps': expected an integer, got a string");
  CHECK(errs[2].to_string() == "--set algorithm.lr=abc: key 'algorithm.lr': expected a number, got a string");
  CHECK(errs[3].to_string()
        == "--set sagc.group_size=1: key 'sagc.group_size': 1 is out of range [2, 65536]");
}

TEST_CASE("node.NAME.KEY sets a key of the [[node]] of that name") {
  auto cfg = parse_config(three_nodes, "test.toml", roles, ".",
                          {"node.main.listen=127.0.0.1:0", "node.w.1.connect=main",
                           "node.w-2.actors=[{ role = \"pong\", count = 3 }]"});
  REQUIRE(cfg.nodes.size() == 3);
  REQUIRE(cfg.nodes[0].listen);
  CHECK(cfg.nodes[0].listen->to_string() == "127.0.0.1:0");
  CHECK(cfg.nodes[1].connect == "main"); // a node name may hold dots
  REQUIRE(cfg.nodes[2].actors.size() == 1);
  CHECK(cfg.nodes[2].actors[0].count == 3);
  CHECK(cfg.count_role("pong") == 4);

  auto none = override_error("node.w-3.listen=127.0.0.1:0", three_nodes);
  CHECK(none.key == "node.w-3.listen");
  CHECK(none.message
        == "test.toml has no [[node]] named \"w-3\" (its nodes: \"main\", \"w.1\", \"w-2\"); did "
           "you mean \"w-2\"?");
  CHECK(override_error("node.listen=127.0.0.1:0", three_nodes).message
        == "[[node]] is an array of tables: set a key of one node as node.NAME.KEY=VALUE");
  auto bad = override_error("node.main.listen=nowhere", three_nodes);
  CHECK(bad.key == "node[1].listen");
  CHECK(bad.message == "\"nowhere\": expected \"host:port\", e.g. \"127.0.0.1:4242\"");
  CHECK(override_error("node.main.actor=[\"ping\"]", three_nodes).message
        == "unknown key; did you mean `actors`?");
}

TEST_CASE("a path set by --set resolves against the config file's directory, as in the file") {
  scratch_dir dir{"config_set_path"};
  auto cfg = parse_config(minimal, "test.toml", roles, dir.path.string(),
                          {"model.checkpoint=ckpt", "sft.init_checkpoint=/abs/init"});
  CHECK(cfg.model.checkpoint == (dir.path / "ckpt").string());
  CHECK(cfg.sft.init_checkpoint == "/abs/init");
}

TEST_CASE("algorithm.name = dapo from --set brings DAPO's defaults for the keys nothing sets") {
  auto cfg = parse_config(minimal, "test.toml", roles, ".",
                          {"algorithm.name=dapo", "algorithm.clip_eps_high=0.3"});
  CHECK(cfg.algorithm.name == algorithm_kind::dapo);
  CHECK(cfg.algorithm.clip_eps_high == 0.3);
  CHECK(cfg.algorithm.dynamic_sampling);
  CHECK(cfg.algorithm.preset_keys
        == std::vector<std::string>{"dynamic_sampling", "overlong", "loss_norm"});
}

TEST_CASE("load_config applies its overrides") {
  scratch_dir dir{"config_set_load"};
  const auto path = (dir.path / "exp.toml").string();
  std::ofstream{path} << "[run]\nsteps = 5\n" << minimal;
  CHECK(load_config(path, roles, {"run.steps=7"}).run.steps == 7);
  CHECK(load_config(path, roles).run.steps == 5);
}
