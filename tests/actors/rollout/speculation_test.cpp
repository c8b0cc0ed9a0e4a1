// Suffix speculative decoding in the rollout worker: rollouts are the plain ones, drafts come
// from siblings, the rollout's own text and earlier responses, and the load-aware switch
// chooses by measured throughput.

#include <catch2/catch.hpp>

#include <ATen/Parallel.h>

#include <algorithm>
#include <map>
#include <vector>

#include "actors/rollout/speculation_switch.hpp"
#include "actors/rollout/worker_core.hpp"
#include "runtime/config.hpp"
#include "tests/actors/rollout/rollout_test_util.hpp"

using namespace sorl;
using namespace sorl::rollout;

namespace {


ml::any_task task(const std::string& name) {
  ml::task_options o;
  o.seed = 3;
  o.number_guess.max_turns = 3;
  return ml::make_task(name, o);
}

rollout_request request(uint64_t id, uint64_t group, uint32_t sample, double temperature, uint32_t max_new) {
  rollout_request r;
  r.request_id = id;
  r.group_id = group;
  r.sample_index = sample;
  r.task_index = group % 2;  // groups 0 and 2 (1 and 3) share a prompt
  r.seed = 1000 + group;
  r.max_new_tokens = max_new;
  r.temperature = temperature;
  return r;
}

std::map<uint64_t, rollout_result> run(worker_core& w) {
  std::map<uint64_t, rollout_result> out;
  for (int guard = 0; guard < 5000 && !w.idle(); ++guard)
    for (auto& r : w.step())
      out[r.request.request_id] = std::move(r);
  REQUIRE(w.idle());
  return out;
}

// Two waves of two groups of 4; the second wave asks the first wave's prompts again.
std::map<uint64_t, rollout_result> waves(speculation_mode mode, const std::string& task_name, double temperature,
                                         uint32_t max_new) {
  worker_options o;
  o.max_batch = 16;
  o.speculative = mode;
  o.drafter.max_depth = 16;
  o.drafter.draft.max_tokens = 6;
  worker_core w{fixtures::small_dims(128), task(task_name), o};
  std::map<uint64_t, rollout_result> all;
  uint64_t id = 1;
  for (uint64_t wave = 0; wave < 2; ++wave) {
    for (uint64_t g = 2 * wave; g < 2 * wave + 2; ++g)
      for (uint32_t i = 0; i < 4; ++i)
        w.enqueue(request(id++, g, i, temperature, max_new));
    for (auto& [k, r] : run(w))
      all[k] = std::move(r);
  }
  return all;
}

void check_same(const std::map<uint64_t, rollout_result>& got, const std::map<uint64_t, rollout_result>& ref) {
  REQUIRE(got.size() == ref.size());
  for (const auto& [k, r] : ref) {
    const rollout_result& g = got.at(k);
    CHECK(g.response == r.response);
    CHECK(g.loss_mask == r.loss_mask);
    CHECK(g.reward == r.reward);
    CHECK(g.finish == r.finish);
    CHECK(g.turns == r.turns);
    REQUIRE(g.logprobs.size() == r.logprobs.size());
    for (size_t j = 0; j < r.logprobs.size(); ++j)
      CHECK(g.logprobs[j] == Approx(r.logprobs[j]).margin(1e-5));
  }
}

speculation_counts total(const std::map<uint64_t, rollout_result>& rs, uint64_t from_id = 0) {
  speculation_counts t;
  for (const auto& [k, r] : rs) {
    if (k < from_id)
      continue;
    t += r.speculation;
  }
  return t;
}

} // namespace

TEST_CASE("speculative rollouts are the plain rollouts for single-turn and multi-turn tasks") {
  at::set_num_threads(1);
  for (const std::string name : {"arithmetic", "number_guess"}) {
    for (const double temperature : {0.0, 1.0}) {
      CAPTURE(name, temperature);
      const auto plain = waves(speculation_mode::off, name, temperature, 24);
      const speculation_counts none = total(plain);
      CHECK(none.verify_steps + none.plain_steps + none.draft_calls == 0);
      for (const auto mode : {speculation_mode::on, speculation_mode::automatic}) {
        const auto spec = waves(mode, name, temperature, 24);
        check_same(spec, plain);
        const speculation_counts t = total(spec);
        CHECK(t.draft_calls > 0);
        CHECK(t.accepted_tokens <= t.drafted_tokens);
        if (mode == speculation_mode::on)
          CHECK(t.plain_steps + t.verify_steps > 0);
      }
    }
  }
}

TEST_CASE("greedy rollouts of a prompt seen before are drafted from earlier responses and accepted") {
  at::set_num_threads(1);
  const auto spec = waves(speculation_mode::on, "arithmetic", 0.0, 24);
  // Second wave (request ids 9..16): the same prompts, greedy, so the global tree holds the
  // exact continuation and every draft of a long enough match is accepted.
  const speculation_counts second = total(spec, 9);
  CHECK(second.drafted_tokens > 0);
  CHECK(second.accepted_tokens == second.drafted_tokens);
  for (uint64_t id = 9; id <= 16; ++id)
    CHECK(spec.at(id).response == spec.at(id - 8).response);
  // Fewer decode steps than tokens: speculation saved forward passes.
  uint64_t tokens = 0;
  for (uint64_t id = 9; id <= 16; ++id)
    tokens += spec.at(id).response.size() - 1;  // the first token comes from the prefill
  CHECK(second.verify_steps + second.plain_steps < tokens);
}

TEST_CASE("finished turns one worker hands to another draft the other's greedy rollouts") {
  at::set_num_threads(1);
  worker_options o;
  o.max_batch = 16;
  o.speculative = speculation_mode::on;
  o.drafter.max_depth = 16;
  o.drafter.draft.max_tokens = 6;
  auto serve = [&](worker_core& w) {
    uint64_t id = 1;
    for (uint64_t g = 0; g < 2; ++g)
      for (uint32_t i = 0; i < 4; ++i)
        w.enqueue(request(id++, g, i, 0.0, 24));
    return run(w);
  };
  worker_core a{fixtures::small_dims(128), task("arithmetic"), o};
  const auto from_a = serve(a);
  auto turns = a.take_finished_turns();
  // Single-turn: one finished turn per rollout, its whole response.
  REQUIRE(turns.size() == from_a.size());
  std::vector<std::vector<int32_t>> responses;
  for (const auto& [k, r] : from_a)
    responses.push_back(r.response);
  std::sort(responses.begin(), responses.end());
  std::sort(turns.begin(), turns.end());
  CHECK(turns == responses);
  CHECK(a.take_finished_turns().empty());

  worker_core with{fixtures::small_dims(128), task("arithmetic"), o};
  CHECK(with.add_peer_responses(turns) == turns.size());
  worker_core without{fixtures::small_dims(128), task("arithmetic"), o};
  const auto got_with = serve(with);
  const auto got_without = serve(without);
  // Speculation never changes a rollout; the peer's text changes how many passes it takes.
  check_same(got_with, from_a);
  check_same(got_without, from_a);
  const speculation_counts w = total(got_with);
  const speculation_counts wo = total(got_without);
  CHECK(w.accepted_tokens > 0);
  CHECK(w.accepted_tokens > wo.accepted_tokens);
  CHECK(w.verify_steps + w.plain_steps < wo.verify_steps + wo.plain_steps);
}

TEST_CASE("a worker skips peer responses with token ids outside its vocabulary") {
  worker_options o;
  o.speculative = speculation_mode::on;
  const ml::model_dims dims = fixtures::small_dims(128);
  const auto vocab = static_cast<int32_t>(dims.vocab);
  worker_core w{dims, task("arithmetic"), o};
  const std::vector<std::vector<int32_t>> peer{
    {1, 2, 3}, {-1, 4}, {5, vocab}, {}, {vocab - 1, 0}, {7, 2147483647}};
  CHECK(w.add_peer_responses(peer) == 2);
  CHECK(w.take_drafter_stats()->added_responses == 2);
  // Speculation off keeps no suffix trees: nothing is taken and no turn is collected.
  o.speculative = speculation_mode::off;
  worker_core off{dims, task("arithmetic"), o};
  CHECK_FALSE(off.drafting());
  CHECK(off.add_peer_responses(peer) == 0);
  off.enqueue(request(1, 0, 0, 0.0, 8));
  CHECK(run(off).size() == 1);
  CHECK(off.take_finished_turns().empty());
}

TEST_CASE("a multi-turn rollout hands over one finished turn per policy turn") {
  at::set_num_threads(1);
  worker_options o;
  o.speculative = speculation_mode::automatic;
  worker_core w{fixtures::small_dims(128), task("number_guess"), o};
  for (uint32_t i = 0; i < 4; ++i)
    w.enqueue(request(i + 1, 0, i, 1.0, 12));
  const auto results = run(w);
  size_t turns = 0;
  for (const auto& [k, r] : results)
    turns += r.turns;
  const auto finished = w.take_finished_turns();
  CHECK(finished.size() == turns);
  CHECK(turns > results.size());
}

TEST_CASE("worker options carry rollout.speculative and the drafter settings") {
  experiment_config cfg;
  CHECK(worker_options_from(cfg).speculative == speculation_mode::off);
  cfg.rollout.speculative = "auto";
  cfg.rollout.draft_max_tokens = 9;
  cfg.rollout.draft_min_token_prob = 0.25;
  cfg.rollout.draft_spec_factor = 1.5;
  cfg.rollout.suffix_max_depth = 20;
  cfg.rollout.suffix_global_bytes = 12345;
  const worker_options o = worker_options_from(cfg);
  CHECK(o.speculative == speculation_mode::automatic);
  CHECK(o.drafter.draft.max_tokens == 9);
  CHECK(o.drafter.draft.min_token_prob == 0.25);
  CHECK(o.drafter.draft.spec_factor == 1.5);
  CHECK(o.drafter.max_depth == 20);
  CHECK(o.drafter.global_bytes == 12345);
  cfg.rollout.speculative = "on";
  CHECK(worker_options_from(cfg).speculative == speculation_mode::on);
}

TEST_CASE("the load-aware switch measures every arm per batch bucket and keeps the fastest") {
  CHECK(speculation_switch::bucket(1) == 0);
  CHECK(speculation_switch::bucket(3) == 1);
  CHECK(speculation_switch::bucket(4) == 2);
  CHECK(speculation_switch::bucket(64) == 6);
  CHECK(speculation_switch(16).arms() == std::vector<int32_t>{0, 4, 8, 16});
  CHECK(speculation_switch(2).arms() == std::vector<int32_t>{0, 1, 2});
  CHECK(speculation_switch(1).arms() == std::vector<int32_t>{0, 1});
  speculation_switch sw(8, 2, 4, 0.5);
  // Warm-up: two steps per arm, the longest draft first, off last. At batch 1 drafts of up to
  // 2 tokens emit 3 tokens per ms, up to 4: 2.5, up to 8: 2, off: 1.
  const std::map<int32_t, int64_t> per_ms{{0, 1}, {2, 3}, {4, 25}, {8, 2}};
  for (const int32_t expect : {8, 8, 4, 4, 2, 2, 0, 0}) {
    const int32_t cap = sw.decide(1);
    CHECK(cap == expect);
    const int64_t tokens = cap == 4 ? 25 : per_ms.at(cap) * 10;
    sw.observe(1, cap, tokens, 10'000'000);
  }
  CHECK(sw.rate(0, 2) == Approx(3000.0));
  CHECK(sw.rate(0, 4) == Approx(2500.0));
  CHECK(sw.rate(0, 0) == Approx(1000.0));
  // Chosen: up to 2, with every 4th decision re-trying another arm in turn (0, 4, 8, ...).
  std::vector<int32_t> picks;
  for (int i = 0; i < 12; ++i)
    picks.push_back(sw.decide(1));
  CHECK(picks == std::vector<int32_t>{2, 2, 2, 0, 2, 2, 2, 4, 2, 2, 2, 8});
  const auto log = sw.take_log();
  REQUIRE(log.size() == 1);
  CHECK(log[0] == "speculation at batch 1-1: drafts of up to 2 tokens; tokens/s up to 8: 2000.0 (2 steps), "
                  "up to 4: 2500.0 (2 steps), up to 2: 3000.0 (2 steps), off: 1000.0 (2 steps)");
  CHECK(sw.take_log().empty());
  // Batch 40 is its own bucket (32-63), where plain decoding wins; measurements move the
  // running mean by the smoothing weight.
  for (int i = 0; i < 8; ++i) {
    const int32_t cap = sw.decide(40);
    sw.observe(40, cap, cap == 0 ? 80 : 50, 1'000'000);
  }
  CHECK(sw.decide(40) == 0);
  CHECK(sw.take_log().at(0).rfind("speculation at batch 32-63: off;", 0) == 0);
  sw.observe(40, 0, 40, 1'000'000); // 0.5 * 80000 + 0.5 * 40000
  CHECK(sw.rate(5, 0) == Approx(60000.0));
  sw.observe(40, 0, 0, 1'000'000); // ignored: no tokens
  sw.observe(40, 0, 10, 0);        // ignored: no time
  sw.observe(40, 3, 10, 1000);     // ignored: not an arm
  CHECK(sw.rate(5, 0) == Approx(60000.0));
  CHECK_THROWS_AS(speculation_switch(0), std::invalid_argument);
  CHECK_THROWS_AS(speculation_switch(8, 0, 4, 0.5), std::invalid_argument);
  CHECK_THROWS_AS(speculation_switch(8, 1, 1, 0.5), std::invalid_argument);
  CHECK_THROWS_AS(speculation_switch(8, 1, 4, 0.0), std::invalid_argument);
}
