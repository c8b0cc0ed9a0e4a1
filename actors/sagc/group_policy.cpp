#include "actors/sagc/group_policy.hpp"

#include <stdexcept>

namespace sorl::sagc {

static_group_policy::static_group_policy(int64_t group_size) : group_size_(group_size) {
  if (group_size < 1)
    throw std::invalid_argument("static_group_policy: group_size must be >= 1, got "
                                + std::to_string(group_size));
}

group_decision static_group_policy::decide(int64_t step) {
  if (step < 0)
    throw std::invalid_argument("static_group_policy::decide: step " + std::to_string(step)
                                + " < 0");
  return {step, group_size_, "static",
          "fixed G = " + std::to_string(group_size_) + " from [sagc].group_size"};
}

} // namespace sorl::sagc
