#include "runtime/ml/formats/hf_tokenizer.hpp"

#include "runtime/ml/formats/tokenizer_json.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <new>
#include <sstream>
#include <unordered_map>
#include <utility>

namespace sorl::ml {

namespace {

using json = nlohmann::json;

constexpr std::string_view replacement_char = "\xEF\xBF\xBD";  // U+FFFD

// ---------------------------------------------------------------------------------------
// UTF-8

// Well-formed per the Unicode standard, table 3-7 (the rule sanitize_utf8 applies), so that
// text passing this check is left unchanged by sanitize_utf8.
bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (n - i < len) return false;
    if (p[i + 1] < lo || p[i + 1] > hi) return false;
    for (std::size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return false;
    i += len;
  }
  return true;
}

std::size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// The code point at s[i] of valid UTF-8; advances i past it.
char32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned c = p[i];
  if (c < 0x80) {
    ++i;
    return c;
  }
  const std::size_t len = utf8_length(static_cast<unsigned char>(c));
  char32_t cp = c & (len == 2 ? 0x1Fu : len == 3 ? 0x0Fu : 0x07u);
  for (std::size_t k = 1; k < len; ++k)
    cp = (cp << 6) | (p[i + k] & 0x3Fu);
  i += len;
  return cp;
}

// The code point that ends s (valid UTF-8, not empty).
char32_t last_code_point(std::string_view s) {
  std::size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80)
    --i;
  return next_code_point(s, i);
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

// Rust's char::is_whitespace (the Unicode White_Space property), which the added-token
// lstrip / rstrip rules of `tokenizers` use (its regex `\s`).
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680
         || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F
         || c == 0x205F || c == 0x3000;
}

// The Unicode `\w` of the Rust regex crate, which `single_word` uses: Alphabetic, marks,
// decimal digits, connector punctuation, joiners. Alphabetic is approximated by the letter
// categories, Nl, and the symbols (circled / squared Latin letters) it adds to them.
bool is_word_character(char32_t c) {
  if (c == 0x200C || c == 0x200D) return true;
  if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149)
      || (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189))
    return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

struct code_point_range {
  char32_t first;
  char32_t last;
};

// Letters (general category L) and numbers (N) assigned in Unicode 15.0 to 16.0, which
// `tokenizers` 0.23 knows (Oniguruma's and Rust's tables) and the libraries here may not
// (PCRE2 10.42: Unicode 14; utf8proc 2.8: Unicode 15.0). Without them a letter of such a
// script is "unassigned" here and splits differently; with a newer library they are redundant.
constexpr code_point_range unicode16_letters[] = {
  {0x1C89, 0x1C8A}, {0xA7CB, 0xA7CD}, {0xA7DA, 0xA7DC}, {0x105C0, 0x105F3}, {0x10D4A, 0x10D65},
  {0x10D6F, 0x10D85}, {0x10EC2, 0x10EC4}, {0x1123F, 0x11240}, {0x11380, 0x11389},
  {0x1138B, 0x1138B}, {0x1138E, 0x1138E}, {0x11390, 0x113B5}, {0x113B7, 0x113B7},
  {0x113D1, 0x113D1}, {0x113D3, 0x113D3}, {0x11BC0, 0x11BE0}, {0x11F02, 0x11F02},
  {0x11F04, 0x11F10}, {0x11F12, 0x11F33}, {0x1342F, 0x1342F}, {0x13441, 0x13446},
  {0x13460, 0x143FA}, {0x16100, 0x1611D}, {0x16D40, 0x16D6C}, {0x18CFF, 0x18CFF},
  {0x1B132, 0x1B132}, {0x1B155, 0x1B155}, {0x1DF25, 0x1DF2A}, {0x1E030, 0x1E06D},
  {0x1E4D0, 0x1E4EB}, {0x1E5D0, 0x1E5ED}, {0x1E5F0, 0x1E5F0}, {0x2B739, 0x2B739},
  {0x2EBF0, 0x2EE5D}, {0x31350, 0x323AF}
};
constexpr code_point_range unicode16_numbers[] = {
  {0x10D40, 0x10D49}, {0x116D0, 0x116E3}, {0x11BF0, 0x11BF9}, {0x11F50, 0x11F59},
  {0x16130, 0x16139}, {0x16D70, 0x16D79}, {0x1CCF0, 0x1CCF9}, {0x1D2C0, 0x1D2D3},
  {0x1E4F0, 0x1E4F9}, {0x1E5F1, 0x1E5FA}
};

template <std::size_t n>
bool in_ranges(char32_t c, const code_point_range (&ranges)[n]) {
  for (const auto& r : ranges)
    if (c >= r.first && c <= r.last) return true;
  return false;
}

// The ranges as members of a PCRE2 character class.
template <std::size_t n>
std::string class_members(const code_point_range (&ranges)[n]) {
  std::string out;
  for (const auto& r : ranges)
    out += r.first == r.last ? fmt::format("\\x{{{:X}}}", static_cast<std::uint32_t>(r.first))
                             : fmt::format("\\x{{{:X}}}-\\x{{{:X}}}", static_cast<std::uint32_t>(r.first),
                                           static_cast<std::uint32_t>(r.last));
  return out;
}

// Rust's char::is_numeric (general categories Nd, Nl, No): what the Digits pre-tokenizer
// splits on.
bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO
         || in_ranges(c, unicode16_numbers);
}

// Code points assigned after Unicode 9.0 (up to utf8proc's 15.0) that have a nonzero
// combining class or a canonical decomposition, and the parts of those decompositions.
// `tokenizers` normalises with unicode-normalization-alignments 0.1.12, whose tables are
// Unicode 9.0: to it these are unassigned, i.e. starters that neither decompose nor compose.
constexpr code_point_range post_unicode9_normalization[] = {
  {0x7FD, 0x7FD}, {0x898, 0x89F}, {0x8CA, 0x8D3}, {0x9FE, 0x9FE}, {0xC3C, 0xC3C}, {0xD3B, 0xD3C},
  {0xEBA, 0xEBA}, {0x1715, 0x1715}, {0x1ABF, 0x1ACE}, {0x1DF6, 0x1DFA}, {0xA82C, 0xA82C},
  {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50},
  {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E},
  {0x11839, 0x1183A}, {0x11930, 0x11930}, {0x11935, 0x11935}, {0x11938, 0x11938},
  {0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34},
  {0x11A47, 0x11A47}, {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45},
  {0x11D97, 0x11D97}, {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F},
  {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF}
};

// NFC of valid UTF-8 without any of post_unicode9_normalization.
std::string utf8proc_nfc(std::string_view s) {
  if (s.empty()) return {};
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &out,
                                          static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    // Valid UTF-8 leaves only allocation failure.
    std::free(out);
    throw std::bad_alloc();
  }
  std::string result(reinterpret_cast<const char*>(out), static_cast<std::size_t>(n));
  std::free(out);
  return result;
}

// NFC as `tokenizers` computes it: UAX #15 with Unicode 9.0's tables (utf8proc has newer
// ones). Normalization stability makes the two differ only on post_unicode9_normalization;
// such a character is a starter that composes with nothing there, so the text on either
// side of it normalises independently and it stays as it is.
std::string nfc_normalize(std::string_view s) {
  if (is_ascii(s)) return std::string(s);  // ASCII never composes
  std::string out;
  std::size_t segment = 0;
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t at = i;
    const char32_t c = next_code_point(s, i);
    if (c < 0x7FD || !in_ranges(c, post_unicode9_normalization)) continue;
    out += utf8proc_nfc(s.substr(segment, at - segment));
    out += s.substr(at, i - at);
    segment = i;
  }
  if (segment == 0) return utf8proc_nfc(s);
  out += utf8proc_nfc(s.substr(segment));
  return out;
}

// ---------------------------------------------------------------------------------------
// GPT-2's bytes_to_unicode (openai/gpt-2 src/encoder.py): printable Latin-1 bytes stand for
// themselves, the other 68 bytes for U+0100 onwards, so every byte string is printable text.

struct byte_unicode_table {
  std::array<char32_t, 256> byte_to_cp{};
  std::array<std::int16_t, 324> cp_to_byte{};  // -1: not a byte's character

  byte_unicode_table() {
    cp_to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
      byte_to_cp[static_cast<std::size_t>(b)] = cp;
      cp_to_byte[cp] = static_cast<std::int16_t>(b);
    }
  }
};

const byte_unicode_table& byte_unicode() {
  static const byte_unicode_table table;
  return table;
}

// The bytes a byte-level token string stands for, or nullopt when a character of it is
// not in the table (the ByteLevel decoder then keeps the token's UTF-8 as it is).
std::optional<std::string> byte_level_decode(std::string_view token) {
  const auto& table = byte_unicode();
  std::string out;
  out.reserve(token.size());
  std::size_t i = 0;
  while (i < token.size()) {
    const char32_t cp = next_code_point(token, i);
    if (cp >= table.cp_to_byte.size() || table.cp_to_byte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(static_cast<unsigned char>(table.cp_to_byte[cp])));
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// PCRE2

struct pcre2_code_free_fn {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buffer{};
  const int n = pcre2_get_error_message(code, buffer.data(), buffer.size());
  if (n < 0) return fmt::format("PCRE2 error {}", code);
  return std::string(reinterpret_cast<const char*>(buffer.data()), static_cast<std::size_t>(n));
}

// Per-thread match state: a compiled pattern is shared by all threads, its match data and
// JIT stack are not.
class match_scratch {
public:
  match_scratch()
    : data_(pcre2_match_data_create(1, nullptr)),
      context_(pcre2_match_context_create(nullptr)),
      // The default JIT stack (32 KiB on the machine stack) runs out on long inputs with
      // backtracking alternatives; 8 MiB is reserved lazily by PCRE2.
      stack_(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)) {
    if (data_ == nullptr || context_ == nullptr) throw std::bad_alloc();
    if (stack_ != nullptr) pcre2_jit_stack_assign(context_, nullptr, stack_);
  }
  ~match_scratch() {
    pcre2_jit_stack_free(stack_);
    pcre2_match_context_free(context_);
    pcre2_match_data_free(data_);
  }
  match_scratch(const match_scratch&) = delete;
  match_scratch& operator=(const match_scratch&) = delete;

  pcre2_match_data* data() const { return data_; }
  pcre2_match_context* context() const { return context_; }

private:
  pcre2_match_data* data_;
  pcre2_match_context* context_;
  pcre2_jit_stack* stack_;
};

match_scratch& thread_scratch() {
  thread_local match_scratch scratch;
  return scratch;
}

// The PCRE2 spelling of an Oniguruma (Ruby syntax) pattern, for the escapes whose meaning
// differs or that PCRE2 lacks: Oniguruma's \s is the White_Space property (PCRE2's adds
// U+180E); its \w is Alphabetic, marks, decimal digits and connector punctuation, plus, outside
// a character class only, ² ³ ¹ ¼ ½ ¾ (PCRE2's: letters, numbers and '_'); its \h is a hex digit
// (PCRE2's: horizontal space); \uHHHH is a code point (PCRE2: \x{HHHH}); and \p{L} / \p{N}
// get the Unicode 15-16 letters and numbers (unicode16_letters); \b and \B follow from \w.
// \W and \H inside a character class have no such spelling and are refused; \P{L} and \P{N}
// inside one and \X (grapheme clusters) keep PCRE2's meaning. Checked against Oniguruma for
// every code point: \s, \h, '.' agree exactly, \w, \p{L}, \p{N} up to Unicode 14.
std::string pcre2_spelling(std::string_view pattern, const std::string& label, const std::string& field) {
  constexpr std::string_view word = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc})";
  constexpr std::string_view latin1_word = R"(\x{B2}\x{B3}\x{B9}\x{BC}-\x{BE})";
  const std::string letters = R"(\p{L})" + class_members(unicode16_letters);
  const std::string numbers = R"(\p{N})" + class_members(unicode16_numbers);
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  std::size_t class_body = 0;  // where the class's first member starts (a ']' there is literal)
  std::size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char d = pattern[i + 1];
      if (d == 'Q') {  // \Q...\E is literal text: copied as it is
        const std::size_t end = pattern.find("\\E", i + 2);
        const std::size_t stop = end == std::string_view::npos ? pattern.size() : end + 2;
        out += pattern.substr(i, stop - i);
        i = stop;
        continue;
      }
      const std::string_view rest = pattern.substr(i);
      const bool letter = rest.substr(0, 5) == R"(\p{L})" || rest.substr(0, 5) == R"(\P{L})";
      const bool number = rest.substr(0, 5) == R"(\p{N})" || rest.substr(0, 5) == R"(\P{N})";
      if ((letter || number) && !(d == 'P' && in_class)) {
        const std::string& members = letter ? letters : numbers;
        out += in_class ? members : (d == 'P' ? "[^" : "[") + members + "]";
        i += 5;
        continue;
      }
      if ((d == 'W' || d == 'H') && in_class)
        throw tokenizer_error(label, field,
                              fmt::format("\\{} inside a character class is not supported (its Oniguruma meaning "
                                          "has no PCRE2 spelling there)",
                                          d));
      switch (d) {
        case 's': out += R"(\p{White_Space})"; break;
        case 'S': out += R"(\P{White_Space})"; break;
        case 'h': out += in_class ? "0-9A-Fa-f" : "[0-9A-Fa-f]"; break;
        case 'H': out += "[^0-9A-Fa-f]"; break;
        case 'w': out += in_class ? std::string(word) : fmt::format("[{}{}]", word, latin1_word); break;
        case 'W': out += fmt::format("[^{}{}]", word, latin1_word); break;
        case 'b':
        case 'B': {
          if (in_class) {  // a backspace there, in both
            out += pattern.substr(i, 2);
            break;
          }
          const std::string w = fmt::format("[{}{}]", word, latin1_word);
          out += d == 'b' ? fmt::format("(?:(?<={0})(?!{0})|(?<!{0})(?={0}))", w)
                          : fmt::format("(?:(?<={0})(?={0})|(?<!{0})(?!{0}))", w);
          break;
        }
        case 'u': {
          const std::string_view hex = pattern.substr(i + 2, 4);
          if (hex.size() != 4 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string_view::npos)
            throw tokenizer_error(label, field, "\\u must be followed by four hex digits");
          out += "\\x{" + std::string(hex) + "}";
          i += 6;
          continue;
        }
        default: {
          const std::size_t len = 1 + utf8_length(static_cast<unsigned char>(d));
          out += pattern.substr(i, len);
          i += len;
          continue;
        }
      }
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      class_body = i + 1 < pattern.size() && pattern[i + 1] == '^' ? i + 2 : i + 1;
    } else if (in_class && c == ']' && i != class_body) {
      in_class = false;
    }
    out += c;
    ++i;
  }
  return out;
}

// One compiled pattern of a Split pre-tokenizer (or the GPT-2 pattern of ByteLevel).
class regex {
public:
  // `literal`: the Split "String" form, matched as the exact text.
  regex(std::string_view pattern, bool literal, std::string label, std::string field)
    : label_(std::move(label)), field_(std::move(field)) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    // Oniguruma's Ruby syntax, which `tokenizers` uses, makes ^ and $ line anchors, and only
    // '\n' a newline.
    const std::uint32_t options = literal ? (PCRE2_LITERAL | PCRE2_UTF)
                                          : (PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE | PCRE2_NEVER_BACKSLASH_C);
    const std::string spelled = literal ? std::string(pattern) : pcre2_spelling(pattern, label_, field_);
    std::unique_ptr<pcre2_compile_context, void (*)(pcre2_compile_context*)> context(
      pcre2_compile_context_create(nullptr), pcre2_compile_context_free);
    if (context == nullptr) throw std::bad_alloc();
    pcre2_set_newline(context.get(), PCRE2_NEWLINE_LF);
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(spelled.data()), spelled.size(), options, &error,
                                     &offset, context.get());
    if (code == nullptr)
      throw tokenizer_error(label_, field_,
                            fmt::format("invalid regular expression: {} (at offset {} of {})", pcre2_message(error),
                                        offset, json(spelled).dump()));
    code_.reset(code);
    // Without JIT (not built in, or no executable memory) the interpreter matches the same.
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  }

  // Calls on_match(start, end) for each match in `subject` (valid UTF-8) in order, as
  // Oniguruma's find_iter (the onig crate) yields them: the search resumes where the last
  // match ended, and an empty match right where the last one ended is skipped by moving one
  // character on.
  template <class F>
  void for_each_match(std::string_view subject, F&& on_match) const {
    match_scratch& scratch = thread_scratch();
    const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
    const std::size_t n = subject.size();
    std::size_t from = 0;
    bool matched_before = false;
    std::size_t last_match_end = 0;
    while (from <= n) {
      int rc = pcre2_match(code_.get(), s, n, from, PCRE2_NO_UTF_CHECK, scratch.data(), scratch.context());
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(code_.get(), s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, scratch.data(),
                         scratch.context());
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0)
        throw tokenizer_error(label_, field_,
                              fmt::format("matching {} bytes of text failed: {}", n, pcre2_message(rc)));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data());
      const std::size_t end = std::min<std::size_t>(ov[1], n);
      const std::size_t start = std::min<std::size_t>(ov[0], end);  // \K can invert them
      if (start == end && matched_before && last_match_end == end) {
        from += from < n ? utf8_length(static_cast<unsigned char>(subject[from])) : 1;
        continue;
      }
      from = end;
      matched_before = true;
      last_match_end = end;
      on_match(start, end);
    }
  }

private:
  std::unique_ptr<pcre2_code, pcre2_code_free_fn> code_;
  std::string label_;
  std::string field_;
};

// `tokenizers`' ByteLevel pattern (pre_tokenizers/byte_level.rs), GPT-2's.
constexpr std::string_view gpt2_pattern =
  R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------------------
// Pre-tokenizer steps

enum class split_behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct split_step {
  std::optional<regex> pattern;  // none: Digits (split on numeric characters)
  split_behavior behavior = split_behavior::isolated;
  bool invert = false;
};

struct span {
  std::size_t start;
  std::size_t end;
  bool is_match;
};

// NormalizedString::split of `tokenizers` (tokenizer/normalizer.rs): the pattern's
// matches and the text between them, each flagged, then merged or dropped per behavior.
// Appends the non-empty pieces to `out`.
void split_piece(const split_step& step, std::string_view piece, std::vector<span>& spans,
                 std::vector<std::string_view>& out) {
  spans.clear();
  if (step.pattern) {
    std::size_t prev = 0;
    step.pattern->for_each_match(piece, [&](std::size_t start, std::size_t end) {
      if (prev != start) spans.push_back({prev, start, false});
      spans.push_back({start, end, true});
      prev = end;
    });
    if (prev != piece.size()) spans.push_back({prev, piece.size(), false});
  } else {
    // Pattern for Fn(char) -> bool: each numeric character is a match of its own.
    std::size_t last_offset = 0;
    std::size_t i = 0;
    while (i < piece.size()) {
      const std::size_t at = i;
      const char32_t c = next_code_point(piece, i);
      if (is_numeric(c)) {
        if (last_offset < at) spans.push_back({last_offset, at, false});
        spans.push_back({at, i, true});
        last_offset = i;
      }
    }
    if (piece.size() > last_offset) spans.push_back({last_offset, piece.size(), false});
  }
  if (step.invert)
    for (span& s : spans)
      s.is_match = !s.is_match;

  const auto emit = [&](std::size_t start, std::size_t end) {
    if (end > start) out.push_back(piece.substr(start, end - start));
  };
  switch (step.behavior) {
    case split_behavior::isolated:
      for (const span& s : spans)
        emit(s.start, s.end);
      return;
    case split_behavior::removed:
      for (const span& s : spans)
        if (!s.is_match) emit(s.start, s.end);
      return;
    case split_behavior::contiguous:
    case split_behavior::merged_with_previous: {
      // Contiguous: runs of equal flags fuse. MergedWithPrevious: a match joins the piece
      // before it unless that piece is a match too.
      std::vector<std::pair<std::size_t, std::size_t>> merged;
      bool previous_match = false;
      for (const span& s : spans) {
        const bool join = step.behavior == split_behavior::contiguous ? s.is_match == previous_match
                                                                       : s.is_match && !previous_match;
        if (join && !merged.empty())
          merged.back().second = s.end;
        else
          merged.emplace_back(s.start, s.end);
        previous_match = s.is_match;
      }
      for (const auto& [start, end] : merged)
        emit(start, end);
      return;
    }
    case split_behavior::merged_with_next: {
      std::vector<std::pair<std::size_t, std::size_t>> merged;  // built right to left
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty())
          merged.back().first = it->start;
        else
          merged.emplace_back(it->start, it->end);
        previous_match = it->is_match;
      }
      for (auto it = merged.rbegin(); it != merged.rend(); ++it)
        emit(it->first, it->second);
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------
// BPE merge table: (left id, right id) → (rank, merged id), open addressing.

class pair_table {
public:
  struct value {
    std::uint32_t rank;
    token_id merged;
  };

  void reserve(std::size_t count) {
    std::size_t capacity = 16;
    while (capacity < count * 2)
      capacity *= 2;
    slots_.assign(capacity, slot{});
    mask_ = capacity - 1;
    size_ = 0;
  }

  // A later merge of the same pair replaces the earlier one, as `tokenizers` building its
  // HashMap from the merges list does.
  void insert_or_assign(token_id left, token_id right, value v) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    place(key(left, right), v);
  }

  const value* find(token_id left, token_id right) const {
    if (slots_.empty()) return nullptr;
    const std::uint64_t k = key(left, right);
    for (std::size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
      const slot& s = slots_[i];
      if (s.key == k) return &s.v;
      if (s.key == empty) return nullptr;
    }
  }

private:
  static constexpr std::uint64_t empty = ~std::uint64_t{0};  // ids < 2^24 never make it
  struct slot {
    std::uint64_t key = empty;
    value v{};
  };

  static std::uint64_t key(token_id left, token_id right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }
  static std::size_t hash(std::uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<std::size_t>(k);
  }
  void place(std::uint64_t k, value v) {
    for (std::size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
      slot& s = slots_[i];
      if (s.key == k) {
        s.v = v;
        return;
      }
      if (s.key == empty) {
        s.key = k;
        s.v = v;
        ++size_;
        return;
      }
    }
  }
  void grow() {
    std::vector<slot> old = std::move(slots_);
    reserve(std::max<std::size_t>(old.size(), 8));
    for (const slot& s : old)
      if (s.key != empty) place(s.key, s.v);
  }

  std::vector<slot> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

// A string_view → id map whose keys point into storage the owner keeps alive and unmoved.
using view_map = std::unordered_map<std::string_view, token_id>;

// ---------------------------------------------------------------------------------------
// Added-token matching: a byte trie, searched leftmost-longest as the Aho-Corasick automaton
// of `tokenizers` (MatchKind::LeftmostLongest) does.

class token_trie {
public:
  token_trie() : nodes_(1) { root_.fill(-1); }

  // Keeps the first token inserted for a given string.
  void insert(std::string_view text, std::int32_t token) {
    if (text.empty()) return;
    std::int32_t node = 0;
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto byte = static_cast<unsigned char>(text[i]);
      std::int32_t child = i == 0 ? root_[byte] : child_of(node, byte);
      if (child < 0) {
        child = static_cast<std::int32_t>(nodes_.size());
        nodes_.emplace_back();
        if (i == 0)
          root_[byte] = child;
        else
          nodes_[static_cast<std::size_t>(node)].children.emplace_back(byte, child);
      }
      node = child;
    }
    auto& terminal = nodes_[static_cast<std::size_t>(node)].token;
    if (terminal < 0) terminal = token;
  }

  bool empty() const { return nodes_.size() == 1; }

  // The longest token starting at text[pos]: (length, token), or token -1.
  std::pair<std::size_t, std::int32_t> longest_at(std::string_view text, std::size_t pos) const {
    std::int32_t node = root_[static_cast<unsigned char>(text[pos])];
    std::pair<std::size_t, std::int32_t> best{0, -1};
    std::size_t i = pos + 1;
    while (node >= 0) {
      const auto& n = nodes_[static_cast<std::size_t>(node)];
      if (n.token >= 0) best = {i - pos, n.token};
      if (i >= text.size()) break;
      node = child_of(node, static_cast<unsigned char>(text[i]));
      ++i;
    }
    return best;
  }

private:
  struct node_t {
    std::vector<std::pair<unsigned char, std::int32_t>> children;
    std::int32_t token = -1;
  };

  std::int32_t child_of(std::int32_t node, unsigned char byte) const {
    for (const auto& [b, child] : nodes_[static_cast<std::size_t>(node)].children)
      if (b == byte) return child;
    return -1;
  }

  std::array<std::int32_t, 256> root_{};
  std::vector<node_t> nodes_;
};

// ---------------------------------------------------------------------------------------
// JSON access, every error naming the field's path.

std::string json_type(const json& j) {
  return j.type_name();
}

std::string quoted_key(std::string_view key) {
  return json(std::string(key)).dump();
}

class object_reader {
public:
  object_reader(const json& obj, const std::string& label, std::string path)
    : obj_(obj), label_(label), path_(std::move(path)) {
    if (!obj.is_object())
      throw tokenizer_error(label_, path_, fmt::format("expected an object, got {}", json_type(obj)));
  }

  std::string path_of(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

  [[noreturn]] void fail(std::string_view key, const std::string& what) const {
    throw tokenizer_error(label_, path_of(key), what);
  }

  // Refuses fields this reader doesn't know: one that changes the tokenization and is
  // ignored would give silently different ids.
  void allow_only(std::initializer_list<std::string_view> known) const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (std::find(known.begin(), known.end(), std::string_view(it.key())) != known.end()) continue;
      std::string list;
      for (std::string_view k : known)
        list += (list.empty() ? "" : ", ") + std::string(k);
      fail(it.key(), fmt::format("unknown field (known here: {})", list));
    }
  }

  // The field, or nullptr when absent or null.
  const json* find(std::string_view key) const {
    const auto it = obj_.find(std::string(key));
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  const json& required(std::string_view key) const {
    const json* v = find(key);
    if (v == nullptr) fail(key, "required, missing");
    return *v;
  }

  bool opt_bool(std::string_view key, bool fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail(key, fmt::format("expected a boolean, got {}", json_type(*v)));
    return v->get<bool>();
  }

  std::optional<std::string> opt_string(std::string_view key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) fail(key, fmt::format("expected a string, got {}", json_type(*v)));
    return v->get<std::string>();
  }

  std::string required_string(std::string_view key) const {
    auto v = opt_string(key);
    if (!v) fail(key, "required, missing");
    return *v;
  }

  // The "type" tag, checked against the supported ones.
  std::string type(std::initializer_list<std::string_view> supported) const {
    std::string list;
    for (std::string_view k : supported)
      list += (list.empty() ? "" : ", ") + std::string(k);
    const json* v = find("type");
    if (v == nullptr) fail("type", fmt::format("required, missing (supported: {})", list));
    if (!v->is_string()) fail("type", fmt::format("expected a string, got {}", json_type(*v)));
    std::string t = v->get<std::string>();
    if (std::find(supported.begin(), supported.end(), std::string_view(t)) == supported.end())
      fail("type", fmt::format("'{}' is not supported (supported: {})", t, list));
    return t;
  }

private:
  const json& obj_;
  const std::string& label_;
  std::string path_;
};

// A token id from JSON: an integer in [0, max_vocab).
token_id read_id(const json& v, const std::string& label, const std::string& path) {
  if (!v.is_number_integer())
    throw tokenizer_error(label, path, fmt::format("expected an integer id, got {}", json_type(v)));
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u >= static_cast<std::uint64_t>(hf_tokenizer::max_vocab))
      throw tokenizer_error(label, path, fmt::format("id {} is out of range (ids must be below {})", u,
                                                     hf_tokenizer::max_vocab));
    return static_cast<token_id>(u);
  }
  const auto i = v.get<std::int64_t>();
  if (i < 0 || i >= hf_tokenizer::max_vocab)
    throw tokenizer_error(label, path,
                          fmt::format("id {} is out of range (ids must be in [0, {}))", i, hf_tokenizer::max_vocab));
  return static_cast<token_id>(i);
}

std::string truncated(std::string_view s) {
  return s.size() <= 40 ? std::string(s) : std::string(s.substr(0, 37)) + "...";
}

}  // namespace

// ---------------------------------------------------------------------------------------

tokenizer_error::tokenizer_error(std::string label, std::string field, const std::string& what)
  : std::runtime_error(label + (field.empty() ? "" : ": field '" + field + "'") + ": " + what),
    label_(std::move(label)),
    field_(std::move(field)) {}

struct hf_tokenizer::impl {
  enum class kind : std::uint8_t { none, model, added, special };

  struct added_token {
    token_id id = 0;
    std::string content;
    bool single_word = false;
    bool lstrip = false;
    bool rstrip = false;
    bool normalized = false;
    bool special = false;
  };

  struct segment {
    std::size_t start;
    std::size_t end;
    token_id token;  // -1: text still to tokenize
  };

  std::string label;

  // Per id: what it is and the bytes it decodes to (a special's content).
  std::vector<kind> kinds;
  std::vector<std::uint32_t> text_offsets;  // kinds.size() + 1 offsets into text_pool
  std::string text_pool;

  // Model.
  std::unordered_map<std::string, token_id> vocab;  // keys as the file spells them
  std::array<token_id, 256> byte_ids{};             // id of each byte's symbol, -1 if none
  pair_table merges;
  bool ignore_merges = false;
  std::string whole_word_pool;  // keys of whole_words
  view_map whole_words;         // byte string → id, for ignore_merges
  token_id unk_id = -1;
  bool fuse_unk = false;

  // Normalizer, pre-tokenizer.
  bool nfc = false;
  std::vector<split_step> splits;
  bool add_prefix_space = false;
  std::optional<regex> byte_level_pattern;

  // Added tokens.
  std::vector<added_token> added;
  std::unordered_map<std::string, token_id> added_by_content;
  token_trie raw_trie;         // normalized: false, matched on the raw text
  token_trie normalized_trie;  // normalized: true, matched on normalised pieces

  std::array<token_id, 7> special_roles{};

  std::string_view text_of(token_id id) const {
    const auto i = static_cast<std::size_t>(id);
    return std::string_view(text_pool).substr(text_offsets[i], text_offsets[i + 1] - text_offsets[i]);
  }

  kind kind_of(token_id id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= kinds.size()) return kind::none;
    return kinds[static_cast<std::size_t>(id)];
  }

  std::vector<token_id> encode(std::string_view text, bool with_special) const;
  void find_added(std::string_view text, const token_trie& trie, bool with_special,
                  std::vector<segment>& out) const;
  void pre_tokenize_and_bpe(std::string_view piece, std::vector<token_id>& out) const;
  void byte_level_and_bpe(std::string_view piece, std::vector<token_id>& out) const;
  void bpe(std::string_view word, std::vector<token_id>& out) const;
};

namespace {

// ---------------------------------------------------------------------------------------
// Parsing

void parse_normalizer(const json& j, const std::string& label, const std::string& path, bool& nfc) {
  if (j.is_null()) return;
  object_reader r(j, label, path);
  const std::string type = r.type({"NFC", "Sequence"});
  if (type == "NFC") {
    r.allow_only({"type"});
    // NFC is idempotent: one pass stands for any number of NFC entries.
    nfc = true;
    return;
  }
  r.allow_only({"type", "normalizers"});
  const json& list = r.required("normalizers");
  if (!list.is_array()) r.fail("normalizers", fmt::format("expected an array, got {}", json_type(list)));
  for (std::size_t i = 0; i < list.size(); ++i)
    parse_normalizer(list[i], label, fmt::format("{}.normalizers[{}]", path, i), nfc);
}

struct parsed_byte_level {
  std::string path;
  bool add_prefix_space = true;
  bool use_regex = true;
};

void parse_pre_tokenizer(const json& j, const std::string& label, const std::string& path,
                         std::vector<split_step>& splits, std::vector<std::string>& split_paths,
                         std::vector<parsed_byte_level>& byte_levels) {
  object_reader r(j, label, path);
  const std::string type = r.type({"ByteLevel", "Split", "Digits", "Sequence"});
  if (type == "Sequence") {
    r.allow_only({"type", "pretokenizers"});
    const json& list = r.required("pretokenizers");
    if (!list.is_array()) r.fail("pretokenizers", fmt::format("expected an array, got {}", json_type(list)));
    for (std::size_t i = 0; i < list.size(); ++i)
      parse_pre_tokenizer(list[i], label, fmt::format("{}.pretokenizers[{}]", path, i), splits, split_paths,
                          byte_levels);
    return;
  }
  if (!byte_levels.empty())
    throw tokenizer_error(label, path,
                          fmt::format("{} after ByteLevel ({}) is not supported: ByteLevel must come last", type,
                                      byte_levels.front().path));
  if (type == "ByteLevel") {
    r.allow_only({"type", "add_prefix_space", "trim_offsets", "use_regex"});
    parsed_byte_level b;
    b.path = path;
    b.add_prefix_space = r.opt_bool("add_prefix_space", true);
    (void)r.opt_bool("trim_offsets", true);  // offsets only
    b.use_regex = r.opt_bool("use_regex", true);
    byte_levels.push_back(std::move(b));
    return;
  }
  split_step step;
  if (type == "Digits") {
    r.allow_only({"type", "individual_digits"});
    step.behavior = r.opt_bool("individual_digits", false) ? split_behavior::isolated : split_behavior::contiguous;
  } else {
    r.allow_only({"type", "pattern", "behavior", "invert"});
    object_reader p(r.required("pattern"), label, r.path_of("pattern"));
    p.allow_only({"Regex", "String"});
    const bool has_regex = p.find("Regex") != nullptr;
    const bool has_string = p.find("String") != nullptr;
    if (has_regex == has_string)
      throw tokenizer_error(label, r.path_of("pattern"), "expected exactly one of Regex and String");
    const std::string key = has_regex ? "Regex" : "String";
    step.pattern.emplace(p.required_string(key), !has_regex, label, p.path_of(key));
    const std::string behavior = r.required_string("behavior");
    static const std::array<std::pair<std::string_view, split_behavior>, 5> behaviors = {{
      {"Removed", split_behavior::removed},
      {"Isolated", split_behavior::isolated},
      {"MergedWithPrevious", split_behavior::merged_with_previous},
      {"MergedWithNext", split_behavior::merged_with_next},
      {"Contiguous", split_behavior::contiguous},
    }};
    const auto it = std::find_if(behaviors.begin(), behaviors.end(),
                                 [&](const auto& b) { return b.first == behavior; });
    if (it == behaviors.end())
      r.fail("behavior", fmt::format("'{}' is not supported (supported: Removed, Isolated, MergedWithPrevious, "
                                     "MergedWithNext, Contiguous)",
                                     behavior));
    step.behavior = it->second;
    step.invert = r.opt_bool("invert", false);
  }
  splits.push_back(std::move(step));
  split_paths.push_back(path);
}

std::string read_whole_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw tokenizer_error(path.string(), "", "cannot open the file");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw tokenizer_error(path.string(), "", "reading the file failed");
  return std::move(buffer).str();
}

}  // namespace

hf_tokenizer::hf_tokenizer(std::shared_ptr<const impl> state) : impl_(std::move(state)) {}

hf_tokenizer hf_tokenizer::load(const std::filesystem::path& tokenizer_json, const hf_special_tokens& specials) {
  return from_json(read_whole_file(tokenizer_json), tokenizer_json.string(), specials);
}

hf_tokenizer hf_tokenizer::from_json(std::string_view json_text, const std::string& label,
                                     const hf_special_tokens& specials) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    throw tokenizer_error(label, "", fmt::format("not valid JSON: {}", e.what()));
  }
  auto t = std::make_shared<impl>();
  t->label = label;
  t->special_roles.fill(-1);

  object_reader top(root, label, "");
  top.allow_only({"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "model",
                  "post_processor", "decoder"});
  // truncation and padding act on batches and lengths, which sorl manages itself; the post
  // processor adds BOS / EOS, which sorl adds itself. Each need only be well-formed.
  for (std::string_view key : {"truncation", "padding", "post_processor"}) {
    const json* v = top.find(key);
    if (v != nullptr && !v->is_object()) top.fail(key, fmt::format("expected an object or null, got {}", json_type(*v)));
  }

  // decoder
  {
    const json* d = top.find("decoder");
    if (d == nullptr) top.fail("decoder", "null is not supported (supported: ByteLevel)");
    object_reader r(*d, label, "decoder");
    r.type({"ByteLevel"});
    r.allow_only({"type", "add_prefix_space", "trim_offsets", "use_regex"});
    for (std::string_view key : {"add_prefix_space", "trim_offsets", "use_regex"})
      (void)r.opt_bool(key, true);  // decoding ignores them
  }

  // normalizer
  if (const json* n = top.find("normalizer")) parse_normalizer(*n, label, "normalizer", t->nfc);

  // pre_tokenizer
  {
    const json* p = top.find("pre_tokenizer");
    if (p == nullptr)
      top.fail("pre_tokenizer", "null is not supported (byte-level BPE needs a ByteLevel pre-tokenizer)");
    std::vector<std::string> split_paths;
    std::vector<parsed_byte_level> byte_levels;
    parse_pre_tokenizer(*p, label, "pre_tokenizer", t->splits, split_paths, byte_levels);
    if (byte_levels.empty())
      top.fail("pre_tokenizer", "has no ByteLevel step (byte-level BPE needs one, last)");
    if (byte_levels.size() > 1)
      throw tokenizer_error(label, byte_levels[1].path, "a second ByteLevel step is not supported");
    t->add_prefix_space = byte_levels[0].add_prefix_space;
    if (byte_levels[0].use_regex) t->byte_level_pattern.emplace(gpt2_pattern, false, label, byte_levels[0].path);
  }

  // model
  const object_reader model(top.required("model"), label, "model");
  model.type({"BPE"});
  model.allow_only({"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
                    "byte_fallback", "ignore_merges", "vocab", "merges"});
  if (const json* d = model.find("dropout")) {
    if (!d->is_number()) model.fail("dropout", fmt::format("expected a number or null, got {}", json_type(*d)));
    if (d->get<double>() != 0.0)
      model.fail("dropout", fmt::format("{} is not supported (BPE-dropout is random; only null or 0)", d->dump()));
  }
  if (model.opt_bool("byte_fallback", false))
    model.fail("byte_fallback", "true is not supported (byte-level BPE has every byte already)");
  for (std::string_view key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto v = model.opt_string(key);
    if (v && !v->empty()) model.fail(key, fmt::format("'{}' is not supported (only null or \"\")", *v));
  }
  t->fuse_unk = model.opt_bool("fuse_unk", false);
  t->ignore_merges = model.opt_bool("ignore_merges", false);

  // model.vocab
  const json& vocab_json = model.required("vocab");
  if (!vocab_json.is_object())
    model.fail("vocab", fmt::format("expected an object, got {}", json_type(vocab_json)));
  if (vocab_json.empty()) model.fail("vocab", "is empty");
  if (vocab_json.size() > static_cast<std::size_t>(max_vocab))
    model.fail("vocab", fmt::format("has {} entries, more than the {} supported", vocab_json.size(), max_vocab));
  token_id max_id = -1;
  std::unordered_map<token_id, const std::string*> vocab_by_id;
  t->vocab.reserve(vocab_json.size());
  vocab_by_id.reserve(vocab_json.size());
  for (auto it = vocab_json.begin(); it != vocab_json.end(); ++it) {
    const std::string path = "model.vocab[" + quoted_key(it.key()) + "]";
    const token_id id = read_id(it.value(), label, path);
    const auto [other, fresh] = vocab_by_id.emplace(id, &it.key());
    if (!fresh)
      throw tokenizer_error(label, path,
                            fmt::format("id {} is also the id of {}", id, quoted_key(truncated(*other->second))));
    t->vocab.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }

  // added_tokens
  if (const json* a = top.find("added_tokens")) {
    if (!a->is_array()) top.fail("added_tokens", fmt::format("expected an array, got {}", json_type(*a)));
    for (std::size_t i = 0; i < a->size(); ++i) {
      const std::string path = fmt::format("added_tokens[{}]", i);
      object_reader r((*a)[i], label, path);
      r.allow_only({"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
      impl::added_token tok;
      tok.id = read_id(r.required("id"), label, r.path_of("id"));
      tok.content = r.required_string("content");
      if (tok.content.empty()) r.fail("content", "is empty");
      tok.special = r.opt_bool("special", false);
      tok.single_word = r.opt_bool("single_word", false);
      tok.lstrip = r.opt_bool("lstrip", false);
      tok.rstrip = r.opt_bool("rstrip", false);
      tok.normalized = r.opt_bool("normalized", !tok.special);
      if (!t->added_by_content.emplace(tok.content, tok.id).second)
        r.fail("content", fmt::format("{} appears twice in added_tokens", quoted_key(truncated(tok.content))));
      // `tokenizers` gives an added token that is also a vocabulary entry the entry's id,
      // and any other one a fresh id: an id that disagrees would make Python's ids differ.
      const auto in_vocab = t->vocab.find(tok.content);
      if (in_vocab != t->vocab.end() && in_vocab->second != tok.id)
        r.fail("id", fmt::format("{} but model.vocab gives {} the id {}", tok.id,
                                 quoted_key(truncated(tok.content)), in_vocab->second));
      if (in_vocab == t->vocab.end()) {
        const auto taken = vocab_by_id.find(tok.id);
        if (taken != vocab_by_id.end())
          r.fail("id", fmt::format("{} is already the id of model.vocab entry {}", tok.id,
                                   quoted_key(truncated(*taken->second))));
      }
      for (const auto& other : t->added)
        if (other.id == tok.id)
          r.fail("id", fmt::format("{} is already the id of added token {}", tok.id, quoted_key(truncated(other.content))));
      max_id = std::max(max_id, tok.id);
      t->added.push_back(std::move(tok));
    }
  }

  // Per-id tables. Ids are below max_vocab (read_id), which bounds these allocations; the
  // texts take space per token, not per id, so a file can't make them large with one huge id.
  const auto size = static_cast<std::size_t>(max_id) + 1;
  t->kinds.assign(size, impl::kind::none);
  {
    // (id, text), the added tokens after the model's so that they win on a shared id.
    std::vector<std::pair<token_id, std::string>> texts;
    texts.reserve(t->vocab.size() + t->added.size());
    for (const auto& [key, id] : t->vocab) {
      auto decoded = byte_level_decode(key);
      texts.emplace_back(id, decoded ? std::move(*decoded) : key);
      t->kinds[static_cast<std::size_t>(id)] = impl::kind::model;
    }
    for (const auto& tok : t->added) {
      if (tok.special) {
        texts.emplace_back(tok.id, tok.content);  // rendered as spelled, so encode_with_special reads it back
        t->kinds[static_cast<std::size_t>(tok.id)] = impl::kind::special;
      } else {
        auto decoded = byte_level_decode(tok.content);
        texts.emplace_back(tok.id, decoded ? std::move(*decoded) : tok.content);
        t->kinds[static_cast<std::size_t>(tok.id)] = impl::kind::added;
      }
    }
    std::stable_sort(texts.begin(), texts.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::size_t total = 0;
    for (const auto& [id, text] : texts)
      total += text.size();
    if (total > std::numeric_limits<std::uint32_t>::max())
      top.fail("model.vocab", "the tokens' text exceeds 4 GiB");
    t->text_pool.reserve(total);
    t->text_offsets.assign(size + 1, 0);
    std::size_t next = 0;
    for (std::size_t i = 0; i < size; ++i) {
      t->text_offsets[i] = static_cast<std::uint32_t>(t->text_pool.size());
      // The last entry of an id is the one that counts.
      const std::string* text = nullptr;
      while (next < texts.size() && static_cast<std::size_t>(texts[next].first) == i)
        text = &texts[next++].second;
      if (text != nullptr) t->text_pool += *text;
    }
    t->text_offsets[size] = static_cast<std::uint32_t>(t->text_pool.size());
  }
  const auto is_special_id = [&](token_id id) { return t->kinds[static_cast<std::size_t>(id)] == impl::kind::special; };

  // The byte symbols BPE starts from. A special token is never one of them (nor a merge
  // result, nor an ignore_merges hit, below), so that plain text can't produce special ids.
  {
    const auto& table = byte_unicode();
    for (std::size_t b = 0; b < 256; ++b) {
      std::string symbol;
      append_utf8(symbol, table.byte_to_cp[b]);
      const auto it = t->vocab.find(symbol);
      t->byte_ids[b] = it != t->vocab.end() && !is_special_id(it->second) ? it->second : -1;
    }
  }
  if (const auto unk = model.opt_string("unk_token")) {
    const auto it = t->vocab.find(*unk);
    if (it == t->vocab.end()) model.fail("unk_token", fmt::format("{} is not in model.vocab", quoted_key(*unk)));
    if (is_special_id(it->second))
      model.fail("unk_token", fmt::format("{} is a special added token, which encode must never produce",
                                          quoted_key(*unk)));
    t->unk_id = it->second;
  }
  if (t->ignore_merges) {
    std::vector<std::pair<std::string, token_id>> words;
    std::size_t total = 0;
    for (const auto& [key, id] : t->vocab) {
      if (is_special_id(id)) continue;
      if (auto decoded = byte_level_decode(key)) {
        total += decoded->size();
        words.emplace_back(std::move(*decoded), id);
      }
    }
    t->whole_word_pool.reserve(total);  // no reallocation below: the views stay valid
    t->whole_words.reserve(words.size());
    for (const auto& [bytes, id] : words) {
      const std::size_t at = t->whole_word_pool.size();
      t->whole_word_pool += bytes;
      t->whole_words.emplace(std::string_view(t->whole_word_pool).substr(at, bytes.size()), id);
    }
  }

  // model.merges: "left right" strings (the older form, split at the one space) or
  // [left, right] pairs; the rank is the position in the list.
  {
    const json& merges_json = model.required("merges");
    if (!merges_json.is_array())
      model.fail("merges", fmt::format("expected an array, got {}", json_type(merges_json)));
    t->merges.reserve(merges_json.size());
    const bool strings = !merges_json.empty() && merges_json[0].is_string();
    std::uint32_t rank = 0;
    for (std::size_t i = 0; i < merges_json.size(); ++i) {
      const std::string path = fmt::format("model.merges[{}]", i);
      const json& m = merges_json[i];
      std::string left, right;
      if (strings) {
        if (!m.is_string())
          throw tokenizer_error(label, path, fmt::format("expected a string like the merges before it, got {}",
                                                         json_type(m)));
        const auto& s = m.get_ref<const std::string&>();
        if (s.rfind("#version", 0) == 0) continue;  // a merges.txt header kept by old exports
        const auto space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          throw tokenizer_error(label, path,
                                fmt::format("{} is not two tokens separated by one space", quoted_key(truncated(s))));
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else {
        if (!m.is_array() || m.size() != 2 || !m[0].is_string() || !m[1].is_string())
          throw tokenizer_error(label, path,
                                fmt::format("expected a pair of strings, got {}", truncated(m.dump())));
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      }
      const auto find = [&](const std::string& s) {
        const auto it = t->vocab.find(s);
        if (it == t->vocab.end())
          throw tokenizer_error(label, path, fmt::format("{} is not in model.vocab", quoted_key(truncated(s))));
        return it->second;
      };
      const token_id l = find(left);
      const token_id r = find(right);
      const token_id merged = find(left + right);
      if (!is_special_id(merged)) t->merges.insert_or_assign(l, r, {rank, merged});
      ++rank;
    }
  }

  // Added-token tries: the special tokens first, then the others, each in file order, as
  // `tokenizers` builds its automata (the first of two equal patterns wins).
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t i = 0; i < t->added.size(); ++i) {
      const auto& tok = t->added[i];
      if (tok.special != (pass == 0)) continue;
      if (tok.normalized)
        t->normalized_trie.insert(t->nfc ? nfc_normalize(tok.content) : tok.content, static_cast<std::int32_t>(i));
      else
        t->raw_trie.insert(tok.content, static_cast<std::int32_t>(i));
    }
  }

  // Roles.
  const std::array<std::pair<const std::optional<std::string>*, std::string_view>, 7> roles = {{
    {&specials.bos, "bos"},
    {&specials.eos, "eos"},
    {&specials.pad, "pad"},
    {&specials.system, "system"},
    {&specials.user, "user"},
    {&specials.assistant, "assistant"},
    {&specials.end_turn, "end_turn"},
  }};
  for (std::size_t i = 0; i < roles.size(); ++i) {
    const auto& name = *roles[i].first;
    if (!name) continue;
    std::optional<token_id> id;
    if (const auto a = t->added_by_content.find(*name); a != t->added_by_content.end())
      id = a->second;
    else if (const auto v = t->vocab.find(*name); v != t->vocab.end())
      id = v->second;
    if (!id)
      throw tokenizer_error(label, "",
                            fmt::format("the {} token {} is neither an added token nor in model.vocab", roles[i].second,
                                        quoted_key(*name)));
    t->special_roles[i] = *id;
  }
  return hf_tokenizer(std::move(t));
}

// ---------------------------------------------------------------------------------------
// Encoding

void hf_tokenizer::impl::find_added(std::string_view text, const token_trie& trie, bool with_special,
                                    std::vector<segment>& out) const {
  out.clear();
  if (trie.empty()) {
    out.push_back({0, text.size(), -1});
    return;
  }
  // AddedVocabulary::find_matches of `tokenizers`: a match is dropped after it was found
  // (a special in plain mode, a single_word one inside a word), so the text it covered is
  // not searched again for other tokens.
  std::size_t start_offset = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const auto [length, index] = trie.longest_at(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    std::size_t start = pos;
    std::size_t stop = pos + length;
    pos = stop;
    const added_token& tok = added[static_cast<std::size_t>(index)];
    if (tok.special && !with_special) continue;
    if (tok.single_word) {
      const bool start_space = start == 0 || !is_word_character(last_code_point(text.substr(0, start)));
      std::size_t after = stop;
      const bool stop_space = stop == text.size() || !is_word_character(next_code_point(text, after));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      std::size_t new_start = start;
      while (new_start > 0) {
        std::size_t begin = new_start - 1;
        while (begin > 0 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80)
          --begin;
        std::size_t at = begin;
        if (!is_white_space(next_code_point(text, at))) break;
        new_start = begin;
      }
      start = std::max(new_start, start_offset);
    }
    if (tok.rstrip) {
      while (stop < text.size()) {
        std::size_t at = stop;
        if (!is_white_space(next_code_point(text, at))) break;
        stop = at;
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok.id});
    start_offset = stop;
  }
  if (start_offset != text.size()) out.push_back({start_offset, text.size(), -1});
}

std::vector<token_id> hf_tokenizer::impl::encode(std::string_view text, bool with_special) const {
  std::string valid;
  if (!is_valid_utf8(text)) {
    valid = sanitize_utf8(text);
    text = valid;
  }
  std::vector<token_id> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<segment> raw, normalized;
  find_added(text, raw_trie, with_special, raw);
  for (const segment& r : raw) {
    if (r.token >= 0) {
      ids.push_back(r.token);
      continue;
    }
    const std::string_view piece = text.substr(r.start, r.end - r.start);
    if (piece.empty()) continue;
    std::string normalized_text;
    std::string_view normal = piece;
    if (nfc && !is_ascii(piece)) {
      normalized_text = nfc_normalize(piece);
      normal = normalized_text;
    }
    find_added(normal, normalized_trie, with_special, normalized);
    for (const segment& n : normalized) {
      if (n.token >= 0)
        ids.push_back(n.token);
      else if (n.end > n.start)
        pre_tokenize_and_bpe(normal.substr(n.start, n.end - n.start), ids);
    }
  }
  return ids;
}

void hf_tokenizer::impl::pre_tokenize_and_bpe(std::string_view piece, std::vector<token_id>& out) const {
  if (splits.empty()) {
    byte_level_and_bpe(piece, out);
    return;
  }
  std::vector<std::string_view> current{piece}, next;
  std::vector<span> spans;
  for (const split_step& step : splits) {
    next.clear();
    for (std::string_view p : current)
      split_piece(step, p, spans, next);
    current.swap(next);
  }
  for (std::string_view p : current)
    byte_level_and_bpe(p, out);
}

void hf_tokenizer::impl::byte_level_and_bpe(std::string_view piece, std::vector<token_id>& out) const {
  std::string prefixed;
  if (add_prefix_space && piece.front() != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed += ' ';
    prefixed += piece;
    piece = prefixed;
  }
  if (!byte_level_pattern) {
    bpe(piece, out);
    return;
  }
  // Isolated: every match and every gap between matches is a word of its own.
  std::size_t prev = 0;
  byte_level_pattern->for_each_match(piece, [&](std::size_t start, std::size_t end) {
    if (prev < start) bpe(piece.substr(prev, start - prev), out);
    if (start < end) bpe(piece.substr(start, end - start), out);
    prev = end;
  });
  if (prev < piece.size()) bpe(piece.substr(prev), out);
}

void hf_tokenizer::impl::bpe(std::string_view word, std::vector<token_id>& out) const {
  // BPE::tokenize and Word::merge_all of `tokenizers` (models/bpe/model.rs, word.rs).
  if (word.empty()) return;
  if (ignore_merges) {
    const auto it = whole_words.find(word);
    if (it != whole_words.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct symbol {
    token_id id;
    std::int32_t prev;
    std::int32_t next;
    bool alive;
  };
  struct merge {
    std::uint32_t rank;
    std::int32_t pos;
    token_id merged;
  };
  thread_local std::vector<symbol> symbols;
  thread_local std::vector<merge> queue;
  symbols.clear();
  queue.clear();

  const auto add = [&](token_id id) {
    const auto n = static_cast<std::int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, true});
  };
  // Characters without a symbol become unk_token (fused into one with fuse_unk) or, without
  // one, are dropped, as BPE::merge_word does.
  bool unk_pending = false;
  for (char c : word) {
    const token_id id = byte_ids[static_cast<unsigned char>(c)];
    if (id >= 0) {
      if (unk_pending) add(unk_id);
      unk_pending = false;
      add(id);
    } else if (unk_id >= 0) {
      if (unk_pending && !fuse_unk) add(unk_id);
      unk_pending = true;
    }
  }
  if (unk_pending) add(unk_id);
  if (symbols.size() <= 1) {
    for (const symbol& s : symbols)
      out.push_back(s.id);
    return;
  }

  // Lowest rank first, then leftmost.
  const auto later = [](const merge& a, const merge& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  for (std::size_t i = 0; i + 1 < symbols.size(); ++i)
    if (const auto* m = merges.find(symbols[i].id, symbols[i + 1].id))
      queue.push_back({m->rank, static_cast<std::int32_t>(i), m->merged});
  std::make_heap(queue.begin(), queue.end(), later);
  const auto push = [&](const merge& m) {
    queue.push_back(m);
    std::push_heap(queue.begin(), queue.end(), later);
  };
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), later);
    const merge top = queue.back();
    queue.pop_back();
    symbol& current = symbols[static_cast<std::size_t>(top.pos)];
    if (!current.alive || current.next == -1) continue;
    const std::int32_t next_pos = current.next;
    const symbol right = symbols[static_cast<std::size_t>(next_pos)];
    // A stale entry: the pair at this position changed since it was queued.
    const auto* now = merges.find(current.id, right.id);
    if (now == nullptr || now->merged != top.merged) continue;
    current.id = top.merged;
    current.next = right.next;
    symbols[static_cast<std::size_t>(next_pos)].alive = false;
    if (right.next >= 0) symbols[static_cast<std::size_t>(right.next)].prev = top.pos;
    if (current.prev >= 0) {
      const symbol& prev = symbols[static_cast<std::size_t>(current.prev)];
      if (const auto* m = merges.find(prev.id, current.id)) push({m->rank, current.prev, m->merged});
    }
    if (current.next >= 0) {
      const symbol& after = symbols[static_cast<std::size_t>(current.next)];
      if (const auto* m = merges.find(current.id, after.id)) push({m->rank, top.pos, m->merged});
    }
  }
  for (const symbol& s : symbols)
    if (s.alive) out.push_back(s.id);
}

// ---------------------------------------------------------------------------------------
// The tokenizer interface

std::vector<token_id> hf_tokenizer::encode(std::string_view text) const {
  return impl_->encode(text, false);
}

std::vector<token_id> hf_tokenizer::encode_with_special(std::string_view text) const {
  return impl_->encode(text, true);
}

std::string hf_tokenizer::decode(const std::vector<token_id>& ids, decode_specials specials) const {
  std::string out;
  out.reserve(ids.size() * 4);
  for (token_id id : ids) {
    const auto k = impl_->kind_of(id);
    if (k == impl::kind::none)
      out += replacement_char;
    else if (k != impl::kind::special || specials == decode_specials::render)
      out += impl_->text_of(id);
  }
  return out;
}

std::int32_t hf_tokenizer::vocab_size() const {
  return static_cast<std::int32_t>(impl_->kinds.size());
}

bool hf_tokenizer::has_special(special_token which) const {
  return impl_->special_roles[static_cast<std::size_t>(which)] >= 0;
}

token_id hf_tokenizer::special_id(special_token which) const {
  const token_id id = impl_->special_roles[static_cast<std::size_t>(which)];
  if (id < 0)
    throw std::out_of_range(fmt::format("{}: no token was named for special token #{}", impl_->label,
                                        static_cast<int>(which)));
  return id;
}

bool hf_tokenizer::is_special(token_id id) const {
  return impl_->kind_of(id) == impl::kind::special;
}

std::string hf_tokenizer::token_text(token_id id) const {
  if (impl_->kind_of(id) == impl::kind::none) return std::string(replacement_char);
  return std::string(impl_->text_of(id));
}

std::optional<token_id> hf_tokenizer::token_to_id(std::string_view content) const {
  const std::string key(content);
  if (const auto it = impl_->added_by_content.find(key); it != impl_->added_by_content.end()) return it->second;
  if (const auto it = impl_->vocab.find(key); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

const std::string& hf_tokenizer::label() const noexcept {
  return impl_->label;
}

std::string byte_level_symbol(std::uint8_t byte) {
  std::string out;
  append_utf8(out, byte_unicode().byte_to_cp[byte]);
  return out;
}

nlohmann::ordered_json byte_level_component(bool use_regex, bool trim_offsets) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", trim_offsets}, {"use_regex", use_regex}};
}

nlohmann::ordered_json added_token_entry(std::int64_t id, const std::string& content, bool special) {
  return {{"id", id},          {"content", content},       {"single_word", false}, {"lstrip", false},
          {"rstrip", false},   {"normalized", !special},   {"special", special}};
}

nlohmann::ordered_json byte_level_bpe_document(nlohmann::ordered_json vocab, nlohmann::ordered_json merges,
                                               nlohmann::ordered_json added_tokens, nlohmann::ordered_json normalizer,
                                               nlohmann::ordered_json pre_tokenizer,
                                               nlohmann::ordered_json post_processor, nlohmann::ordered_json decoder,
                                               bool ignore_merges) {
  nlohmann::ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = std::move(added_tokens);
  j["normalizer"] = std::move(normalizer);
  j["pre_tokenizer"] = std::move(pre_tokenizer);
  j["post_processor"] = std::move(post_processor);
  j["decoder"] = std::move(decoder);
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", ignore_merges},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merges)}};
  return j;
}

std::string byte_tokenizer_json() {
  const byte_tokenizer bytes;
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_symbol(static_cast<std::uint8_t>(b))] = b;
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (token_id id = 256; id < byte_tokenizer::size; ++id) {
    vocab[bytes.token_text(id)] = id;
    added.push_back(added_token_entry(id, bytes.token_text(id), true));
  }
  // A text encoded with special tokens added (transformers' default) starts with <|bos|>, as
  // sorl's single-turn prompts do (encode_single_turn_prompt); chat templates tokenize
  // without, and write their own.
  const std::string bos = bytes.token_text(byte_tokenizer::bos);
  const nlohmann::ordered_json bos_piece = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
  const nlohmann::ordered_json post = {
      {"type", "TemplateProcessing"},
      {"single", {bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair", {bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens", {{bos, {{"id", bos}, {"ids", {byte_tokenizer::bos}}, {"tokens", {bos}}}}}}};
  // One pre-token per text and no merges: every byte is its own token, as byte_tokenizer.
  return byte_level_bpe_document(vocab, nlohmann::ordered_json::array(), added, nullptr,
                                 byte_level_component(false, false), post, byte_level_component(false, false),
                                 false)
             .dump(2) +
         "\n";
}

}  // namespace sorl::ml
