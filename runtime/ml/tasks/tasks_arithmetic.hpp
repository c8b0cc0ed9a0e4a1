#pragma once

#include "runtime/ml/tasks/tasks.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace sorl::ml {

/// a + b computed column by column with the carries dropped, the leftmost column written in
/// full: 57 + 68 → 115 (7+8 → 5, 5+6 → 11), 57 + 8 → 55, 7 + 8 → 15. Equals a + b exactly
/// when no column carries. Throws std::invalid_argument for a negative operand.
std::int64_t sum_without_carries(std::int64_t a, std::int64_t b);

/// Multi-digit integer arithmetic, generated from a seeded stream.
///
/// Prompt format: `<a><op><b>=` with non-negative decimal operands and no spaces, e.g.
/// "12+34=", "7-19=", "23*4=", "84/12=". The reference is the exact integer result
/// ("46", "-12", "92", "7"); '/' only appears with exact quotients (a = b·q, b >= 1).
/// Each operand (for '/', the divisor and the quotient) draws its digit count uniformly
/// from [min_digits, max_digits], then its value uniformly among numbers of that many
/// digits (one digit includes 0). The operator is drawn uniformly from `operators`.
///
/// Answer format: the completion must be exactly the result in `parse_integer_answer`'s
/// format (optional surrounding ASCII whitespace). Reward 1 when equal, else 0; reasons:
/// "correct", "wrong answer: got X, expected Y", or the parse error.
///
/// Held-out split: a problem (its text "12+34") belongs to eval when its content hash
/// falls in the `eval_fraction` share, so eval problems never occur in train; the
/// partition depends on eval_fraction only, not on the seed, so runs with different
/// seeds (a warm start, then RL) hold out the same problems. Prompt
/// (split, index) draws problems from stream (seed, split, index) until one belongs to
/// the split; this throws std::runtime_error after 100000 draws (a split so small it
/// is practically empty, e.g. eval_fraction 0.001 on one-digit '+').
class arithmetic_task final : public single_turn_task {
public:
  /// Throws std::invalid_argument naming the bad option.
  arithmetic_task(const arithmetic_options& options, std::uint64_t seed, double eval_fraction);

  std::string_view name() const override;
  std::optional<std::uint64_t> size(task_split split) const override;
  task_prompt prompt(task_split split, std::uint64_t index) const override;
  reward_result score(const task_prompt& prompt, std::string_view completion) const override;
  /// wrong_answers "near": the reference shifted by a nonzero offset in [-10, 10], from
  /// `seed`. "dropped_carry": for an addition that carries, its sum with the carries dropped
  /// ("57+68=" → "115", `sum_without_carries`), the commonest slip of column addition; for
  /// any other problem std::nullopt. A warm start taught the slip on more than half of the
  /// carrying additions answers them wrongly when greedy yet still samples the right sum:
  /// headroom that RL can take by choosing among answers the policy already produces.
  std::optional<std::string> wrong_completion(const task_prompt& prompt,
                                              std::uint64_t seed) const override;

  /// The split the problem "<a><op><b>" (no '=') belongs to; exposed for tests.
  task_split split_of_problem(std::string_view problem) const;

private:
  arithmetic_options options_;
  std::uint64_t seed_;
  double eval_fraction_;
};

} // namespace sorl::ml
