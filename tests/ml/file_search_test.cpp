#include "runtime/ml/tasks/file_search.hpp"
#include "runtime/ml/train/sft.hpp"
#include "runtime/ml/tasks/tasks.hpp"
#include "runtime/ml/formats/tokenizer.hpp"
#include "actors/sagc/timing.hpp"

#include "tests/ml/chat_test_util.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

using namespace sorl::ml;
using sorl::ml::test::actions_of;

namespace {

// Episode seed 7 with the default options gives this tree (key 3001):
//   /          etc/ docs/ todo.txt index.html
//   /etc       docs/ logs/ main.py
//   /docs      src/ index.html notes.txt
//   /etc/docs  data.csv ("key: 3001") config.ini
//   /etc/logs  index.html
//   /docs/src  notes.txt config.ini
constexpr std::uint64_t seed7 = 7;

std::string observe(file_search_environment& env, std::string_view action) {
  const env_step s = env.step(action);
  CHECK_FALSE(s.done);
  CHECK(s.reward == 0.0);
  return s.observation;
}

/// The nearest-rank percentile the run metrics use, p in [0, 1].
std::size_t percentile(const std::vector<std::size_t>& v, double p) {
  return static_cast<std::size_t>(
    sorl::sagc::nearest_rank_percentile(std::vector<int64_t>(v.begin(), v.end()), 100 * p));
}

} // namespace

TEST_CASE("file_search answers every command from the episode's tree") {
  file_search_environment env({});
  CHECK(env.reset(seed7) == "find the key. in /");
  CHECK(env.key() == "3001");
  CHECK(observe(env, "ls") == "etc/ docs/ todo.txt index.html");
  CHECK(observe(env, "cat todo.txt") == "see readme");
  CHECK(observe(env, "cd etc") == "in /etc");
  CHECK(observe(env, "  ls \n") == "docs/ logs/ main.py"); // actions are trimmed
  CHECK(observe(env, "cd docs") == "in /etc/docs");
  CHECK(observe(env, "ls") == "data.csv config.ini");
  CHECK(observe(env, "cat config.ini") == "todo: tidy up");
  CHECK(observe(env, "cat data.csv") == "key: 3001");
  CHECK(observe(env, "cd ..") == "in /etc");
  CHECK(observe(env, "cd ..") == "in /");
  CHECK(env.cwd() == 0);
  CHECK(env.turns() == 10);
  const env_step s = env.step("answer 3001");
  CHECK(s.done);
  CHECK(s.reward == 1.0);
  CHECK(s.observation.empty());
  CHECK(s.reason == "right answer in 11 turns");
  CHECK_FALSE(env.running());
  CHECK_THROWS_AS(env.step("ls"), std::logic_error);
}

TEST_CASE("file_search answers bad commands with a templated observation and charges each a turn") {
  file_search_environment env({});
  env.reset(seed7);
  CHECK(observe(env, "cd ..") == "already at /");
  CHECK(observe(env, "cd logs") == "no such directory"); // a grandchild, not a child
  CHECK(observe(env, "cd") == "unknown command");
  CHECK(observe(env, "cat main.py") == "no such file"); // in /etc, not here
  CHECK(observe(env, "cat") == "unknown command");
  CHECK(observe(env, "ls -la") == "unknown command");
  CHECK(observe(env, "rm -rf /") == "unknown command");
  CHECK(observe(env, "") == "unknown command");
  CHECK(observe(env, "LS") == "unknown command");
  CHECK(env.cwd() == 0);
  CHECK(env.turns() == 9);
}

TEST_CASE("a wrong or empty file_search answer ends the episode with reward 0") {
  file_search_environment env({});
  env.reset(seed7);
  env_step s = env.step("answer 3002");
  CHECK(s.done);
  CHECK(s.reward == 0.0);
  CHECK(s.reason == "wrong answer \"3002\" in 1 turns");
  env.reset(seed7);
  s = env.step("answer");
  CHECK(s.done);
  CHECK(s.reward == 0.0);
  env.reset(seed7);
  s = env.step("answer 30011"); // the key must match whole
  CHECK(s.reward == 0.0);
  env.reset(seed7);
  s = env.step(" answer   3001 ");
  CHECK(s.reward == 1.0);
}

TEST_CASE("file_search ends at the turn budget and at the token budget and says which") {
  file_search_options o;
  o.max_turns = 3;
  file_search_environment env(o);
  env.reset(seed7);
  observe(env, "ls");
  observe(env, "ls");
  env_step s = env.step("ls");
  CHECK(s.done);
  CHECK(s.reward == 0.0);
  CHECK(s.observation.empty());
  CHECK(s.reason == "turn budget of 3 exhausted");

  // Tokens: <|bos|> + (18 + 3) for the first observation = 22; each "ls" adds 2 + 1 and its
  // listing "etc/ docs/ todo.txt index.html" 30 + 3: 36 per turn. 22 + 2 * 36 = 94 < 100,
  // 22 + 3 * 36 = 130 >= 100.
  o = {};
  o.max_episode_tokens = 100;
  file_search_environment small(o);
  small.reset(seed7);
  CHECK(small.tokens() == 22);
  observe(small, "ls");
  observe(small, "ls");
  CHECK(small.tokens() == 94);
  s = small.step("ls");
  CHECK(s.done);
  CHECK(s.reason == "token budget of 100 tokens exhausted after 3 turns");
  CHECK(small.tokens() == 130);
  // An answer always ends the episode on its own terms.
  small.reset(seed7);
  CHECK(small.step("answer 3001").reward == 1.0);
}

TEST_CASE("file_search options out of range are rejected by name") {
  auto with = [](auto set) {
    file_search_options o;
    set(o);
    return o;
  };
  CHECK_THROWS_WITH(file_search_environment(with([](auto& o) { o.depth = 0; })), Catch::Contains("depth"));
  CHECK_THROWS_WITH(file_search_environment(with([](auto& o) { o.depth = 5; })), Catch::Contains("depth"));
  CHECK_THROWS_WITH(file_search_environment(with([](auto& o) { o.max_dirs = 9; })), Catch::Contains("max_dirs"));
  CHECK_THROWS_WITH(file_search_environment(with([](auto& o) { o.max_files = 0; })), Catch::Contains("max_files"));
  CHECK_THROWS_WITH(file_search_environment(with([](auto& o) { o.max_turns = 0; })), Catch::Contains("max_turns"));
  CHECK_THROWS_WITH(file_search_environment(with([](auto& o) { o.max_episode_tokens = 63; })),
                    Catch::Contains("max_episode_tokens"));
  CHECK_THROWS_WITH(file_search_task(with([](auto& o) { o.detour_rate = 1.5; }), 0),
                    Catch::Contains("detour_rate"));
  CHECK_THROWS_WITH(file_search_task(with([](auto& o) { o.wrong_episodes = "quit"; }), 0),
                    Catch::Contains("wrong_episodes"));
  CHECK_THROWS_WITH(file_search_task(with([](auto& o) { o.wrong_episodes = "give_up";
                                                        o.wander_share = -0.1; }), 0),
                    Catch::Contains("wander_share"));
  // "wander" already makes every wrong demonstration wander: a share there is a mistake.
  CHECK_THROWS_WITH(file_search_task(with([](auto& o) { o.wander_share = 0.5; }), 0),
                    Catch::Contains("wander_share"));
}

TEST_CASE("file_search trees are a function of the seed and hide the key at the deepest level") {
  file_search_options o;
  o.depth = 3;
  o.max_dirs = 3;
  o.max_files = 3;
  file_search_environment a(o), b(o);
  int differ = 0;
  for (std::uint64_t seed = 0; seed < 50; ++seed) {
    CHECK(a.reset(seed) == b.reset(seed));
    REQUIRE(a.tree().size() == b.tree().size());
    CHECK(a.key() == b.key());
    int holders = 0;
    for (std::size_t i = 0; i < a.tree().size(); ++i) {
      const fs_directory& d = a.tree()[i];
      CHECK(d.files == b.tree()[i].files);
      CHECK(d.contents == b.tree()[i].contents);
      CHECK((d.level < 3 ? d.subdirs.size() >= 1 && d.subdirs.size() <= 3 : d.subdirs.empty()));
      CHECK((d.files.size() >= 1 && d.files.size() <= 3));
      for (const auto& c : d.contents)
        if (c == "key: " + a.key()) {
          ++holders;
          CHECK(d.level == 3);
        }
    }
    CHECK(holders == 1);
    a.reset(seed + 1000);
    differ += a.key() != b.key();
  }
  CHECK(differ >= 45); // 4-digit keys: a collision in 50 draws is rare (p ~ 0.005 for 1)
  const file_search_task task(o, 5);
  CHECK(task.demonstrate(task.episode_seed(task_split::eval, 3), true)
          .back().content == task.demonstrate(task.episode_seed(task_split::eval, 3), true).back().content);
}

TEST_CASE("the expert demonstration searches depth-first and answers the key") {
  file_search_options o;
  o.detour_rate = 0.0;
  const file_search_task task(o, 0);
  // The task's own seed stream is not the raw seed; use the environment's seed 7 directly.
  const std::vector<chat_message> chat = task.demonstrate(seed7, true);
  std::vector<std::string> actions;
  for (const auto& m : chat)
    if (m.role == chat_role::assistant)
      actions.push_back(m.content);
  const std::vector<std::string> expected{"ls", "cd etc", "ls", "cd docs", "ls", "cat data.csv",
                                          "answer 3001"};
  CHECK(actions == expected);
  CHECK(chat.back().role == chat_role::assistant);
  REQUIRE(chat.size() == 14);
  CHECK(chat[8].content == "in /etc/docs");
  CHECK(chat[10].content == "data.csv config.ini");
}

TEST_CASE("a give_up demonstration answers not found where the expert leaves the first deepest directory in vain") {
  file_search_options o;
  o.detour_rate = 0.0;
  o.wrong_episodes = "give_up";
  const file_search_task task(o, 0);
  // Episode seed 5: /src holds src/ and logs/; the key 4831 is in /src/logs/data.csv, so the
  // expert reads /src/src/log.txt in vain, goes back up and on to /src/logs.
  const std::vector<std::string> expert{"ls",      "cd src",       "ls",     "cd src",
                                        "ls",      "cat log.txt",  "cd ..",  "cd logs",
                                        "ls",      "cat notes.txt", "cat data.csv",
                                        "answer 4831"};
  CHECK(actions_of(task.demonstrate(5, true)) == expert);
  const std::vector<std::string> gave_up = actions_of(task.demonstrate(5, false));
  REQUIRE(gave_up.size() == 7);
  CHECK(std::equal(gave_up.begin(), gave_up.end() - 1, expert.begin()));
  CHECK(gave_up.back() == "answer not found");
  file_search_environment env(o);
  env.reset(5);
  env_step last;
  for (const auto& a : gave_up)
    last = env.step(a);
  CHECK(last.done);
  CHECK(last.reward == 0.0);
  // Episode seed 7's key is in the first deepest directory searched: nothing to give up on.
  CHECK(actions_of(task.demonstrate(seed7, false)) == actions_of(task.demonstrate(seed7, true)));
  // With detours too, a give_up episode is the expert's up to its last action, and only the
  // episodes it fails are counted wrong.
  o.detour_rate = 0.1;
  const file_search_task detouring(o, 3);
  const auto demos = make_episode_demonstrations(detouring, task_split::train, 0, 400, 1.0, 9);
  std::size_t failed = 0;
  for (std::size_t i = 0; i < demos.size(); ++i) {
    const std::uint64_t episode = detouring.episode_seed(task_split::train, i);
    const auto wrong = actions_of(demos[i].chat);
    const auto right = actions_of(detouring.demonstrate(episode, true));
    INFO("episode " << i);
    REQUIRE(wrong.size() <= right.size());
    CHECK(std::equal(wrong.begin(), wrong.end() - 1, right.begin()));
    CHECK(demos[i].correct == (wrong == right));
    failed += !demos[i].correct;
  }
  // Roughly half of these trees hide the key outside the first deepest directory (0.49 at
  // depth 2 with up to two directories per level, estimated on 4000 episodes).
  CHECK(failed >= 150);
  CHECK(failed <= 250);
}

TEST_CASE("give_up with a wander_share: that share of the wrong demonstrations wanders and only answers not found") {
  file_search_options o;
  o.wrong_episodes = "give_up";
  auto answers_only_not_found = [](const std::vector<std::string>& actions) {
    for (const auto& a : actions)
      if (a.rfind("answer", 0) == 0 && a != "answer not found")
        return false;
    return true;
  };
  // Share 1: every wrong demonstration wanders, including those whose key is in the first
  // deepest directory; none answers digits, so none is correct. A wanderer answers with
  // probability 1/40 per turn: P(at most 9 turns) = 1 - (39/40)^9 = 0.204, 81.5 of 400
  // expected (sd 8.1); the rest run 10 turns or more, up to the 60-turn budget.
  o.wander_share = 1.0;
  const file_search_task all(o, 3);
  const auto wanderers = make_episode_demonstrations(all, task_split::train, 0, 400, 1.0, 9);
  std::size_t short_ones = 0;
  for (const auto& d : wanderers) {
    const auto actions = actions_of(d.chat);
    CHECK_FALSE(d.correct);
    CHECK(answers_only_not_found(actions));
    CHECK(actions.size() <= 60);
    short_ones += actions.size() <= 9;
  }
  CHECK(short_ones >= 55);
  CHECK(short_ones <= 110);
  // Share 0.25: about a quarter of the wrong demonstrations wander (100 of 400 expected, sd
  // 8.7). Correct demonstrations are the expert's, whatever the share.
  o.wander_share = 0.25;
  const file_search_task some(o, 3);
  o.wander_share = 0.0;
  const file_search_task none(o, 3);
  const auto mixed = make_episode_demonstrations(some, task_split::train, 0, 400, 1.0, 9);
  const auto plain = make_episode_demonstrations(none, task_split::train, 0, 400, 1.0, 9);
  std::size_t wandered = 0;
  for (std::size_t i = 0; i < mixed.size(); ++i) {
    const std::uint64_t episode = some.episode_seed(task_split::train, i);
    const auto right = actions_of(some.demonstrate(episode, true));
    CHECK(right == actions_of(none.demonstrate(episode, true)));
    const auto wrong = actions_of(mixed[i].chat);
    // (A give_up demonstration whose key is in the first deepest directory answers it.)
    CHECK((mixed[i].correct || answers_only_not_found(wrong)));
    // The others are give_up's demonstration, exactly as without a share.
    wandered += wrong != actions_of(plain[i].chat);
  }
  CHECK(wandered >= 70);
  CHECK(wandered <= 125);
}

TEST_CASE("environment turns of a file_search episode are masked from the loss") {
  const byte_tokenizer tok;
  const file_search_task task({}, 2);
  const std::vector<chat_message> chat = task.demonstrate(task.episode_seed(task_split::train, 0), true);
  const sft_sequence e = encode_episode(tok, chat);
  REQUIRE(e.loss_mask.size() == e.ids.size());
  std::string trained, expected;
  for (std::size_t i = 0; i < e.ids.size(); ++i)
    if (e.loss_mask[i])
      trained += tok.token_text(e.ids[i]);
  for (const auto& m : chat)
    if (m.role == chat_role::assistant)
      expected += m.content + "<|end_turn|>";
  CHECK(trained == expected);
  // The environment's token count is the encoded transcript's length.
  file_search_environment env({});
  env.reset(task.episode_seed(task_split::train, 0));
  for (const auto& m : chat)
    if (m.role == chat_role::assistant)
      env.step(m.content);
  CHECK(env.tokens() == static_cast<std::int64_t>(e.ids.size()));
}

TEST_CASE("warm-start demonstrations have a long tail of episode lengths") {
  // configs/agent.toml's settings: default tree, 60 turns, 1536 tokens, 30% wandering.
  const file_search_task task({}, 1);
  const auto demos = make_episode_demonstrations(task, task_split::train, 0, 1000, 0.3, 1);
  std::vector<std::size_t> tokens, expert_turns;
  std::size_t wanderers = 0, wanderers_at_budget = 0, expert_right = 0, experts = 0;
  for (const auto& d : demos) {
    std::size_t n = 1, turns = 0;
    for (const auto& m : d.chat) {
      n += m.content.size() + 2;
      turns += m.role == chat_role::assistant;
    }
    tokens.push_back(n);
    CHECK(n <= 1536 + 16); // the last action may cross the budget by its own length
    CHECK(turns <= 60);
    if (d.correct) {
      ++experts;
      expert_turns.push_back(turns);
      expert_right += d.chat.back().content.rfind("answer ", 0) == 0;
    } else {
      ++wanderers;
      wanderers_at_budget += d.chat.back().content.rfind("answer ", 0) != 0;
    }
  }
  REQUIRE(experts == 700);
  CHECK(expert_right == 700);
  // Depth 2 and no detour: ls, cd, ls, cd, ls, cat, answer is the shortest expert episode.
  CHECK(percentile(expert_turns, 0.0) >= 7);
  // A wanderer answers with probability 1/40 a turn: (39/40)^60 = 0.219 of them reach the
  // 60-turn budget (or the token budget first); 300 of them, binomial sd 0.024.
  CHECK(static_cast<double>(wanderers_at_budget) / static_cast<double>(wanderers)
        == Approx(0.219).margin(0.08));
  const std::size_t p50 = percentile(tokens, 0.5), p99 = percentile(tokens, 0.99);
  INFO("p50 " << p50 << " p99 " << p99);
  // Measured with these seeds: p50 295, p99 1459 tokens (ratio 4.9; sorl_episode_lengths
  // prints the same).
  CHECK(p50 >= 200);
  CHECK(p50 <= 400);
  CHECK(static_cast<double>(p99) >= 4.0 * static_cast<double>(p50));
}

TEST_CASE("a file_search preamble opens the first observation and leaves the episode as it was") {
  file_search_options plain;
  file_search_options o;
  o.preamble_bytes = 100;
  o.preamble_families = 4;
  file_search_environment env(o);
  const std::string first = env.reset(seed7);
  const std::string preamble = file_search_preamble(o, file_search_family(o, seed7));
  REQUIRE(preamble.size() == 100);
  CHECK(first == preamble + "\nfind the key. in /");
  // <|bos|> + <|user|> + 100 + 1 + 18 bytes + <|end_turn|> + <|assistant|> = 123 tokens.
  CHECK(env.tokens() == 123);
  // The tree and the key are those of the episode without a preamble (the comment at the top).
  CHECK(observe(env, "ls") == "etc/ docs/ todo.txt index.html");
  CHECK(env.key() == "3001");
  // The expert takes the same actions; only the first observation differs.
  file_search_task with_preamble(o, 0), without(plain, 0);
  const auto a = with_preamble.demonstrate(seed7, true);
  const auto b = without.demonstrate(seed7, true);
  CHECK(actions_of(a) == actions_of(b));
  REQUIRE(a.size() == b.size());
  CHECK(a.front().content == first);
  for (std::size_t i = 1; i < a.size(); ++i)
    CHECK(a[i].content == b[i].content);
}

TEST_CASE("file_search preambles: a text per family, the same for every episode of it") {
  file_search_options o;
  o.preamble_bytes = 512;
  std::vector<std::string> texts;
  for (std::int64_t f = 0; f < o.preamble_families; ++f) {
    texts.push_back(file_search_preamble(o, f));
    CHECK(texts.back().size() == 512);
    CHECK(texts.back().find_first_not_of("abcdefghijklmnopqrstuvwxyz.: ") == std::string::npos);
    CHECK(file_search_preamble(o, f) == texts.back());
  }
  // Different families share less than one 16-token KV block, so their prompts share no
  // cached prefix past the chat's first block.
  for (std::size_t i = 0; i < texts.size(); ++i)
    for (std::size_t j = i + 1; j < texts.size(); ++j) {
      const auto diff = std::mismatch(texts[i].begin(), texts[i].end(), texts[j].begin());
      CHECK(diff.first - texts[i].begin() < 16);
    }
  // Episodes spread over the families: 1600 seeds, 100 expected each (sd ~9.7).
  std::vector<int> count(static_cast<std::size_t>(o.preamble_families), 0);
  for (std::uint64_t seed = 0; seed < 1600; ++seed) {
    const auto f = file_search_family(o, seed);
    REQUIRE(f >= 0);
    REQUIRE(f < o.preamble_families);
    ++count[static_cast<std::size_t>(f)];
  }
  CHECK(*std::min_element(count.begin(), count.end()) >= 70);
  CHECK(*std::max_element(count.begin(), count.end()) <= 130);
  // Two episodes of one family open alike; the rest of the observation follows.
  std::uint64_t other = seed7 + 1;
  while (file_search_family(o, other) != file_search_family(o, seed7))
    ++other;
  file_search_environment x(o), y(o);
  CHECK(x.reset(seed7) == y.reset(other));
  CHECK(x.key() != y.key());
}

TEST_CASE("file_search preamble options out of range are rejected by name") {
  auto with = [](auto edit) {
    file_search_options o;
    edit(o);
    return o;
  };
  CHECK_THROWS_WITH(file_search_environment(with([](auto& o) { o.preamble_bytes = -1; })),
                    Catch::Contains("preamble_bytes"));
  CHECK_THROWS_WITH(file_search_environment(with([](auto& o) { o.preamble_bytes = 70000; })),
                    Catch::Contains("preamble_bytes"));
  CHECK_THROWS_WITH(file_search_environment(with([](auto& o) { o.preamble_families = 0; })),
                    Catch::Contains("preamble_families"));
  // 1 + 3 + 1500 + 1 + 18 = 1523 tokens of first observation leave 13 of 1536.
  CHECK_THROWS_WITH(file_search_environment(with([](auto& o) { o.preamble_bytes = 1500; })),
                    Catch::Contains("max_episode_tokens = 1536") && Catch::Contains("1587"));
  CHECK_NOTHROW(file_search_environment(with([](auto& o) {
    o.preamble_bytes = 1500;
    o.max_episode_tokens = 1587;
  })));
  file_search_options o;
  o.preamble_bytes = 8;
  CHECK_THROWS_WITH(file_search_preamble(o, 16), Catch::Contains("family 16"));
  CHECK_THROWS_WITH(file_search_preamble(o, -1), Catch::Contains("family -1"));
  o.preamble_bytes = 0;
  CHECK(file_search_preamble(o, 3).empty());
}
