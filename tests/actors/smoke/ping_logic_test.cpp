#include <catch2/catch.hpp>

#include "actors/smoke/ping_logic.hpp"

using sorl::smoke::ping_logic;
using sorl::smoke::pong_verdict;

TEST_CASE("a round completes when every live ponger answered once") {
  ping_logic lg{2};
  lg.set_pongers({"a", "b"});
  CHECK(lg.begin_round() == 0);
  CHECK(lg.on_pong(0, "a", 100) == pong_verdict::counted);
  CHECK_FALSE(lg.round_complete());
  CHECK(lg.on_pong(0, "a", 100) == pong_verdict::duplicate);
  CHECK(lg.on_pong(1, "b", 100) == pong_verdict::stale);
  CHECK(lg.on_pong(0, "c", 100) == pong_verdict::unknown);
  CHECK(lg.on_pong(0, "b", 300) == pong_verdict::counted);
  CHECK(lg.close_round_if_complete());
  CHECK(lg.rounds_done() == 1);
  CHECK_FALSE(lg.finished());
  CHECK(lg.answers() == 2);
  CHECK(lg.mean_rtt_ns() == 200.0);
  CHECK(lg.max_rtt_ns() == 300);
}

TEST_CASE("a ponger that goes down is no longer waited for") {
  ping_logic lg{1};
  lg.set_pongers({"a", "b"});
  lg.begin_round();
  CHECK(lg.on_pong(0, "a", 1) == pong_verdict::counted);
  CHECK(lg.on_ponger_down("b"));
  CHECK_FALSE(lg.on_ponger_down("b"));
  CHECK(lg.close_round_if_complete());
  CHECK(lg.finished());
  CHECK(lg.live_pongers() == 1);
  CHECK(lg.on_pong(0, "b", 1) == pong_verdict::unknown);
}

TEST_CASE("misuse of the round protocol raises") {
  CHECK_THROWS_AS(ping_logic{0}, std::invalid_argument);
  ping_logic lg{1};
  lg.set_pongers({"a"});
  lg.begin_round();
  CHECK_THROWS_AS(lg.begin_round(), std::logic_error);
  lg.on_pong(0, "a", 1);
  REQUIRE(lg.close_round_if_complete());
  CHECK_THROWS_AS(lg.begin_round(), std::logic_error);
  CHECK_FALSE(lg.close_round_if_complete());
}
