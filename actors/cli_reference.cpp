#include "actors/cli_reference.hpp"

#include <algorithm>
#include <set>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace sorl {

namespace {

bool hidden(const CLI::Option* o) {
  return o->get_group().empty();
}

/// How the option is typed on the command line: "config", or "-h", "--help".
std::vector<std::string> names(const CLI::Option* o) {
  if (o->get_positional() && !o->nonpositional())
    return {o->get_name(true)};
  std::vector<std::string> out;
  for (const auto& s : o->get_snames())
    out.push_back("-" + s);
  for (const auto& l : o->get_lnames())
    out.push_back("--" + l);
  return out;
}

bool is_flag(const CLI::Option* o) {
  return o->get_items_expected_max() == 0;
}

/// The names of the options in `set`, sorted (a set of pointers has no stable order).
std::vector<std::string> option_names(const std::set<CLI::Option*>& set) {
  std::vector<std::string> out;
  for (const auto* o : set)
    out.push_back(names(o).empty() ? o->get_name() : names(o).back());
  std::sort(out.begin(), out.end());
  return out;
}

/// CLI11 descriptions break lines for a terminal; a table cell or a JSON string wants one.
std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

std::string cell(const std::string& text) {
  std::string out;
  for (char c : one_line(text))
    out += c == '|' ? std::string{"\\|"} : std::string{c};
  return out;
}

std::string joined(const std::vector<std::string>& items, std::string_view quote_with = "`") {
  std::string out;
  for (const auto& i : items)
    out += fmt::format("{}{}{}{}", out.empty() ? "" : ", ", quote_with, i, quote_with);
  return out;
}

std::vector<const CLI::App*> subcommands(const CLI::App& app) {
  return app.get_subcommands([](const CLI::App* s) { return !s->get_group().empty(); });
}

/// Appends `app`'s section, then its subcommands': blocks (heading, description,
/// subcommands, arguments, footer) separated by one blank line. A subcommand inherits its
/// parent's footer when it is made, so a footer equal to `parent_footer` is written once, at
/// the parent.
void markdown(const CLI::App& app, const std::string& path, const std::string& parent_footer,
              std::string& out) {
  std::vector<std::string> blocks{fmt::format("## `{}`\n", path)};
  if (!app.get_description().empty())
    blocks.push_back(one_line(app.get_description()) + "\n");
  const auto subs = subcommands(app);
  if (!subs.empty()) {
    std::vector<std::string> list;
    for (const auto* s : subs)
      list.push_back(s->get_name());
    blocks.push_back(fmt::format("Subcommands{}: {}.\n",
                                 app.get_require_subcommand_min() > 0 ? " (one is required)" : "",
                                 joined(list)));
  }
  const auto options = app.get_options([](const CLI::Option* o) { return !hidden(o); });
  if (!options.empty()) {
    std::string table = "| argument | type | default | required | description |\n"
                        "| --- | --- | --- | --- | --- |\n";
    for (const auto* o : options) {
      auto description = one_line(o->get_description());
      if (auto ex = option_names(o->get_excludes()); !ex.empty())
        description += "; excludes " + joined(ex);
      if (auto needs = option_names(o->get_needs()); !needs.empty())
        description += "; needs " + joined(needs);
      table +=
        fmt::format("| {} | {} | {} | {} | {} |\n", joined(names(o)),
                    is_flag(o) ? "flag" : cell(o->get_type_name()),
                    o->get_default_str().empty() ? "" : "`" + cell(o->get_default_str()) + "`",
                    o->get_required() ? "yes" : "", cell(description));
    }
    blocks.push_back(table);
  }
  const auto footer = app.get_footer();
  if (!footer.empty() && footer != parent_footer)
    blocks.push_back("```\n" + footer + (footer.back() == '\n' ? "" : "\n") + "```\n");
  for (const auto& block : blocks)
    out += "\n" + block;
  for (const auto* s : subs)
    markdown(*s, path + " " + s->get_name(), footer, out);
}

nlohmann::ordered_json json(const CLI::App& app, std::string_view name) {
  nlohmann::ordered_json j;
  j["name"] = std::string{name};
  j["description"] = one_line(app.get_description());
  j["footer"] = app.get_footer();
  j["required_subcommands"] = app.get_require_subcommand_min();
  j["arguments"] = nlohmann::ordered_json::array();
  for (const auto* o : app.get_options([](const CLI::Option* o) { return !hidden(o); })) {
    nlohmann::ordered_json a;
    a["names"] = names(o);
    a["positional"] = !o->nonpositional();
    a["type"] = is_flag(o) ? "" : o->get_type_name();
    a["flag"] = is_flag(o);
    a["default"] = o->get_default_str().empty() ? nlohmann::ordered_json(nullptr)
                                                : nlohmann::ordered_json(o->get_default_str());
    a["required"] = o->get_required();
    a["description"] = one_line(o->get_description());
    a["excludes"] = option_names(o->get_excludes());
    a["needs"] = option_names(o->get_needs());
    j["arguments"].push_back(std::move(a));
  }
  j["subcommands"] = nlohmann::ordered_json::array();
  for (const auto* s : subcommands(app))
    j["subcommands"].push_back(json(*s, s->get_name()));
  return j;
}

} // namespace

std::string cli_reference_markdown(const CLI::App& app, std::string_view program) {
  std::string out = fmt::format(
    "<!-- Generated by `{} config --cli` (scripts/gen-docs): edit the CLI11 definitions in "
    "actors/main.cpp, not this file. -->\n"
    "# Command-line reference\n\n"
    "Every subcommand, argument and option of `{}`, read off the parser that reads the command "
    "line. A type is CLI11's (TEXT, INT, FLOAT, with the check it runs); a flag takes no value.\n",
    program, program);
  markdown(app, std::string{program}, "", out);
  return out;
}

std::string cli_reference_json(const CLI::App& app, std::string_view program) {
  return json(app, program).dump(2) + "\n";
}

} // namespace sorl
