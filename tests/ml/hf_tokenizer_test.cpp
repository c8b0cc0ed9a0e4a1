// Hugging Face tokenizer.json tokenizers (runtime/ml/formats/hf_tokenizer.hpp): small hand-written
// files (the 256 byte-level symbols, ids = byte values, plus a few merges) whose ids are
// worked out by hand for BPE merge order, the pre-tokenizer patterns, NFC, added tokens and
// ignore_merges; decoding; and refusals that name the field. Parity with the Python
// `tokenizers` library on real vocabularies is bench/interop/tokenizer_parity.py's job.
#include "runtime/ml/formats/hf_tokenizer.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace sorl::ml;
using json = nlohmann::json;
using ids = std::vector<token_id>;

namespace {

// GPT-2's bytes_to_unicode: the vocabulary spelling of raw bytes ("Ġ" for a space).
std::string mapped(std::string_view raw) {
  std::string out;
  for (char ch : raw) {
    const auto b = static_cast<unsigned char>(ch);
    unsigned cp = b;
    if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE))) {
      unsigned n = 0;
      for (unsigned x = 0; x < b; ++x)
        if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE))) ++n;
      cp = 256 + n;
    }
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

json byte_level(bool use_regex = true, bool add_prefix_space = false) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", true},
          {"use_regex", use_regex}};
}

json sequence(std::vector<json> steps) {
  return {{"type", "Sequence"}, {"pretokenizers", std::move(steps)}};
}

json split(std::string regex, std::string behavior = "Isolated", bool invert = false) {
  return {{"type", "Split"}, {"pattern", {{"Regex", std::move(regex)}}}, {"behavior", std::move(behavior)},
          {"invert", invert}};
}

json added(token_id id, std::string content, bool special, json options = json::object()) {
  json t = {{"id", id},         {"content", std::move(content)}, {"single_word", false},
            {"lstrip", false},  {"rstrip", false},               {"normalized", false},
            {"special", special}};
  for (auto it = options.begin(); it != options.end(); ++it)
    t[it.key()] = it.value();
  return t;
}

// A tokenizer.json: ids 0..255 are the bytes, then each merge's result in merge order (from
// 256), then `extra` vocabulary entries. Merges and extras are given as raw bytes.
struct spec {
  explicit spec(std::vector<std::pair<std::string, std::string>> m = {}, json pre = byte_level())
    : merges(std::move(m)), pre_tokenizer(std::move(pre)) {}

  std::vector<std::pair<std::string, std::string>> merges;
  json pre_tokenizer;
  json normalizer = nullptr;
  json added_tokens = json::array();
  bool ignore_merges = false;
  std::vector<std::string> extra;
};

json make(const spec& s) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b)
    vocab[mapped(std::string(1, static_cast<char>(b)))] = b;
  token_id next = 256;
  json merges = json::array();
  for (const auto& [l, r] : s.merges) {
    const std::string m = mapped(l + r);
    if (!vocab.contains(m)) vocab[m] = next++;
    merges.push_back({mapped(l), mapped(r)});
  }
  for (const auto& e : s.extra)
    if (!vocab.contains(mapped(e))) vocab[mapped(e)] = next++;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", s.added_tokens},
          {"normalizer", s.normalizer},
          {"pre_tokenizer", s.pre_tokenizer},
          {"post_processor", nullptr},
          {"decoder", byte_level()},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", s.ignore_merges},
            {"vocab", vocab},
            {"merges", merges}}}};
}

hf_tokenizer build(const json& j, const hf_special_tokens& specials = {}) {
  return hf_tokenizer::from_json(j.dump(), "t.json", specials);
}

hf_tokenizer build(const spec& s) {
  return build(make(s));
}

// The message from_json throws for `j`, or "" when it accepts it.
std::string error_of(const json& j, const hf_special_tokens& specials = {}) {
  try {
    (void)build(j, specials);
  } catch (const tokenizer_error& e) {
    return e.what();
  }
  return "";
}

// Options naming one role's token.
hf_special_tokens named(std::optional<std::string> hf_special_tokens::*role, std::string content) {
  hf_special_tokens s;
  s.*role = std::move(content);
  return s;
}

const std::string llama3_pattern =
  R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace

TEST_CASE("hf_tokenizer: merges apply lowest rank first, leftmost on ties", "[hf_tokenizer]") {
  // 256 "ab", 257 "bc", 258 "abc".
  const auto t = build(spec{{{"a", "b"}, {"b", "c"}, {"ab", "c"}}});
  CHECK(t.encode("abc") == ids{258});
  // ab (rank 0) first; then bc at the end (rank 1) before ab+c (rank 2).
  CHECK(t.encode("abcbc") == ids{258, 257});

  // bc ranked first: a + bc, which no merge joins.
  const auto u = build(spec{{{"b", "c"}, {"a", "b"}, {"ab", "c"}}});
  CHECK(u.encode("abc") == ids{97, 256});

  const auto v = build(spec{{{"a", "a"}}});
  CHECK(v.encode("aaa") == ids{256, 97});
  CHECK(v.encode("aaaa") == ids{256, 256});
  CHECK(v.encode("") == ids{});
}

TEST_CASE("hf_tokenizer: ByteLevel splits with the GPT-2 pattern", "[hf_tokenizer]") {
  // 256 "t'", 257 "'s", 258 "'T", 259 " w", 260 "  ", 261 " b", 262 " \n", 263 "\n\n",
  // 264 " 1", 265 "o!", 266 "!!".
  const auto t = build(spec{{{"t", "'"},
                             {"'", "s"},
                             {"'", "T"},
                             {" ", "w"},
                             {" ", " "},
                             {" ", "b"},
                             {" ", "\n"},
                             {"\n", "\n"},
                             {" ", "1"},
                             {"o", "!"},
                             {"!", "!"}}});
  // "it" "'s": unsplit, t' (rank 0) would win.
  CHECK(t.encode("it's") == ids{105, 116, 257});
  // The contractions are lower case only: "DON" "'" "T".
  CHECK(t.encode("DON'T") == ids{68, 79, 78, 39, 84});
  CHECK(t.encode("hello world") == ids{104, 101, 108, 108, 111, 259, 111, 114, 108, 100});
  // \s+(?!\S) leaves the last space to the next word.
  CHECK(t.encode("a   b") == ids{97, 260, 261});
  CHECK(t.encode("a   ") == ids{97, 260, 32});
  CHECK(t.encode("a \nb") == ids{97, 32, 10, 98});
  CHECK(t.encode("a\n\nb") == ids{97, 10, 10, 98});
  CHECK(t.encode("a\n\n") == ids{97, 263});
  CHECK(t.encode("x 123") == ids{120, 264, 50, 51});
  // "no" "!!!": unsplit, o! (rank 9) would come before !! (rank 10).
  CHECK(t.encode("no!!!") == ids{110, 111, 266, 33});

  const auto prefixed = build(spec{{{" ", "h"}}, byte_level(true, true)});
  CHECK(prefixed.encode("hi") == ids{256, 105});
  CHECK(prefixed.encode(" hi") == ids{256, 105});
}

TEST_CASE("hf_tokenizer: Digits splits numbers before ByteLevel", "[hf_tokenizer]") {
  // 256 "12", 257 " 1", 258 the second byte of U+0663 (ARABIC-INDIC DIGIT THREE) + "4".
  const std::vector<std::pair<std::string, std::string>> merges = {{"1", "2"}, {" ", "1"}, {"\xA3", "4"}};
  const json digits_individual = {{"type", "Digits"}, {"individual_digits", true}};
  const json digits_runs = {{"type", "Digits"}, {"individual_digits", false}};
  CHECK(build(spec{merges, sequence({digits_individual, byte_level()})}).encode("x 123") == ids{120, 32, 49, 50, 51});
  CHECK(build(spec{merges, sequence({digits_runs, byte_level()})}).encode("x 123") == ids{120, 32, 256, 51});
  // Without Digits, " 123" is one word and 12 (rank 0) beats " 1" (rank 1).
  CHECK(build(spec{merges}).encode("x 123") == ids{120, 32, 256, 51});
  CHECK(build(spec{merges, sequence({digits_individual, byte_level()})}).encode("\xD9\xA3" "4") == ids{217, 163, 52});
  CHECK(build(spec{merges}).encode("\xD9\xA3" "4") == ids{217, 258});
}

TEST_CASE("hf_tokenizer: Split with the Llama 3 pattern", "[hf_tokenizer]") {
  // 256 "34", 257 "12", 258 "123", 259 "45", 260 "'T", 261 " w", 262 "!!", 263 "!!\n",
  // 264 "\n\n", 265 "  ".
  const auto t = build(spec{{{"3", "4"},
                             {"1", "2"},
                             {"12", "3"},
                             {"4", "5"},
                             {"'", "T"},
                             {" ", "w"},
                             {"!", "!"},
                             {"!!", "\n"},
                             {"\n", "\n"},
                             {" ", " "}},
                            sequence({split(llama3_pattern), byte_level(false)})});
  // \p{N}{1,3}: "123" "45"; unsplit, 34 (rank 0) would win.
  CHECK(t.encode("12345") == ids{258, 259});
  // Case-insensitive contractions: "DON" "'T".
  CHECK(t.encode("DON'T") == ids{68, 79, 78, 260});
  CHECK(t.encode("hello world") == ids{104, 101, 108, 108, 111, 261, 111, 114, 108, 100});
  // " ?[^\s\p{L}\p{N}]+[\r\n]*" takes the newlines after punctuation.
  CHECK(t.encode("hi!!\n\nyo") == ids{104, 105, 263, 10, 121, 111});
  // "a" "  \n" " " " b".
  CHECK(t.encode("a  \n  b") == ids{97, 265, 10, 32, 32, 98});
}

TEST_CASE("hf_tokenizer: Split behaviors and String patterns", "[hf_tokenizer]") {
  // 256 "-b", 257 "--": they apply only where no split falls between the two.
  const std::vector<std::pair<std::string, std::string>> merges = {{"-", "b"}, {"-", "-"}};
  const auto with = [&](json step) { return build(spec{merges, sequence({std::move(step), byte_level(false)})}); };
  CHECK(with(split("-", "Isolated")).encode("a-b-") == ids{97, 45, 98, 45});
  CHECK(with(split("-", "MergedWithPrevious")).encode("a-b-") == ids{97, 45, 98, 45});
  CHECK(with(split("-", "MergedWithNext")).encode("a-b-") == ids{97, 256, 45});
  CHECK(with(split("-", "Removed")).encode("a-b-") == ids{97, 98});
  CHECK(with(split("-", "Isolated")).encode("a--b") == ids{97, 45, 45, 98});
  CHECK(with(split("-", "Contiguous")).encode("a--b") == ids{97, 257, 98});
  // Inverted, the pattern says what to keep: Removed drops the rest.
  CHECK(with(split(R"(\p{L}+)", "Removed", true)).encode("a-b-") == ids{97, 98});
  CHECK(with(split(R"(\p{L}+)", "Removed", false)).encode("a-b-") == ids{45, 45});
  // A String pattern is literal text: "." is not "any character".
  json literal = {{"type", "Split"}, {"pattern", {{"String", "."}}}, {"behavior", "Removed"}, {"invert", false}};
  CHECK(with(literal).encode("a.-b") == ids{97, 256});
}

TEST_CASE("hf_tokenizer: patterns mean what Oniguruma makes of them", "[hf_tokenizer]") {
  // Each pattern's matches are removed; what remains is encoded byte by byte.
  const auto removing = [](std::string regex) {
    return build(spec{{}, sequence({split(std::move(regex), "Removed"), byte_level(false)})});
  };
  // \s is White_Space, without U+180E MONGOLIAN VOWEL SEPARATOR.
  CHECK(removing(R"(\s+)").encode("a\xE1\xA0\x8E" "b c") == ids{97, 225, 160, 142, 98, 99});
  // \w takes combining marks.
  CHECK(removing(R"(\w+)").encode("e\xCC\x81!x") == ids{33});
  // \b follows that \w: no boundary between U+0301 and "x".
  CHECK(removing(R"(\bx)").encode("e\xCC\x81x x") == ids{101, 204, 129, 120, 32});
  // \h is a hex digit.
  CHECK(removing(R"(\h+)").encode("cafe-42 zz") == ids{45, 32, 122, 122});
  // \uHHHH is a code point.
  CHECK(removing(R"(\u00e9)").encode("caf\xC3\xA9s") == ids{99, 97, 102, 115});
  // \p{L} knows U+31350 (a CJK Extension H ideograph, Unicode 15).
  CHECK(removing(R"(\p{L}+)").encode("a\xF0\xB1\x8D\x90" "b1") == ids{49});
  // ^ and $ anchor at line ends.
  CHECK(removing("^x|x$").encode("xax\nxbx") == ids{97, 10, 98});
}

TEST_CASE("hf_tokenizer: the NFC normalizer composes before BPE", "[hf_tokenizer]") {
  // 256 "é" (C3 A9).
  const std::vector<std::pair<std::string, std::string>> merges = {{"\xC3", "\xA9"}};
  spec s{merges};
  CHECK(build(s).encode("e\xCC\x81") == ids{101, 204, 129});  // no normalizer: e + U+0301
  s.normalizer = {{"type", "NFC"}};
  CHECK(build(s).encode("e\xCC\x81") == ids{256});
  CHECK(build(s).encode("cafe\xCC\x81") == ids{99, 97, 102, 256});
  s.normalizer = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "NFC"}}}}};
  CHECK(build(s).encode("e\xCC\x81") == ids{256});
}

TEST_CASE("hf_tokenizer: added tokens, special or not", "[hf_tokenizer]") {
  spec s;
  s.added_tokens = json::array({added(256, "<|eos|>", true), added(257, "<tool>", false),
                                added(258, "<l>", true, {{"lstrip", true}}), added(259, "<r>", false, {{"rstrip", true}}),
                                added(260, "<a>", false), added(261, "<a>b", false)});
  const auto t = build(make(s), named(&hf_special_tokens::eos, "<|eos|>"));

  // encode: the special token is plain text ("a" "<|" "eos" "|>" "b"), byte by byte here.
  CHECK(t.encode("a<|eos|>b") == ids{97, 60, 124, 101, 111, 115, 124, 62, 98});
  CHECK(t.encode_with_special("a<|eos|>b") == ids{97, 256, 98});
  // Non-special added tokens match in both.
  CHECK(t.encode("x<tool>y") == ids{120, 257, 121});
  CHECK(t.encode_with_special("x<tool>y") == ids{120, 257, 121});
  // lstrip / rstrip take the whitespace next to the token.
  CHECK(t.encode_with_special("a  <l>b") == ids{97, 258, 98});
  CHECK(t.encode("a  <l>b") == ids{97, 32, 32, 60, 108, 62, 98});
  CHECK(t.encode("a<r> \t b") == ids{97, 259, 98});
  // Longest match first.
  CHECK(t.encode("x<a>bc") == ids{120, 261, 99});
  CHECK(t.encode("x<a>c") == ids{120, 260, 99});

  CHECK(t.vocab_size() == 262);
  CHECK(t.is_special(256));
  CHECK(t.is_special(258));
  CHECK_FALSE(t.is_special(257));
  CHECK_FALSE(t.is_special(97));
  CHECK_FALSE(t.is_special(9999));
  CHECK(t.token_text(256) == "<|eos|>");
  CHECK(t.token_text(32) == " ");
  CHECK(t.decode({97, 256, 98}) == "a<|eos|>b");
  CHECK(t.decode({97, 256, 98}, decode_specials::skip) == "ab");
  CHECK(t.decode({259, 257}, decode_specials::skip) == "<r><tool>");

  CHECK(t.has_special(special_token::eos));
  CHECK(t.special_id(special_token::eos) == 256);
  CHECK_FALSE(t.has_special(special_token::bos));
  CHECK_THROWS_AS(t.special_id(special_token::bos), std::out_of_range);
  CHECK(t.token_to_id("<tool>") == std::optional<token_id>(257));
  CHECK(t.token_to_id(mapped(" ")) == std::optional<token_id>(32));
  CHECK_FALSE(t.token_to_id("<none>").has_value());
}

TEST_CASE("hf_tokenizer: normalized added tokens match the normalised text", "[hf_tokenizer]") {
  spec s;
  s.normalizer = {{"type", "NFC"}};
  s.added_tokens = json::array({added(256, "caf\xC3\xA9", false, {{"normalized", true}})});
  CHECK(build(s).encode("a cafe\xCC\x81!") == ids{97, 32, 256, 33});
  // Matched on the raw text, the decomposed spelling is not the token.
  s.added_tokens = json::array({added(256, "caf\xC3\xA9", false, {{"normalized", false}})});
  CHECK(build(s).encode("a cafe\xCC\x81!") == ids{97, 32, 99, 97, 102, 195, 169, 33});
  CHECK(build(s).encode("a caf\xC3\xA9!") == ids{97, 32, 256, 33});
}

TEST_CASE("hf_tokenizer: ignore_merges emits a vocabulary word whole", "[hf_tokenizer]") {
  // 256 "bc", 257 "abc" (no merge makes it).
  spec s{{{"b", "c"}}};
  s.extra = {"abc"};
  CHECK(build(s).encode("abc") == ids{97, 256});
  s.ignore_merges = true;
  CHECK(build(s).encode("abc") == ids{257});
  CHECK(build(s).encode("abcc") == ids{97, 256, 99});
}

TEST_CASE("hf_tokenizer: plain text never yields a special token", "[hf_tokenizer]") {
  // "ab" (256) is a vocabulary word made special: its merge is dropped, and ignore_merges
  // doesn't look it up.
  spec s{{{"a", "b"}, {"b", "c"}}};
  s.added_tokens = json::array({added(256, "ab", true), added(258, "<x y>", false)});
  const auto t = build(s);
  CHECK(t.encode("ab") == ids{97, 98});
  CHECK(t.encode("abc") == ids{97, 257});
  CHECK(t.encode_with_special("abc") == ids{256, 99});
  s.ignore_merges = true;
  CHECK(build(s).encode("ab") == ids{97, 98});
  // A token whose text isn't byte-level decodes as it is spelled.
  CHECK(t.decode({258}) == "<x y>");
  CHECK(t.encode("<x y>") == ids{258});
}

TEST_CASE("hf_tokenizer: merges in the older string form", "[hf_tokenizer]") {
  json j = make(spec{{{"a", "b"}, {" ", "a"}}});
  j["model"]["merges"] = {"#version: 0.2", "a b", mapped(" ") + " a"};
  const auto t = build(j);
  // "a b" has rank 0 once the header is skipped, so it beats " a".
  CHECK(t.encode("ab ab") == ids{256, 32, 256});
}

TEST_CASE("hf_tokenizer: decode inverts encode and never throws", "[hf_tokenizer]") {
  spec s{{{" ", "t"}, {"\xF0", "\x9F"}, {"e", "\xCC"}}};
  s.added_tokens = json::array({added(300, "<|end|>", true)});
  const auto t = build(s);
  for (const std::string& text : std::vector<std::string>{
         "Hello, \xE4\xB8\x96\xE7\x95\x8C! \xF0\x9F\x91\x8B\xF0\x9F\x8F\xBD", "e\xCC\x81 \t\n  done  ",
        "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 \xF0\x9F\x87\xAB\xF0\x9F\x87\xB7",
        "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7", std::string("nul\0byte", 8)})
    CHECK(t.decode(t.encode(text)) == text);
  // Invalid UTF-8 is encoded as sanitize_utf8 makes it.
  const std::string invalid = "a\xFF\xC3(b\xED\xA0\x80";
  CHECK(t.encode(invalid) == t.encode(sanitize_utf8(invalid)));
  CHECK(t.decode(t.encode(invalid)) == sanitize_utf8(invalid));
  // A lone byte token decodes to that byte, valid UTF-8 or not.
  CHECK(t.decode({0xC3}) == "\xC3");
  // Outside the vocabulary (and in the hole between 259 and 300): U+FFFD.
  CHECK(t.vocab_size() == 301);
  CHECK(t.decode({-1, 301, 280, 104}) == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDh");
  CHECK(t.token_text(280) == "\xEF\xBF\xBD");
  CHECK_FALSE(t.is_special(280));
  CHECK(t.decode({300}, decode_specials::skip).empty());
}

TEST_CASE("hf_tokenizer: long runs stay fast and exact", "[hf_tokenizer]") {
  const auto t = build(spec{{{" ", " "}, {"7", "7"}}});
  const auto spaces = t.encode(std::string(100000, ' '));
  REQUIRE(spaces.size() == 50000);
  CHECK(std::count(spaces.begin(), spaces.end(), 256) == 50000);
  const auto digits = t.encode(std::string(100001, '7'));
  REQUIRE(digits.size() == 50001);
  CHECK(digits.back() == 55);
}

TEST_CASE("hf_tokenizer: one instance serves several threads", "[hf_tokenizer]") {
  const auto t = build(spec{{{"a", "b"}, {" ", "a"}}, sequence({split(llama3_pattern), byte_level(false)})});
  const std::string text = "ab ab cab 123 it's DON'T\n\n  x";
  const ids expected = t.encode(text);
  std::vector<ids> got(4);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] {
      for (int k = 0; k < 200; ++k)
        got[i] = t.encode(text);
    });
  for (auto& th : threads)
    th.join();
  for (const auto& g : got)
    CHECK(g == expected);
}

TEST_CASE("hf_tokenizer: refusals name the field", "[hf_tokenizer]") {
  const json base = make(spec{{{"a", "b"}}});
  const auto with = [&](const std::string& pointer, json value) {
    json j = base;
    j[json::json_pointer(pointer)] = std::move(value);
    return error_of(j);
  };
  CHECK(error_of(base).empty());

  CHECK_THROWS_WITH(hf_tokenizer::from_json("{\"model\": [", "t.json"), Catch::StartsWith("t.json: not valid JSON"));
  CHECK(error_of(json::array()) == "t.json: expected an object, got array");
  try {
    (void)hf_tokenizer::from_json("{\"model\": 1", "t.json");
    FAIL("accepted malformed JSON");
  } catch (const tokenizer_error& e) {
    CHECK(e.label() == "t.json");
    CHECK(e.field().empty());
  }
  CHECK(with("/model/type", "Unigram") == "t.json: field 'model.type': 'Unigram' is not supported (supported: BPE)");
  CHECK(with("/normalizer", {{"type", "Lowercase"}})
        == "t.json: field 'normalizer.type': 'Lowercase' is not supported (supported: NFC, Sequence)");
  CHECK(with("/normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "NFKC"}}}}})
        == "t.json: field 'normalizer.normalizers[1].type': 'NFKC' is not supported (supported: NFC, Sequence)");
  CHECK(with("/pre_tokenizer", {{"type", "Whitespace"}})
        == "t.json: field 'pre_tokenizer.type': 'Whitespace' is not supported (supported: ByteLevel, Split, Digits, "
           "Sequence)");
  CHECK(with("/pre_tokenizer", split("a"))
        == "t.json: field 'pre_tokenizer': has no ByteLevel step (byte-level BPE needs one, last)");
  CHECK(with("/pre_tokenizer", sequence({byte_level(), {{"type", "Digits"}, {"individual_digits", true}}}))
        == "t.json: field 'pre_tokenizer.pretokenizers[1]': Digits after ByteLevel (pre_tokenizer.pretokenizers[0]) "
           "is not supported: ByteLevel must come last");
  CHECK_THAT(with("/pre_tokenizer", sequence({split("(a"), byte_level()})),
             Catch::StartsWith("t.json: field 'pre_tokenizer.pretokenizers[0].pattern.Regex': invalid regular "
                               "expression: "));
  CHECK_THAT(with("/pre_tokenizer", sequence({split(R"([\W])"), byte_level()})),
             Catch::StartsWith("t.json: field 'pre_tokenizer.pretokenizers[0].pattern.Regex': \\W inside a "
                               "character class is not supported"));
  CHECK_THAT(with("/pre_tokenizer", sequence({split("a", "Sideways"), byte_level()})),
             Catch::StartsWith("t.json: field 'pre_tokenizer.pretokenizers[0].behavior': 'Sideways' is not "
                               "supported"));
  CHECK(with("/decoder", {{"type", "WordPiece"}})
        == "t.json: field 'decoder.type': 'WordPiece' is not supported (supported: ByteLevel)");
  CHECK(with("/decoder", nullptr) == "t.json: field 'decoder': null is not supported (supported: ByteLevel)");
  CHECK(with("/model/byte_fallback", true)
        == "t.json: field 'model.byte_fallback': true is not supported (byte-level BPE has every byte already)");
  CHECK(with("/model/dropout", 0.1)
        == "t.json: field 'model.dropout': 0.1 is not supported (BPE-dropout is random; only null or 0)");
  CHECK(error_of([&] {
          json j = base;
          j["model"]["dropout"] = 0.0;
          return j;
        }())
          .empty());
  CHECK(with("/model/continuing_subword_prefix", "##")
        == "t.json: field 'model.continuing_subword_prefix': '##' is not supported (only null or \"\")");
  CHECK(with("/model/end_of_word_suffix", "</w>")
        == "t.json: field 'model.end_of_word_suffix': '</w>' is not supported (only null or \"\")");
  CHECK(with("/model/unk_token", "<unk>") == "t.json: field 'model.unk_token': \"<unk>\" is not in model.vocab");
  CHECK(with("/model/vocab/a", -1)
        == "t.json: field 'model.vocab[\"a\"]': id -1 is out of range (ids must be in [0, 16777216))");
  CHECK(with("/model/vocab/a", 1 << 24)
        == "t.json: field 'model.vocab[\"a\"]': id 16777216 is out of range (ids must be below 16777216)");
  CHECK(with("/model/vocab/a", "97") == "t.json: field 'model.vocab[\"a\"]': expected an integer id, got string");
  CHECK(with("/model/vocab/x", 97) == "t.json: field 'model.vocab[\"x\"]': id 97 is also the id of \"a\"");
  CHECK(with("/model/vocab", json::object()) == "t.json: field 'model.vocab': is empty");
  CHECK(with("/model/merges/0", json::array({"a", "zz"})) == "t.json: field 'model.merges[0]': \"zz\" is not in model.vocab");
  CHECK(with("/model/merges/0", json::array({"b", "a"})) == "t.json: field 'model.merges[0]': \"ba\" is not in model.vocab");
  CHECK(with("/model/merges/0", json::array({"a"})) == "t.json: field 'model.merges[0]': expected a pair of strings, got [\"a\"]");
  CHECK(with("/model/merges", json::array({"a b c"}))
        == "t.json: field 'model.merges[0]': \"a b c\" is not two tokens separated by one space");
  CHECK(with("/model/merges", json::array({"a b", json::array({"a", "b"})}))
        == "t.json: field 'model.merges[1]': expected a string like the merges before it, got array");
  CHECK(with("/added_tokens", json::array({added(5, "a", false)}))
        == "t.json: field 'added_tokens[0].id': 5 but model.vocab gives \"a\" the id 97");
  CHECK(with("/added_tokens", json::array({added(97, "<x>", true)}))
        == "t.json: field 'added_tokens[0].id': 97 is already the id of model.vocab entry \"a\"");
  CHECK(with("/added_tokens", json::array({added(300, "<x>", true), added(300, "<y>", true)}))
        == "t.json: field 'added_tokens[1].id': 300 is already the id of added token \"<x>\"");
  CHECK(with("/added_tokens", json::array({added(300, "<x>", true), added(301, "<x>", true)}))
        == "t.json: field 'added_tokens[1].content': \"<x>\" appears twice in added_tokens");
  CHECK(with("/added_tokens", json::array({added(300, "", true)})) == "t.json: field 'added_tokens[0].content': is empty");
  CHECK(with("/added_tokens/0", 1) == "t.json: field 'added_tokens[0]': expected an object, got number");
  CHECK_THAT(with("/shortcuts", true), Catch::StartsWith("t.json: field 'shortcuts': unknown field (known here: "));
  CHECK_THAT(with("/model/max_len", 5), Catch::StartsWith("t.json: field 'model.max_len': unknown field"));
  CHECK(with("/model", nullptr) == "t.json: field 'model': required, missing");

  CHECK(error_of(base, named(&hf_special_tokens::bos, "<s>"))
        == "t.json: the bos token \"<s>\" is neither an added token nor in model.vocab");
  CHECK(error_of(base, named(&hf_special_tokens::bos, "a")).empty());

  const auto missing = std::filesystem::temp_directory_path() / "sorl_no_such_tokenizer.json";
  CHECK_THROWS_AS(hf_tokenizer::load(missing), tokenizer_error);
}

TEST_CASE("hf_tokenizer: load reads a file", "[hf_tokenizer]") {
  const auto path = std::filesystem::temp_directory_path()
                    / ("sorl_hf_tokenizer_test_" + std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()))
                       + ".json");
  {
    std::ofstream out(path);
    out << make(spec{{{"a", "b"}}}).dump(2);
  }
  const auto t = hf_tokenizer::load(path, named(&hf_special_tokens::bos, "ab"));
  std::filesystem::remove(path);
  CHECK(t.label() == path.string());
  CHECK(t.encode("abc") == ids{256, 99});
  CHECK(t.special_id(special_token::bos) == 256);
  CHECK_FALSE(t.is_special(256));
}

TEST_CASE("byte_tokenizer_json gives byte_tokenizer's ids and specials", "[hf_tokenizer]") {
  hf_special_tokens names;
  names.bos = "<|bos|>";
  names.eos = "<|eos|>";
  names.pad = "<|pad|>";
  names.system = "<|system|>";
  names.user = "<|user|>";
  names.assistant = "<|assistant|>";
  names.end_turn = "<|end_turn|>";
  const hf_tokenizer hf = hf_tokenizer::from_json(byte_tokenizer_json(), "bytes.json", names);
  const byte_tokenizer bytes;
  CHECK(hf.vocab_size() == byte_tokenizer::size);
  CHECK(byte_level_symbol(' ') == "\xc4\xa0");  // U+0120, GPT-2's spelling of a space
  CHECK(byte_level_symbol('a') == "a");
  for (const auto which : {special_token::bos, special_token::eos, special_token::pad, special_token::system,
                           special_token::user, special_token::assistant, special_token::end_turn})
    CHECK(hf.special_id(which) == bytes.special_id(which));
  for (const std::string text : {"12+34=", "  two  spaces\n\ttab", "caf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x98\x80",
                                 "<|eos|> is plain text here", ""}) {
    INFO(text);
    CHECK(hf.encode(text) == bytes.encode(text));
    CHECK(hf.encode_with_special(text) == bytes.encode_with_special(text));
    CHECK(hf.decode(bytes.encode_with_special(text)) == text);
  }
  const std::string chat = "<|bos|><|user|>ls<|end_turn|><|assistant|>cd a<|end_turn|>";
  CHECK(hf.encode_with_special(chat) == bytes.encode_with_special(chat));
  for (token_id id = 256; id < byte_tokenizer::size; ++id) {
    CHECK(hf.is_special(id));
    CHECK(hf.token_text(id) == bytes.token_text(id));
  }
}
