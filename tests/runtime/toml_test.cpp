// toml++ 3.3.0 reaches undefined behaviour on these inputs when built as Debian ships it
// (runtime/toml.hpp says why); through runtime/toml.hpp each is an ordinary config error at
// the line and column where the parser stopped.

#include <catch2/catch.hpp>

#include <string>

#include "runtime/config.hpp"
#include "runtime/toml.hpp"

using sorl::config_error;
using sorl::config_exception;

namespace {

config_error only_config_error(const std::string& text) {
  try {
    sorl::parse_config(text, "test.toml", {"ping", "pong"});
  } catch (const config_exception& e) {
    REQUIRE(e.errors().size() == 1);
    return e.errors()[0];
  }
  FAIL("expected a config error");
  return {};
}

} // namespace

TEST_CASE("a Cyrillic letter at the start of a line is a syntax error, not undefined "
          "behaviour") {
  // d0 ba is U+043A, which 3.3.0's whitespace table sends to an unreachable switch default.
  auto e = only_config_error("\xd0\xba");
  CHECK(e.file == "test.toml");
  CHECK(e.line == 1);
  CHECK(e.column == 1);
  CHECK(e.message
        == "TOML syntax error: Error while parsing root table: expected keys, tables, "
           "whitespace or comments, saw '\xd0\xba'");
  e = only_config_error("[run]\nsteps = 3\n\xd0\xba = 1\n");
  CHECK(e.line == 3);
  CHECK(e.column == 1);
}

TEST_CASE("a table header opened by a backtick or an equals sign is a config error") {
  for (const char* text : {"[`", "[="}) {
    CAPTURE(text);
    const auto e = only_config_error(text);
    CHECK(e.line == 1);
    CHECK(e.column == 2);
    CHECK(e.message
          == "TOML syntax error: the parser cannot read what follows (its internal check "
             "`is_bare_key_character(*cp) || is_string_delimiter(*cp)` (toml++ parser.inl:3037) "
             "failed)");
  }
  const auto e = only_config_error("x = 1\n[=");
  CHECK(e.line == 2);
  CHECK(e.column == 2);
}

TEST_CASE("malformed times and values are config errors where the parser stopped") {
  auto e = only_config_error("a = 1979-05-27TE07:32:00.070\n");
  CHECK(e.line == 1);
  CHECK(e.column == 19);
  CHECK_THAT(e.message, Catch::Contains("`is_decimal_digit(*cp)` (toml++ parser.inl:2345)"));
  e = only_config_error("A=[}e$d=[[e-02-02e22");
  CHECK(e.line == 1);
  CHECK(e.column == 4);
  CHECK_THAT(e.message, Catch::Contains("`!is_value_terminator(*cp)` (toml++ parser.inl:2549)"));
}

TEST_CASE("parse_toml reads valid TOML, non-ASCII strings included") {
  const auto t = sorl::parse_toml("a = \"\xd0\xba\"\n[b]\nc = 1979-05-27T07:32:00Z\n", "t.toml");
  CHECK(t["a"].value<std::string>() == std::string("\xd0\xba"));
  CHECK(t["b"]["c"].is_date_time());
}
