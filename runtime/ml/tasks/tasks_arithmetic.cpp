#include "runtime/ml/tasks/tasks_arithmetic.hpp"

#include "runtime/ml/tasks/tasks_random.hpp"

#include <stdexcept>
#include <string>

namespace sorl::ml {

namespace {

constexpr int max_supported_digits = 9;
constexpr int max_draws = 100000;

std::int64_t pow10(int n) {
  std::int64_t p = 1;
  for (int i = 0; i < n; ++i)
    p *= 10;
  return p;
}

// A number with a digit count drawn from [min_digits, max_digits]; one digit includes 0.
std::int64_t draw_operand(detail::split_mix& rng, int min_digits, int max_digits,
                          bool nonzero) {
  const int digits = static_cast<int>(rng.between(min_digits, max_digits));
  const std::int64_t lo = digits == 1 ? (nonzero ? 1 : 0) : pow10(digits - 1);
  return rng.between(lo, pow10(digits) - 1);
}

struct problem {
  std::int64_t a = 0;
  char op = '+';
  std::int64_t b = 0;
  std::int64_t result = 0;

  std::string text() const { return std::to_string(a) + op + std::to_string(b); }
};

problem draw_problem(detail::split_mix& rng, const arithmetic_options& opt) {
  problem p;
  p.op = opt.operators[rng.below(opt.operators.size())];
  switch (p.op) {
    case '+':
      p.a = draw_operand(rng, opt.min_digits, opt.max_digits, false);
      p.b = draw_operand(rng, opt.min_digits, opt.max_digits, false);
      p.result = p.a + p.b;
      break;
    case '-':
      p.a = draw_operand(rng, opt.min_digits, opt.max_digits, false);
      p.b = draw_operand(rng, opt.min_digits, opt.max_digits, false);
      if (!opt.allow_negative && p.a < p.b)
        std::swap(p.a, p.b);
      p.result = p.a - p.b;
      break;
    case '*':
      p.a = draw_operand(rng, opt.min_digits, opt.max_digits, false);
      p.b = draw_operand(rng, opt.min_digits, opt.max_digits, false);
      p.result = p.a * p.b;
      break;
    default: { // '/', validated at construction
      p.b = draw_operand(rng, opt.min_digits, opt.max_digits, true);
      const std::int64_t q = draw_operand(rng, opt.min_digits, opt.max_digits, false);
      p.a = p.b * q;
      p.result = q;
      break;
    }
  }
  return p;
}

} // namespace

arithmetic_task::arithmetic_task(const arithmetic_options& options, std::uint64_t seed,
                                 double eval_fraction)
  : options_(options), seed_(seed), eval_fraction_(eval_fraction) {
  const auto fail = [](const std::string& what) {
    throw std::invalid_argument("arithmetic task: " + what);
  };
  if (options.min_digits < 1)
    fail("min_digits must be >= 1, got " + std::to_string(options.min_digits));
  if (options.max_digits < options.min_digits)
    fail("max_digits (" + std::to_string(options.max_digits) + ") must be >= min_digits ("
         + std::to_string(options.min_digits) + ")");
  if (options.max_digits > max_supported_digits)
    fail("max_digits must be <= " + std::to_string(max_supported_digits) + ", got "
         + std::to_string(options.max_digits));
  if (options.operators.empty())
    fail("operators must name at least one of \"+-*/\"");
  for (char c : options.operators)
    if (c != '+' && c != '-' && c != '*' && c != '/')
      fail("operators may contain only '+', '-', '*', '/', got "
           + quote_for_reason(options.operators));
  if (options.wrong_answers != "near" && options.wrong_answers != "dropped_carry")
    fail("wrong_answers must be \"near\" or \"dropped_carry\", got "
         + quote_for_reason(options.wrong_answers));
  if (!(eval_fraction >= 0.0 && eval_fraction < 1.0))
    fail("eval_fraction must be in [0, 1), got " + std::to_string(eval_fraction));
}

std::string_view arithmetic_task::name() const {
  return "arithmetic";
}

std::optional<std::uint64_t> arithmetic_task::size(task_split split) const {
  if (split == task_split::eval && eval_fraction_ == 0.0)
    return 0;
  return std::nullopt;
}

task_split arithmetic_task::split_of_problem(std::string_view problem) const {
  // Independent of the seed on purpose: a warm start and an RL run with different seeds
  // must still agree on which problems are held out.
  return detail::split_of(detail::hash_text(problem), eval_fraction_);
}

task_prompt arithmetic_task::prompt(task_split split, std::uint64_t index) const {
  if (split == task_split::eval && eval_fraction_ == 0.0)
    throw std::out_of_range("arithmetic task: the eval split is empty (eval_fraction = 0)");
  detail::split_mix rng(detail::stream_seed(seed_, split, index));
  for (int draw = 0; draw < max_draws; ++draw) {
    const problem p = draw_problem(rng, options_);
    const std::string text = p.text();
    if (split_of_problem(text) != split)
      continue;
    task_prompt out;
    out.split = split;
    out.index = index;
    out.prompt = text + "=";
    out.reference = std::to_string(p.result);
    return out;
  }
  throw std::runtime_error("arithmetic task: no problem of the " + std::string(to_string(split))
                           + " split found in " + std::to_string(max_draws)
                           + " draws; widen the digits or change eval_fraction");
}

reward_result arithmetic_task::score(const task_prompt& prompt,
                                     std::string_view completion) const {
  const integer_answer got = parse_integer_answer(completion);
  if (!got.value)
    return {0.0, got.error};
  const integer_answer want = parse_integer_answer(prompt.reference);
  if (!want.value) // a caller-built prompt with a bad reference: still no throw on output
    return {0.0, "reference is not an integer: " + quote_for_reason(prompt.reference)};
  if (*got.value != *want.value)
    return {0.0, "wrong answer: got " + std::to_string(*got.value) + ", expected "
                   + std::to_string(*want.value)};
  return {1.0, "correct"};
}

std::int64_t sum_without_carries(std::int64_t a, std::int64_t b) {
  if (a < 0 || b < 0)
    throw std::invalid_argument("sum_without_carries: operands must be >= 0, got "
                                + std::to_string(a) + " and " + std::to_string(b));
  std::int64_t out = 0, place = 1;
  while (true) {
    const std::int64_t column = a % 10 + b % 10;
    a /= 10;
    b /= 10;
    if (a == 0 && b == 0)
      return out + column * place; // the leftmost column is written in full
    out += column % 10 * place;
    place *= 10;
  }
}

std::optional<std::string> arithmetic_task::wrong_completion(const task_prompt& prompt,
                                                             std::uint64_t seed) const {
  const integer_answer ref = parse_integer_answer(prompt.reference);
  if (options_.wrong_answers == "dropped_carry") {
    // The operands come back from the prompt's own text, "<a>+<b>=".
    const std::string_view text = prompt.prompt;
    const auto plus = text.find('+');
    if (plus == std::string_view::npos || text.size() < plus + 3 || text.back() != '='
        || !ref.value)
      return std::nullopt;
    const integer_answer a = parse_integer_answer(text.substr(0, plus));
    const integer_answer b = parse_integer_answer(text.substr(plus + 1, text.size() - plus - 2));
    if (!a.value || !b.value || *a.value < 0 || *b.value < 0 || *a.value + *b.value != *ref.value)
      return std::nullopt;
    const std::int64_t slip = sum_without_carries(*a.value, *b.value);
    if (slip == *ref.value)
      return std::nullopt;
    return std::to_string(slip);
  }
  detail::split_mix rng(detail::mix64(seed ^ detail::hash_text(prompt.prompt)));
  return std::to_string(detail::wrong_integer_near(ref.value.value_or(0), rng));
}

} // namespace sorl::ml
