#pragma once

// The resolved configuration of a run: every key of runtime/config.hpp with the value the run
// uses (defaults and preset defaults filled in, paths made absolute), written as TOML into the
// run directory so that a run says exactly what it ran with and can be started again from it.

#include <filesystem>
#include <string>
#include <vector>

#include "runtime/config.hpp"

namespace sorl {

/// One key of the resolved file: `table` is a section name or "node[N]" (1-based), `value`
/// the TOML text of the value (strings quoted and escaped, floats with a '.' or exponent).
struct resolved_entry {
  std::string table;
  std::string key;
  std::string value;
};

/// Every key of `cfg` in file order. Paths (task.path, task.eval_path, model.checkpoint,
/// run.output_dir, the TLS files) are made absolute against the working directory, so the
/// file means the same wherever it is loaded from. network.tls_passphrase is left out: a
/// secret is not copied into the run directory.
std::vector<resolved_entry> resolved_entries(const experiment_config& cfg);

/// resolved_entries as a TOML document that parse_config reads back to the same settings
/// (the same resolved_entries), passphrase excepted. A comment at the top names the file and
/// each `--set` override (experiment_config::overrides), whose values the entries hold.
std::string resolved_toml(const experiment_config& cfg);

/// `sorl check --json`'s document for `cfg`, one JSON object with a trailing newline:
///   "file"      the experiment file, as given;
///   "overrides" the `--set` overrides applied, as given (experiment_config::overrides);
///   "run_dir"   run.output_dir/run.name, as the run will name it;
///   "hub"       the hub's `listen` endpoint "host:port", or null (a single node without one);
///   "nodes"     [{"name", "listen" (endpoint or null), "connects_to" (the node it joins
///               through, null for the hub and a lone node), "actors": [{"role", "count"}]}]
///               in file order;
///   "roles"     {role: actors of that role over every node};
///   "presets"   preset_summary(cfg) ("" when none);
///   "config"    the resolved configuration, resolved_entries as JSON in their order:
///               {table: {key: value}}, with "node" an array of node tables; non-finite
///               floats are the strings "inf", "-inf" and "nan" (JSON has no such numbers);
///   "started"   false: checking starts nothing.
/// Keys only get added; existing ones keep their meaning.
std::string check_json(const experiment_config& cfg);

/// What a preset (algorithm.name = "dapo") changed, for the keys the file does not set and
/// whose value differs from the plain default: "algorithm = dapo sets clip_eps_high = 0.28
/// (default 0.2), dynamic_sampling = true (default false), overlong = "shape" (default
/// "none")". Empty when the preset changed nothing.
std::string preset_summary(const experiment_config& cfg);

/// File name of the resolved configuration inside the run directory.
inline constexpr const char* resolved_config_name = "config.resolved.toml";

/// What write_resolved_config did.
struct resolved_write {
  std::filesystem::path path;     ///< run_dir/config.resolved.toml
  std::filesystem::path previous; ///< where the previous session's file was kept; empty if not
  /// "table.key: OLD → NEW" for every key that differs from the previous session's file
  /// (resume only; "(absent)" for a key one side lacks).
  std::vector<std::string> changes;
};

/// Writes run_dir/config.resolved.toml (creating the run directory). A fresh run replaces
/// the file and removes the numbered copies of a replaced run. With `resume`, an existing
/// file with the same settings is left as it is; one with different settings is kept as
/// config.resolved.N.toml (the first free N ≥ 1), the new one takes its name, and the
/// differences are returned. Raises std::runtime_error naming the path on an I/O error.
resolved_write write_resolved_config(const experiment_config& cfg, bool resume);

/// "table.key: OLD → NEW" for each key whose value differs between two resolved files
/// (comments and blank lines ignored), in the order of `after`, then keys only `before` has.
std::vector<std::string> resolved_differences(const std::string& before, const std::string& after);

} // namespace sorl
