#include "runtime/topology.hpp"
#include "runtime/role_names.hpp"

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <thread>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/all.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/openssl/remote_actor.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace sorl {

// -- run_outcome ---------------------------------------------------------------------------

void run_outcome::set(const std::string& key, double value) {
  std::lock_guard<std::mutex> guard{mtx_};
  values_[key] = value;
}

void run_outcome::add(const std::string& key, double delta) {
  std::lock_guard<std::mutex> guard{mtx_};
  values_[key] += delta;
}

std::optional<double> run_outcome::get(const std::string& key) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = values_.find(key);
  if (i == values_.end())
    return std::nullopt;
  return i->second;
}

std::map<std::string, double> run_outcome::snapshot() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return values_;
}

std::string role_context::name() const {
  return fmt::format("{}#{}@{}", role, index, node);
}

std::set<std::string> role_names(const role_table& table) {
  std::set<std::string> out;
  for (const auto& r : table)
    out.insert(r.name);
  return out;
}

namespace {

/// Why a node that joins a running job is sent away.
constexpr const char* late_join_reason =
  "the job is already running and its roster is fixed; a node cannot join it midway "
  "(to bring this node back, restart the whole job with --resume)";


using namespace std::chrono_literals;

// -- shared bookkeeping --------------------------------------------------------------------

/// Filled by a node agent when it ends; read by the thread that started the run.
struct node_result {
  std::mutex mtx;
  std::condition_variable cv;
  bool done = false;
  bool ok = false;
  std::string why;

  void finish(bool success, std::string reason) {
    std::lock_guard<std::mutex> guard{mtx};
    if (done)
      return;
    done = true;
    ok = success;
    why = std::move(reason);
    cv.notify_all();
  }
};

/// One actor a node agent must spawn.
struct planned_actor {
  std::string role;
  int32_t index = 0;
};

/// The actors of `node` with their global per-role indices (file order over all nodes).
std::vector<planned_actor> plan_node(const experiment_config& cfg, const std::string& node) {
  std::map<std::string, int32_t> next;
  std::vector<planned_actor> out;
  for (const auto& n : cfg.nodes) {
    for (const auto& spec : n.actors) {
      for (int64_t i = 0; i < spec.count; ++i) {
        auto idx = next[spec.role]++;
        if (n.name == node)
          out.push_back({spec.role, idx});
      }
    }
  }
  return out;
}

size_t total_actors(const experiment_config& cfg) {
  size_t total = 0;
  for (const auto& n : cfg.nodes)
    for (const auto& spec : n.actors)
      total += static_cast<size_t>(spec.count);
  return total;
}

// -- directory -----------------------------------------------------------------------------

struct directory_state {
  static inline const char* name = "sorl.directory";
  const experiment_config* cfg = nullptr;
  size_t expected_actors = 0;
  size_t expected_agents = 0;
  std::vector<peer_info> members;
  std::vector<std::pair<std::string, caf::actor>> agents;
  bool roster_sent = false;
  bool stopping = false;
  bool interrupted = false; ///< a stop request from a signal was handled
};

/// Why a member went down, in words, and whether that is a crash (as opposed to a clean
/// exit or a lost node, which roles are expected to handle).
std::pair<std::string, bool> classify_down(const caf::error& reason) {
  if (!reason || reason == caf::exit_reason::normal)
    return {"exited", false};
  if (reason == caf::exit_reason::remote_link_unreachable)
    return {"node lost (connection closed or timed out)", false};
  if (reason == caf::exit_reason::user_shutdown || reason == caf::exit_reason::kill)
    return {"stopped", false};
  return {"failed: " + caf::to_string(reason), true};
}

caf::behavior directory_actor(caf::stateful_actor<directory_state>* self,
                              const experiment_config* cfg) {
  self->state.cfg = cfg;
  self->state.expected_actors = total_actors(*cfg);
  self->state.expected_agents = cfg->nodes.size();
  auto stop = [self](bool ok, std::string why) {
    auto& st = self->state;
    if (st.stopping)
      return;
    st.stopping = true;
    if (ok)
      spdlog::info("directory: job finished: {}", why);
    else
      spdlog::error("directory: job failed: {}", why);
    // Agents first: on every link their shutdown travels ahead of their actors', so an agent
    // knows the job ended before it sees its actors go down.
    for (auto& [node, agent] : st.agents)
      self->send(agent, shutdown_atom::value, ok, why);
    for (auto& m : st.members)
      self->send(m.handle, shutdown_atom::value, ok, why);
    if (st.members.empty())
      self->quit();
    else
      self->delayed_send(self, std::chrono::milliseconds{st.cfg->network.stop_grace_ms},
                         stop_timeout_atom::value);
  };
  self->set_down_handler([self, stop](caf::down_msg& dm) {
    auto& st = self->state;
    for (auto i = st.agents.begin(); i != st.agents.end(); ++i) {
      if (i->second.address() == dm.source) {
        st.agents.erase(i);
        break;
      }
    }
    auto it = std::find_if(st.members.begin(), st.members.end(),
                           [&](const peer_info& p) { return p.handle.address() == dm.source; });
    if (it == st.members.end())
      return;
    peer_info gone = *it;
    st.members.erase(it);
    auto [why, crashed] = classify_down(dm.reason);
    if (st.stopping) {
      if (st.members.empty())
        self->quit();
      return;
    }
    spdlog::log(crashed ? spdlog::level::err : spdlog::level::warn,
                "directory: peer down: {} ({})", gone.name(), why);
    if (!st.roster_sent) {
      stop(false, fmt::format("{} went down before every node had joined ({})", gone.name(),
                              why));
      return;
    }
    for (auto& m : st.members)
      self->send(m.handle, peer_down_atom::value, gone, why);
    if (crashed)
      stop(false, fmt::format("{} {}", gone.name(), why));
  });
  self->delayed_send(self, std::chrono::milliseconds{cfg->network.join_timeout_ms},
                     join_timeout_atom::value);
  return {
    [self](register_atom, peer_info& p) {
      auto& st = self->state;
      if (st.stopping || st.roster_sent) {
        spdlog::warn("directory: late registration of {} ignored", p.name());
        self->send(p.handle, shutdown_atom::value, false, std::string{late_join_reason});
        return;
      }
      self->monitor(p.handle);
      spdlog::debug("directory: registered {}", p.name());
      st.members.push_back(std::move(p));
      if (st.members.size() == st.expected_actors) {
        st.roster_sent = true;
        spdlog::info("directory: roster complete: {} actors on {} nodes", st.members.size(),
                     st.cfg->nodes.size());
        for (auto& m : st.members)
          self->send(m.handle, roster_atom::value, st.members);
      }
    },
    [self](join_atom, std::string& node, caf::actor& agent) {
      auto& st = self->state;
      // A node with actors that joins once the roster is out is a restarted node: the roster
      // every actor holds is fixed once the job runs. A node without actors may join at any
      // time (nothing waits for it); it only hears the shutdown.
      if (st.roster_sent && !st.stopping && !plan_node(*st.cfg, node).empty()) {
        spdlog::warn("directory: node {} tried to join the running job; refused", node);
        self->send(agent, shutdown_atom::value, false, std::string{late_join_reason});
        return;
      }
      self->monitor(agent);
      st.agents.emplace_back(std::move(node), std::move(agent));
    },
    [stop](shutdown_atom, bool ok, std::string& why) { stop(ok, std::move(why)); },
    [self, stop](interrupt_atom, int32_t signo, std::string& node) {
      auto& st = self->state;
      if (st.stopping || st.interrupted)
        return;
      st.interrupted = true;
      auto what = fmt::format("{} on node {}", signal_name(signo), node);
      auto trainer = std::find_if(st.members.begin(), st.members.end(),
                                  [](const peer_info& p) { return p.role == role::trainer; });
      if (!st.roster_sent)
        stop(false, fmt::format("stopped by {} before every node had joined; nothing to save",
                                what));
      else if (trainer == st.members.end())
        stop(false, "stopped by " + what);
      else // the trainer ends the job once its checkpoint is written
        self->send(trainer->handle, interrupt_atom::value, signo, node);
    },
    [self, stop](join_timeout_atom) {
      auto& st = self->state;
      if (st.roster_sent || st.stopping)
        return;
      std::map<std::string, int64_t> have;
      for (auto& m : st.members)
        have[m.node + "/" + m.role]++;
      std::string missing;
      for (auto& n : st.cfg->nodes)
        for (auto& spec : n.actors) {
          auto want = spec.count - have[n.name + "/" + spec.role];
          if (want > 0)
            missing += fmt::format("{}{} ({}×{})", missing.empty() ? "" : ", ", n.name,
                                   spec.role, want);
        }
      stop(false, fmt::format("not every node joined within {} ms; missing: {}",
                              st.cfg->network.join_timeout_ms, missing));
    },
    [self](stop_timeout_atom) {
      for (auto& m : self->state.members)
        spdlog::warn("directory: {} did not stop within the grace period", m.name());
      self->quit();
    },
  };
}

// -- node agent ----------------------------------------------------------------------------

struct agent_state {
  static inline const char* name = "sorl.node_agent";
  std::vector<caf::actor> local;
  std::vector<std::string> local_names; ///< parallel to `local`, for the stop log
  bool shutdown_seen = false;
  bool ok = false;
  std::string why;
};

struct agent_plan {
  const experiment_config* cfg = nullptr;
  const role_table* table = nullptr;
  std::string node;
  caf::actor directory;
  std::shared_ptr<run_outcome> outcome;
  std::shared_ptr<node_result> result;
};

caf::behavior node_agent(caf::stateful_actor<agent_state>* self, agent_plan plan) {
  auto finish_if_idle = [self, result = plan.result] {
    auto& st = self->state;
    if (!st.local.empty())
      return;
    if (!st.shutdown_seen)
      result->finish(false, st.why.empty() ? "actors ended before the job finished" : st.why);
    else
      result->finish(st.ok, st.why);
    self->quit();
  };
  self->set_down_handler([self, finish_if_idle, plan](caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source == plan.directory.address()) {
      if (!st.shutdown_seen) {
        spdlog::error("node {}: lost the directory on the hub node ({}); stopping",
                      plan.node, caf::to_string(dm.reason));
        st.why = "lost the hub node";
        for (auto& a : st.local)
          self->send_exit(a, caf::exit_reason::user_shutdown);
      }
      finish_if_idle();
      return;
    }
    auto it = std::find_if(st.local.begin(), st.local.end(),
                           [&](const caf::actor& a) { return a.address() == dm.source; });
    if (it != st.local.end()) {
      auto i = it - st.local.begin();
      spdlog::debug("node {}: {} stopped ({}); {} local actors left", plan.node,
                    st.local_names[i], caf::to_string(dm.reason), st.local.size() - 1);
      st.local.erase(it);
      st.local_names.erase(st.local_names.begin() + i);
    }
    finish_if_idle();
  });
  self->monitor(plan.directory);
  self->send(plan.directory, join_atom::value, plan.node, caf::actor{self});
  for (auto& p : plan_node(*plan.cfg, plan.node)) {
    auto entry = std::find_if(plan.table->begin(), plan.table->end(),
                              [&](const role_entry& r) { return r.name == p.role; });
    if (entry == plan.table->end()) {
      // parse_config rejects unknown roles, so this is a wiring bug, not user error.
      spdlog::critical("node {}: role \"{}\" missing from the role table", plan.node, p.role);
      std::abort();
    }
    role_context ctx;
    ctx.config = plan.cfg;
    ctx.role = p.role;
    ctx.index = p.index;
    ctx.node = plan.node;
    ctx.directory = plan.directory;
    ctx.outcome = plan.outcome;
    auto handle = entry->spawn(self->system(), ctx);
    self->monitor(handle);
    self->state.local.push_back(handle);
    self->state.local_names.push_back(peer_info{p.role, p.index, plan.node, handle}.name());
    self->send(plan.directory, register_atom::value,
               peer_info{p.role, p.index, plan.node, handle});
  }
  if (self->state.local.empty())
    spdlog::info("node {}: no actors to run", plan.node);
  return {
    [self, node = plan.node](shutdown_atom, bool ok, std::string& why) {
      auto& st = self->state;
      spdlog::debug("node {}: the job ended; waiting for {} local actors", node,
                    st.local.size());
      st.shutdown_seen = true;
      st.ok = ok;
      st.why = std::move(why);
    },
  };
}

// -- actor system setup --------------------------------------------------------------------

void configure_system(caf::actor_system_config& sys_cfg, const experiment_config& cfg,
                      bool networked) {
  add_sorl_message_types(sys_cfg);
  // CAF otherwise spawns one worker per core; sorl's actors do little CPU work themselves
  // (heavy math runs in libtorch's own pool), and tests start several systems at once.
  sys_cfg.set("scheduler.max-threads", static_cast<size_t>(
                                         std::max(2u, std::min(4u, std::thread::hardware_concurrency()))));
  if (!networked)
    return;
  sys_cfg.load<caf::io::middleman>();
  sys_cfg.set("middleman.heartbeat-interval",
              caf::timespan{std::chrono::milliseconds{cfg.network.heartbeat_ms}});
  sys_cfg.set("middleman.connection-timeout",
              caf::timespan{std::chrono::milliseconds{cfg.network.connection_timeout_ms}});
  if (cfg.network.tls_enabled()) {
    sys_cfg.load<caf::openssl::manager>();
    sys_cfg.openssl_certificate = cfg.network.tls_certificate;
    sys_cfg.openssl_key = cfg.network.tls_key;
    sys_cfg.openssl_cafile = cfg.network.tls_ca_file;
    sys_cfg.openssl_passphrase = cfg.network.tls_passphrase;
  }
}

/// Waits for every agent's result, then for the actor count to drop to zero (bounded).
run_result collect(caf::actor_system& sys, std::vector<std::shared_ptr<node_result>>& results,
                   size_t baseline) {
  run_result out;
  for (auto& r : results) {
    std::unique_lock<std::mutex> guard{r->mtx};
    r->cv.wait(guard, [&] { return r->done; });
    if (!r->ok && out.exit_code == 0) {
      out.exit_code = 1;
      out.why = r->why;
    } else if (out.why.empty()) {
      out.why = r->why;
    }
  }
  auto deadline = std::chrono::steady_clock::now() + 15s;
  while (sys.registry().running() > baseline && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  out.leaked_actors = sys.registry().running() - std::min(sys.registry().running(), baseline);
  if (out.leaked_actors > 0) {
    // The actor system's destructor would wait for them forever; fail loudly instead.
    spdlog::critical("{} actors still running 15 s after the job ended", out.leaked_actors);
    std::fflush(nullptr);
    std::_Exit(3);
  }
  return out;
}

/// While alive, the first signal `interrupts` sees goes to `directory` as a stop request;
/// `ack` is printed on this process's stdout when it does.
class interrupt_route {
public:
  interrupt_route(interrupt_watch* interrupts, caf::actor directory, std::string node,
                  std::string ack)
    : interrupts_(interrupts) {
    if (!interrupts_)
      return;
    interrupts_->on_first([directory = std::move(directory), node = std::move(node),
                           ack = std::move(ack)](int signo) {
      caf::anon_send(directory, interrupt_atom::value, static_cast<int32_t>(signo), node);
      fmt::print("\nsorl: {}: {}\n", signal_name(signo), ack);
      std::fflush(stdout);
    });
  }
  ~interrupt_route() {
    if (interrupts_)
      interrupts_->on_first(nullptr);
  }
  interrupt_route(const interrupt_route&) = delete;
  interrupt_route& operator=(const interrupt_route&) = delete;

private:
  interrupt_watch* interrupts_;
};

/// What a node that hosts the hub (or the whole job) prints on the first signal.
constexpr const char* hub_ack =
  "stopping the job cleanly: the trainer finishes the step in progress and writes a "
  "checkpoint (signal again to exit at once, losing that step)";

bool write_port_file(const std::string& path, uint16_t port) {
  auto tmp = path + ".tmp";
  {
    std::ofstream out{tmp};
    if (!out)
      return false;
    out << port << '\n';
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  return !ec;
}

} // namespace

// -- entry points --------------------------------------------------------------------------

run_result run_in_process(const experiment_config& cfg, const role_table& table,
                          std::shared_ptr<run_outcome> outcome, interrupt_watch* interrupts) {
  if (!outcome)
    outcome = std::make_shared<run_outcome>();
  caf::actor_system_config sys_cfg;
  configure_system(sys_cfg, cfg, false);
  caf::actor_system sys{sys_cfg};
  auto baseline = sys.registry().running();
  auto directory = sys.spawn(directory_actor, &cfg);
  interrupt_route route{interrupts, directory, cfg.nodes.empty() ? "" : cfg.nodes.front().name,
                        hub_ack};
  std::vector<std::shared_ptr<node_result>> results;
  // Held until every agent has reported: an actor nobody references is terminated as
  // unreachable, and the directory (the agents' other holder) may quit before an agent has
  // seen its last actor go down, which would leave this thread waiting for a result forever.
  std::vector<caf::actor> agents;
  for (const auto& node : cfg.nodes) {
    auto result = std::make_shared<node_result>();
    results.push_back(result);
    agents.push_back(
      sys.spawn(node_agent, agent_plan{&cfg, &table, node.name, directory, outcome, result}));
  }
  directory = nullptr; // the agents and the roster hold it from here on
  return collect(sys, results, baseline);
}

run_result run_node(const experiment_config& cfg, const role_table& table,
                    const node_options& opts, std::shared_ptr<run_outcome> outcome) {
  if (!outcome)
    outcome = std::make_shared<run_outcome>();
  const node_config* self_node = cfg.find_node(opts.node);
  if (!self_node) {
    std::string names;
    for (auto& n : cfg.nodes)
      names += (names.empty() ? "" : ", ") + n.name;
    return {2, fmt::format("{} has no node \"{}\" (nodes: {})", cfg.file, opts.node, names), 0};
  }
  caf::actor_system_config sys_cfg;
  configure_system(sys_cfg, cfg, true);
  caf::actor_system sys{sys_cfg};
  auto baseline = sys.registry().running();
  bool tls = cfg.network.tls_enabled();
  caf::actor directory;
  if (self_node->listen) {
    const auto& ep = *self_node->listen;
    directory = sys.spawn(directory_actor, &cfg);
    auto port = tls ? caf::openssl::publish(directory, ep.port, ep.host.c_str(), true)
                    : sys.middleman().publish(directory, ep.port, ep.host.c_str(), true);
    if (!port) {
      caf::anon_send_exit(directory, caf::exit_reason::user_shutdown);
      return {2, fmt::format("node {}: cannot listen on {}: {}", opts.node, ep.to_string(),
                             sys.render(port.error())),
              0};
    }
    endpoint bound{ep.host, *port};
    // Scripts and tests read this line to find a port chosen by the OS (listen port 0).
    fmt::print("sorl node {}: listening on {}{}\n", opts.node, bound.to_string(),
               tls ? " (TLS)" : "");
    std::fflush(stdout);
    if (!opts.port_file.empty() && !write_port_file(opts.port_file, *port))
      spdlog::warn("node {}: cannot write the port file {}", opts.node, opts.port_file);
  } else {
    const node_config* hub = cfg.hub();
    if (!self_node->connect.empty())
      hub = cfg.find_node(self_node->connect);
    std::optional<endpoint> target = opts.connect;
    if (!target && hub)
      target = hub->listen;
    if (!target)
      return {2, fmt::format("node {}: no hub to connect to (give one node `listen`)",
                             opts.node),
              0};
    if (auto why = cfg.network.plaintext_refusal(*target, "connect to"); !why.empty())
      return {2, fmt::format("node {}: {}", opts.node, why), 0};
    auto deadline = std::chrono::steady_clock::now()
                    + std::chrono::milliseconds{cfg.network.connect_timeout_ms};
    std::string last_error;
    for (;;) {
      if (opts.interrupts && opts.interrupts->received() != 0)
        return {1, fmt::format("node {}: stopped by {} while connecting to the hub", opts.node,
                               signal_name(opts.interrupts->received())),
                0};
      auto res = tls ? caf::openssl::remote_actor(sys, target->host, target->port)
                     : sys.middleman().remote_actor(target->host, target->port);
      if (res) {
        directory = *res;
        break;
      }
      last_error = sys.render(res.error());
      if (std::chrono::steady_clock::now() >= deadline)
        return {2, fmt::format("node {}: cannot reach the hub at {} within {} ms: {}",
                               opts.node, target->to_string(),
                               cfg.network.connect_timeout_ms, last_error),
                0};
      std::this_thread::sleep_for(100ms);
    }
    spdlog::info("node {}: connected to the hub at {}", opts.node, target->to_string());
  }
  interrupt_route route{opts.interrupts, directory, opts.node,
                        self_node->listen
                          ? std::string{hub_ack}
                          : fmt::format("node {} asked the hub to stop the job cleanly: the "
                                        "trainer finishes the step in progress and writes a "
                                        "checkpoint, then every node exits (signal again to "
                                        "exit this node at once)",
                                        opts.node)};
  auto result = std::make_shared<node_result>();
  std::vector<std::shared_ptr<node_result>> results{result};
  // Held until the agent has reported (see run_in_process).
  auto agent =
    sys.spawn(node_agent, agent_plan{&cfg, &table, opts.node, directory, outcome, result});
  directory = nullptr;
  auto out = collect(sys, results, baseline);
  return out;
}

} // namespace sorl
