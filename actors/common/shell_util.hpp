#pragma once

// Small helpers shared by the actor shells of `sorl train`: roster lookups, clocks and
// envelope dispatch. CAF lives here, never in the pure-logic folders.

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <caf/actor.hpp>
#include <spdlog/spdlog.h>

#include "runtime/actor_types.hpp"
#include "runtime/envelope.hpp"
#include "runtime/role_names.hpp"

namespace sorl {

/// Handles of every roster member with `role`, in roster (index) order.
std::vector<peer_info> peers_with_role(const std::vector<peer_info>& roster,
                                       std::string_view role);

/// The single member with `role`, or an invalid handle when there is none.
caf::actor single_peer(const std::vector<peer_info>& roster, std::string_view role);

/// steady_clock now, nanoseconds.
inline int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::steady_clock::now().time_since_epoch())
    .count();
}

/// Opens `e` as Schema when its id matches and runs `fn`; logs (and counts into `rejected`
/// when given) an envelope that fails to open or read. Returns true when the id matched.
template <class Schema, class Fn>
bool handle_as(const envelope& e, const std::string& who, Fn&& fn) {
  if (e.schema_id() != capnp::typeId<Schema>())
    return false;
  if (auto err = with_envelope<Schema>(e, std::forward<Fn>(fn)))
    spdlog::error("{}: rejected an envelope: {}", who, describe(err));
  return true;
}

/// handle_as over several schemas: opens `e` as whichever of `Schemas` its id names and calls
/// `fn` with that schema's reader (one generic lambda, or one overload per schema). Returns
/// false when `e` is of none of them.
template <class... Schemas, class Fn>
bool handle_any(const envelope& e, const std::string& who, Fn&& fn) {
  return (handle_as<Schemas>(e, who, [&](typename Schemas::Reader r) { fn(r); }) || ...);
}

/// Ends the job: logs `why` as an error of `who` and asks the directory to shut everyone
/// down with ok = false (the process then exits 1 with `why`).
void fail_job(const caf::actor& directory, const std::string& who, std::string why);

/// Logs an envelope nobody handled.
void log_unhandled(const envelope& e, const std::string& who);

} // namespace sorl
