#include <catch2/catch.hpp>

#include <algorithm>

#include "runtime/ml/policy/torch_compat.hpp"
#include <ATen/Parallel.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <vector>

#include "actors/rollout/request_sampling.hpp"
#include "actors/rollout/worker_core.hpp"
#include "actors/rollout/worker_serving.hpp"
#include "actors/sync/weight_receiver.hpp"
#include "runtime/config.hpp"
#include "runtime/envelope.hpp"
#include "runtime/ml/formats/hf_model.hpp"
#include "runtime/ml/formats/tokenizer.hpp"
#include "runtime/ml/policy/sampler.hpp"
#include "tests/actors/rollout/rollout_test_util.hpp"
#include "tests/support/scratch_dir.hpp"

using namespace sorl;
using namespace sorl::rollout;

namespace {

using fixtures::small_dims;

ml::any_task arithmetic() {
  ml::task_options o;
  o.seed = 3;
  return ml::make_task("arithmetic", o);
}

ml::any_task guessing() {
  ml::task_options o;
  o.seed = 3;
  o.number_guess.max_turns = 4;
  return ml::make_task("number_guess", o);
}

rollout_request request(uint64_t id, uint64_t group, uint32_t sample, uint64_t seed,
                        uint32_t max_new = 6) {
  rollout_request r;
  r.request_id = id;
  r.group_id = group;
  r.sample_index = sample;
  r.task_index = group;
  r.seed = seed;
  r.max_new_tokens = max_new;
  r.temperature = 1.0f;
  return r;
}

/// A clock that advances 1000 ns per reading, so timings are exact.
worker_options counting_clock() {
  worker_options o;
  o.max_batch = 16;
  auto t = std::make_shared<int64_t>(0);
  o.clock = [t] { return *t += 1000; };
  return o;
}

std::vector<rollout_result> run(worker_core& w) {
  std::vector<rollout_result> all;
  for (int guard = 0; guard < 1000 && !w.idle(); ++guard)
    for (auto& r : w.step())
      all.push_back(std::move(r));
  REQUIRE(w.idle());
  return all;
}

/// The GenerateRequest as a worker receives it: built, flattened to bytes, parsed back.
rollout_request over_the_wire(const std::function<void(msg::GenerateRequest::Builder)>& fill) {
  const envelope sent = build_envelope<msg::GenerateRequest>(fill);
  auto received = envelope::from_bytes(sent.schema_id(), sent.data(), sent.size_bytes());
  REQUIRE(received);
  auto opened = open_envelope<msg::GenerateRequest>(*received);
  REQUIRE(opened);
  const request_sampling s = read_sampling(opened->root());
  rollout_request r;
  r.max_new_tokens = 8;
  r.temperature = s.temperature;
  r.top_p = s.top_p;
  r.top_k = s.top_k;
  return r;
}

} // namespace

TEST_CASE("a rollout's tokens do not depend on which siblings share its worker") {
  at::set_num_threads(1);
  worker_core together{small_dims(), arithmetic(), counting_clock()};
  for (uint32_t i = 0; i < 4; ++i)
    together.enqueue(request(10 + i, 7, i, 99));
  auto all = run(together);
  REQUIRE(all.size() == 4);

  // Sample 2 alone on another worker (same weights: both are the seed-0 init).
  worker_core alone{small_dims(), arithmetic(), counting_clock()};
  alone.enqueue(request(12, 7, 2, 99));
  auto one = run(alone);
  REQUIRE(one.size() == 1);
  auto it = std::find_if(all.begin(), all.end(),
                         [](const rollout_result& r) { return r.request.sample_index == 2; });
  REQUIRE(it != all.end());
  CHECK(it->response == one[0].response);
  CHECK(it->logprobs == one[0].logprobs);
  // Siblings draw from different streams: not all four identical.
  bool differ = false;
  for (auto& r : all)
    differ = differ || r.response != all[0].response;
  CHECK(differ);
}

TEST_CASE("single-turn rollouts carry masks, log-probs, rewards and exact timing events") {
  at::set_num_threads(1);
  worker_core w{small_dims(), arithmetic(), counting_clock()};
  w.enqueue(request(1, 0, 0, 5, 3));
  w.enqueue(request(2, 0, 1, 5, 3));
  CHECK(w.in_flight() == 2);
  auto all = run(w);
  REQUIRE(all.size() == 2);
  ml::byte_tokenizer tok;
  for (auto& r : all) {
    CHECK(r.prompt.front() == tok.special_id(ml::special_token::bos));
    CHECK(r.response.size() >= 1);
    CHECK(r.response.size() <= 3);
    CHECK(r.loss_mask == std::vector<uint8_t>(r.response.size(), 1));
    CHECK(r.logprobs.size() == r.response.size());
    for (auto lp : r.logprobs)
      CHECK(lp <= 0.0f);
    CHECK(r.reward >= 0.0);
    CHECK(r.reward <= 1.0);
    CHECK(!r.reward_reason.empty());
    CHECK(r.turns == 1);
    CHECK(r.end_ns > r.start_ns);
    if (r.response.size() == 3 && r.response.back() != tok.special_id(ml::special_token::eos))
      CHECK(r.finish == ml::finish_reason::length);
  }
  auto events = w.take_events();
  REQUIRE(events.size() == 4);
  CHECK(events[0].kind == event_kind::start);
  CHECK(events[0].ns == 1000);
  CHECK(events[1].kind == event_kind::start);
  CHECK(events[1].ns == 2000);
  CHECK(events[2].kind == event_kind::finish);
  CHECK(events[3].kind == event_kind::finish);
  CHECK(w.take_events().empty());
}

TEST_CASE("multi-turn rollouts interleave policy tokens with untrained environment turns") {
  at::set_num_threads(1);
  worker_core w{small_dims(), guessing(), counting_clock()};
  w.enqueue(request(1, 0, 0, 11, 4));
  auto all = run(w);
  REQUIRE(all.size() == 1);
  auto& r = all[0];
  ml::byte_tokenizer tok;
  CHECK(r.turns >= 1);
  CHECK(r.turns <= 4);
  REQUIRE(r.loss_mask.size() == r.response.size());
  REQUIRE(r.logprobs.size() == r.response.size());
  size_t env_tokens = 0;
  for (size_t i = 0; i < r.response.size(); ++i)
    if (r.loss_mask[i] == 0) {
      ++env_tokens;
      CHECK(r.logprobs[i] == 0.0f);
    }
  if (r.turns > 1) {
    CHECK(env_tokens > 0);
    // Each environment turn ends by reopening the assistant's turn.
    auto assistant = tok.special_id(ml::special_token::assistant);
    CHECK(std::count(r.response.begin(), r.response.end(), assistant) == r.turns - 1);
  }
  // The prompt is a chat that ends with the open assistant turn.
  CHECK(r.prompt.back() == tok.special_id(ml::special_token::assistant));
  auto chunks = 0;
  for (auto& e : w.take_events())
    chunks += e.kind == event_kind::chunk;
  CHECK(chunks == static_cast<int>(r.turns) - 1);
}

TEST_CASE("a file_search rollout masks exactly the environment's turns, replayed from its actions") {
  at::set_num_threads(1);
  ml::task_options o;
  o.seed = 3;
  o.file_search.max_turns = 6;
  auto task = ml::make_task("file_search", o);
  auto dims = small_dims();
  dims.max_seq = 320;
  worker_core w{dims, task, counting_clock()};
  w.enqueue(request(1, 0, 0, 11, 6));
  w.enqueue(request(2, 1, 0, 12, 6));
  auto all = run(w);
  REQUIRE(all.size() == 2);
  ml::byte_tokenizer tok;
  const auto end_turn = tok.special_id(ml::special_token::end_turn);
  for (auto& r : all) {
    INFO(r.reward_reason);
    REQUIRE(r.loss_mask.size() == r.response.size());
    auto env = task.multi_turn->make_environment();
    env->reset(task.multi_turn->episode_seed(ml::task_split::train, r.request.task_index));
    size_t i = 0, env_turns = 0;
    uint32_t actions = 0;
    while (i < r.response.size()) {
      std::vector<int32_t> action;
      for (; i < r.response.size() && r.loss_mask[i] == 1; ++i)
        action.push_back(r.response[i]);
      ++actions;
      auto step = env->step(tok.decode(action, ml::decode_specials::skip));
      if (i == r.response.size())
        break;
      // The environment's turn, in encode_chat's layout, none of it trained on.
      std::vector<int32_t> expected;
      if (action.empty() || action.back() != end_turn)
        expected.push_back(end_turn);
      expected.push_back(tok.special_id(ml::special_token::user));
      auto obs = tok.encode(step.observation);
      expected.insert(expected.end(), obs.begin(), obs.end());
      expected.push_back(end_turn);
      expected.push_back(tok.special_id(ml::special_token::assistant));
      std::vector<int32_t> got;
      for (; i < r.response.size() && r.loss_mask[i] == 0; ++i) {
        got.push_back(r.response[i]);
        CHECK(r.logprobs[i] == 0.0f);
      }
      CHECK(got == expected);
      ++env_turns;
    }
    CHECK(actions == r.turns);
    CHECK(env_turns + 1 == r.turns);
  }
}

TEST_CASE("multi-turn rollouts continue from parked KV with the full forward's log-probs and free it at "
          "the end") {
  at::set_num_threads(1);
  worker_options o = counting_clock();
  o.chunk_tokens = 0; // chunk events only at turn ends
  worker_core w{small_dims(), guessing(), o};
  {
    // Weights far from uniform attention (std ~0.3), so a wrong key, value or position shows.
    at::NoGradGuard no_grad;
    for (auto& [name, t] : w.model().parameters())
      if (name.find("norm") == std::string::npos)
        t.mul_(15.0);
  }
  w.weights_changed();
  for (uint32_t i = 0; i < 3; ++i)
    w.enqueue(request(1 + i, i, 0, 21 + i, 4));
  auto all = run(w);
  REQUIRE(all.size() == 3);
  // Each episode's last parked KV is freed at its end; what stays is the prefix cache's.
  CHECK(w.kv_blocks_in_use() == w.prefix_cached_blocks());
  size_t continued = 0;
  for (auto& r : all) {
    INFO(r.reward_reason);
    REQUIRE(r.status == rollout_status::ok);
    continued += r.turns >= 2;
    // Temperature 1: each action token's log-prob is log_softmax of the full forward's logits.
    std::vector<int32_t> seq = r.prompt;
    seq.insert(seq.end(), r.response.begin(), r.response.end());
    at::NoGradGuard no_grad;
    const at::Tensor ids = at::tensor(std::vector<int64_t>(seq.begin(), seq.end()), at::kLong).unsqueeze(0);
    const at::Tensor lp = at::log_softmax(w.model().forward(ids).squeeze(0), -1);
    for (size_t i = 0; i < r.response.size(); ++i)
      if (r.loss_mask[i] == 1)
        CHECK(r.logprobs[i] ==
              Approx(lp[static_cast<int64_t>(r.prompt.size() + i) - 1][r.response[i]].item<double>()).margin(1e-4));
  }
  CHECK(continued > 0);

  // Between turns an episode holds its parked KV; aborting it frees it.
  w.enqueue(request(9, 9, 0, 33, 4));
  bool between_turns = false;
  for (int guard = 0; guard < 100 && !between_turns; ++guard) {
    REQUIRE(w.step().empty());
    for (auto& e : w.take_events())
      between_turns = between_turns || e.kind == event_kind::chunk;
  }
  REQUIRE(between_turns);
  CHECK(w.kv_blocks_in_use() > w.prefix_cached_blocks());
  CHECK(w.abort_all().size() == 1);
  CHECK(w.kv_blocks_in_use() == w.prefix_cached_blocks());
}

TEST_CASE("an episode whose next environment turn does not fit ends as truncated at length") {
  at::set_num_threads(1);
  auto task = guessing();
  ml::byte_tokenizer tok;
  auto env = task.multi_turn->make_environment();
  auto first = env->reset(task.multi_turn->episode_seed(ml::task_split::train, 0));
  auto prompt = ml::encode_chat(tok, {ml::chat_message{ml::chat_role::user, first}}, true);
  // Room for the first turn's 6 tokens and 3 more: never for an observation turn after it.
  auto dims = small_dims();
  dims.max_seq = static_cast<int64_t>(prompt.size()) + 6 + 3;
  worker_core w{dims, task, counting_clock()};
  w.enqueue(request(1, 0, 0, 11, 6));
  auto all = run(w);
  REQUIRE(all.size() == 1);
  INFO(all[0].reward_reason);
  CHECK(all[0].status == rollout_status::ok); // its reward so far stands
  CHECK(all[0].turns == 1);
  CHECK(all[0].reward_reason == "context full after 1 turns");
  CHECK(all[0].finish == ml::finish_reason::length);
}

TEST_CASE("abort_all returns every held rollout as aborted with reward 0") {
  at::set_num_threads(1);
  worker_core w{small_dims(), arithmetic(), counting_clock()};
  for (uint32_t i = 0; i < 3; ++i)
    w.enqueue(request(i, 1, i, 5, 6));
  CHECK_THROWS_AS(w.enqueue(request(1, 1, 1, 5, 6)), std::invalid_argument);
  auto finished = w.step().size(); // an EOS at the first token finishes a rollout at once
  auto aborted = w.abort_all();
  CHECK(finished + aborted.size() == 3);
  for (auto& r : aborted) {
    CHECK(r.finish == ml::finish_reason::abort);
    CHECK(r.reward == 0.0);
    CHECK(r.reward_reason == "aborted");
  }
  CHECK(w.idle());
}

TEST_CASE("abort stops chosen rollouts at once and frees their KV while the others go on") {
  at::set_num_threads(1);
  worker_core w{small_dims(), arithmetic(), counting_clock()};
  CHECK(w.kv_blocks_in_use() == 0);
  for (uint32_t i = 0; i < 3; ++i)
    w.enqueue(request(i, 1, i, 5, 40)); // group 1: to be cut
  for (uint32_t i = 0; i < 2; ++i)
    w.enqueue(request(10 + i, 2, i, 9, 40)); // group 2: keeps decoding
  std::vector<rollout_result> early;
  for (int k = 0; k < 3; ++k)
    for (auto& r : w.step())
      early.push_back(std::move(r));
  w.take_events();
  auto blocks_before = w.kv_blocks_in_use();
  REQUIRE(blocks_before > 0);
  size_t group1_live = 0;
  for (uint64_t id : {0, 1, 2})
    group1_live += std::none_of(early.begin(), early.end(),
                                [&](const rollout_result& r) { return r.request.request_id == id; });
  auto aborted = w.abort({0, 1, 2, 999}); // 999: unknown, ignored
  REQUIRE(aborted.size() == group1_live);
  for (auto& r : aborted) {
    CHECK(r.request.group_id == 1);
    CHECK(r.finish == ml::finish_reason::abort);
    CHECK(r.reward == 0.0);
  }
  auto events = w.take_events();
  REQUIRE(events.size() == group1_live);
  for (auto& e : events) {
    CHECK(e.kind == event_kind::finish);
    CHECK(e.reason == ml::finish_reason::abort);
  }
  if (group1_live > 0)
    CHECK(w.kv_blocks_in_use() < blocks_before);
  // Group 2 finishes normally and the cache is empty afterwards.
  auto rest = run(w);
  for (auto& r : rest) {
    CHECK(r.request.group_id == 2);
    CHECK(r.finish != ml::finish_reason::abort);
  }
  CHECK(w.kv_blocks_in_use() == w.prefix_cached_blocks());
  // A rollout still queued (never stepped) is aborted too.
  w.enqueue(request(20, 3, 0, 1, 40));
  auto queued = w.abort({20});
  REQUIRE(queued.size() == 1);
  CHECK(queued[0].finish == ml::finish_reason::abort);
  CHECK(w.idle());
  CHECK(w.step().empty());
}

namespace {

/// A user task whose scorer misbehaves: index 0 throws, index 1 returns NaN, others 0.7.
class faulty_task final : public ml::single_turn_task {
public:
  std::string_view name() const override {
    return "faulty";
  }
  std::optional<uint64_t> size(ml::task_split) const override {
    return 3;
  }
  ml::task_prompt prompt(ml::task_split split, uint64_t index) const override {
    ml::task_prompt p;
    p.split = split;
    p.index = index;
    p.prompt = "q" + std::to_string(index);
    p.reference = "a";
    return p;
  }
  ml::reward_result score(const ml::task_prompt& p, std::string_view) const override {
    if (p.index == 0)
      throw std::runtime_error("scorer exploded");
    if (p.index == 1)
      return {std::nan(""), "nan"};
    return {0.7, "partial"};
  }
  std::optional<std::string> wrong_completion(const ml::task_prompt&, uint64_t) const override {
    return "x";
  }
};

/// An environment that throws on its first step.
class faulty_env final : public ml::environment {
public:
  std::string reset(uint64_t) override {
    return "go";
  }
  ml::env_step step(std::string_view) override {
    throw std::runtime_error("environment exploded");
  }
  int turns() const override {
    return 0;
  }
};

class faulty_multi final : public ml::multi_turn_task {
public:
  std::string_view name() const override {
    return "faulty_env";
  }
  std::unique_ptr<ml::environment> make_environment() const override {
    return std::make_unique<faulty_env>();
  }
  uint64_t episode_seed(ml::task_split, uint64_t index) const override {
    return index;
  }
  int max_turns() const override {
    return 3;
  }
  std::vector<ml::chat_message> demonstrate(uint64_t, bool) const override {
    return {};
  }
};

} // namespace

TEST_CASE("a scorer or environment that throws or returns NaN gives a failed reward and not a 0") {
  at::set_num_threads(1);
  ml::any_task task;
  task.single_turn = std::make_shared<faulty_task>();
  worker_core w{small_dims(), task, counting_clock()};
  for (uint64_t i = 0; i < 3; ++i) {
    auto r = request(i, i, 0, 5, 2);
    r.task_index = i;
    w.enqueue(r);
  }
  std::map<uint64_t, rollout_result> by_id;
  for (auto& r : run(w))
    by_id[r.request.request_id] = r;
  REQUIRE(by_id.size() == 3);
  CHECK(by_id[0].status == rollout_status::reward_failed);
  CHECK(by_id[0].failure == "task error: scorer exploded");
  CHECK(by_id[1].status == rollout_status::reward_failed);
  CHECK(by_id[1].failure == "reward nan is not finite (nan)");
  CHECK(by_id[2].status == rollout_status::ok);
  CHECK(by_id[2].failure.empty());
  CHECK(by_id[2].reward == Approx(0.7));

  ml::any_task multi;
  multi.multi_turn = std::make_shared<faulty_multi>();
  worker_core m{small_dims(), multi, counting_clock()};
  m.enqueue(request(9, 0, 0, 5, 2));
  auto done = run(m);
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == rollout_status::reward_failed);
  CHECK(done[0].failure == "environment error: environment exploded");
  CHECK(done[0].turns == 1);
}

TEST_CASE("a prompt that does not fit the context comes back as a failed rollout and is not dropped") {
  at::set_num_threads(1);
  auto path = std::filesystem::temp_directory_path() / "sorl_worker_long_prompt.jsonl";
  std::ofstream{path} << "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n"
                      << "{\"prompt\": \"" << std::string(600, '7') << "\", \"answer\": \"1\"}\n";
  ml::task_options o;
  o.eval_fraction = 0.0;
  o.jsonl.path = path.string(); // context_tokens = 0: the loader does not check, as a
                                // worker must expect from any task
  auto dims = small_dims();
  dims.max_seq = 512; // the tiny preset's context
  worker_core w{dims, ml::make_task("jsonl", o), counting_clock()};
  for (uint32_t i = 0; i < 2; ++i) {
    auto fits = request(i, 0, i, 5, 2);
    fits.task_index = 0;
    w.enqueue(fits);
    auto too_long = request(2 + i, 1, i, 5, 2);
    too_long.task_index = 1;
    w.enqueue(too_long);
  }
  auto events = w.take_events();
  CHECK(events.size() == 4 + 2); // four starts, and the two failed ones finish at once
  std::map<uint64_t, rollout_result> by_id;
  for (auto& r : run(w))
    by_id[r.request.request_id] = r;
  REQUIRE(by_id.size() == 4);
  for (uint64_t id : {2, 3}) {
    CHECK(by_id[id].status == rollout_status::failed);
    CHECK(by_id[id].failure == "prompt of 601 tokens does not fit the context of 512 tokens");
    CHECK(by_id[id].finish == ml::finish_reason::abort);
    CHECK(by_id[id].response.empty());
  }
  for (uint64_t id : {0, 1})
    CHECK(by_id[id].status == rollout_status::ok);

  // A request the shell refuses (weights of another version) is answered the same way.
  w.take_events();
  w.reject(request(7, 2, 0, 5, 2), "the worker holds weights version 3, the request wants 4");
  CHECK_FALSE(w.idle());
  auto refused = w.step();
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].status == rollout_status::failed);
  CHECK(refused[0].failure == "the worker holds weights version 3, the request wants 4");
  auto ev = w.take_events();
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].kind == event_kind::start);
  CHECK(ev[1].kind == event_kind::finish);
  CHECK(ev[1].reason == ml::finish_reason::abort);
  std::filesystem::remove(path);
}

TEST_CASE("long rollouts report chunk events every chunk_tokens while they decode") {
  at::set_num_threads(1);
  auto opts = counting_clock();
  opts.chunk_tokens = 8;
  worker_core w{small_dims(), arithmetic(), opts};
  w.enqueue(request(1, 0, 0, 21, 40));
  auto done = run(w);
  REQUIRE(done.size() == 1);
  auto len = done[0].response.size();
  std::vector<uint32_t> chunk_tokens;
  for (auto& e : w.take_events())
    if (e.kind == event_kind::chunk)
      chunk_tokens.push_back(e.tokens);
  // Reported after each decode step while the rollout is still live: at 8, 16, ... < len.
  std::vector<uint32_t> expected;
  for (uint32_t k = 8; k < len; k += 8)
    expected.push_back(k);
  CHECK(chunk_tokens == expected);
}

// Sampling parameters from the configuration to the sampler: config → the trainer's
// GenerateRequest (write_sampling) → bytes → the worker (read_sampling) →
// worker_core::sampling_for → sampler.

TEST_CASE("top_p = 0.8 in the config reaches the sampler as exactly 0.8") {
  const auto cfg = parse_config(R"(
[algorithm]
temperature = 0.7
top_p = 0.8
top_k = 272

[[node]]
name = "main"
actors = ["trainer", "rollout_worker"]
)",
                                "test.toml", {"trainer", "rollout_worker"});
  const auto& a = cfg.algorithm;
  // What the trainer's send_requests writes.
  const rollout_request req = over_the_wire([&](msg::GenerateRequest::Builder b) {
    write_sampling(b, {a.temperature, a.top_p, static_cast<uint32_t>(a.top_k)});
  });
  worker_core w(small_dims(), arithmetic());
  for (const uint32_t turn : {0u, 3u}) {
    const ml::sampling_params p = w.sampling_for(req, turn);
    CHECK(p.top_p == 0.8);              // the double 0.8, bit for bit
    CHECK(p.top_p != static_cast<double>(0.8f));
    CHECK(p.temperature == 0.7);
    CHECK(p.top_k == 272);
  }
  // And the sampler keeps exactly {3, 0} of (0.3, 0.1, 0.1, 0.5) with those parameters at T 1.
  ml::sampling_params p = w.sampling_for(req, 0);
  p.temperature = 1.0;
  std::vector<float> logits;
  for (const double q : {0.3, 0.1, 0.1, 0.5}) logits.push_back(static_cast<float>(std::log(q)));
  const auto dist = ml::sampling_distribution(logits.data(), 4, p);
  REQUIRE(dist.size() == 2);
  CHECK(dist[0].token == 3);
  CHECK(dist[1].token == 0);
}

TEST_CASE("a request from a sender without the Float64 fields is read from the Float32 ones") {
  const rollout_request req = over_the_wire([](msg::GenerateRequest::Builder b) {
    b.setTemperature(0.5f);
    b.setTopP(0.75f);
    b.setTopK(7);
  });
  CHECK(req.temperature == 0.5);
  CHECK(req.top_p == 0.75);
  CHECK(req.top_k == 7);
}

TEST_CASE("worker options come from [rollout], with the config's defaults") {
  experiment_config cfg;
  const worker_options plain;
  const auto d = worker_options_from(cfg);
  CHECK(d.max_batch == plain.max_batch);
  CHECK(d.chunk_tokens == plain.chunk_tokens);
  CHECK(d.prefix_cache_bytes == plain.prefix_cache_bytes);
  cfg.rollout.max_batch = 5;
  cfg.rollout.chunk_tokens = 0;
  cfg.rollout.prefix_cache_bytes = 12345;
  const auto o = worker_options_from(cfg);
  CHECK(o.max_batch == 5);
  CHECK(o.chunk_tokens == 0);
  CHECK(o.prefix_cache_bytes == 12345);
  // small_dims: 1 layer x (K, V) x 1 kv head x head_dim 16 x 4 bytes = 128 bytes a token.
  CHECK(worker_core::prefix_cache_tokens(small_dims(), 12345) == 96);
}

TEST_CASE("prompts that share a start reuse its cached KV, a weight change drops it, and rollouts stay "
          "those of a worker without the cache") {
  at::set_num_threads(1);
  auto path = std::filesystem::temp_directory_path() / "sorl_worker_shared_prefix.jsonl";
  const std::string shared(63, 'x');  // <|bos|> + 63 bytes: four whole 16-token blocks
  std::ofstream{path} << "{\"prompt\": \"" << shared << "1+1=\", \"answer\": \"2\"}\n"
                      << "{\"prompt\": \"" << shared << "2+2=\", \"answer\": \"4\"}\n";
  ml::task_options o;
  o.eval_fraction = 0.0;
  o.jsonl.path = path.string();
  auto dims = small_dims();
  dims.max_seq = 512;
  auto with_cache = counting_clock();
  auto without = counting_clock();
  without.prefix_cache_bytes = 0;
  worker_core on{dims, ml::make_task("jsonl", o), with_cache};
  worker_core off{dims, ml::make_task("jsonl", o), without};
  auto serve = [](worker_core& w, std::vector<rollout_request> rs) {
    for (auto& r : rs)
      w.enqueue(r);
    return run(w);
  };
  auto task = [](rollout_request r, uint64_t index) {
    r.task_index = index;
    return r;
  };
  // Sibling 0 alone, then sibling 1 and another prompt with the same start.
  const std::vector<rollout_request> first{task(request(1, 0, 0, 5, 4), 0)};
  const std::vector<rollout_request> later{task(request(2, 0, 1, 5, 4), 0), task(request(3, 1, 0, 6, 4), 1)};
  auto a = serve(on, first), b = serve(off, first);
  auto a2 = serve(on, later), b2 = serve(off, later);
  a.insert(a.end(), a2.begin(), a2.end());
  b.insert(b.end(), b2.begin(), b2.end());
  REQUIRE(a.size() == 3);
  REQUIRE(b.size() == 3);
  std::map<uint64_t, const rollout_result*> ref;
  for (const auto& r : b)
    ref[r.request.request_id] = &r;
  for (const auto& r : a) {
    const auto& p = *ref.at(r.request.request_id);
    CHECK(r.response == p.response);
    REQUIRE(r.logprobs.size() == p.logprobs.size());
    for (size_t i = 0; i < r.logprobs.size(); ++i)
      CHECK(r.logprobs[i] == Approx(p.logprobs[i]).margin(1e-5));
    CHECK(r.prefill.prompt_tokens == 68);
    CHECK(p.prefill.prompt_tokens == 68);
    CHECK(p.prefill.cached_tokens == 0);
    // The first prefilled everything; the others found the four shared blocks.
    CHECK(r.prefill.cached_tokens == (r.request.request_id == 1 ? 0u : 64u));
  }
  const ml::prefill_stats st = on.take_prefill_stats();
  CHECK(st.prompt_tokens == 3 * 68);
  CHECK(st.hit_tokens == 128);
  CHECK(st.computed_tokens == 3 * 68 - 128);
  CHECK(on.prefix_cached_blocks() >= 4);
  on.weights_changed();
  CHECK(on.prefix_cached_blocks() == 0);
  auto again = serve(on, {task(request(4, 2, 0, 7, 4), 1)});
  REQUIRE(again.size() == 1);
  CHECK(again[0].prefill.cached_tokens == 0);
  std::filesystem::remove(path);
}

// The serving rules the worker's shell follows (worker_serving.hpp).

TEST_CASE("a worker refuses a request for weights it does not hold with the exact reason") {
  constexpr auto none = sync::weight_receiver::no_version;
  CHECK(version_refusal(none, 0) ==
        std::optional<std::string>{"the worker holds no weights yet, the request wants version 0"});
  CHECK(version_refusal(3, 4) == std::optional<std::string>{
                                   "the worker holds weights version 3, the request wants version 4"});
  CHECK(version_refusal(4, 3) == std::optional<std::string>{
                                   "the worker holds weights version 4, the request wants version 3"});
  CHECK_FALSE(version_refusal(0, 0));
  CHECK_FALSE(version_refusal(7, 7));

  at::set_num_threads(1);
  worker_core w{small_dims(), arithmetic(), counting_clock()};
  auto stale = request(1, 0, 0, 5, 2);
  stale.weight_version = 2;
  auto served = request(2, 1, 0, 5, 2);
  served.weight_version = 3;
  const auto refused = admit(w, stale, 3);
  CHECK(refused.held);
  CHECK(refused.refusal == "the worker holds weights version 3, the request wants version 2");
  CHECK(refused.error.empty());
  const auto taken = admit(w, served, 3);
  CHECK(taken.held);
  CHECK(taken.refusal.empty());
  CHECK(taken.error.empty());
  const auto again = admit(w, served, 3); // the rollout in flight answers for it
  CHECK_FALSE(again.held);
  CHECK(again.refusal.empty());
  CHECK(again.error == "rollout 2 is already held");
  std::map<uint64_t, rollout_result> by_id;
  for (int guard = 0; guard < 100 && !w.idle(); ++guard) {
    auto t = decode_tick(w, "w");
    REQUIRE_FALSE(t.failure);
    for (auto& r : t.results)
      by_id[r.request.request_id] = r;
  }
  REQUIRE(by_id.size() == 2);
  CHECK(by_id[1].status == rollout_status::failed);
  CHECK(by_id[1].failure == "the worker holds weights version 3, the request wants version 2");
  CHECK(by_id[1].finish == ml::finish_reason::abort);
  CHECK(by_id[1].response.empty());
  CHECK(by_id[2].status == rollout_status::ok);
  CHECK_FALSE(by_id[2].response.empty());
}

TEST_CASE("a decoding failure fails the rollouts it cut and keeps those that ended before it") {
  auto held_rollout = [](uint64_t id, ml::finish_reason finish, rollout_status status,
                         std::string failure, double reward, std::string reason) {
    rollout_result r;
    r.request.request_id = id;
    r.finish = finish;
    r.status = status;
    r.failure = std::move(failure);
    r.reward = reward;
    r.reward_reason = std::move(reason);
    r.response = {5, 6};
    return r;
  };
  std::vector<rollout_result> held{
    held_rollout(1, ml::finish_reason::eos, rollout_status::ok, "", 1.0, "correct"),
    held_rollout(2, ml::finish_reason::abort, rollout_status::ok, "", 0.0, "aborted"),
    held_rollout(3, ml::finish_reason::abort, rollout_status::failed, "refused", 0.0, "refused"),
    held_rollout(4, ml::finish_reason::length, rollout_status::reward_failed, "task error: x",
                 0.0, "task error: x"),
    held_rollout(5, ml::finish_reason::abort, rollout_status::ok, "", 0.0, "aborted"),
  };
  const auto before = held;
  mark_cut_by_failure(held, "rollout_worker#1@n", "out of memory");
  REQUIRE(held.size() == 5);
  const std::string why = "decoding failed on rollout_worker#1@n: out of memory";
  for (size_t i : {1, 4}) { // aborted while ok: cut by the failure
    CHECK(held[i].status == rollout_status::failed);
    CHECK(held[i].failure == why);
    CHECK(held[i].reward_reason == why);
    CHECK(held[i].reward == 0.0);
    CHECK(held[i].finish == ml::finish_reason::abort);
    CHECK(held[i].request.request_id == before[i].request.request_id);
  }
  for (size_t i : {0, 2, 3}) { // finished, refused or reward-failed before it: as they were
    CHECK(held[i].status == before[i].status);
    CHECK(held[i].failure == before[i].failure);
    CHECK(held[i].reward_reason == before[i].reward_reason);
    CHECK(held[i].reward == before[i].reward);
    CHECK(held[i].finish == before[i].finish);
  }
  CHECK(held[0].status == rollout_status::ok); // still trained on

  // On a core: a refusal that waits in the core keeps its reason, a live rollout is cut.
  at::set_num_threads(1);
  worker_core w{small_dims(), arithmetic(), counting_clock()};
  w.enqueue(request(10, 0, 0, 5, 6));
  w.reject(request(11, 1, 0, 5, 6), "refused");
  auto lost = abort_after_decode_failure(w, "w", "boom");
  CHECK(w.idle());
  std::map<uint64_t, rollout_result> by_id;
  for (auto& r : lost)
    by_id[r.request.request_id] = r;
  REQUIRE(by_id.size() == 2);
  CHECK(by_id[10].status == rollout_status::failed);
  CHECK(by_id[10].failure == "decoding failed on w: boom");
  CHECK(by_id[11].status == rollout_status::failed);
  CHECK(by_id[11].failure == "refused");
}

TEST_CASE("every timing event goes to the controller and the scheduler, a start also to the "
          "trainer") {
  auto to = [](event_kind kind) {
    std::string out;
    for (auto p : event_destinations(kind))
      out += p == event_peer::sagc_controller ? "sagc_controller "
             : p == event_peer::scheduler     ? "scheduler "
                                              : "trainer ";
    return out;
  };
  CHECK(to(event_kind::start) == "sagc_controller scheduler trainer ");
  CHECK(to(event_kind::chunk) == "sagc_controller scheduler ");
  CHECK(to(event_kind::finish) == "sagc_controller scheduler ");
}

TEST_CASE("the weight receiver sees every bf16 parameter of the rollout model, in model order") {
  at::set_num_threads(1);
  worker_core w{small_dims(), arithmetic(), counting_clock()};
  const auto layout = receiver_layout_of(w.sync_targets());
  // small_dims: vocab 272, d_model 32, one layer, 2 heads / 1 kv head of 16, d_ff 64, tied.
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want{
    {"model.embed_tokens.weight", {272, 32}},
    {"model.layers.0.self_attn.q_proj.weight", {32, 32}},
    {"model.layers.0.self_attn.k_proj.weight", {16, 32}},
    {"model.layers.0.self_attn.v_proj.weight", {16, 32}},
    {"model.layers.0.self_attn.o_proj.weight", {32, 32}},
    {"model.layers.0.mlp.gate_proj.weight", {64, 32}},
    {"model.layers.0.mlp.up_proj.weight", {64, 32}},
    {"model.layers.0.mlp.down_proj.weight", {32, 64}},
    {"model.layers.0.input_layernorm.weight", {32}},
    {"model.layers.0.post_attention_layernorm.weight", {32}},
    {"model.norm.weight", {32}},
  };
  const std::vector<uint64_t> elements{8704, 1024, 512, 512, 1024, 2048, 2048, 2048, 32, 32, 32};
  REQUIRE(layout.expected.size() == want.size());
  REQUIRE(layout.targets.size() == want.size());
  uint64_t total = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(layout.expected[i].name == want[i].first);
    CHECK(layout.expected[i].shape == want[i].second);
    CHECK(layout.expected[i].dtype == sync::weight_dtype::bf16);
    CHECK(layout.expected[i].hash == 0);
    CHECK(layout.targets[i].tensor == i);
    CHECK(layout.targets[i].elements == elements[i]);
    CHECK(layout.expected[i].elements() == elements[i]);
    CHECK(static_cast<void*>(layout.targets[i].bits) == w.model().parameters()[i].second.data_ptr());
    total += layout.targets[i].elements;
  }
  CHECK(total == 18016);
  CHECK(static_cast<int64_t>(total) == small_dims().parameter_count());

  const ml::policy_model fp32{small_dims(), 0};
  CHECK_THROWS_WITH(receiver_layout_of(fp32.parameters()),
                    "rollout parameter \"model.embed_tokens.weight\" is not contiguous bf16");
}

TEST_CASE("a Hugging Face prompt format encodes single-turn prompts with its chat template") {
  at::set_num_threads(1);
  sorl::test::scratch_dir scratch{"worker_core_hf_format"};
  const auto dir = scratch.path / "model";
  ml::save_hf_byte_model(ml::policy_model{small_dims(), 9}, dir, ml::sorl_prompt_format::chat, at::kFloat);
  ml::byte_tokenizer tok;
  const auto format = ml::prompt_format::hugging_face(
    dir, {tok.special_id(ml::special_token::eos), tok.special_id(ml::special_token::end_turn)});
  auto task = arithmetic();
  worker_core w{small_dims(), task, counting_clock(), format};
  const auto req = request(1, 4, 0, 5, 3);
  CHECK(w.sampling_for(req, 0).eos_token_ids == format.stop_ids());
  w.enqueue(req);
  auto all = run(w);
  REQUIRE(all.size() == 1);
  const auto text = task.single_turn->prompt(ml::task_split::train, 4).prompt;
  // One user message of the directory's template (sorl's turn format here), not <|bos|> + text.
  CHECK(all[0].prompt == format.single_turn(text));
  CHECK(all[0].prompt == ml::encode_chat(tok, {{ml::chat_role::user, text}}, true));
  CHECK(all[0].status == rollout_status::ok);

  CHECK_THROWS_WITH((worker_core{small_dims(), guessing(), counting_clock(), format}),
                    Catch::Contains("multi-turn task 'number_guess' needs sorl's byte format"));
}
