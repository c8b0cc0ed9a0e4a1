#include "actors/roles.hpp"

#include "actors/smoke/smoke_actors.hpp"

namespace sorl {

const role_table& builtin_roles() {
  static const role_table table{
    {"ping", "smoke test: sends rounds of Ping envelopes to every pong and ends the job",
     smoke::spawn_ping},
    {"pong", "smoke test: answers each Ping with a Pong", smoke::spawn_pong},
  };
  return table;
}

} // namespace sorl
