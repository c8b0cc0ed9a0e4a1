// Built-in reasoning checkers (runtime/ml/tasks/reasoning_checks.hpp) on hand-worked cases, each
// with the score reasoning-gym 0.1.25 gives it (bench/interop/reward_parity.py compares
// thousands more against reasoning-gym itself).
#include "runtime/ml/tasks/reasoning_checks.hpp"

#include <catch2/catch.hpp>

using namespace sorl::ml;

TEST_CASE("arithmetic as sympy's parse_expr reads it", "[reasoning_checks]") {
  auto v = [](const char* e) { return evaluate_arithmetic(e); };
  CHECK(*v("94*4 - 61 - 6") == 309);
  CHECK(*v("(1+2)*3") == 9);
  CHECK(*v("-2**2") == -4);            // ** binds tighter than unary minus
  CHECK(*v("2**-1") == 0.5L);
  CHECK(*v("2**3**2") == 512);         // right-associative
  CHECK(*v("2^3") == 1);               // bitwise XOR, as Python leaves ^
  CHECK(*v("1 + 2 ^ 3") == 0);         // XOR below +: (1+2) ^ 3
  CHECK(*v("3!") == 6);
  CHECK(*v("3!!") == 3);               // double factorial
  CHECK(*v("2**3!") == 64);            // the factorial binds to its atom
  CHECK(*v("10/4") == 2.5L);
  CHECK(*v("7//2") == 3);
  CHECK(*v("-7 % 3") == 2);            // Python's sign rule
  CHECK(*v(".5*2") == 1);
  CHECK(*v("2.*3") == 6);
  CHECK(*v("1e3") == 1000);
  CHECK(*v("1_000 + 1") == 1001);
  CHECK(*v("--5") == 5);
  CHECK(*v("\t( 4 )\t") == 4);
  for (const char* bad : {"", "4/0", "0**-1", "2(3)", "0094+1", "1 +\n 2", "x - x + 5", "abs(-3)", "2.5^1",
                          "(-8)**0.5", "1 2", "(1+2", "1+2)", "1 = 1", "5 apples", "1__0", "2.5!", "(-1)!"})
    CHECK_FALSE(v(bad).has_value());
  CHECK(*v("00") == 0);  // Python allows a zero written with several zeros
}

TEST_CASE("countdown scores as reasoning-gym does", "[reasoning_checks]") {
  const std::vector<std::int64_t> numbers = {6, 61, 94, 4};
  CHECK(countdown_score("94*4 - 61 - 6", numbers, 309) == 1.0);
  CHECK(countdown_score(" 4*94-6-61 ", numbers, 309) == 1.0);      // any order, spaces
  CHECK(countdown_score("94*4 - 61 - 6 + 0", numbers, 309) == 0.05);  // 0 is not a given number
  CHECK(countdown_score("94*4 - 61 + 6", numbers, 309) == 0.05);      // right numbers, wrong value
  CHECK(countdown_score("94*4 - 61", numbers, 315) == 0.05);          // a number left out
  CHECK(countdown_score("309", numbers, 309) == 0.05);
  CHECK(countdown_score("94*4 - 61 - 6 = 309", numbers, 309) == 0.01);  // not an expression
  CHECK(countdown_score("The answer is 94*4 - 61 - 6", numbers, 309) == 0.01);
  CHECK(countdown_score("", numbers, 309) == 0.01);
  CHECK(countdown_score("  ", numbers, 309) == 0.01);
  // np.isclose: 1e-6 + 1e-5 * 309 = 0.003091 of slack around the target.
  const std::vector<std::int64_t> three = {1000, 3, 309};
  CHECK(countdown_score("309 + 3/1000", three, 309) == 1.0);    // off by 0.003
  CHECK(countdown_score("309 + 3/1000*3/1000", {1000, 3, 309, 3, 1000}, 309) == 1.0);
  CHECK(countdown_score("309 + 3*3/1000", {3, 3, 1000, 309}, 309) == 0.05);  // off by 0.009
}

TEST_CASE("gsm_symbolic scores the first number as reasoning-gym does", "[reasoning_checks]") {
  CHECK(first_number_score("288", "288") == 1.0);
  CHECK(first_number_score("The answer is 288.", "288") == 1.0);
  CHECK(first_number_score("288.0", "288") == 1.0);
  CHECK(first_number_score("287", "288") == 0.01);
  CHECK(first_number_score("12 apples and 288", "288") == 0.01);  // the first number counts
  CHECK(first_number_score("no number", "288") == 0.0);
  CHECK(first_number_score("", "288") == 0.0);
  // \b before the minus sign needs a word character in front of it: at the start of the
  // text the number found is 5, after a letter it is -5 (Python's re does the same).
  CHECK(first_number_score("-5", "-5") == 0.01);
  CHECK(first_number_score("x-5", "-5") == 1.0);
  CHECK(first_number_score("288kg", "288") == 0.0);  // no word boundary after the digits
  CHECK(first_number_score("\xd9\xa3" "57", "357") == 1.0);  // Arabic-Indic three: float() reads it
}

TEST_CASE("last_number scores the conclusion of a worked answer", "[reasoning_checks]") {
  CHECK(last_number_score("7 + 5 = 12, and 12 - 3 = 9. The answer is 9.", "9") == 1.0);
  CHECK(first_number_score("7 + 5 = 12, and 12 - 3 = 9. The answer is 9.", "9") == 0.01);
  CHECK(last_number_score("9, not 10", "9") == 0.01); // the last number counts
  CHECK(last_number_score("288", "288") == 1.0);
  CHECK(last_number_score("so 288.0", "288") == 1.0);
  CHECK(last_number_score("no number", "288") == 0.0);
  CHECK(last_number_score("", "288") == 0.0);
  CHECK(last_number_score("5 minus 9 is x-4", "-4") == 1.0);
  CHECK(last_number_score("5 - 9 = -4. The answer is -4.", "-4") == 1.0); // first_number: 0.01
  CHECK(first_number_score("-4", "-4") == 0.01);
  CHECK(last_number_score("-4", "-4") == 1.0);
  CHECK(last_number_score("12 - 3 = 9", "9") == 1.0);  // a minus between numbers is the operator
  CHECK(last_number_score("12 - 3 = 9", "-9") == 0.01);
  CHECK(last_number_score("it is 288kg", "288") == 0.0); // no word boundary after the digits
  CHECK(last_number_score("12", "twelve") == 0.0);       // the reference is not a number
}

TEST_CASE("the answer inside the last answer tags", "[reasoning_checks]") {
  CHECK(extract_tagged_answer("think... <answer>42</answer>") == std::optional<std::string>("42"));
  CHECK(extract_tagged_answer("<answer> 1 </answer> then <answer>\n 2 + 3 \n</answer>") ==
        std::optional<std::string>("2 + 3"));
  CHECK(extract_tagged_answer("<answer>multi\nline</answer>") == std::optional<std::string>("multi\nline"));
  CHECK(extract_tagged_answer("<answer></answer>") == std::optional<std::string>(""));
  CHECK_FALSE(extract_tagged_answer("no tags 42").has_value());
  CHECK_FALSE(extract_tagged_answer("<answer>unclosed").has_value());
}
