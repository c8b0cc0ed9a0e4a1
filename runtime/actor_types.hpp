#pragma once

// CAF-side vocabulary shared by the topology and every actor shell: atoms, the peer record
// of the roster, and the registration of sorl's message types. Everything CAF-specific that
// actor shells need comes from here or runtime/topology.hpp, so a port to CAF 1.x touches
// runtime/ only.

#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>

#include "runtime/envelope.hpp"

namespace sorl {

/// node agent → directory: (register_atom, peer_info) for each local actor.
using register_atom = caf::atom_constant<caf::atom("register")>;
/// node agent → directory: (join_atom, node name, agent) so the agent hears the shutdown.
using join_atom = caf::atom_constant<caf::atom("join")>;
/// directory → every actor, once every expected actor has registered:
/// (roster_atom, std::vector<peer_info>).
using roster_atom = caf::atom_constant<caf::atom("roster")>;
/// directory → every live actor: (peer_down_atom, peer_info, reason) when an actor or its
/// whole node is gone.
using peer_down_atom = caf::atom_constant<caf::atom("peer_down")>;
/// any actor → directory, directory → everyone: (shutdown_atom, ok, why) ends the job.
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
/// directory → itself: the join deadline passed.
using join_timeout_atom = caf::atom_constant<caf::atom("join_tmo")>;
/// directory → itself: the shutdown grace period passed.
using stop_timeout_atom = caf::atom_constant<caf::atom("stop_tmo")>;
/// actor → itself: periodic work (e.g. the next smoke round).
using tick_atom = caf::atom_constant<caf::atom("tick")>;
/// the process that got SIGINT / SIGTERM → directory → trainer:
/// (interrupt_atom, int32_t signal number, std::string node): stop after the current step,
/// with a checkpoint (runtime/interrupt.hpp).
using interrupt_atom = caf::atom_constant<caf::atom("interrupt")>;
/// trainer → itself: (deadline_atom, step) when deadline mode's rollout budget is spent.
using deadline_atom = caf::atom_constant<caf::atom("deadline")>;
/// trainer → itself: (watchdog_atom, step) to check that its rollout phase still progresses.
using watchdog_atom = caf::atom_constant<caf::atom("watchdog")>;

/// One actor of the running topology: what it is, where it runs, how to reach it.
struct peer_info {
  std::string role;
  int32_t index = 0; ///< 0-based among the actors of this role on all nodes
  std::string node;
  caf::actor handle;

  /// "role#index@node", the name used in logs.
  std::string name() const {
    return role + "#" + std::to_string(index) + "@" + node;
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_info& x) {
  return f(caf::meta::type_name("sorl::peer_info"), x.role, x.index, x.node, x.handle);
}

/// Registers every sorl message type with `cfg` (envelope, peer_info and their vectors).
/// Every process of a topology must call it, or remote messages fail to deserialize.
void add_sorl_message_types(caf::actor_system_config& cfg);

} // namespace sorl
