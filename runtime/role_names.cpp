#include "runtime/role_names.hpp"

namespace sorl::role {

std::string missing_for_training(const std::function<int64_t(std::string_view role)>& count) {
  const int64_t trainers = count(trainer);
  if (trainers == 0)
    return "";
  std::string missing;
  for (const char* r : training_roles)
    if (count(r) == 0)
      missing += std::string{missing.empty() ? "" : ", "} + r;
  if (trainers > 1)
    missing += std::string{missing.empty() ? "" : "; "} + "exactly one trainer";
  return missing;
}

} // namespace sorl::role
