#include "actors/sagc/controller_state.hpp"

#include <cmath>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace sorl::sagc {

namespace {

using json = nlohmann::json;

constexpr const char* format_name = "sorl.sagc_controller";
constexpr int format_version = 1;

json optional_step(const std::optional<int64_t>& step) {
  return step ? json(*step) : json(nullptr);
}

[[noreturn]] void fail(const std::string& key, const std::string& what) {
  throw controller_state_error("sagc_controller state: key '" + key + "': " + what);
}

const json& field(const json& j, const std::string& key) {
  auto it = j.find(key);
  if (it == j.end())
    fail(key, "missing");
  return *it;
}

template <class T>
T get(const json& j, const std::string& key) {
  const json& v = field(j, key);
  bool ok = false;
  if constexpr (std::is_same_v<T, std::string>)
    ok = v.is_string();
  else if constexpr (std::is_floating_point_v<T>)
    ok = v.is_number();
  else
    ok = v.is_number_integer();
  if (!ok)
    fail(key, "expected " +
                std::string{std::is_same_v<T, std::string> ? "a string"
                            : std::is_floating_point_v<T>  ? "a number"
                                                           : "an integer"} +
                ", got " + v.dump());
  return v.get<T>();
}

std::optional<int64_t> get_step(const json& j, const std::string& key) {
  if (field(j, key).is_null())
    return std::nullopt;
  return get<int64_t>(j, key);
}

} // namespace

std::string save_controller_state(const rollout_timing& timing, const group_policy& policy) {
  const policy_memory m = policy.memory();
  const auto& window = timing.rule().durations();
  const auto& relative = timing.rule().relative_lengths();
  return json{{"format", format_name},
              {"format_version", format_version},
              {"policy", m.policy},
              {"last_closed_step", optional_step(timing.last_closed_step())},
              {"window_ns", std::vector<double>(window.begin(), window.end())},
              {"window_relative", std::vector<double>(relative.begin(), relative.end())},
              {"virtual_queue", m.virtual_queue},
              {"truncated", m.truncated},
              {"steps_counted", m.steps_counted},
              {"events_counted", m.events_counted},
              {"event_sum", m.event_sum},
              {"last_observed_step", optional_step(m.last_observed)},
              {"last_decided_step", optional_step(m.last_decided)},
              {"notes", m.notes}}
    .dump();
}

std::string restore_controller_state(std::string_view text, rollout_timing& timing,
                                     group_policy& policy) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw controller_state_error("sagc_controller state: not a JSON object");
  if (get<std::string>(j, "format") != format_name)
    fail("format", "expected \"" + std::string{format_name} + "\", got " + j["format"].dump());
  if (get<int64_t>(j, "format_version") != format_version)
    fail("format_version", "this build reads version " + std::to_string(format_version) + ", got " +
                             j["format_version"].dump());
  const json& w = field(j, "window_ns");
  if (!w.is_array())
    fail("window_ns", "expected an array, got " + w.dump());
  std::vector<double> window;
  for (const auto& d : w) {
    if (!d.is_number() || !std::isfinite(d.get<double>()) || d.get<double>() < 0)
      fail("window_ns", "expected durations >= 0 in ns, got " + d.dump());
    window.push_back(d.get<double>());
  }
  // Absent in states written before the group_tokens rule existed: an empty window.
  std::vector<double> relative;
  if (auto it = j.find("window_relative"); it != j.end()) {
    if (!it->is_array())
      fail("window_relative", "expected an array, got " + it->dump());
    for (const auto& r : *it) {
      if (!r.is_number() || !std::isfinite(r.get<double>()) || r.get<double>() < 0)
        fail("window_relative", "expected relative lengths >= 0, got " + r.dump());
      relative.push_back(r.get<double>());
    }
  }
  const auto last_closed = get_step(j, "last_closed_step");
  if (last_closed && *last_closed < 0)
    fail("last_closed_step", "must be >= 0, got " + std::to_string(*last_closed));

  policy_memory m;
  m.policy = get<std::string>(j, "policy");
  m.virtual_queue = get<double>(j, "virtual_queue");
  m.truncated = get<double>(j, "truncated");
  m.steps_counted = get<int64_t>(j, "steps_counted");
  m.events_counted = get<int64_t>(j, "events_counted");
  // Absent in states written before the group_tokens rule: Σ s_t was the event count.
  m.event_sum = j.contains("event_sum") ? get<double>(j, "event_sum")
                                        : static_cast<double>(m.events_counted);
  m.last_observed = get_step(j, "last_observed_step");
  m.last_decided = get_step(j, "last_decided_step");
  m.notes = get<std::string>(j, "notes");

  // The policy first, against a copy of the restored window: a refused memory then leaves
  // both untouched.
  straggler_rule rule(timing.rule().options());
  for (double d : window)
    rule.add(d);
  for (double r : relative)
    rule.add_relative(r);
  std::string warning;
  const std::string configured = policy.memory().policy;
  try {
    check_policy_memory(m); // also when this run's policy does not use it: corrupt is corrupt
    if (m.policy == configured)
      policy.restore(m, rule);
  } catch (const std::invalid_argument& e) {
    throw controller_state_error("sagc_controller state: " + std::string{e.what()});
  }
  if (m.policy != configured) {
    warning = "the checkpoint's group-size policy is \"" + m.policy + "\", this run's is \"" +
              configured + "\": the straggler window is restored, the policy starts afresh";
  }
  timing.restore(window, last_closed, relative);
  // The policy's window statistics follow the restored window in every case.
  if (m.policy != configured)
    policy.restore(policy.memory(), timing.rule());
  return warning;
}

} // namespace sorl::sagc
