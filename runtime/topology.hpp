#pragma once

// Topology: turns an experiment_config into running actors, in one process (`sorl train`)
// or one node per process (`sorl node`), ARCHITECTURE.md §5.
//
// Every process runs a node agent per node it hosts; the hub node (the one with `listen`)
// also runs the directory. Agents spawn their node's roles, register each actor with the
// directory, and watch them. When every expected actor has registered, the directory sends
// each one the roster. The protocol every role actor follows:
//
//   receives (roster_atom, std::vector<peer_info>)       once, when everyone has joined
//   receives (peer_down_atom, peer_info, std::string)     an actor or its node is gone
//   receives (shutdown_atom, bool ok, std::string why)    the job ends: quit
//   sends    (shutdown_atom, bool ok, std::string why)    to the directory, to end the job
//
// and the trainer also receives (interrupt_atom, int32_t signal, std::string node) when a
// process of the job got SIGINT / SIGTERM (runtime/interrupt.hpp): it finishes its step,
// writes a checkpoint and ends the job.
//
// Failure detection bound: a node whose process dies is seen as soon as its TCP connection
// closes (the kernel sends FIN/RST: milliseconds; the multi-process test measures it). A
// node that goes silent without closing its sockets (frozen, partitioned, powered off) is
// dropped after `network.connection_timeout_ms` without traffic; heartbeats every
// `network.heartbeat_ms` keep idle but healthy links alive. The directory then tells every
// remaining actor with peer_down within one more message hop.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "runtime/actor_types.hpp"
#include "runtime/config.hpp"
#include "runtime/interrupt.hpp"

namespace sorl {

/// Results that actors publish for whoever started the run (tests, the CLI summary).
/// Thread-safe: actors on any scheduler thread may write.
class run_outcome {
public:
  void set(const std::string& key, double value);
  void add(const std::string& key, double delta);
  std::optional<double> get(const std::string& key) const;
  std::map<std::string, double> snapshot() const;

private:
  mutable std::mutex mtx_;
  std::map<std::string, double> values_;
};

/// What a role's spawn function gets: its identity, the config and the directory.
struct role_context {
  const experiment_config* config = nullptr; ///< outlives every actor of the run
  std::string role;
  int32_t index = 0; ///< 0-based among all actors of this role, over all nodes in file order
  std::string node;
  caf::actor directory;
  std::shared_ptr<run_outcome> outcome; ///< never null

  /// "role#index@node".
  std::string name() const;
};

/// Spawns one actor of a role. Called on the node agent's thread.
using spawn_fn = std::function<caf::actor(caf::actor_system&, const role_context&)>;

/// One entry of the role table: the only place that maps TOML role names to actors.
struct role_entry {
  std::string name;
  std::string summary; ///< one line for `sorl --help`
  spawn_fn spawn;
};

using role_table = std::vector<role_entry>;

/// Names of all roles in `table`, for config validation.
std::set<std::string> role_names(const role_table& table);

/// How a run ended.
struct run_result {
  int exit_code = 0;        ///< 0 = the job ended with shutdown(ok = true)
  std::string why;          ///< the shutdown reason, or what went wrong
  size_t leaked_actors = 0; ///< actors still running after the job ended (must be 0)
};

/// Runs every node of `cfg` in this process, without networking. Blocks until the job ends.
/// With `interrupts`, the first SIGINT / SIGTERM asks the trainer to stop after its current
/// step with a checkpoint (the job then ends with exit_code 1 and the trainer's reason).
run_result run_in_process(const experiment_config& cfg, const role_table& table,
                          std::shared_ptr<run_outcome> outcome = nullptr,
                          interrupt_watch* interrupts = nullptr);

/// Options of `sorl node`.
struct node_options {
  std::string node;                ///< which [[node]] of the file to run
  std::optional<endpoint> connect; ///< overrides the hub's `listen` address (e.g. port 0)
  std::string port_file;           ///< hub only: write the bound port here once listening
  /// When set, the first SIGINT / SIGTERM this process gets asks the trainer (through the
  /// hub) to stop after its current step with a checkpoint; while still connecting to the
  /// hub, the node gives up instead.
  interrupt_watch* interrupts = nullptr;
};

/// Runs one node of `cfg`: the hub publishes the directory at its `listen` address (TLS when
/// configured); the others connect to it, retrying for `network.connect_timeout_ms`. Blocks
/// until the job ends. Returns exit_code 2 when the node cannot start (unknown node, cannot
/// bind, hub unreachable), 1 when the job failed or the hub was lost.
run_result run_node(const experiment_config& cfg, const role_table& table,
                    const node_options& opts, std::shared_ptr<run_outcome> outcome = nullptr);

} // namespace sorl
