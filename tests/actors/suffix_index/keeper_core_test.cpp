// The suffix-index keeper's decisions on hand-built messages: every other known worker gets a
// worker's responses, malformed or hostile messages are refused with their reason, the
// counters add up, and a worker's finished turns are cut into messages within the bounds.

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "actors/suffix_index/keeper_core.hpp"

using namespace sorl::suffix_index;
using names = std::vector<std::string>;

namespace {

const std::string a = "rollout_worker#0@main";
const std::string b = "rollout_worker#1@main";
const std::string c = "rollout_worker#2@other";

keeper_core three_workers() {
  keeper_core k;
  for (const auto& w : {c, a, b})
    k.join(w);
  k.join(a); // twice: no-op
  return k;
}

} // namespace

TEST_CASE("the keeper forwards a worker's responses to every other worker") {
  keeper_core k = three_workers();
  CHECK(k.workers() == 3);
  const token_responses rs{{1, 2, 3}, {4, 5}};
  keeper_forward f = k.on_responses(b, rs);
  CHECK(f.refusal.empty());
  CHECK(f.destinations == names{a, c});
  f = k.on_responses(a, {{7}});
  CHECK(f.destinations == names{b, c});
  const keeper_counters& n = k.counters();
  CHECK(n.received == 2);
  CHECK(n.refused == 0);
  CHECK(n.responses_in == 3);
  CHECK(n.tokens_in == 6);
  CHECK(n.sends == 4);
  CHECK(n.responses_forwarded == 2 * 2 + 2 * 1);
  CHECK(n.tokens_forwarded == 2 * 5 + 2 * 1);
  CHECK(k.summary() == "3 responses (6 tokens) received in 2 messages, forwarded as 4 messages (6 "
                       "responses, 12 tokens); 0 messages refused");
  // A worker that left gets nothing, and what it still sends is refused.
  CHECK(k.leave(c));
  CHECK_FALSE(k.leave(c));
  CHECK(k.on_responses(a, rs).destinations == names{b});
  CHECK_FALSE(k.on_responses(c, rs).refusal.empty());
  // The only worker left has nobody to forward to: accepted, nothing sent.
  CHECK(k.leave(b));
  f = k.on_responses(a, rs);
  CHECK(f.refusal.empty());
  CHECK(f.destinations.empty());
}

TEST_CASE("the keeper refuses malformed or hostile messages and says why") {
  keeper_core k = three_workers();
  auto refusal = [&](const std::string& origin, const token_responses& rs) {
    const keeper_forward f = k.on_responses(origin, rs);
    CHECK(f.destinations.empty());
    return f.refusal;
  };
  CHECK(refusal("rollout_worker#9@main", {{1}}) ==
        "responses from 'rollout_worker#9@main' refused: not a rollout worker of this job");
  CHECK(refusal("", {{1}}) == "responses from '' refused: not a rollout worker of this job");
  const std::string long_name(1000, 'x');
  CHECK(refusal(long_name, {{1}}) == "responses from '" + std::string(64, 'x') +
                                       "... (1000 bytes)' refused: not a rollout worker of this "
                                       "job");
  CHECK(refusal("w\n[error] forged", {{1}}) ==
        "responses from 'w?[error] forged' refused: not a rollout worker of this job");
  CHECK(refusal(a, {}) == "responses from 'rollout_worker#0@main' refused: no responses");
  CHECK(refusal(a, token_responses(257, {1})) ==
        "responses from 'rollout_worker#0@main' refused: 257 responses, more than 256");
  token_responses too_long{{1}, std::vector<std::int32_t>(65537, 3)};
  CHECK(refusal(a, too_long) ==
        "responses from 'rollout_worker#0@main' refused: response 1 has 65537 tokens, more than "
        "65536");
  CHECK(refusal(a, {{1, 2}, {3, -4, 5}}) ==
        "responses from 'rollout_worker#0@main' refused: response 1 has the negative token id -4");
  const keeper_counters& n = k.counters();
  CHECK(n.received == 8);
  CHECK(n.refused == 8);
  CHECK(n.responses_in == 0);
  CHECK(n.sends == 0);
  // At the bounds: accepted. An empty response is harmless (the workers skip it).
  token_responses most(256, std::vector<std::int32_t>{0});
  most[0].assign(65536, 5);
  most[1].clear();
  const keeper_forward f = k.on_responses(a, most);
  CHECK(f.refusal.empty());
  CHECK(f.destinations == names{b, c});
  CHECK(n.tokens_in == 65536 + 254);
}

TEST_CASE("a worker's finished turns are cut into messages within the keeper's bounds") {
  using tokens = std::vector<std::int32_t>;
  SECTION("at most 256 responses a message, in order") {
    token_responses turns;
    for (std::int32_t i = 0; i < 600; ++i)
      turns.push_back(tokens{i});
    const auto msgs = split_for_keeper(turns);
    REQUIRE(msgs.size() == 3);
    CHECK(msgs[0].size() == 256);
    CHECK(msgs[1].size() == 256);
    CHECK(msgs[2].size() == 88);
    CHECK(msgs[1].front() == tokens{256});
    CHECK(msgs[2].back() == tokens{599});
  }
  SECTION("at most 1 MiB of tokens a message") {
    // 40000 tokens = 160000 bytes: six fit in 1 MiB (960000 bytes), a seventh does not.
    const token_responses turns(13, tokens(40000, 1));
    const auto msgs = split_for_keeper(turns);
    REQUIRE(msgs.size() == 3);
    CHECK(msgs[0].size() == 6);
    CHECK(msgs[1].size() == 6);
    CHECK(msgs[2].size() == 1);
    for (const auto& m : msgs) {
      std::size_t bytes = 0;
      for (const auto& r : m)
        bytes += r.size() * sizeof(std::int32_t);
      CHECK(bytes <= max_message_token_bytes);
    }
  }
  SECTION("empty turns and turns the keeper would refuse stay home") {
    std::size_t left_out = 0;
    const token_responses turns{tokens{1}, tokens{}, tokens(65537, 2), tokens(65536, 3)};
    const auto msgs = split_for_keeper(turns, &left_out);
    CHECK(left_out == 2);
    REQUIRE(msgs.size() == 1);
    REQUIRE(msgs[0].size() == 2);
    CHECK(msgs[0][0] == tokens{1});
    CHECK(msgs[0][1].size() == 65536);
    CHECK(split_for_keeper({}).empty());
  }
  SECTION("every message the split makes is accepted by the keeper") {
    keeper_core k = three_workers();
    token_responses turns;
    for (std::int32_t i = 0; i < 700; ++i)
      turns.push_back(tokens(static_cast<std::size_t>(100 + (i * 37) % 3000), i));
    for (const auto& m : split_for_keeper(turns))
      CHECK(k.on_responses(a, m).refusal.empty());
    CHECK(k.counters().responses_in == 700);
  }
}
