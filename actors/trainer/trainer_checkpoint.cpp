#include "actors/trainer/trainer_checkpoint.hpp"
#include "runtime/role_names.hpp"

#include <stdexcept>

#include <nlohmann/json.hpp>

namespace sorl::trainer {

namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& key, const std::string& what) {
  throw std::invalid_argument("trainer state: key '" + key + "': " + what);
}

const json& field(const json& j, const std::string& key) {
  auto it = j.find(key);
  if (it == j.end())
    fail(key, "missing");
  return *it;
}

uint64_t count(const json& j, const std::string& key) {
  const json& v = field(j, key);
  if (!v.is_number_unsigned())
    fail(key, "expected an integer >= 0, got " + v.dump());
  return v.get<uint64_t>();
}

} // namespace

const std::vector<std::string>& stateful_roles() {
  static const std::vector<std::string> roles{role::sagc_controller, role::scheduler};
  return roles;
}

std::string to_json(const trainer_snapshot& s) {
  json j{{"step", s.step},
         {"next_group_id", s.counters.next_group_id},
         {"next_request_id", s.counters.next_request_id},
         {"task_cursor", s.counters.task_cursor},
         {"reward_history", s.reward_history},
         {"accuracy_before", s.accuracy_before ? json(*s.accuracy_before) : json(nullptr)}};
  if (s.roles) {
    json roles = json::object();
    for (const auto& [role, text] : *s.roles) {
      auto state = json::parse(text, nullptr, false);
      if (state.is_discarded())
        throw std::invalid_argument("trainer state: the " + role + "'s state is not JSON");
      roles[role] = std::move(state);
    }
    j["roles"] = std::move(roles);
  }
  return j.dump();
}

trainer_snapshot parse_trainer_snapshot(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw std::invalid_argument("trainer state: not a JSON object");
  trainer_snapshot s;
  s.step = static_cast<int64_t>(count(j, "step"));
  s.counters.next_group_id = count(j, "next_group_id");
  s.counters.next_request_id = count(j, "next_request_id");
  s.counters.task_cursor = count(j, "task_cursor");
  const json& h = field(j, "reward_history");
  if (!h.is_array())
    fail("reward_history", "expected an array, got " + h.dump());
  for (const auto& r : h) {
    if (!r.is_number())
      fail("reward_history", "expected numbers, got " + r.dump());
    s.reward_history.push_back(r.get<double>());
  }
  if (auto a = j.find("accuracy_before"); a != j.end() && !a->is_null()) {
    if (!a->is_number())
      fail("accuracy_before", "expected a number or null, got " + a->dump());
    s.accuracy_before = a->get<double>();
  }
  if (auto r = j.find("roles"); r != j.end()) {
    if (!r->is_object())
      fail("roles", "expected an object, got " + r->dump());
    s.roles.emplace();
    for (const auto& role : stateful_roles()) {
      auto it = r->find(role);
      if (it == r->end())
        fail("roles." + role, "missing: the checkpoint lacks the " + role + "'s state");
      (*s.roles)[role] = it->dump();
    }
  }
  return s;
}

} // namespace sorl::trainer
