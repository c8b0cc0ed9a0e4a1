#include "actors/common/shell_util.hpp"

#include <caf/send.hpp>

namespace sorl {

std::vector<peer_info> peers_with_role(const std::vector<peer_info>& roster,
                                       std::string_view role) {
  std::vector<peer_info> out;
  for (const auto& p : roster)
    if (p.role == role)
      out.push_back(p);
  std::sort(out.begin(), out.end(),
            [](const peer_info& a, const peer_info& b) { return a.index < b.index; });
  return out;
}

caf::actor single_peer(const std::vector<peer_info>& roster, std::string_view role) {
  for (const auto& p : roster)
    if (p.role == role)
      return p.handle;
  return caf::actor{};
}

void fail_job(const caf::actor& directory, const std::string& who, std::string why) {
  spdlog::error("{}: {}", who, why);
  caf::anon_send(directory, shutdown_atom::value, false, std::move(why));
}

void log_unhandled(const envelope& e, const std::string& who) {
  spdlog::error("{}: dropped an envelope of unexpected schema {:#018x} ({} bytes)", who,
                e.schema_id(), e.size_bytes());
}

} // namespace sorl
