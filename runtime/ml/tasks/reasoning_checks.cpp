#include "runtime/ml/tasks/reasoning_checks.hpp"

#include "runtime/ml/formats/tokenizer.hpp"  // sanitize_utf8
#include "runtime/ml/tasks/tasks.hpp"          // trim_ascii_whitespace

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <stdexcept>

namespace sorl::ml {

namespace {

// A compiled pattern with Python `re` semantics on str (Unicode \d, \w, \b, \s) as far as
// PCRE2's UTF + UCP mode gives them.
class pattern {
 public:
  explicit pattern(const char* source, std::uint32_t extra = 0) {
    int err = 0;
    PCRE2_SIZE at = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source), PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | extra, &err, &at, nullptr);
    if (code_ == nullptr) throw std::logic_error("reasoning_checks: a built-in pattern does not compile");
  }
  ~pattern() { pcre2_code_free(code_); }
  pattern(const pattern&) = delete;
  pattern& operator=(const pattern&) = delete;

  // Every non-overlapping match from the left, as (begin, end) of the whole match and of
  // group 1 (when the pattern has one).
  struct match {
    std::size_t begin, end, g_begin, g_end;
  };
  std::vector<match> all(std::string_view text, std::size_t limit = SIZE_MAX) const {
    std::vector<match> out;
    std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
        pcre2_match_data_create_from_pattern(code_, nullptr), pcre2_match_data_free);
    std::size_t start = 0;
    while (start <= text.size() && out.size() < limit) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start, 0, md.get(),
                                 nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      match m{ov[0], ov[1], rc > 1 ? ov[2] : ov[0], rc > 1 ? ov[3] : ov[0]};
      out.push_back(m);
      start = m.end > m.begin ? m.end : m.end + 1;
    }
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
};

// Python's str.strip() for the whitespace a completion holds: ASCII whitespace, the
// separators \x1c-\x1f, and NEL / NBSP / the Unicode spaces encoded in UTF-8.
bool space_at_front(std::string_view s, std::size_t& n) {
  static const char* spaces[] = {"\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\xA8", "\xE2\x80\xA9",
                                 "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"};
  if (s.empty()) return false;
  const char c = s.front();
  if (c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f')) {
    n = 1;
    return true;
  }
  for (const char* sp : spaces)
    if (s.substr(0, std::char_traits<char>::length(sp)) == sp) {
      n = std::char_traits<char>::length(sp);
      return true;
    }
  if (s.size() >= 3 && s.substr(0, 2) == "\xE2\x80" && static_cast<unsigned char>(s[2]) >= 0x80 &&
      static_cast<unsigned char>(s[2]) <= 0x8A) {  // U+2000..U+200A
    n = 3;
    return true;
  }
  return false;
}

bool space_at_back(std::string_view s, std::size_t& n) {
  for (std::size_t len = 1; len <= std::min<std::size_t>(3, s.size()); ++len) {
    std::size_t m = 0;
    if (space_at_front(s.substr(s.size() - len), m) && m == len) {
      n = len;
      return true;
    }
  }
  return false;
}

std::string strip(std::string_view s) {
  std::size_t n = 0;
  while (space_at_front(s, n)) s.remove_prefix(n);
  while (space_at_back(s, n)) s.remove_suffix(n);
  return std::string(s);
}

// Recursive descent over Python's expression grammar, restricted to numbers.
class arithmetic_parser {
 public:
  explicit arithmetic_parser(std::string_view s) : s_(s) {}

  std::optional<long double> parse() {
    auto v = xor_expr();
    skip();
    if (!v || i_ != s_.size()) return std::nullopt;
    return v->v;
  }

 private:
  struct value {
    long double v;
    bool exact;  // an Integer or Rational for sympy: no decimal literal took part
  };
  using result = std::optional<value>;

  static bool is_integer(const value& x) {
    return x.exact && std::fabs(x.v) < 9.2e18L && x.v == std::floor(x.v);
  }

  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }
  bool eat(std::string_view tok) {
    skip();
    if (s_.substr(i_, tok.size()) != tok) return false;
    i_ += tok.size();
    return true;
  }
  bool peek(std::string_view tok) {
    skip();
    return s_.substr(i_, tok.size()) == tok;
  }

  result xor_expr() {
    auto a = sum();
    while (a && eat("^")) {
      auto b = sum();
      if (!b || !is_integer(*a) || !is_integer(*b)) return std::nullopt;
      a = value{static_cast<long double>(static_cast<std::int64_t>(a->v) ^ static_cast<std::int64_t>(b->v)), true};
    }
    return a;
  }

  result sum() {
    auto a = term();
    while (a) {
      if (eat("+")) {
        auto b = term();
        if (!b) return std::nullopt;
        a = value{a->v + b->v, a->exact && b->exact};
      } else if (eat("-")) {
        auto b = term();
        if (!b) return std::nullopt;
        a = value{a->v - b->v, a->exact && b->exact};
      } else {
        break;
      }
    }
    return a;
  }

  result term() {
    auto a = unary();
    while (a) {
      if (peek("**")) break;
      if (eat("*")) {
        auto b = unary();
        if (!b) return std::nullopt;
        a = value{a->v * b->v, a->exact && b->exact};
      } else if (eat("//")) {
        auto b = unary();
        if (!b || b->v == 0) return std::nullopt;
        a = value{std::floor(a->v / b->v), a->exact && b->exact};
      } else if (eat("/")) {
        auto b = unary();
        if (!b || b->v == 0) return std::nullopt;
        a = value{a->v / b->v, a->exact && b->exact};
      } else if (eat("%")) {
        auto b = unary();
        if (!b || b->v == 0) return std::nullopt;
        a = value{a->v - b->v * std::floor(a->v / b->v), a->exact && b->exact};  // Python's sign rule
      } else {
        break;
      }
    }
    return a;
  }

  result unary() {
    if (eat("-")) {
      auto a = unary();
      if (!a) return std::nullopt;
      return value{-a->v, a->exact};
    }
    if (eat("+")) return unary();
    return power();
  }

  result power() {
    auto base = postfix();
    if (!base || !eat("**")) return base;
    auto exp = unary();  // right-associative, and 2**-1 is allowed
    if (!exp) return std::nullopt;
    if (base->v == 0 && exp->v < 0) return std::nullopt;  // zoo
    if (base->v < 0 && exp->v != std::floor(exp->v)) return std::nullopt;  // complex
    const bool exact = base->exact && is_integer(*exp);
    const long double v = std::pow(base->v, exp->v);
    if (!std::isfinite(v)) return std::nullopt;
    return value{v, exact};
  }

  result postfix() {
    auto a = atom();
    while (a) {
      skip();
      const bool twice = s_.substr(i_, 2) == "!!";
      if (!twice && !eat("!")) break;
      if (twice) i_ += 2;
      if (!is_integer(*a) || a->v < 0 || a->v > 1754) return std::nullopt;  // 1754! is long double's largest
      long double f = 1;
      for (auto k = static_cast<std::int64_t>(a->v); k > 1; k -= twice ? 2 : 1) f *= static_cast<long double>(k);
      a = value{f, true};
    }
    return a;
  }

  result atom() {
    skip();
    if (eat("(")) {
      auto v = xor_expr();
      if (!v || !eat(")")) return std::nullopt;
      return v;
    }
    return number();
  }

  // Python's numeric literals: digits with single underscores between them; no leading
  // zeros on a non-zero integer; an optional fraction and exponent making it a Float.
  result number() {
    skip();
    const std::size_t start = i_;
    auto digits = [&]() {
      const std::size_t b = i_;
      while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) ||
                                (s_[i_] == '_' && i_ > b && i_ + 1 < s_.size() &&
                                 std::isdigit(static_cast<unsigned char>(s_[i_ + 1])))))
        ++i_;
      return i_ > b;
    };
    const bool int_part = digits();
    bool is_float = false;
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      const bool frac = digits();
      if (!int_part && !frac) return std::nullopt;
      is_float = true;
    } else if (!int_part) {
      return std::nullopt;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!digits()) return std::nullopt;
      is_float = true;
    }
    // A letter or digit right after a number is no Python token sympy evaluates ("2x" is
    // implicit multiplication only with a transformation parse_expr does not apply).
    if (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '_' || s_[i_] == '.'))
      return std::nullopt;
    std::string text;
    for (std::size_t k = start; k < i_; ++k)
      if (s_[k] != '_') text += s_[k];
    if (!is_float && text.size() > 1 && text[0] == '0' && text.find_first_not_of('0') != std::string::npos)
      return std::nullopt;  // "0094": a syntax error in Python 3
    if (!is_float && text.size() > 18) return std::nullopt;  // beyond what long double holds exactly
    return value{std::strtold(text.c_str(), nullptr), !is_float};
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

// A number's text with every decimal digit (Unicode category Nd) as its ASCII digit, as
// Python's float() reads them. Unicode encodes each script's digits 0-9 as a contiguous run,
// and adjacent runs are whole runs of ten, so a digit's value is its distance from the start
// of its contiguous Nd block, modulo 10.
std::string ascii_digits(std::string_view s) {
  std::string out;
  std::size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                    static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) return {};
    i += static_cast<std::size_t>(n);
    if (cp < 0x80) {
      out += static_cast<char>(cp);
      continue;
    }
    if (utf8proc_category(cp) != UTF8PROC_CATEGORY_ND) return {};
    utf8proc_int32_t start = cp;
    while (start > 0 && utf8proc_category(start - 1) == UTF8PROC_CATEGORY_ND) --start;
    out += static_cast<char>('0' + (cp - start) % 10);
  }
  return out;
}

}  // namespace

std::optional<std::string> extract_tagged_answer(std::string_view completion) {
  static const pattern tags(R"(<answer>\s?(.*?)\s?</answer>)", PCRE2_DOTALL);
  const std::string text = sanitize_utf8(completion);
  const auto matches = tags.all(text);
  if (matches.empty()) return std::nullopt;
  const auto& m = matches.back();
  return strip(std::string_view(text).substr(m.g_begin, m.g_end - m.g_begin));
}

std::string completion_answer(std::string_view completion) {
  if (auto tagged = extract_tagged_answer(completion))
    return *tagged;
  return std::string(trim_ascii_whitespace(completion));
}

std::optional<long double> evaluate_arithmetic(std::string_view expression) {
  return arithmetic_parser(expression).parse();
}

double countdown_score(std::string_view answer_in, const std::vector<std::int64_t>& numbers, std::int64_t target) {
  static const pattern ints(R"(\b\d+\b)");
  const std::string answer = sanitize_utf8(answer_in);
  if (strip(answer).empty()) return 0.01;
  // sympy's parser sees the text as Python source: surrounding spaces are fine.
  const auto v = evaluate_arithmetic(strip(answer));
  if (!v) return 0.01;
  std::vector<std::int64_t> used;
  for (const auto& m : ints.all(answer)) {
    const std::string digits = answer.substr(m.begin, m.end - m.begin);
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 18)
      return 0.05;  // non-ASCII digits or a huge literal: not the given numbers
    used.push_back(std::stoll(digits));
  }
  std::vector<std::int64_t> given = numbers;
  std::sort(used.begin(), used.end());
  std::sort(given.begin(), given.end());
  if (used != given) return 0.05;
  const long double t = static_cast<long double>(target);
  return std::fabs(*v - t) <= 1e-6L + 1e-5L * std::fabs(t) ? 1.0 : 0.05;
}

namespace {

/// first_number_score and last_number_score: the `last` or first number of the answer against
/// the expected value.
double number_score(std::string_view answer_in, std::string_view expected, bool last) {
  static const pattern number(R"(\b-?\d+(?:\.\d+)?\b)");
  const std::string answer = sanitize_utf8(answer_in);
  const auto m = last ? number.all(answer) : number.all(answer, 1);
  if (m.empty()) return 0.0;
  const auto& hit = last ? m.back() : m.front();
  std::string found = ascii_digits(answer.substr(hit.begin, hit.end - hit.begin));
  // `\b-?` takes a minus only after a word character ("x-5"); reasoning-gym's first-number
  // rule keeps that quirk, the last-number rule also reads "is -5" and a leading "-5".
  const bool word_before_minus =
    hit.begin >= 2 && (std::isalnum(static_cast<unsigned char>(answer[hit.begin - 2])) != 0
                       || answer[hit.begin - 2] == '_');
  if (last && !found.empty() && found[0] != '-' && hit.begin >= 1 && answer[hit.begin - 1] == '-'
      && !word_before_minus)
    found.insert(found.begin(), '-');
  if (found.empty()) return 0.0;
  char* end = nullptr;
  const std::string exp(expected);
  const double want = std::strtod(exp.c_str(), &end);
  if (exp.empty() || end != exp.c_str() + exp.size()) return 0.0;
  return std::strtod(found.c_str(), nullptr) == want ? 1.0 : 0.01;
}

}  // namespace

double first_number_score(std::string_view answer, std::string_view expected) {
  return number_score(answer, expected, /*last=*/false);
}

double last_number_score(std::string_view answer, std::string_view expected) {
  return number_score(answer, expected, /*last=*/true);
}

}  // namespace sorl::ml
