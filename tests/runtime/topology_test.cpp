#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>

#include "actors/common/train_setup.hpp"
#include "actors/roles.hpp"
#include "runtime/actor_types.hpp"
#include "runtime/config.hpp"
#include "runtime/role_names.hpp"
#include "runtime/topology.hpp"

using namespace sorl;

namespace {

experiment_config smoke(const std::string& nodes, int rounds = 25) {
  auto text = "[smoke]\nrounds = " + std::to_string(rounds)
              + "\ninterval_ms = 0\npayload_bytes = 32\n" + nodes;
  return parse_config(text, "smoke-test.toml", role_names(builtin_roles()));
}

/// Ends the job as soon as the roster is out.
caf::behavior finisher(caf::event_based_actor* self, caf::actor directory) {
  return {
    [self, directory](roster_atom, const std::vector<peer_info>&) {
      self->send(directory, shutdown_atom::value, true, std::string{"finished at once"});
    },
    [](peer_down_atom, const peer_info&, const std::string&) {},
    [self](shutdown_atom, bool, const std::string&) { self->quit(); },
  };
}

/// Ignores the shutdown and stops only once the directory is gone, i.e. after the hub's stop
/// grace period: the last actor of its node goes down after the directory has quit.
caf::behavior stubborn(caf::event_based_actor* self, caf::actor directory) {
  self->monitor(directory);
  self->set_down_handler([self](caf::down_msg&) { self->quit(); });
  return {
    [](roster_atom, const std::vector<peer_info>&) {},
    [](peer_down_atom, const peer_info&, const std::string&) {},
    [](shutdown_atom, bool, const std::string&) {},
  };
}

} // namespace

TEST_CASE("a node whose last actor stops after the directory has quit still reports and ends "
          "the run") {
  const role_table table{
    {"finisher", "ends the job",
     [](caf::actor_system& sys, const role_context& ctx) {
       return sys.spawn(finisher, ctx.directory);
     }},
    {"stubborn", "outlives the directory",
     [](caf::actor_system& sys, const role_context& ctx) {
       return sys.spawn(stubborn, ctx.directory);
     }},
  };
  const auto cfg = parse_config("[network]\nstop_grace_ms = 100\n[[node]]\nname = \"main\"\n"
                                "actors = [\"finisher\", \"stubborn\"]\n",
                                "grace.toml", role_names(table));
  // On a thread, so that a run that never ends fails this case instead of hanging it; the
  // thread owns copies of what it reads.
  auto done = std::make_shared<std::promise<run_result>>();
  auto ended = done->get_future();
  std::thread([done, cfg, table] { done->set_value(run_in_process(cfg, table)); }).detach();
  REQUIRE(ended.wait_for(std::chrono::seconds{60}) == std::future_status::ready);
  const auto result = ended.get();
  CHECK(result.exit_code == 0);
  CHECK(result.why == "finished at once");
  CHECK(result.leaked_actors == 0);
}

TEST_CASE("one process runs every node, exchanges envelopes and shuts down cleanly") {
  auto cfg = smoke(R"(
[[node]]
name = "main"
listen = "127.0.0.1:0"
actors = ["ping"]
[[node]]
name = "a"
actors = [{ role = "pong", count = 2 }]
[[node]]
name = "b"
actors = ["pong"]
)");
  auto outcome = std::make_shared<run_outcome>();
  auto result = run_in_process(cfg, builtin_roles(), outcome);
  CHECK(result.exit_code == 0);
  CHECK(result.leaked_actors == 0);
  CHECK(result.why == "25 rounds, 75 answers from 3 pongers");
  CHECK(outcome->get("smoke.rounds") == 25.0);
  CHECK(outcome->get("smoke.answers") == 75.0);
  CHECK_FALSE(outcome->get("smoke.rejected"));
}

TEST_CASE("a job whose roles cannot work fails with a reason and still stops every actor") {
  auto cfg = smoke(R"(
[[node]]
name = "main"
actors = ["ping"]
)");
  auto result = run_in_process(cfg, builtin_roles());
  CHECK(result.exit_code == 1);
  CHECK(result.why == "the topology has no pong actor");
  CHECK(result.leaked_actors == 0);
}

TEST_CASE("a node without actors is allowed and stops with the job") {
  auto cfg = smoke(R"(
[[node]]
name = "main"
listen = "127.0.0.1:0"
actors = ["ping", "pong"]
[[node]]
name = "idle"
actors = []
)",
                   3);
  auto result = run_in_process(cfg, builtin_roles());
  CHECK(result.exit_code == 0);
  CHECK(result.leaked_actors == 0);
}

TEST_CASE("run_node refuses a node the file does not define") {
  auto cfg = smoke("[[node]]\nname = \"main\"\nactors = [\"ping\", \"pong\"]\n");
  node_options opts;
  opts.node = "nope";
  auto result = run_node(cfg, builtin_roles(), opts);
  CHECK(result.exit_code == 2);
  CHECK(result.why == "smoke-test.toml has no node \"nope\" (nodes: main)");
}

TEST_CASE("every shipped config in configs/ loads with the real role table") {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator{fs::path{SORL_SOURCE_DIR} / "configs"})
    if (e.path().extension() == ".toml")
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<std::string> loaded;
  for (const auto& path : files) {
    INFO(path.string());
    try {
      const auto cfg = load_config(path.string(), role_names(builtin_roles()));
      CHECK_FALSE(cfg.nodes.empty());
      // A training config also builds its task, as `sorl check` and `sorl train` do first.
      if (cfg.count_role("trainer") > 0)
        CHECK_NOTHROW(make_task_from(cfg));
      loaded.push_back(path.filename().string());
    } catch (const config_exception& e) {
      // A config of a fetched model and dataset (scripts/fetch-model, scripts/fetch-data) loads
      // once they are fetched; on a clean clone its only errors are those missing inputs.
      const bool fetched_inputs_missing = std::all_of(e.errors().begin(), e.errors().end(), [](const auto& err) {
        return (err.key == "model.hf_dir" || err.key == "task.path" || err.key == "task.eval_path")
               && err.message.find("does not exist") != std::string::npos;
      });
      if (fetched_inputs_missing) {
        loaded.push_back(path.filename().string());
        continue;
      }
      for (const auto& err : e.errors())
        UNSCOPED_INFO(err.to_string());
      FAIL("the config does not load");
    }
  }
  // The directory was found and holds the configs the README runs.
  CHECK(std::count(loaded.begin(), loaded.end(), "default.toml") == 1);
  CHECK(std::count(loaded.begin(), loaded.end(), "smoke.toml") == 1);
  CHECK(loaded.size() == files.size());
}

TEST_CASE("the [task] keys of file_search reach the task sorl train builds") {
  auto cfg = parse_config(
    "[task]\nname = \"file_search\"\ndetour_rate = 0.0\nwrong_episodes = \"give_up\"\n"
    "[[node]]\nname = \"main\"\nactors = [\"ping\", \"pong\"]\n",
    "task-test.toml", role_names(builtin_roles()));
  const ml::any_task task = make_task_from(cfg);
  REQUIRE(task.is_multi_turn());
  // Episode seed 5 (tests/ml/file_search_test.cpp): the expert takes 12 actions, the one
  // that gives up after /src/src answers "not found" at the 7th.
  std::size_t actions = 0;
  for (const auto& m : task.multi_turn->demonstrate(5, false))
    actions += m.role == ml::chat_role::assistant;
  CHECK(actions == 7);
}

TEST_CASE("a topology with a trainer is complete only with every training role and one "
          "trainer") {
  std::map<std::string, int64_t> have{{"trainer", 1}, {"learner", 1}};
  auto count = [&](std::string_view role) {
    auto it = have.find(std::string(role));
    return it == have.end() ? int64_t{0} : it->second;
  };
  CHECK(sorl::role::missing_for_training(count)
        == "sync_publisher, sagc_controller, scheduler, rollout_worker");
  have = {{"trainer", 2}, {"learner", 1}, {"sync_publisher", 1}, {"sagc_controller", 1},
          {"scheduler", 1}, {"rollout_worker", 3}};
  CHECK(sorl::role::missing_for_training(count) == "exactly one trainer");
  have["trainer"] = 1;
  CHECK(sorl::role::missing_for_training(count).empty());
  have.erase("scheduler");
  have["trainer"] = 3;
  CHECK(sorl::role::missing_for_training(count) == "scheduler; exactly one trainer");
  // Without a trainer nothing is required: the smoke topologies run ping and pong alone.
  have = {{"ping", 1}, {"pong", 2}};
  CHECK(sorl::role::missing_for_training(count).empty());
}
