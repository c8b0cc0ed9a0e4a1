#pragma once

// Built-in answer checkers for reasoning tasks, scoring as reasoning-gym's own score_answer
// does (reasoning-gym 0.1.25: games/countdown.py, arithmetic/gsm_symbolic/gsm_symbolic.py,
// utils.py extract_answer), so that a run can score in-process what a reward process running
// reasoning-gym would score. bench/interop/reward_parity.py compares them case by case.
//
// Known differences: reasoning-gym parses countdown expressions with sympy's parse_expr,
// which accepts anything Python can spell (function calls, symbols that cancel, 1e3);
// evaluate_arithmetic accepts Python's arithmetic on numbers with sympy's readings (below)
// and scores anything else as unparsable. Integers beyond 2^63, expressions written with
// non-ASCII digits and newlines inside parentheses are unparsable here too. Text that is not
// valid UTF-8 is checked as Python would see it decoded with errors="replace" (sanitize_utf8).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sorl::ml {

/// The text inside the last `<answer>...</answer>` of `completion` (one optional whitespace
/// character inside each tag dropped, then stripped), or nullopt when there is none:
/// reasoning-gym's extract_answer(completion, "answer").
std::optional<std::string> extract_tagged_answer(std::string_view completion);

/// The answer a completion gives: extract_tagged_answer's when it has `<answer>` tags
/// (reasoning-gym's convention), else the whole completion with surrounding ASCII whitespace
/// removed.
std::string completion_answer(std::string_view completion);

/// The value of an arithmetic expression as sympy's parse_expr reads it, in long double:
/// integers (Python's literal rules: `1_000`, no leading zeros) and decimals (`2.`, `.5`,
/// `1e3`), binary + - * / // % with Python's precedence, ** (right-associative, above unary
/// minus: -2**2 = -4), ^ as Python's bitwise XOR on integers (lowest precedence, as parse_expr
/// leaves it), unary + and -, postfix ! and !! (factorial and double factorial, tightest),
/// parentheses, spaces and tabs. nullopt when the text is anything else, divides by zero,
/// takes a non-integer power of a negative number, or XORs or factorials a non-integer.
std::optional<long double> evaluate_arithmetic(std::string_view expression);

/// reasoning-gym's countdown score of `answer` (the extracted answer, not the completion):
/// 0.01 when it is empty or not an expression; 0.05 when the whole numbers in its text
/// (`\b\d+\b`) are not exactly `numbers` as a multiset, or its value is not `target`
/// (np.isclose: |v − t| <= 1e-6 + 1e-5·|t|); 1.0 otherwise.
double countdown_score(std::string_view answer, const std::vector<std::int64_t>& numbers, std::int64_t target);

/// reasoning-gym's gsm_symbolic score of `answer`: the first number in it
/// (`\b-?\d+(?:\.\d+)?\b`, Unicode word boundaries as Python's `re`) compared with
/// `expected` as doubles: 1.0 when equal, 0.01 when not, 0.0 when there is no number or
/// `expected` is not a number.
double first_number_score(std::string_view answer, std::string_view expected);

/// first_number_score's rule on the last number of `answer` instead of the first: a response
/// that works through the problem before it answers ("7 + 5 = 12, 12 - 3 = 9, so 9") is
/// scored on its conclusion, not on the first operand it restates. Unlike it, a minus sign
/// at the start or after a non-word character belongs to the number ("is -4" reads −4).
double last_number_score(std::string_view answer, std::string_view expected);

}  // namespace sorl::ml
