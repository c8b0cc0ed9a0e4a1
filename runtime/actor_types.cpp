#include "runtime/actor_types.hpp"

namespace sorl {

void add_sorl_message_types(caf::actor_system_config& cfg) {
  // add_message_type<T> also registers std::vector<T> under "std::vector<NAME>".
  cfg.add_message_type<envelope>("sorl::envelope");
  cfg.add_message_type<peer_info>("sorl::peer_info");
}

} // namespace sorl
