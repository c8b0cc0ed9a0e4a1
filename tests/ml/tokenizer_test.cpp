#include "runtime/ml/formats/tokenizer.hpp"

#include <catch2/catch.hpp>

#include <stdexcept>

using namespace sorl::ml;

TEST_CASE("byte tokenizer maps text to its bytes", "[tokenizer]") {
  const byte_tokenizer tok;
  CHECK(tok.encode("12+34=") == std::vector<token_id>{'1', '2', '+', '3', '4', '='});
  CHECK(tok.encode("") .empty());
  // UTF-8 "é" is two bytes, C3 A9; bytes >= 0x80 must come out non-negative.
  CHECK(tok.encode("\xC3\xA9") == std::vector<token_id>{0xC3, 0xA9});
  CHECK(tok.encode(std::string_view("a\0b", 3)) == std::vector<token_id>{'a', 0, 'b'});
}

TEST_CASE("byte tokenizer reports its vocabulary and special ids", "[tokenizer]") {
  const byte_tokenizer tok;
  CHECK(tok.vocab_size() == 272);
  CHECK(tok.special_id(special_token::bos) == 256);
  CHECK(tok.special_id(special_token::eos) == 257);
  CHECK(tok.special_id(special_token::pad) == 258);
  CHECK(tok.special_id(special_token::system) == 259);
  CHECK(tok.special_id(special_token::user) == 260);
  CHECK(tok.special_id(special_token::assistant) == 261);
  CHECK(tok.special_id(special_token::end_turn) == 262);
  CHECK_FALSE(tok.is_special(0));
  CHECK_FALSE(tok.is_special(255));
  CHECK(tok.is_special(256));
  CHECK(tok.is_special(271)); // reserved
  CHECK_FALSE(tok.is_special(272));
  CHECK_FALSE(tok.is_special(-1));
  CHECK(tok.token_text(257) == "<|eos|>");
  CHECK(tok.token_text(263) == "<|reserved_0|>");
  CHECK(tok.token_text(271) == "<|reserved_8|>");
  CHECK(tok.token_text('x') == "x");
  CHECK(tok.token_text(1000) == "\xEF\xBF\xBD");
}

TEST_CASE("plain encode never produces special ids from literal markers", "[tokenizer]") {
  const byte_tokenizer tok;
  const auto ids = tok.encode("<|eos|>");
  REQUIRE(ids.size() == 7);
  for (token_id id : ids)
    CHECK_FALSE(tok.is_special(id));
  CHECK(tok.decode(ids) == "<|eos|>");
}

TEST_CASE("encode_with_special turns literal markers into their ids", "[tokenizer]") {
  const byte_tokenizer tok;
  CHECK(tok.encode_with_special("<|user|>hi<|end_turn|>")
        == std::vector<token_id>{260, 'h', 'i', 262});
  CHECK(tok.encode_with_special("<|reserved_3|>") == std::vector<token_id>{266});
  // An incomplete or unknown marker stays text.
  CHECK(tok.encode_with_special("<|eos") == std::vector<token_id>{'<', '|', 'e', 'o', 's'});
  CHECK(tok.encode_with_special("<|foo|>").size() == 7);
}

TEST_CASE("decode renders or skips special tokens", "[tokenizer]") {
  const byte_tokenizer tok;
  const std::vector<token_id> ids{256, '4', '6', 257};
  CHECK(tok.decode(ids) == "<|bos|>46<|eos|>");
  CHECK(tok.decode(ids, decode_specials::skip) == "46");
}

TEST_CASE("decode never throws on invalid UTF-8 or out-of-range ids", "[tokenizer]") {
  const byte_tokenizer tok;
  // A lone continuation byte and a truncated 3-byte sequence pass through as bytes.
  std::string out;
  REQUIRE_NOTHROW(out = tok.decode({'a', 0x80, 0xE2, 0x82}));
  CHECK(out == std::string("a\x80\xE2\x82"));
  // Ids a 272-wide model can't produce but a wider one could decode to U+FFFD.
  CHECK(tok.decode({'a', 272, -5, 'b'}) == "a\xEF\xBF\xBD\xEF\xBF\xBD" "b");
  CHECK(tok.decode({300}, decode_specials::skip) == "\xEF\xBF\xBD");
}

TEST_CASE("encode then decode is the identity on arbitrary bytes", "[tokenizer]") {
  const byte_tokenizer tok;
  std::string all;
  for (int b = 0; b < 256; ++b)
    all.push_back(static_cast<char>(b));
  CHECK(tok.decode(tok.encode(all)) == all);
}

TEST_CASE("sanitize_utf8 replaces each maximal ill-formed subpart with one U+FFFD",
          "[tokenizer]") {
  const std::string r = "\xEF\xBF\xBD";
  CHECK(sanitize_utf8("plain ascii") == "plain ascii");
  CHECK(sanitize_utf8("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80") == "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  CHECK(sanitize_utf8("a\x80z") == "a" + r + "z");               // stray continuation
  CHECK(sanitize_utf8("\xE2\x82z") == r + "z");                  // truncated 3-byte: one U+FFFD
  CHECK(sanitize_utf8("\xE2\x82") == r);                         // truncated at the end
  CHECK(sanitize_utf8("\xC0\xAF") == r + r);                     // overlong lead: each byte
  CHECK(sanitize_utf8("\xED\xA0\x80") == r + r + r);             // surrogate D800
  CHECK(sanitize_utf8("\xF4\x90\x80\x80") == r + r + r + r);     // above U+10FFFF
  CHECK(sanitize_utf8("\xF0\x9F\x98") == r);                     // truncated 4-byte
  CHECK(sanitize_utf8("\xFF") == r);
}

TEST_CASE("encode_chat lays out turns with markers", "[tokenizer]") {
  const byte_tokenizer tok;
  const std::vector<chat_message> chat{{chat_role::user, "hi"}, {chat_role::assistant, "5"}};
  CHECK(encode_chat(tok, chat, false)
        == std::vector<token_id>{256, 260, 'h', 'i', 262, 261, '5', 262});
  CHECK(encode_chat(tok, {{chat_role::system, "<|eos|>"}}, true)
        == std::vector<token_id>{256, 259, '<', '|', 'e', 'o', 's', '|', '>', 262, 261});
}
