#include "actors/trainer/trainer_checkpoint.hpp"

#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>

using namespace sorl::trainer;

TEST_CASE("the trainer's checkpoint state round-trips with every role's state") {
  trainer_snapshot s;
  s.step = 3;
  s.counters = {12, 48, 11};
  s.reward_history = {0.25, 0.5, 0.1};
  s.accuracy_before = 0.375;
  s.roles = std::map<std::string, std::string>{{"sagc_controller", "{\"virtual_queue\":1.8}"},
                                               {"scheduler", "{\"round_robin_last\":\"w\"}"}};
  auto back = parse_trainer_snapshot(to_json(s));
  CHECK(back.step == 3);
  CHECK(back.counters.next_group_id == 12);
  CHECK(back.counters.next_request_id == 48);
  CHECK(back.counters.task_cursor == 11);
  CHECK(back.reward_history == s.reward_history); // doubles round-trip exactly
  CHECK(back.accuracy_before == 0.375);
  REQUIRE(back.roles);
  CHECK(back.roles->at("sagc_controller") == "{\"virtual_queue\":1.8}");
  CHECK(back.roles->at("scheduler") == "{\"round_robin_last\":\"w\"}");
}

TEST_CASE("a trainer state written before roles' state was saved loads without it") {
  auto s = parse_trainer_snapshot("{\"step\":2,\"next_group_id\":8,\"next_request_id\":32,"
                                  "\"task_cursor\":8,\"reward_history\":[0.5,0.25]}");
  CHECK(s.step == 2);
  CHECK(s.reward_history.size() == 2);
  CHECK_FALSE(s.roles);
  CHECK_FALSE(s.accuracy_before);
}

TEST_CASE("a corrupt trainer state is refused by key") {
  const std::string base = "\"next_group_id\":8,\"next_request_id\":32,\"task_cursor\":8,"
                           "\"reward_history\":[0.5]";
  struct bad_case {
    std::string text;
    std::string says;
  };
  for (const auto& c : std::vector<bad_case>{
         {"", "not a JSON object"},
         {"{\"step\":2," + base.substr(0, 20), "not a JSON object"},
         {"{" + base + "}", "'step': missing"},
         {"{\"step\":-1," + base + "}", "'step': expected an integer >= 0"},
         {"{\"step\":\"2\"," + base + "}", "'step': expected an integer >= 0"},
         {"{\"step\":2," + base + ",\"roles\":{\"scheduler\":{}}}",
          "'roles.sagc_controller': missing"},
         {"{\"step\":2," + base + ",\"roles\":[]}", "'roles': expected an object"},
       }) {
    INFO(c.text);
    try {
      parse_trainer_snapshot(c.text);
      FAIL("parsed a corrupt trainer state");
    } catch (const std::invalid_argument& e) {
      CHECK_THAT(e.what(), Catch::Contains(c.says));
    }
  }
}
