// Tests of the held-out evaluation (runtime/ml/train/evaluate.hpp) and the supervised warm start
// (runtime/ml/train/sft.hpp). Models are a few thousand parameters and tasks a handful of problems,
// so the whole file runs in seconds on 2 cores.

#include "runtime/ml/formats/checkpoint.hpp"
#include "runtime/ml/formats/tokenizer.hpp"
#include "runtime/ml/policy/generate.hpp"
#include "runtime/ml/tasks/reward_process.hpp"
#include "runtime/ml/train/evaluate.hpp"
#include "runtime/ml/train/sft.hpp"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <limits>
#include <numeric>
#include <set>
#include <string>

using namespace sorl::ml;
namespace fs = std::filesystem;

namespace {

// A model just big enough to memorise a handful of short answers; vocab covers the byte
// tokenizer.
model_dims test_dims() {
  model_dims d;
  d.vocab = byte_tokenizer::size;
  d.d_model = 32;
  d.n_layers = 2;
  d.n_heads = 4;
  d.n_kv_heads = 2;
  d.d_ff = 64;
  d.max_seq = 128;
  return d;
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(SORL_TEST_DATA_DIR) / ("sft_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Eight one-character problems with integer answers; train and eval are the same file, so
// eval accuracy measures memorisation, which a tiny model reaches in tens of steps.
any_task memorise_task(const std::string& name) {
  const fs::path path = scratch(name) / "problems.jsonl";
  std::ofstream out(path);
  const char* answers[] = {"3", "17", "5", "42", "8", "11", "29", "60"};
  for (int i = 0; i < 8; ++i)
    out << "{\"prompt\": \"" << static_cast<char>('a' + i) << "?\", \"answer\": \"" << answers[i]
        << "\"}\n";
  out.close();
  task_options t;
  t.jsonl.path = path.string();
  t.jsonl.eval_path = path.string();
  t.jsonl.match = answer_match::integer;
  return make_task("jsonl", t);
}

sft_options small_options() {
  sft_options o;
  o.dims = test_dims();
  o.steps = 60;
  o.batch_size = 8;
  o.lr = 1e-2;
  o.warmup_steps = 5;
  o.wrong_fraction = 0.0;
  o.eval_count = 8;
  o.eval_before = false;
  o.eval_max_new_tokens = 6;
  o.seed = 7;
  o.task = "jsonl";
  return o;
}

// A single-turn task whose reward is a function of the prompt index alone, so accuracy can be
// computed by hand whatever the (untrained) model emits: index % 3 == 0 → 1, == 1 → 0.5,
// == 2 → 0. The split holds 12 prompts.
class stub_task final : public single_turn_task {
 public:
  std::string_view name() const override { return "stub"; }
  std::optional<std::uint64_t> size(task_split) const override { return 12; }
  task_prompt prompt(task_split split, std::uint64_t index) const override {
    if (index >= 12) throw std::out_of_range("stub: index");
    return {split, index, "q" + std::to_string(index) + "=", std::to_string(index)};
  }
  reward_result score(const task_prompt& p, std::string_view) const override {
    const double r = p.index % 3 == 0 ? 1.0 : p.index % 3 == 1 ? 0.5 : 0.0;
    return {r, "stub " + std::to_string(p.index)};
  }
  std::optional<std::string> wrong_completion(const task_prompt&, std::uint64_t) const override {
    return "x";
  }
};

// stub_task's rewards, except that the reward of the prompts in `failing` fails as a reward
// process's does (a null with a reason), and that of `not_finite` is NaN.
class failing_stub_task final : public single_turn_task {
 public:
  failing_stub_task(std::set<std::uint64_t> failing, std::set<std::uint64_t> not_finite)
      : failing_(std::move(failing)), not_finite_(std::move(not_finite)) {}
  std::string_view name() const override { return "failing_stub"; }
  std::optional<std::uint64_t> size(task_split s) const override { return stub_.size(s); }
  task_prompt prompt(task_split split, std::uint64_t index) const override { return stub_.prompt(split, index); }
  reward_result score(const task_prompt& p, std::string_view completion) const override {
    if (failing_.count(p.index) != 0) throw reward_failed_error(reward_failure::scorer, "scorer: no integer answer");
    if (not_finite_.count(p.index) != 0) return {std::numeric_limits<double>::quiet_NaN(), "nan"};
    return stub_.score(p, completion);
  }
  std::optional<std::string> wrong_completion(const task_prompt& p, std::uint64_t n) const override {
    return stub_.wrong_completion(p, n);
  }

 private:
  stub_task stub_;
  std::set<std::uint64_t> failing_;
  std::set<std::uint64_t> not_finite_;
};

// An environment that ends after (seed % 3) + 1 actions and pays 1 at the end when the seed is
// even; it also checks that each action comes back as text.
class stub_env final : public environment {
 public:
  std::string reset(std::uint64_t seed) override {
    seed_ = seed;
    turns_ = 0;
    return "start " + std::to_string(seed);
  }
  env_step step(std::string_view) override {
    ++turns_;
    env_step s;
    if (turns_ == static_cast<int>(seed_ % 3) + 1) {
      s.done = true;
      s.reward = seed_ % 2 == 0 ? 1.0 : 0.0;
      s.reason = "end";
    } else {
      s.observation = "again";
    }
    return s;
  }
  int turns() const override { return turns_; }

 private:
  std::uint64_t seed_ = 0;
  int turns_ = 0;
};

// stub_env, except that its first step throws in the episode of seed `failing`.
class failing_env final : public environment {
 public:
  explicit failing_env(std::uint64_t failing) : failing_(failing) {}
  std::string reset(std::uint64_t seed) override {
    seed_ = seed;
    return env_.reset(seed);
  }
  env_step step(std::string_view action) override {
    if (seed_ == failing_) throw std::runtime_error("environment: checker crashed");
    return env_.step(action);
  }
  int turns() const override { return env_.turns(); }

 private:
  stub_env env_;
  std::uint64_t failing_;
  std::uint64_t seed_ = 0;
};

class stub_multi_task final : public multi_turn_task {
 public:
  /// `failing`: the episode seed whose environment throws (failing_env); none by default.
  explicit stub_multi_task(std::optional<std::uint64_t> failing = std::nullopt) : failing_(failing) {}
  std::string_view name() const override { return "stub_multi"; }
  std::unique_ptr<environment> make_environment() const override {
    if (failing_) return std::make_unique<failing_env>(*failing_);
    return std::make_unique<stub_env>();
  }
  std::uint64_t episode_seed(task_split, std::uint64_t index) const override { return index; }
  int max_turns() const override { return 5; }
  std::vector<chat_message> demonstrate(std::uint64_t, bool) const override {
    return {{chat_role::user, "start"}, {chat_role::assistant, "1"}};
  }

 private:
  std::optional<std::uint64_t> failing_;
};

// Six episodes of up to 3 tokens an action, every one kept as a sample.
eval_options six_episodes() {
  eval_options o;
  o.count = 6;
  o.max_new_tokens = 3;
  o.keep_samples = 6;
  return o;
}

bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor x = a.detach().contiguous(), y = b.detach().contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

double mean(const std::vector<double>& v, std::size_t from, std::size_t n) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(from),
                         v.begin() + static_cast<std::ptrdiff_t>(from + n), 0.0) / static_cast<double>(n);
}

}  // namespace

TEST_CASE("evaluate accounts rewards and accuracy over the requested block of prompts", "[sft]") {
  const policy_model model(test_dims(), 1);
  const byte_tokenizer tok;
  const stub_task task;
  eval_options o;
  o.count = 10;
  o.max_new_tokens = 4;
  o.keep_samples = 3;
  // Indices 0..9: rewards 1, .5, 0, 1, .5, 0, 1, .5, 0, 1 → 4 correct, mean 5.5 / 10.
  eval_report r = evaluate(model, tok, task, o);
  CHECK(r.count == 10);
  CHECK(r.correct == 4);
  CHECK(r.accuracy == Approx(0.4));
  CHECK(r.mean_reward == Approx(0.55));
  CHECK(r.mean_turns == 1.0);
  REQUIRE(r.samples.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(r.samples[i].index == i);
    CHECK(r.samples[i].prompt == "q" + std::to_string(i) + "=");
    CHECK(r.samples[i].response_tokens >= 1);
    CHECK(r.samples[i].response_tokens <= 4);
  }
  CHECK(r.mean_response_tokens >= 1.0);
  CHECK(r.mean_response_tokens <= 4.0);

  // The block is clamped to the split: indices 5..11 → rewards 0, 1, .5, 0, 1, .5, 0.
  o.first_index = 5;
  r = evaluate(model, tok, task, o);
  CHECK(r.count == 7);
  CHECK(r.correct == 2);
  CHECK(r.mean_reward == Approx(3.0 / 7.0));

  o.first_index = 12;
  r = evaluate(model, tok, task, o);
  CHECK(r.count == 0);
  CHECK(r.accuracy == 0.0);
}

TEST_CASE("a reward that fails is counted and left out of accuracy and mean reward, or ends the "
          "evaluation naming its prompt", "[sft]") {
  const policy_model model(test_dims(), 1);
  const byte_tokenizer tok;
  eval_options o;
  o.count = 10;
  o.max_new_tokens = 4;
  o.keep_samples = 10;
  // Indices 0..9 of stub_task: rewards 1, .5, 0, 1, .5, 0, 1, .5, 0, 1. Prompts 1 and 6 fail in
  // the scorer, prompt 9's reward is NaN; the seven scored ones, 0 2 3 4 5 7 8, have rewards
  // 1, 0, 1, .5, 0, .5, 0: 2 correct of 7, mean reward 3 / 7.
  const failing_stub_task task({1, 6}, {9});
  const eval_report r = evaluate(model, tok, task, o);
  CHECK(r.count == 10);
  CHECK(r.reward_failures == 3);
  CHECK(r.correct == 2);
  CHECK(r.accuracy == Approx(2.0 / 7.0));
  CHECK(r.mean_reward == Approx(3.0 / 7.0));
  REQUIRE(r.samples.size() == 10);
  for (std::size_t i = 0; i < 10; ++i) {
    CAPTURE(i);
    CHECK(r.samples[i].reward_failed == (i == 1 || i == 6 || i == 9));
    CHECK(r.samples[i].response_tokens >= 1);  // generated all the same
  }
  CHECK(r.samples[1].reason == "scorer: no integer answer");
  CHECK(r.samples[1].reward == 0.0);
  CHECK(r.samples[9].reason == "reward nan is not finite (nan)");

  // Every reward failing: nothing is scored, accuracy and mean reward are 0, not NaN.
  const failing_stub_task none({0, 1, 2}, {});
  o.count = 3;
  const eval_report empty = evaluate(model, tok, none, o);
  CHECK(empty.count == 3);
  CHECK(empty.reward_failures == 3);
  CHECK(empty.accuracy == 0.0);
  CHECK(empty.mean_reward == 0.0);

  // The "fail" rule: the evaluation ends at the failed reward, naming the prompt.
  o.count = 10;
  o.fail_on_reward_failure = true;
  CHECK_THROWS_AS(evaluate(model, tok, failing_stub_task({6}, {}), o), eval_reward_failed);
  CHECK_THROWS_WITH(evaluate(model, tok, failing_stub_task({6}, {}), o),
                    "evaluate: the reward of prompt 6 of split eval failed: scorer: no integer answer");
  CHECK_THROWS_WITH(evaluate(model, tok, failing_stub_task({}, {9}), o),
                    "evaluate: the reward of prompt 9 of split eval failed: reward nan is not finite (nan)");
  // Without a failure the rule changes nothing.
  const eval_report clean = evaluate(model, tok, failing_stub_task({}, {}), o);
  CHECK(clean.reward_failures == 0);
  CHECK(clean.accuracy == Approx(0.4));
}

TEST_CASE("a multi-turn episode whose environment throws ends as a reward failure", "[sft]") {
  const policy_model model(test_dims(), 2);
  const byte_tokenizer tok;
  eval_options o = six_episodes();
  // As in the stub's run (1, 2, 3, 1, 2, 3 turns; reward 1 for even episodes), but episode 4
  // throws at its first step: 2 correct (0, 2) of the 5 scored.
  const any_task task{nullptr, std::make_shared<stub_multi_task>(4)};
  const eval_report r = evaluate(model, tok, task, o);
  CHECK(r.count == 6);
  CHECK(r.reward_failures == 1);
  CHECK(r.correct == 2);
  CHECK(r.accuracy == Approx(0.4));
  REQUIRE(r.samples.size() == 6);
  CHECK(r.samples[4].reward_failed);
  CHECK(r.samples[4].turns == 1);
  CHECK(r.samples[4].reason == "environment: checker crashed");
  CHECK(r.samples[5].turns == 3);  // the others run to their end
  o.fail_on_reward_failure = true;
  CHECK_THROWS_WITH(evaluate(model, tok, task, o),
                    "evaluate: the reward of episode 4 of split eval (turn 1) failed: environment: checker crashed");
}

TEST_CASE("greedy evaluation does not depend on the batch size", "[sft]") {
  const policy_model model(test_dims(), 3, 0.3);  // large weights: varied, long completions
  const byte_tokenizer tok;
  const stub_task task;
  eval_options o;
  o.count = 12;
  o.max_new_tokens = 8;
  o.keep_samples = 12;
  o.batch = 64;
  const eval_report wide = evaluate(model, tok, task, o);
  o.batch = 1;
  const eval_report narrow = evaluate(model, tok, task, o);
  REQUIRE(wide.samples.size() == narrow.samples.size());
  for (std::size_t i = 0; i < wide.samples.size(); ++i)
    CHECK(wide.samples[i].completion == narrow.samples[i].completion);
}

TEST_CASE("evaluate runs multi-turn episodes to the environment's end", "[sft]") {
  const policy_model model(test_dims(), 2);
  const byte_tokenizer tok;
  const eval_options o = six_episodes();
  // Episode i (seed i) takes (i % 3) + 1 turns: 1, 2, 3, 1, 2, 3 → mean 2; reward 1 for even i.
  const eval_report r = evaluate(model, tok, any_task{nullptr, std::make_shared<stub_multi_task>()}, o);
  CHECK(r.count == 6);
  CHECK(r.correct == 3);
  CHECK(r.accuracy == Approx(0.5));
  CHECK(r.mean_turns == Approx(2.0));
  REQUIRE(r.samples.size() == 6);
  for (std::size_t i = 0; i < 6; ++i) {
    CHECK(r.samples[i].turns == static_cast<int>(i % 3) + 1);
    CHECK(r.samples[i].prompt == "start " + std::to_string(i));
    CHECK(r.samples[i].response_tokens >= r.samples[i].turns);
    CHECK(r.samples[i].response_tokens <= 3 * r.samples[i].turns);
  }
}

TEST_CASE("multi-turn evaluation continued from each episode's KV takes the actions of re-prefilling every turn",
          "[sft]") {
  // Weights of std 0.3: attention far from uniform and greedy argmaxes far from ties, so any
  // wrong key, value or position changes an action while fp32 rounding (~1e-6) does not.
  const policy_model model(test_dims(), 3, 0.3);
  const byte_tokenizer tok;
  task_options to;
  to.number_guess.max_turns = 4;
  const any_task task = make_task("number_guess", to);
  eval_options o;
  o.count = 5;
  o.max_new_tokens = 4;
  o.keep_samples = 5;
  const eval_report r = evaluate(model, tok, task, o);
  REQUIRE(r.samples.size() == 5);
  int later_turns = 0;
  for (std::size_t i = 0; i < 5; ++i) {
    // The reference: a fresh generator per turn prefills the whole chat.
    auto env = task.multi_turn->make_environment();
    std::vector<chat_message> chat{{chat_role::user, env->reset(task.multi_turn->episode_seed(o.split, i))}};
    std::string actions;
    double reward = 0.0;
    for (int turn = 0; turn < task.multi_turn->max_turns(); ++turn) {
      const std::vector<token_id> ids = encode_chat(tok, chat, true);
      if (static_cast<std::int64_t>(ids.size()) >= test_dims().max_seq) break;
      sampling_params p;
      p.temperature = 0.0;
      p.max_new_tokens = o.max_new_tokens;
      p.eos_token_ids = {tok.special_id(special_token::end_turn), tok.special_id(special_token::eos)};
      generator g(model);
      g.submit(ids, p);
      const generation_result out = g.run_until_idle().at(0);
      std::vector<token_id> body = out.tokens;
      if (out.reason == finish_reason::eos) body.pop_back();
      const std::string action = tok.decode(body, decode_specials::skip);
      actions += (turn == 0 ? "" : " | ") + action;
      later_turns += turn > 0;
      const env_step step = env->step(action);
      reward += step.reward;
      chat.push_back({chat_role::assistant, action});
      if (step.done) break;
      chat.push_back({chat_role::user, step.observation});
    }
    CHECK(r.samples[i].completion == actions);
    CHECK(r.samples[i].reward == std::clamp(reward, 0.0, 1.0));
  }
  CHECK(later_turns > 0);
}

TEST_CASE("training sequences put the loss on the answer and the turn ends only", "[sft]") {
  const byte_tokenizer tok;
  const sft_sequence d = encode_demonstration(tok, {"12+3=", "15", true});
  const std::vector<token_id> ids{byte_tokenizer::bos, '1', '2', '+', '3', '=', '1', '5', byte_tokenizer::eos};
  CHECK(d.ids == ids);
  CHECK(d.loss_mask == std::vector<std::uint8_t>{0, 0, 0, 0, 0, 0, 1, 1, 1});

  const std::vector<chat_message> chat{{chat_role::user, "guess 1..9"},
                                       {chat_role::assistant, "5"},
                                       {chat_role::user, "lower"},
                                       {chat_role::assistant, "2"}};
  const sft_sequence e = encode_episode(tok, chat);
  CHECK(e.ids == encode_chat(tok, chat, false));
  REQUIRE(e.loss_mask.size() == e.ids.size());
  std::string trained;
  for (std::size_t i = 0; i < e.ids.size(); ++i)
    if (e.loss_mask[i]) trained += tok.token_text(e.ids[i]);
  CHECK(trained == "5<|end_turn|>2<|end_turn|>");
}

TEST_CASE("sft options out of range are rejected by name", "[sft]") {
  sft_options o;
  CHECK_NOTHROW(validate(o));
  o.wrong_fraction = 1.5;
  CHECK_THROWS_WITH(validate(o), Catch::Contains("wrong_fraction"));
  o = {};
  o.steps = 0;
  CHECK_THROWS_WITH(validate(o), Catch::Contains("steps"));
  o = {};
  o.preset = "huge";
  CHECK_THROWS_AS(validate(o), std::invalid_argument);
  o = {};
  o.dims = test_dims();
  o.dims->vocab = 100;
  CHECK_THROWS_WITH(validate(o), Catch::Contains("vocab"));
  o = {};
  o.steps = std::int64_t{1} << 40;
  o.batch_size = std::int64_t{1} << 23; // 2^63: one past int64
  CHECK_THROWS_WITH(validate(o), "sft_options.steps × batch_size = 1099511627776 × 8388608 "
                                 "overflows a 64-bit count");
  o.batch_size = (std::int64_t{1} << 23) - 1;
  CHECK_NOTHROW(validate(o));
  o = {};
  o.group_by_length = -1;
  CHECK_THROWS_WITH(validate(o), Catch::Contains("group_by_length"));
}

TEST_CASE("length grouping regroups each window of the shuffled order into batches of similar length",
          "[sft]") {
  // 24 examples of distinct lengths (7 i mod 24 is a permutation of 0..23), batches of 3,
  // windows of 4 batches: one epoch is two windows.
  std::vector<std::int64_t> lengths(24);
  for (std::size_t i = 0; i < lengths.size(); ++i) lengths[i] = static_cast<std::int64_t>((7 * i) % 24) + 10;
  const auto plain = sft_batch_schedule(lengths, 8, 3, 0, 5);
  CHECK(sft_batch_schedule(lengths, 8, 3, 1, 5) == plain); // 1 = off, as 0
  const auto grouped = sft_batch_schedule(lengths, 8, 3, 4, 5);
  REQUIRE(grouped.size() == 8);

  auto padded = [&](const std::vector<std::vector<std::size_t>>& s) {
    std::int64_t total = 0;
    for (const auto& b : s) {
      std::int64_t longest = 0;
      for (const std::size_t i : b) longest = std::max(longest, lengths[i]);
      total += longest * static_cast<std::int64_t>(b.size());
    }
    return total;
  };
  std::int64_t real = 0;
  for (const std::int64_t l : lengths) real += l;

  for (int w = 0; w < 2; ++w) {
    // The window holds the plain order's examples for the same four batches...
    std::vector<std::size_t> want, got;
    for (int b = 4 * w; b < 4 * w + 4; ++b) {
      REQUIRE(grouped[b].size() == 3);
      want.insert(want.end(), plain[b].begin(), plain[b].end());
      got.insert(got.end(), grouped[b].begin(), grouped[b].end());
    }
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    CHECK(got == want);
    // ... cut into length bands that do not overlap: sorted by length, the window's 12
    // examples are the concatenation of its batches in some order.
    std::vector<std::pair<std::int64_t, std::int64_t>> bands; // (shortest, longest) per batch
    for (int b = 4 * w; b < 4 * w + 4; ++b) {
      std::int64_t lo = 1 << 30, hi = 0;
      for (const std::size_t i : grouped[b]) lo = std::min(lo, lengths[i]), hi = std::max(hi, lengths[i]);
      bands.emplace_back(lo, hi);
    }
    std::sort(bands.begin(), bands.end());
    for (std::size_t k = 1; k < bands.size(); ++k) CHECK(bands[k - 1].second < bands[k].first);
  }
  // One epoch: every example exactly once.
  std::vector<std::size_t> epoch;
  for (const auto& b : grouped) epoch.insert(epoch.end(), b.begin(), b.end());
  std::sort(epoch.begin(), epoch.end());
  for (std::size_t i = 0; i < epoch.size(); ++i) CHECK(epoch[i] == i);
  // Sorted bands are the padding-optimal cut of each window; nothing beats the real tokens.
  CHECK(padded(grouped) <= padded(plain));
  CHECK(padded(grouped) >= real);
  CHECK(padded(grouped) < padded(plain)); // for this seed: a strict gain

  CHECK_THROWS_AS(sft_batch_schedule({}, 1, 3, 4, 5), std::invalid_argument);
  CHECK_THROWS_AS(sft_batch_schedule(lengths, 1, 0, 4, 5), std::invalid_argument);
}

TEST_CASE("run_sft lowers the loss and writes a checkpoint that loads back bit-exactly", "[sft]") {
  const any_task task = memorise_task("checkpoint");
  sft_options o = small_options();
  o.steps = 40;
  o.wrong_fraction = 0.25;
  o.output_dir = (scratch("checkpoint_out") / "ckpt").string();
  std::int64_t calls = 0;
  const sft_report r = run_sft(o, task, [&](const sft_progress& p) {
    if (!p.eval) {
      ++calls;
      CHECK(p.step == calls);
      CHECK(p.tokens_per_second > 0.0);
    }
  });
  CHECK(calls == o.steps);
  REQUIRE(r.losses.size() == 40);
  CHECK(r.pool_size == 8);
  CHECK(r.wrong_in_pool == 2);
  // Memorising 8 answers: the loss falls from ~log(272) ≈ 5.6 to well under half of it.
  CHECK(mean(r.losses, 35, 5) < 0.5 * mean(r.losses, 0, 5));
  REQUIRE(r.after);

  REQUIRE_FALSE(r.checkpoint.empty());
  CHECK(latest_checkpoint(o.output_dir) == r.checkpoint);
  policy_model fresh(test_dims(), 12345);  // different init: every weight must be overwritten
  const loaded_checkpoint c = load_checkpoint(r.checkpoint, fresh.parameters());
  const auto& want = r.model->parameters();
  const auto& got = fresh.parameters();
  REQUIRE(want.size() == got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].first);
    CHECK(bit_equal(want[i].second, got[i].second));
  }
  REQUIRE(c.optimizer.size() == r.optimizer_state.size());
  for (std::size_t i = 0; i < r.optimizer_state.size(); ++i) {
    bool found = false;
    for (const auto& [name, t] : c.optimizer)
      if (name == r.optimizer_state[i].first) {
        found = true;
        CHECK(bit_equal(t, r.optimizer_state[i].second));
      }
    CHECK(found);
  }
  CHECK(c.state.step == 40);
  CHECK(c.state.rng_states.count("sft.data") == 1);
  CHECK(c.state.metadata.at("sorl.sft.wrong_fraction") == "0.25");
  CHECK(c.state.metadata.at("sorl.sft.preset") == "custom");
  CHECK(c.state.metadata.at("sorl.sft.task") == "jsonl");
  CHECK(c.state.metadata.at("sorl.model.d_model") == "32");
  CHECK(c.state.metadata.count("sorl.sft.eval_accuracy") == 1);
}

TEST_CASE("run_sft starts from init_checkpoint's weights and refuses a missing or mismatched one",
          "[sft]") {
  const any_task task = memorise_task("init");
  sft_options first = small_options();
  first.steps = 40;
  first.eval_count = 0;
  first.output_dir = (scratch("init_first") / "ckpt").string();
  const sft_report a = run_sft(first, task);
  REQUIRE_FALSE(a.checkpoint.empty());

  // Another seed (another fresh initialisation) and a learning rate too small to move an fp32
  // weight of this size: what the run ends with is what it started from.
  sft_options next = small_options();
  next.seed = 99;
  next.steps = 1;
  next.lr = 1e-12;
  next.warmup_steps = 0;
  next.eval_count = 0;
  next.init_checkpoint = first.output_dir;
  next.output_dir = (scratch("init_next") / "ckpt").string();
  const sft_report b = run_sft(next, task);
  const auto& want = a.model->parameters();
  const auto& got = b.model->parameters();
  REQUIRE(want.size() == got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].first);
    CHECK(at::allclose(want[i].second, got[i].second, /*rtol=*/0.0, /*atol=*/1e-9));
  }
  // Its first loss is the memorised one, not a fresh model's ~log(272) = 5.6.
  REQUIRE(b.losses.size() == 1);
  CHECK(b.losses[0] < 0.5 * a.losses[0]);
  CHECK(b.losses[0] < 2.0 * mean(a.losses, 35, 5));
  policy_model reread(test_dims(), 1);
  CHECK(load_checkpoint(b.checkpoint, reread.parameters()).state.metadata.at("sorl.sft.init_checkpoint")
        == a.checkpoint.string());

  // A root without a checkpoint: named, before any demonstration is built.
  sft_options missing = next;
  missing.init_checkpoint = (scratch("init_missing") / "nothing").string();
  try {
    run_sft(missing, task);
    FAIL("a missing init_checkpoint was accepted");
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    CHECK(what.find("init_checkpoint") != std::string::npos);
    CHECK(what.find(missing.init_checkpoint) != std::string::npos);
  }
  // Another model's checkpoint: refused, nothing trained.
  sft_options other = next;
  model_dims wide = test_dims();
  wide.d_model = 48;
  other.dims = wide;
  CHECK_THROWS_AS(run_sft(other, task), checkpoint_error);
}

TEST_CASE("all-wrong demonstrations give measurably lower accuracy than all-right ones", "[sft]") {
  // Tolerance: the right-trained model must answer at least 6 of the 8 memorised problems and
  // the wrong-trained one at most 2 (it learns a wrong answer for each; in practice 8 vs 0).
  const any_task task = memorise_task("wrong_fraction");
  sft_options o = small_options();
  o.wrong_fraction = 0.0;
  const sft_report right = run_sft(o, task);
  o.wrong_fraction = 1.0;
  const sft_report wrong = run_sft(o, task);
  REQUIRE(right.after);
  REQUIRE(wrong.after);
  CHECK(wrong.wrong_in_pool == 8);
  CHECK(right.after->accuracy >= 0.75);
  CHECK(wrong.after->accuracy <= 0.25);
}

TEST_CASE("run_sft trains on multi-turn episodes and evaluates whole episodes", "[sft]") {
  sft_options o;
  o.dims = test_dims();
  o.task = "number_guess";
  o.task_config.number_guess.lo = 1;
  o.task_config.number_guess.hi = 8;
  o.task_config.number_guess.max_turns = 4;
  o.steps = 8;
  o.batch_size = 4;
  o.eval_count = 4;
  o.eval_max_new_tokens = 4;
  o.eval_every = 4;
  const sft_report r = run_sft(o);
  CHECK(r.pool_size == 32);
  // round(32 × 0.2) = 6 episodes are drawn wrong; the guesser that ignores the feedback still
  // finds the number in 1..8 within 4 guesses in 2 of them, which then count as correct.
  CHECK(std::llround(32 * o.wrong_fraction) == 6);
  CHECK(r.wrong_in_pool == 4);
  REQUIRE(r.before);
  REQUIRE(r.after);
  REQUIRE(r.during.size() == 1);
  CHECK(r.during[0].first == 4);
  CHECK(r.after->count == 4);
  CHECK(r.after->mean_turns >= 1.0);
  CHECK(r.after->mean_turns <= 4.0);
  CHECK(r.losses.back() < r.losses.front());
}

TEST_CASE("a non-finite loss or gradient stops the warm start at its step and writes nothing",
          "[sft]") {
  const any_task task = memorise_task("nonfinite");
  sft_options o = small_options();
  o.steps = 3;
  o.eval_count = 0;
  // Weights of 1e20 square to inf in fp32 inside the RMS norms: the first step's gradient is
  // NaN, which would otherwise step every weight to NaN.
  o.init_std = 1e20;
  o.output_dir = (scratch("nonfinite_out") / "ckpt").string();
  CHECK_THROWS_WITH(run_sft(o, task), Catch::Contains("sft step 1") && Catch::Contains("not finite"));
  CHECK_FALSE(fs::exists(o.output_dir));
}
