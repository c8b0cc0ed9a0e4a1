#include "actors/sagc/group_policy.hpp"

#include <catch2/catch.hpp>

#include <memory>

using namespace sorl::sagc;

TEST_CASE("the static policy returns the configured G for every step with its reason",
          "[group_policy]") {
  std::unique_ptr<group_policy> p = std::make_unique<static_group_policy>(8);
  for (int64_t step : {0, 1, 57}) {
    auto d = p->decide(step);
    CHECK(d.step == step);
    CHECK(d.group_size == 8);
    CHECK(d.policy == "static");
    CHECK(d.reason == "fixed G = 8 from [sagc].group_size");
  }
  // Feedback does not move a static G.
  step_timing heavy;
  heavy.straggler_event = true;
  p->observe(heavy);
  CHECK(p->decide(58).group_size == 8);
}

TEST_CASE("the static policy rejects a group size below one and a negative step",
          "[group_policy]") {
  CHECK_THROWS_WITH(static_group_policy(0), Catch::Contains("group_size must be >= 1, got 0"));
  static_group_policy p(1);
  CHECK(p.decide(0).group_size == 1);
  CHECK_THROWS_AS(p.decide(-1), std::invalid_argument);
}
