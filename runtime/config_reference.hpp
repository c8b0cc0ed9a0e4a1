#pragma once

// The configuration reference rendered from config_keys() (runtime/config.hpp), the list the
// parser's own reader calls record: markdown (docs/config.md), JSON, and a commented TOML
// template. `sorl config` prints them; scripts/gen-docs writes docs/config.md with it.

#include <string>
#include <string_view>
#include <vector>

#include "runtime/config.hpp"

namespace sorl {

/// The shortest text that reads back as the same double, always a TOML float ("1.0", not
/// "1"; "inf", "nan").
std::string toml_float(double x);

/// A value as TOML text: strings quoted and escaped, floats with a '.' or an exponent,
/// integers of five digits or more grouped by '_' (67_108_864), lists as [ ... ]; "" for
/// std::monostate.
std::string config_value_toml(const config_value& value);

/// What `k` accepts, for people: "[0, 2^20]", "(0, 1]", "[1, inf]" for integer and number
/// keys (powers of two from 2^16 written as such), "\"a\", \"b\"" for a choice, "" otherwise.
std::string config_accepts(const config_key& k);

/// Markdown: a title, then per table (sections in file order, then [[node]] and its actors
/// entries) its meaning and a table of key, type, default, accepts and meaning. The first
/// line says the file is generated and by which command.
std::string config_reference_markdown(const std::vector<config_key>& keys);

/// JSON: an array of every entry of `keys` in order, each an object with table, key, type,
/// default (typed; null without one), example, required, min, max (null = unbounded; an
/// infinite bound is null too), min_open, choices and meaning.
std::string config_reference_json(const std::vector<config_key>& keys);

/// A commented TOML file with every table and every key at its default, each key after a
/// comment with its meaning (and what it accepts). A key without a default is written with
/// its example when the parser requires it (a [[node]]'s name), else commented out; the keys
/// of a table that lives inside a list (a [[node]]'s actors entries) are described in
/// comments. parse_config reads it back to the defaults, with one [[node]] named by the
/// example and no actors.
std::string config_reference_toml(const std::vector<config_key>& keys);

} // namespace sorl
