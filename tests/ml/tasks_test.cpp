#include "runtime/ml/tasks/environments.hpp"
#include "runtime/ml/tasks/jsonl_task.hpp"
#include "runtime/ml/tasks/reward_process.hpp"
#include "runtime/ml/tasks/tasks.hpp"
#include "runtime/ml/tasks/tasks_arithmetic.hpp"
#include "runtime/ml/tasks/tasks_random.hpp"

#include "tests/ml/chat_test_util.hpp"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <string>

using namespace sorl::ml;
using sorl::ml::test::actions_of;

namespace {

task_prompt hand_prompt(std::string prompt, std::string reference) {
  task_prompt p;
  p.prompt = std::move(prompt);
  p.reference = std::move(reference);
  return p;
}

std::string write_data_file(const std::string& name, const std::string& content) {
  std::filesystem::create_directories(SORL_TEST_DATA_DIR);
  const std::string path = std::string(SORL_TEST_DATA_DIR) + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  return path;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

} // namespace

// -- answer format --------------------------------------------------------------------------

TEST_CASE("the integer answer format accepts canonical integers with surrounding whitespace",
          "[tasks]") {
  CHECK(parse_integer_answer("46").value == 46);
  CHECK(parse_integer_answer(" \t46\r\n").value == 46);
  CHECK(parse_integer_answer("-12").value == -12);
  CHECK(parse_integer_answer("0").value == 0);
  CHECK(parse_integer_answer("9223372036854775807").value == INT64_MAX);
  CHECK(parse_integer_answer("-9223372036854775808").value == INT64_MIN);
}

TEST_CASE("the integer answer format rejects everything else with a reason", "[tasks]") {
  const auto error_of = [](std::string_view s) {
    const integer_answer a = parse_integer_answer(s);
    CHECK_FALSE(a.value.has_value());
    return a.error;
  };
  CHECK(error_of("") == "empty answer");
  CHECK(error_of(" \n ") == "empty answer");
  CHECK(contains(error_of("046"), "leading zero"));
  CHECK(contains(error_of("-0"), "-0"));
  CHECK(contains(error_of("+5"), "not an integer"));
  CHECK(contains(error_of("4 6"), "not an integer"));
  CHECK(contains(error_of("46."), "not an integer"));
  CHECK(contains(error_of("-"), "not an integer"));
  CHECK(contains(error_of("forty-six"), "not an integer"));
  CHECK(contains(error_of("9223372036854775808"), "out of range"));
  CHECK(contains(error_of("-9223372036854775809"), "out of range"));
}

// -- arithmetic -----------------------------------------------------------------------------

TEST_CASE("whether a task is multi-turn is known from its name as make_task builds it", "[tasks]") {
  for (const char* name : {"arithmetic", "number_guess", "file_search"}) {
    CAPTURE(name);
    CHECK(is_multi_turn_task(name) == make_task(name, task_options{}).is_multi_turn());
  }
  CHECK(is_multi_turn_task("number_guess"));
  CHECK(is_multi_turn_task("file_search"));
  CHECK_FALSE(is_multi_turn_task("arithmetic"));
  CHECK_FALSE(is_multi_turn_task("jsonl"));  // make_task builds a single-turn jsonl_task
  CHECK_FALSE(is_multi_turn_task("chess"));
  CHECK(task_names().size() == 4);  // a new task needs its line above
}

TEST_CASE("arithmetic rewards hand-made completions, malformed ones with 0", "[tasks]") {
  const arithmetic_task task({}, 0, 0.1);
  const task_prompt p = hand_prompt("12+34=", "46");
  CHECK(task.score(p, "46").reward == 1.0);
  CHECK(task.score(p, "46").reason == "correct");
  CHECK(task.score(p, " 46\n").reward == 1.0);

  const reward_result wrong = task.score(p, "45");
  CHECK(wrong.reward == 0.0);
  CHECK(wrong.reason == "wrong answer: got 45, expected 46");

  CHECK(task.score(p, "").reward == 0.0);
  CHECK(task.score(p, "").reason == "empty answer");
  CHECK(task.score(p, "046").reward == 0.0);
  CHECK(task.score(p, "46 apples").reward == 0.0);
  CHECK(task.score(p, "<|eos|>46").reward == 0.0);
  CHECK(task.score(p, "99999999999999999999999").reward == 0.0);

  // Invalid UTF-8 and control bytes: no throw, 0, and a reason that is valid UTF-8.
  reward_result garbage;
  REQUIRE_NOTHROW(garbage = task.score(p, std::string("\xFF\xFE\x01" "46", 5)));
  CHECK(garbage.reward == 0.0);
  CHECK(sanitize_utf8(garbage.reason) == garbage.reason);
  CHECK(contains(garbage.reason, "\\x01"));

  // A negative reference.
  CHECK(task.score(hand_prompt("7-19=", "-12"), "-12").reward == 1.0);
}

TEST_CASE("arithmetic prompts follow the format and their references are right", "[tasks]") {
  arithmetic_options opt;
  opt.min_digits = 1;
  opt.max_digits = 3;
  opt.operators = "+-*/";
  const arithmetic_task task(opt, 7, 0.2);
  const std::regex format(R"(^([0-9]+)([-+*/])([0-9]+)=$)");
  std::set<char> ops_seen;
  for (std::uint64_t i = 0; i < 400; ++i) {
    const task_prompt p = task.prompt(task_split::train, i);
    std::smatch m;
    REQUIRE(std::regex_match(p.prompt, m, format));
    const long long a = std::stoll(m[1]), b = std::stoll(m[3]);
    const char op = m[2].str()[0];
    ops_seen.insert(op);
    long long want = 0;
    if (op == '+') want = a + b;
    if (op == '-') want = a - b;
    if (op == '*') want = a * b;
    if (op == '/') {
      REQUIRE(b != 0);
      REQUIRE(a % b == 0); // only exact quotients
      want = a / b;
      REQUIRE(m[3].length() <= 3);
    } else {
      REQUIRE(m[1].length() <= 3);
      REQUIRE(m[3].length() <= 3);
    }
    CHECK(p.reference == std::to_string(want));
    CHECK(task.score(p, p.reference).reward == 1.0);
  }
  CHECK(ops_seen == std::set<char>{'+', '-', '*', '/'});
}

TEST_CASE("arithmetic prompts are deterministic in seed, split and index", "[tasks]") {
  const arithmetic_task a({}, 1, 0.1), b({}, 1, 0.1), c({}, 2, 0.1);
  int differs = 0;
  for (std::uint64_t i = 0; i < 20; ++i) {
    CHECK(a.prompt(task_split::train, i).prompt == b.prompt(task_split::train, i).prompt);
    differs += a.prompt(task_split::train, i).prompt != c.prompt(task_split::train, i).prompt;
  }
  CHECK(differs > 0);
}

TEST_CASE("arithmetic eval problems never appear in train", "[tasks]") {
  arithmetic_options opt;
  opt.min_digits = 1;
  opt.max_digits = 1; // only 100 distinct '+' problems, so overlap would show
  const arithmetic_task task(opt, 3, 0.3);
  std::set<std::string> train, eval;
  for (std::uint64_t i = 0; i < 1000; ++i)
    train.insert(task.prompt(task_split::train, i).prompt);
  for (std::uint64_t i = 0; i < 300; ++i)
    eval.insert(task.prompt(task_split::eval, i).prompt);
  CHECK(!eval.empty());
  CHECK(train.size() + eval.size() <= 100);
  for (const auto& e : eval)
    CHECK(train.count(e) == 0);
  // The partition doesn't depend on the seed: another seed holds out the same problems.
  const arithmetic_task other(opt, 99, 0.3);
  for (const auto& e : eval)
    CHECK(other.split_of_problem(e.substr(0, e.size() - 1)) == task_split::eval);
}

TEST_CASE("arithmetic without subtraction negatives keeps results non-negative", "[tasks]") {
  arithmetic_options opt;
  opt.operators = "-";
  opt.allow_negative = false;
  const arithmetic_task task(opt, 5, 0.1);
  for (std::uint64_t i = 0; i < 200; ++i)
    CHECK(task.prompt(task_split::train, i).reference[0] != '-');
}

TEST_CASE("arithmetic rejects invalid options naming them", "[tasks]") {
  const auto build = [](arithmetic_options o, double eval_fraction = 0.1) {
    return arithmetic_task(o, 0, eval_fraction);
  };
  arithmetic_options o;
  o.min_digits = 0;
  CHECK_THROWS_WITH(build(o), Catch::Contains("min_digits"));
  o = {};
  o.min_digits = 3;
  o.max_digits = 2;
  CHECK_THROWS_WITH(build(o), Catch::Contains("max_digits"));
  o = {};
  o.max_digits = 10;
  CHECK_THROWS_AS(build(o), std::invalid_argument);
  o = {};
  o.operators = "";
  CHECK_THROWS_WITH(build(o), Catch::Contains("operators"));
  o.operators = "+^";
  CHECK_THROWS_WITH(build(o), Catch::Contains("operators"));
  CHECK_THROWS_WITH(build({}, 1.0), Catch::Contains("eval_fraction"));
  o = {};
  o.wrong_answers = "random";
  CHECK_THROWS_WITH(build(o), Catch::Contains("wrong_answers"));
}

TEST_CASE("a sum without carries drops every carry and writes the leftmost column in full",
          "[tasks]") {
  CHECK(sum_without_carries(57, 68) == 115); // 7+8=15 -> 5, 5+6=11 in full
  CHECK(sum_without_carries(57, 8) == 55);   // 7+8 -> 5, then 5
  CHECK(sum_without_carries(8, 57) == 55);
  CHECK(sum_without_carries(7, 8) == 15);    // one column: the true sum
  CHECK(sum_without_carries(12, 34) == 46);  // no column carries: the true sum
  CHECK(sum_without_carries(95, 5) == 90);   // 5+5 -> 0, then 9
  CHECK(sum_without_carries(999, 1) == 990);
  CHECK(sum_without_carries(0, 0) == 0);
  CHECK_THROWS_WITH(sum_without_carries(-1, 3), Catch::Contains("-1"));
}

TEST_CASE("dropped-carry demonstrations slip only on additions that carry", "[tasks]") {
  arithmetic_options opt;
  opt.wrong_answers = "dropped_carry";
  const arithmetic_task task(opt, 4, 0.1);
  // Hand-made prompts: a slip where a column carries, none where none does.
  task_prompt carry{task_split::train, 0, "57+68=", "125"};
  CHECK(task.wrong_completion(carry, 1) == std::optional<std::string>("115"));
  CHECK(task.wrong_completion(carry, 2) == std::optional<std::string>("115"));
  task_prompt plain{task_split::train, 0, "12+34=", "46"};
  CHECK(task.wrong_completion(plain, 1) == std::nullopt);
  task_prompt one_column{task_split::train, 0, "7+8=", "15"};
  CHECK(task.wrong_completion(one_column, 1) == std::nullopt);
  task_prompt bad_reference{task_split::train, 0, "57+68=", "124"};
  CHECK(task.wrong_completion(bad_reference, 1) == std::nullopt);

  // Every position drawn wrong: exactly the carrying additions are demonstrated wrong.
  const auto demos = make_demonstrations(task, task_split::train, 0, 200, 1.0, 3);
  int slipped = 0;
  for (std::size_t i = 0; i < demos.size(); ++i) {
    const task_prompt p = task.prompt(task_split::train, i);
    const auto plus = p.prompt.find('+');
    const std::int64_t a = std::stoll(p.prompt.substr(0, plus));
    const std::int64_t b = std::stoll(p.prompt.substr(plus + 1));
    const bool carries = (a % 10 + b % 10 >= 10) && (a >= 10 || b >= 10);
    CHECK(demos[i].correct == !carries);
    CHECK(demos[i].completion
          == (carries ? std::to_string(sum_without_carries(a, b)) : p.reference));
    slipped += carries;
  }
  // 1-2 digit operands: about a third of the additions carry into a second column.
  CHECK(slipped > 40);
  CHECK(slipped < 120);

  // "near" keeps its old behaviour on the same prompts: always a wrong answer.
  const arithmetic_task near({}, 4, 0.1);
  CHECK(near.wrong_completion(plain, 1).has_value());
  CHECK(near.score(plain, *near.wrong_completion(plain, 1)).reward == 0.0);
}

TEST_CASE("an eval_fraction of 0 leaves the eval split empty", "[tasks]") {
  const arithmetic_task task({}, 0, 0.0);
  CHECK(task.size(task_split::eval) == std::optional<std::uint64_t>(0));
  CHECK_FALSE(task.size(task_split::train).has_value());
  CHECK_THROWS_AS(task.prompt(task_split::eval, 0), std::out_of_range);
}

// -- number guessing ------------------------------------------------------------------------

TEST_CASE("a number-guess episode ends when the number is found", "[tasks][env]") {
  number_guess_environment env({1, 100, 10});
  CHECK(env.start(37) == "guess 1..100");
  env_step s = env.step("50");
  CHECK(s.observation == "lower");
  CHECK_FALSE(s.done);
  CHECK(s.reward == 0.0);
  s = env.step("fifty");
  CHECK(s.observation == "invalid");
  CHECK_FALSE(s.done);
  CHECK(contains(s.reason, "not an integer"));
  s = env.step(" 30 ");
  CHECK(s.observation == "higher");
  CHECK(env.turns() == 3);
  s = env.step("37");
  CHECK(s.done);
  CHECK(s.reward == 1.0);
  CHECK(s.reason == "found in 4 turns");
  CHECK(s.observation.empty());
  CHECK(env.turns() == 4);
  CHECK_THROWS_AS(env.step("37"), std::logic_error);
}

TEST_CASE("a number-guess episode ends at the turn budget with reward 0", "[tasks][env]") {
  number_guess_environment env({1, 100, 3});
  env.start(10);
  CHECK_FALSE(env.step("1").done);
  CHECK_FALSE(env.step("\xFF").done); // malformed actions cost a turn
  const env_step last = env.step("200"); // out of range: legal, truthful feedback
  CHECK(last.done);
  CHECK(last.reward == 0.0);
  CHECK(contains(last.reason, "turn budget of 3 exhausted"));
  CHECK(env.turns() == 3);
}

TEST_CASE("a lucky first guess is a one-turn episode", "[tasks][env]") {
  number_guess_environment env({-5, 5, 4});
  CHECK(env.start(-5) == "guess -5..5");
  const env_step s = env.step("-5");
  CHECK(s.done);
  CHECK(s.reward == 1.0);
  CHECK(env.turns() == 1);
}

TEST_CASE("number-guess needs reset before step and rejects bad options", "[tasks][env]") {
  number_guess_environment env({1, 100, 10});
  CHECK_THROWS_AS(env.step("1"), std::logic_error);
  CHECK_THROWS_AS(env.start(101), std::invalid_argument);
  CHECK_THROWS_WITH(number_guess_environment({5, 4, 10}), Catch::Contains("hi"));
  CHECK_THROWS_WITH(number_guess_environment({1, 2, 0}), Catch::Contains("max_turns"));
}

TEST_CASE("number-guess reset draws the target from the seed", "[tasks][env]") {
  number_guess_environment a({1, 100, 10}), b({1, 100, 10});
  std::set<std::int64_t> targets;
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    a.reset(seed);
    b.reset(seed);
    CHECK(a.target() == b.target());
    CHECK(a.target() >= 1);
    CHECK(a.target() <= 100);
    targets.insert(a.target());
  }
  CHECK(targets.size() > 50);
}

namespace {

// A seed whose episode hides `target` (found by trying seeds; the range is small).
std::uint64_t seed_with_target(const number_guess_options& opt, std::int64_t target) {
  number_guess_environment env(opt);
  for (std::uint64_t seed = 0;; ++seed) {
    env.reset(seed);
    if (env.target() == target)
      return seed;
  }
}

} // namespace

TEST_CASE("the expert demonstration bisects", "[tasks][env]") {
  const number_guess_options opt{1, 100, 10};
  const number_guess_task task(opt, 0);
  const auto low = task.demonstrate(seed_with_target(opt, 1), true);
  CHECK(actions_of(low) == std::vector<std::string>{"50", "25", "12", "6", "3", "1"});
  REQUIRE(low.size() == 12); // the first observation, 6 actions, 5 feedback turns
  CHECK(low[0].role == chat_role::user);
  CHECK(low[0].content == "guess 1..100");
  CHECK(low[2].content == "lower");
  const auto high = task.demonstrate(seed_with_target(opt, 100), true);
  CHECK(actions_of(high) == std::vector<std::string>{"50", "75", "88", "94", "97", "99", "100"});
  CHECK(high[2].content == "higher");
  CHECK(actions_of(task.demonstrate(seed_with_target(opt, 50), true))
        == std::vector<std::string>{"50"});
}

TEST_CASE("episode seeds of the two splits are disjoint", "[tasks][env]") {
  const number_guess_task task({}, 11);
  std::set<std::uint64_t> train, eval;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    train.insert(task.episode_seed(task_split::train, i));
    eval.insert(task.episode_seed(task_split::eval, i));
  }
  CHECK(train.size() == 1000);
  CHECK(eval.size() == 1000);
  for (auto s : eval)
    CHECK(train.count(s) == 0);
}

TEST_CASE("episode demonstrations carry the requested share of wrong ones", "[tasks][env]") {
  const number_guess_task task({1, 100, 8}, 4);
  const auto demos = make_episode_demonstrations(task, task_split::train, 0, 20, 0.25, 9);
  REQUIRE(demos.size() == 20);
  int wrong = 0, drawn_wrong = 0;
  for (std::size_t i = 0; i < demos.size(); ++i) {
    wrong += !demos[i].correct;
    drawn_wrong +=
      actions_of(demos[i].chat)
      != actions_of(task.demonstrate(task.episode_seed(task_split::train, i), true));
    // Replaying the actions on the same episode reproduces the outcome.
    auto env = task.make_environment();
    env->reset(task.episode_seed(task_split::train, i));
    env_step s;
    for (const auto& a : actions_of(demos[i].chat))
      s = env->step(a);
    CHECK(s.done);
    CHECK(s.reward == (demos[i].correct ? 1.0 : 0.0));
  }
  // round(20 × 0.25) = 5 are drawn wrong; the feedback-ignoring guesser (8 guesses in 1..100)
  // hits the number in one of them, which then counts as correct.
  CHECK(drawn_wrong == 5);
  CHECK(wrong == 4);
}

// -- demonstrations and the factory ---------------------------------------------------------

TEST_CASE("demonstrations carry exactly the requested share of wrong answers", "[tasks]") {
  const arithmetic_task task({}, 2, 0.1);
  const auto demos = make_demonstrations(task, task_split::train, 10, 100, 0.25, 5);
  REQUIRE(demos.size() == 100);
  int wrong = 0;
  for (std::size_t i = 0; i < demos.size(); ++i) {
    const task_prompt p = task.prompt(task_split::train, 10 + i);
    CHECK(demos[i].prompt == p.prompt);
    CHECK(task.score(p, demos[i].completion).reward == (demos[i].correct ? 1.0 : 0.0));
    wrong += !demos[i].correct;
  }
  CHECK(wrong == 25);
  for (const auto& d : make_demonstrations(task, task_split::train, 0, 10, 0.0, 1))
    CHECK(d.correct);
  CHECK_THROWS_AS(make_demonstrations(task, task_split::train, 0, 10, 1.5, 1),
                  std::invalid_argument);
}

TEST_CASE("a wrong integer answer near either end of int64 stays in range", "[tasks]") {
  constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t min = std::numeric_limits<std::int64_t>::min();
  int flipped = 0;
  for (std::uint64_t seed = 0; seed < 64; ++seed) {
    // The same draws, made by hand: an offset of 1..10, then its sign.
    detail::split_mix draws(seed);
    const std::int64_t offset = draws.between(1, 10);
    const bool negative = draws.below(2) == 0;
    detail::split_mix a(seed), b(seed), c(seed);
    CHECK(detail::wrong_integer_near(0, a) == (negative ? -offset : offset));
    // Moving up from the maximum (or down from the minimum) would overflow: it moves the
    // other way instead.
    CHECK(detail::wrong_integer_near(max, b) == max - offset);
    CHECK(detail::wrong_integer_near(min, c) == min + offset);
    flipped += negative ? 0 : 1;
  }
  CHECK(flipped > 0);
  CHECK(flipped < 64);
}

TEST_CASE("wrong demonstrations for JSONL answers at the ends of int64 are in range",
          "[tasks][jsonl]") {
  const std::string max = "9223372036854775807", min = "-9223372036854775808";
  std::string content;
  for (int i = 0; i < 40; ++i)
    content += "{\"prompt\": \"q" + std::to_string(i) + "\", \"answer\": "
               + (i % 2 == 0 ? max : min) + "}\n";
  jsonl_options opt;
  opt.path = write_data_file("int64_ends.jsonl", content);
  opt.eval_path = write_data_file("int64_ends_eval.jsonl", "{\"prompt\": \"e\", \"answer\": 1}\n");
  opt.match = answer_match::integer;
  const jsonl_task task(opt, 0.0);
  const auto demos = make_demonstrations(task, task_split::train, 0, 40, 1.0, 17);
  REQUIRE(demos.size() == 40);
  for (std::size_t i = 0; i < demos.size(); ++i) {
    CAPTURE(i, demos[i].completion);
    CHECK_FALSE(demos[i].correct);
    const task_prompt p = task.prompt(task_split::train, i);
    const integer_answer got = parse_integer_answer(demos[i].completion);
    REQUIRE(got.value);
    if (p.reference == max) {
      CHECK(*got.value >= std::numeric_limits<std::int64_t>::max() - 10);
      CHECK(*got.value < std::numeric_limits<std::int64_t>::max());
    } else {
      CHECK(*got.value <= std::numeric_limits<std::int64_t>::min() + 10);
      CHECK(*got.value > std::numeric_limits<std::int64_t>::min());
    }
    CHECK(task.score(p, demos[i].completion).reward == 0.0);
  }
}

TEST_CASE("number-guess ranges whose width overflows int64 are refused", "[tasks][env]") {
  constexpr std::int64_t limit = std::int64_t{1} << 62;
  // hi − lo = 2^63 here: the check itself must not overflow.
  CHECK_THROWS_WITH(number_guess_environment({-limit, limit, 10}), Catch::Contains("hi - lo"));
  CHECK_THROWS_WITH(number_guess_environment({-limit, 0, 10}), Catch::Contains("hi - lo"));
  CHECK_NOTHROW(number_guess_environment({-limit, -1, 10}));
}

TEST_CASE("make_task builds the named task and rejects unknown names", "[tasks]") {
  task_options opt;
  const any_task a = make_task("arithmetic", opt);
  CHECK_FALSE(a.is_multi_turn());
  CHECK(a.name() == "arithmetic");
  const any_task g = make_task("number_guess", opt);
  CHECK(g.is_multi_turn());
  CHECK(g.multi_turn->max_turns() == 10);
  CHECK_THROWS_WITH(make_task("chess", opt),
                    Catch::Contains("chess") && Catch::Contains("arithmetic"));
  opt.eval_fraction = -0.1;
  CHECK_THROWS_AS(make_task("arithmetic", opt), std::invalid_argument);
  opt = {};
  opt.arithmetic.max_digits = 0;
  CHECK_THROWS_AS(make_task("arithmetic", opt), std::invalid_argument);
  opt = {};
  CHECK_THROWS_AS(make_task("jsonl", opt), std::invalid_argument); // no path
}

// -- JSONL ----------------------------------------------------------------------------------

TEST_CASE("a JSONL dataset loads with line numbers, skipping blank lines", "[tasks][jsonl]") {
  const std::string path = write_data_file(
    "ok.jsonl", "{\"prompt\": \"capital of France?\", \"answer\": \"Paris\"}\n"
                "\n"
                "{\"prompt\": \"2+2=\", \"answer\": 4, \"source\": \"extra fields are ignored\"}\r\n"
                "   \n"
                "{\"answer\": \" Rome \", \"prompt\": \"capital of Italy?\"}");
  const auto recs = load_jsonl(path, answer_match::exact);
  REQUIRE(recs.size() == 3);
  CHECK(recs[0].prompt == "capital of France?");
  CHECK(recs[0].line == 1);
  CHECK(recs[1].answer == "4");
  CHECK(recs[1].line == 3);
  CHECK(recs[2].answer == " Rome ");
  CHECK(recs[2].line == 5);
}

TEST_CASE("malformed JSONL lines are errors naming file and line", "[tasks][jsonl]") {
  struct bad_case {
    const char* name;
    std::string content;
    std::size_t line;
    const char* message;
  };
  const std::string good = "{\"prompt\": \"p\", \"answer\": \"a\"}\n";
  const std::vector<bad_case> cases{
    {"bad_json.jsonl", good + good + "{\"prompt\": \"p\", \"answer\": }\n", 3, "invalid JSON"},
    {"missing.jsonl", good + "{\"prompt\": \"p\"}\n", 2, "missing field \"answer\""},
    {"missing_prompt.jsonl", "{\"answer\": \"a\"}\n", 1, "missing field \"prompt\""},
    {"prompt_type.jsonl", "{\"prompt\": 5, \"answer\": \"a\"}\n", 1,
     "field \"prompt\" must be a string"},
    {"answer_type.jsonl", good + "\n" + good + "{\"prompt\": \"p\", \"answer\": 4.5}\n", 4,
     "field \"answer\" must be a string or an integer"},
    {"not_object.jsonl", "[1, 2]\n", 1, "expected a JSON object"},
    {"empty_prompt.jsonl", "{\"prompt\": \"\", \"answer\": \"a\"}\n", 1, "is empty"},
    {"empty_answer.jsonl", good + "{\"prompt\": \"p\", \"answer\": \"  \"}\n", 2, "is empty"},
    {"empty.jsonl", "\n\n", 0, "no records"},
  };
  for (const auto& c : cases) {
    const std::string path = write_data_file(c.name, c.content);
    try {
      load_jsonl(path, answer_match::exact);
      FAIL("no error for " << c.name);
    } catch (const task_data_error& e) {
      INFO(e.what());
      CHECK(e.line() == c.line);
      CHECK(e.path() == path);
      CHECK(contains(e.what(), path + ":" + std::to_string(c.line) + ": "));
      CHECK(contains(e.what(), c.message));
    }
  }
}

TEST_CASE("JSONL integer mode checks references at load time", "[tasks][jsonl]") {
  const std::string path =
    write_data_file("int.jsonl", "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n"
                                 "{\"prompt\": \"1+2=\", \"answer\": \"three\"}\n");
  CHECK_NOTHROW(load_jsonl(path, answer_match::exact));
  try {
    load_jsonl(path, answer_match::integer);
    FAIL("no error");
  } catch (const task_data_error& e) {
    CHECK(e.line() == 2);
    CHECK(contains(e.what(), "integer"));
  }
}

TEST_CASE("a JSONL prompt that leaves no room in the context is refused at load time",
          "[tasks][jsonl]") {
  // 600 characters: <|bos|> + 600 byte tokens = 601 tokens against the tiny preset's 512.
  const std::string good = "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n";
  const std::string path = write_data_file(
    "long.jsonl", good + "{\"prompt\": \"" + std::string(600, '7') + "\", \"answer\": \"1\"}\n");
  CHECK(load_jsonl(path, answer_match::exact).size() == 2); // unchecked without a context
  try {
    load_jsonl(path, answer_match::exact, 512);
    FAIL("no error");
  } catch (const task_data_error& e) {
    INFO(e.what());
    CHECK(e.line() == 2);
    CHECK(contains(e.what(), path + ":2: field \"prompt\" takes 601 tokens"));
    CHECK(contains(e.what(), "context of 512 tokens"));
  }
  // The boundary: 510 bytes + <|bos|> = 511 tokens leave one to generate; 511 bytes do not.
  const std::string edge = write_data_file(
    "edge.jsonl", "{\"prompt\": \"" + std::string(510, 'x') + "\", \"answer\": \"1\"}\n");
  CHECK(load_jsonl(edge, answer_match::exact, 512).size() == 1);
  const std::string over = write_data_file(
    "over.jsonl", "{\"prompt\": \"" + std::string(511, 'x') + "\", \"answer\": \"1\"}\n");
  CHECK_THROWS_AS(load_jsonl(over, answer_match::exact, 512), task_data_error);
  // The task built from options checks its eval file too.
  jsonl_options o;
  o.path = edge;
  o.eval_path = path;
  o.context_tokens = 512;
  CHECK_THROWS_WITH(jsonl_task(o, 0.0), Catch::Contains("long.jsonl:2:"));
}

TEST_CASE("a missing JSONL file is an error naming it", "[tasks][jsonl]") {
  const std::string path = std::string(SORL_TEST_DATA_DIR) + "/does_not_exist.jsonl";
  try {
    task_options opt;
    opt.jsonl.path = path;
    make_task("jsonl", opt);
    FAIL("no error");
  } catch (const task_data_error& e) {
    CHECK(e.line() == 0);
    CHECK(contains(e.what(), path));
    CHECK(contains(e.what(), "cannot open"));
  }
}

TEST_CASE("a JSONL task scores exact answers after trimming", "[tasks][jsonl]") {
  jsonl_options opt;
  opt.path = write_data_file("train.jsonl", "{\"prompt\": \"capital of France?\", \"answer\": \"Paris\"}\n"
                                            "{\"prompt\": \"capital of Italy?\", \"answer\": \"Rome\"}\n");
  opt.eval_path = write_data_file("eval.jsonl", "{\"prompt\": \"capital of Spain?\", \"answer\": \"Madrid\"}\n");
  const jsonl_task task(opt, 0.1);
  CHECK(task.size(task_split::train) == std::optional<std::uint64_t>(2));
  CHECK(task.size(task_split::eval) == std::optional<std::uint64_t>(1));
  const task_prompt p = task.prompt(task_split::train, 0);
  CHECK(p.prompt == "capital of France?");
  CHECK(task.score(p, " Paris\n").reward == 1.0);
  const reward_result r = task.score(p, "paris");
  CHECK(r.reward == 0.0);
  CHECK(r.reason == "wrong answer: got \"paris\", expected \"Paris\"");
  CHECK(task.score(p, "").reason == "empty completion");
  CHECK(task.score(p, "\xC3").reward == 0.0);
  CHECK(task.prompt(task_split::eval, 0).reference == "Madrid");
  CHECK_THROWS_AS(task.prompt(task_split::eval, 1), std::out_of_range);
  // A wrong demonstration uses another train answer, never an eval one.
  CHECK(task.wrong_completion(p, 3) == "Rome");
}

TEST_CASE("a JSONL task without an eval file splits by prompt", "[tasks][jsonl]") {
  std::string content;
  for (int i = 0; i < 200; ++i)
    content += "{\"prompt\": \"q" + std::to_string(i) + "\", \"answer\": \"" + std::to_string(i)
               + "\"}\n";
  jsonl_options opt;
  opt.path = write_data_file("split.jsonl", content);
  opt.match = answer_match::integer;
  const jsonl_task task(opt, 0.5);
  const auto n_train = *task.size(task_split::train), n_eval = *task.size(task_split::eval);
  CHECK(n_train + n_eval == 200);
  CHECK(n_train > 50);
  CHECK(n_eval > 50);
  std::set<std::string> train;
  for (const auto& r : task.records(task_split::train))
    train.insert(r.prompt);
  for (const auto& r : task.records(task_split::eval))
    CHECK(train.count(r.prompt) == 0);
  // Integer mode scores like arithmetic.
  const task_prompt p = task.prompt(task_split::train, 0);
  CHECK(task.score(p, p.reference + " ").reward == 1.0);
  CHECK(task.score(p, "0" + p.reference).reward == 0.0);
}

TEST_CASE("a JSONL task scores reasoning answers with reasoning-gym's rules", "[tasks][jsonl]") {
  jsonl_options opt;
  opt.path = write_data_file("reasoning.jsonl",
                             "{\"prompt\": \"What is 40 + 2?\", \"answer\": \"42\", \"entry\": {\"k\": 1}}\n"
                             "{\"prompt\": \"Half of 5?\", \"answer\": \"2.5\"}\n");
  opt.eval_path = opt.path;
  opt.match = answer_match::first_number;
  const jsonl_task task(opt, 0.0);
  const task_prompt p = task.prompt(task_split::train, 0);
  CHECK(task.records(task_split::train)[0].entry_json == "{\"k\":1}");
  CHECK(task.records(task_split::train)[1].entry_json.empty());
  // The first number of the answer counts, and a tagged answer is the answer.
  CHECK(task.score(p, "42 is the sum").reward == 1.0);
  CHECK(task.score(p, "40 + 2 = 42").reward == 0.01);
  CHECK(task.score(p, "so <answer>42</answer>").reward == 1.0);
  CHECK(task.score(p, "41, no: <answer> 42 </answer>").reward == 1.0);
  const reward_result none = task.score(p, "I do not know");
  CHECK(none.reward == 0.0);
  CHECK(none.reason == "wrong answer: got \"I do not know\", expected \"42\"");
  CHECK(task.score(task.prompt(task_split::train, 1), "2.5").reward == 1.0);
  // A wrong demonstration of an integer answer is a nearby integer; of another, a record's answer.
  const auto wrong = task.wrong_completion(p, 5);
  REQUIRE(wrong);
  CHECK(task.score(p, *wrong).reward < 1.0);
  CHECK(task.wrong_completion(task.prompt(task_split::train, 1), 5) == "42");
}

TEST_CASE("a JSONL countdown task reads its numbers and target from the entry", "[tasks][jsonl]") {
  jsonl_options opt;
  opt.path = write_data_file(
      "countdown.jsonl",
      "{\"prompt\": \"Make 12 from 3 and 4\", \"answer\": \"3*4\", "
      "\"entry\": {\"metadata\": {\"numbers\": [3, 4], \"target\": 12}}}\n");
  opt.eval_path = opt.path;
  opt.match = answer_match::countdown;
  const jsonl_task task(opt, 0.0);
  const auto& rec = task.records(task_split::train)[0];
  CHECK(rec.numbers == std::vector<std::int64_t>{3, 4});
  CHECK(rec.target == 12);
  const task_prompt p = task.prompt(task_split::train, 0);
  CHECK(task.score(p, "<answer>4 * 3</answer>").reward == 1.0);
  CHECK(task.score(p, "<answer>3 + 4</answer>").reward == 0.05);
  CHECK(task.score(p, "<answer>3 * 4 * 1</answer>").reward == 0.05);
  CHECK(task.score(p, "").reward == 0.01);

  opt.path = write_data_file("countdown_bad.jsonl",
                             "{\"prompt\": \"a\", \"answer\": \"1\", \"entry\": {\"metadata\": {\"numbers\": [1]}}}\n"
                             "{\"prompt\": \"b\", \"answer\": \"1\"}\n");
  opt.eval_path.clear();
  try {
    jsonl_task bad(opt, 0.0);
    FAIL("loaded");
  } catch (const task_data_error& e) {
    CHECK(e.line() == 1);
    CHECK(std::string(e.what()).find("metadata.numbers (an array) and metadata.target") != std::string::npos);
  }
  opt.path = write_data_file("countdown_text.jsonl",
                             "{\"prompt\": \"a\", \"answer\": \"1\", \"entry\": {\"metadata\": "
                             "{\"numbers\": [1, \"x\"], \"target\": 1}}}\n");
  CHECK_THROWS_WITH(jsonl_task(opt, 0.0),
                    Catch::Contains("field \"entry.metadata.numbers\" holds a string, not an integer"));
}

TEST_CASE("a JSONL prompt is counted in the policy's own tokens against its context", "[tasks][jsonl]") {
  const std::string path = write_data_file("long_prompt.jsonl", "{\"prompt\": \"abcd\", \"answer\": \"1\"}\n");
  // The byte format needs 5 tokens; a format with 3 tokens per byte needs 12.
  CHECK(load_jsonl(path, answer_match::exact, 6).size() == 1);
  const auto triple = [](const std::string& s) { return static_cast<std::int64_t>(3 * s.size()); };
  CHECK(load_jsonl(path, answer_match::exact, 13, triple).size() == 1);
  CHECK_THROWS_WITH(load_jsonl(path, answer_match::exact, 12, triple),
                    Catch::Contains("takes 12 tokens, which leaves no room"));
}

TEST_CASE("a JSONL task with a reward command scores through its scorer process", "[tasks][jsonl]") {
  const std::string scorer = write_data_file("scorer.py", R"(import json, sys
for line in sys.stdin:
    req = json.loads(line)
    out = []
    for it in req["items"]:
        bonus = 0.5 if (it["entry"] or {}).get("k") == 7 else 0.0
        out.append(bonus + (0.5 if it["completion"].strip() == it["answer"] else 0.0))
    print(json.dumps({"id": req["id"], "rewards": out}), flush=True)
)");
  jsonl_options opt;
  opt.path = write_data_file("scored.jsonl",
                             "{\"prompt\": \"p\", \"answer\": \"yes\", \"entry\": {\"k\": 7}}\n"
                             "{\"prompt\": \"q\", \"answer\": \"no\"}\n");
  opt.eval_path = opt.path;
  opt.reward.argv = {"python3", scorer};
  opt.reward.timeout_ms = 20000;
  const jsonl_task task(opt, 0.0);
  const task_prompt p = task.prompt(task_split::train, 0);
  CHECK(task.score(p, " yes ").reward == 1.0);
  CHECK(task.score(p, "maybe").reward == 0.5);
  CHECK(task.score(task.prompt(task_split::train, 1), "no").reward == 0.5);
  CHECK(task.score(p, "yes").reason == "reward process");

  // A scorer that dies is a failed reward, never a 0.
  opt.reward.argv = {"python3", "-c", "import sys; sys.exit(3)"};
  const jsonl_task broken(opt, 0.0);
  CHECK_THROWS_AS(broken.score(p, "yes"), reward_failed_error);
}
