#include "runtime/config_reference.hpp"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace sorl {

std::string toml_float(double x) {
  if (std::isnan(x))
    return "nan";
  if (std::isinf(x))
    return x > 0 ? "inf" : "-inf";
  auto s = fmt::format("{}", x);
  if (s.find_first_of(".eE") == std::string::npos)
    s += ".0";
  return s;
}

namespace {

/// 67108864 -> "67_108_864": TOML's digit separator, so the text still reads back.
std::string grouped(int64_t v) {
  auto digits = fmt::format("{}", v < 0 ? -static_cast<uint64_t>(v) : static_cast<uint64_t>(v));
  if (digits.size() < 5)
    return fmt::format("{}", v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0)
      out += '_';
    out += digits[i];
  }
  return (v < 0 ? "-" : "") + out;
}

/// N when x == 2^N with N >= 16, else -1.
int power_of_two(uint64_t x) {
  if (x < (uint64_t{1} << 16) || (x & (x - 1)) != 0)
    return -1;
  int n = 0;
  while (x >>= 1)
    ++n;
  return n;
}

/// An integer bound for people: 2^20, 2^63-1, -2^61, else grouped.
std::string integer_bound(int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  if (v > 0) {
    if (int n = power_of_two(u); n >= 0)
      return fmt::format("2^{}", n);
    if (int n = power_of_two(u + 1); n >= 0)
      return fmt::format("2^{}-1", n);
  } else if (v < 0 && v != std::numeric_limits<int64_t>::min()) {
    if (int n = power_of_two(static_cast<uint64_t>(-v)); n >= 0)
      return fmt::format("-2^{}", n);
  }
  return grouped(v);
}

/// A float bound for people: 1e6 rather than 1000000, 1e-9 rather than 1e-09.
std::string number_bound(double x) {
  if (std::isinf(x))
    return x > 0 ? "inf" : "-inf";
  if (x >= 1e5 && std::fabs(std::log10(x) - std::round(std::log10(x))) < 1e-12)
    return fmt::format("1e{}", static_cast<int>(std::round(std::log10(x))));
  auto s = fmt::format("{}", x);
  if (auto e = s.find("e-0"); e != std::string::npos)
    s.erase(e + 2, 1);
  return s;
}

std::string bound_text(const config_value& v) {
  if (auto* i = std::get_if<int64_t>(&v))
    return integer_bound(*i);
  if (auto* d = std::get_if<double>(&v))
    return number_bound(*d);
  return "";
}

/// A markdown table cell: a '|' would end the cell, a newline the row.
std::string cell(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += ' ';
    else
      out += c;
  }
  return out;
}

std::string code(std::string_view text) {
  return text.empty() ? "" : "`" + cell(text) + "`";
}

/// How a table kind is written: "[run]", "[[node]]", "[[node]] actors entries".
std::string table_heading(const std::string& table) {
  if (table == "node")
    return "[[node]]";
  if (auto dot = table.find('.'); dot != std::string::npos)
    return table_heading(table.substr(0, dot)) + " " + table.substr(dot + 1) + " entries";
  return "[" + table + "]";
}

std::string sentence(std::string_view text) {
  std::string out{text};
  if (!out.empty())
    out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out + ".";
}

/// The tables in file order, each with its keys in order; the top-level entries ("" table)
/// give each table's meaning.
struct table_group {
  std::string table;
  std::string meaning;
  std::vector<const config_key*> keys;
};

std::vector<table_group> group_by_table(const std::vector<config_key>& keys) {
  std::vector<table_group> groups;
  std::map<std::string, size_t> index;
  auto group = [&](const std::string& table) -> table_group& {
    auto [it, fresh] = index.emplace(table, groups.size());
    if (fresh)
      groups.push_back({table, "", {}});
    return groups[it->second];
  };
  for (const auto& k : keys) {
    if (k.table.empty())
      group(k.key).meaning = k.meaning;
    else
      group(k.table).keys.push_back(&k);
  }
  return groups;
}

std::string default_cell(const config_key& k) {
  if (!std::holds_alternative<std::monostate>(k.default_value))
    return code(config_value_toml(k.default_value));
  if (k.required)
    return "required";
  return k.example.empty() ? "none" : "none (e.g. " + code(k.example) + ")";
}

nlohmann::ordered_json json_value(const config_value& v) {
  return std::visit(
    [](const auto& x) -> nlohmann::ordered_json {
      using T = std::decay_t<decltype(x)>;
      if constexpr (std::is_same_v<T, std::monostate>)
        return nullptr;
      else if constexpr (std::is_same_v<T, double>)
        return std::isfinite(x) ? nlohmann::ordered_json(x) : nlohmann::ordered_json(nullptr);
      else
        return x;
    },
    v);
}

/// `words` as comment lines of at most `width` columns (a longer word gets a line of its
/// own): the first line starts with `first`, the others with `next`.
std::string comment(const std::vector<std::string>& items, std::string_view first = "# ",
                    std::string_view next = "# ", size_t width = 96) {
  std::string out;
  std::string line{first};
  size_t base = first.size();
  for (const auto& word : items) {
    if (line.size() > base && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line = std::string{next};
      base = next.size();
    } else if (line.size() > base) {
      line += ' ';
    }
    line += word;
  }
  return out + line + "\n";
}

/// `text` split at spaces.
std::vector<std::string> words(std::string_view text) {
  std::vector<std::string> out;
  size_t from = 0;
  while (from < text.size()) {
    auto space = text.find(' ', from);
    if (space == std::string_view::npos)
      space = text.size();
    if (space > from)
      out.emplace_back(text.substr(from, space - from));
    from = space + 1;
  }
  return out;
}

/// The meaning of `k` and what it accepts, as words; the range or the list of choices stays
/// one word, so that a line never breaks inside it.
std::vector<std::string> described(const config_key& k) {
  auto out = words(k.meaning);
  if (auto accepts = config_accepts(k); !accepts.empty()) {
    out.back() += ";";
    out.emplace_back(k.type == config_type::choice ? "one of" : "accepts");
    out.push_back(accepts);
  }
  return out;
}

} // namespace

std::string config_value_toml(const config_value& value) {
  return std::visit(
    [](const auto& x) -> std::string {
      using T = std::decay_t<decltype(x)>;
      if constexpr (std::is_same_v<T, std::monostate>) {
        return "";
      } else if constexpr (std::is_same_v<T, bool>) {
        return x ? "true" : "false";
      } else if constexpr (std::is_same_v<T, int64_t>) {
        return grouped(x);
      } else if constexpr (std::is_same_v<T, double>) {
        return toml_float(x);
      } else if constexpr (std::is_same_v<T, std::string>) {
        return toml_quoted(x);
      } else {
        std::string out = "[";
        for (const auto& item : x)
          out += (out.size() > 1 ? ", " : "") + toml_quoted(item);
        return out + "]";
      }
    },
    value);
}

std::string config_accepts(const config_key& k) {
  if (k.type == config_type::choice) {
    std::string out;
    for (const auto& c : k.choices)
      out += (out.empty() ? "" : ", ") + toml_quoted(c);
    return out;
  }
  if (std::holds_alternative<std::monostate>(k.lo) && std::holds_alternative<std::monostate>(k.hi))
    return "";
  return fmt::format("{}{}, {}]", k.lo_open ? "(" : "[",
                     std::holds_alternative<std::monostate>(k.lo) ? "-inf" : bound_text(k.lo),
                     std::holds_alternative<std::monostate>(k.hi) ? "inf" : bound_text(k.hi));
}

std::string config_reference_markdown(const std::vector<config_key>& keys) {
  std::string out =
    "<!-- Generated by `sorl config --format markdown` (scripts/gen-docs): edit the reader "
    "calls in runtime/config.cpp, not this file. -->\n"
    "# Configuration reference\n\n"
    "Every key of the experiment file, in the order the parser reads it, as the reader call in "
    "`runtime/config.cpp` that parses and checks it records it. docs/your-task.md "
    "tells how the tables fit together; `sorl config --format toml` writes a file with "
    "every key at its default. Ranges are inclusive unless a parenthesis opens them.\n";
  for (const auto& g : group_by_table(keys)) {
    out += fmt::format("\n## {}\n\n", table_heading(g.table));
    if (!g.meaning.empty())
      out += sentence(g.meaning) + "\n\n";
    else if (auto dot = g.table.rfind('.'); dot != std::string::npos)
      out += fmt::format("The entries of {} `{}` written as tables.\n\n",
                         table_heading(g.table.substr(0, dot)), g.table.substr(dot + 1));
    out += "| key | type | default | accepts | meaning |\n| --- | --- | --- | --- | --- |\n";
    for (const auto* k : g.keys)
      out += fmt::format("| {} | {} | {} | {} | {} |\n", code(k->key), to_string(k->type),
                         default_cell(*k), cell(config_accepts(*k)), cell(k->meaning));
  }
  return out;
}

std::string config_reference_json(const std::vector<config_key>& keys) {
  auto all = nlohmann::ordered_json::array();
  for (const auto& k : keys) {
    nlohmann::ordered_json j;
    j["table"] = k.table;
    j["key"] = k.key;
    j["type"] = std::string{to_string(k.type)};
    j["default"] = json_value(k.default_value);
    j["example"] =
      k.example.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(k.example);
    j["required"] = k.required;
    j["min"] = json_value(k.lo);
    j["max"] = json_value(k.hi);
    j["min_open"] = k.lo_open;
    j["choices"] = k.choices;
    j["meaning"] = k.meaning;
    all.push_back(std::move(j));
  }
  return all.dump(2) + "\n";
}

std::string config_reference_toml(const std::vector<config_key>& keys) {
  std::string out =
    "# A sorl experiment file with every key at its default, written by `sorl config "
    "--format toml`.\n"
    "# docs/config.md holds the same reference; docs/your-task.md tells how the tables\n"
    "# fit together.\n";
  const auto groups = group_by_table(keys);
  // Tables that live inside a key's list (node.actors) are described under that key.
  std::map<std::string, const table_group*> nested;
  for (const auto& g : groups)
    if (g.table.find('.') != std::string::npos)
      nested.emplace(g.table, &g);
  for (const auto& g : groups) {
    if (nested.count(g.table))
      continue;
    out += "\n" + comment(words(sentence(g.meaning)));
    out += (g.table == "node" ? "[[node]]" : "[" + g.table + "]") + "\n";
    for (const auto* k : g.keys) {
      out += comment(described(*k));
      if (!std::holds_alternative<std::monostate>(k->default_value))
        out += fmt::format("{} = {}\n", k->key, config_value_toml(k->default_value));
      else
        out += fmt::format("{}{} = {}\n", k->required ? "" : "# ", k->key, k->example);
      auto inner = nested.find(g.table + "." + k->key);
      if (inner == nested.end())
        continue;
      out += comment(words(fmt::format("An {} entry as a table:", k->key)));
      for (const auto* e : inner->second->keys) {
        auto what = !std::holds_alternative<std::monostate>(e->default_value)
                      ? "default " + config_value_toml(e->default_value)
                    : e->required ? "required, e.g. " + e->example
                                  : "e.g. " + e->example;
        auto line = described(*e);
        line.insert(line.begin(), e->key + ":");
        line.push_back("(" + what + ")");
        out += comment(line, "#   ", "#     ");
      }
    }
  }
  return out;
}

} // namespace sorl
