#include "actors/scheduler/placement.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <optional>

namespace sorl::scheduler {

std::string save_placement_state(const placement& p) {
  nlohmann::json j{
    {"format", "sorl.scheduler"}, {"format_version", 1}, {"round_robin_last", p.round_robin_last()}};
  if (const auto e = p.generation_estimate())
    j["generation_estimate"] = *e;
  return j.dump();
}

void restore_placement_state(std::string_view text, placement& p) {
  auto j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw std::invalid_argument("scheduler state: not a JSON object");
  auto expect = [&](const char* key, bool ok, const char* what) {
    if (!j.contains(key))
      throw std::invalid_argument(std::string{"scheduler state: key '"} + key + "': missing");
    if (!ok)
      throw std::invalid_argument(std::string{"scheduler state: key '"} + key + "': expected " +
                                  what + ", got " + j[key].dump());
  };
  expect("format", j.contains("format") && j["format"] == "sorl.scheduler", "\"sorl.scheduler\"");
  expect("format_version", j.contains("format_version") && j["format_version"] == 1, "1");
  expect("round_robin_last", j.contains("round_robin_last") && j["round_robin_last"].is_string(),
         "a string");
  std::optional<double> estimate;
  if (j.contains("generation_estimate")) {
    const auto& e = j["generation_estimate"];
    if (!e.is_number() || !std::isfinite(e.get<double>()) || e.get<double>() < 0)
      throw std::invalid_argument("scheduler state: key 'generation_estimate': expected a number "
                                  ">= 0 (tokens), got " + e.dump());
    estimate = e.get<double>();
  }
  p.restore_round_robin(j["round_robin_last"].get<std::string>());
  p.restore_generation_estimate(estimate);
}

} // namespace sorl::scheduler
