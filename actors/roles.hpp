#pragma once

// The role table: the one place that maps the role names of a TOML topology to the
// functions that spawn their actors.

#include "runtime/topology.hpp"

namespace sorl {

/// Every role sorl can place on a node, in the order `sorl roles` lists them.
const role_table& builtin_roles();

} // namespace sorl
