#pragma once

// The command-line reference read off the CLI11 app that parses the command line
// (actors/main.cpp builds it; `sorl config --cli` walks that very object), so that
// docs/cli.md names every subcommand, argument and default the parser has, and no other.

#include <string>
#include <string_view>

namespace CLI {
class App;
} // namespace CLI

namespace sorl {

/// Markdown: a first line saying the file is generated and by which command, then per
/// command (`program`, then its subcommands depth first, in the order they were added) its
/// description, the subcommands it takes, a table of its arguments (name, type as CLI11
/// names it, default when the option captured one, required, description with what it
/// excludes or needs) and its footer as a code block. Hidden options and subcommands (an
/// empty group) are left out. `program` names the app itself: CLI11 renames it to argv[0]
/// when it parses, which would make the text depend on how the binary was started.
std::string cli_reference_markdown(const CLI::App& app, std::string_view program);

/// JSON: the app as an object {name, description, footer, required_subcommands, arguments:
/// [{names, positional, type, flag, default, required, description, excludes, needs}],
/// subcommands: [objects like this one]}, names as typed on the command line.
std::string cli_reference_json(const CLI::App& app, std::string_view program);

} // namespace sorl
