// Scoring a model directory on held-out problems (runtime/ml/train/hf_eval.hpp): the aggregate
// against hand-computed values, answer extraction and checkers, the JSONL reader's errors,
// and a whole run on a small exported model whose greedy answers are known.
#include "runtime/ml/train/hf_eval.hpp"

#include "tests/ml/policy_test_util.hpp"

#include "tests/support/scratch_dir.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

using namespace sorl::ml;
namespace fs = std::filesystem;

namespace {

fs::path write_lines(const fs::path& dir, const std::string& name, const std::string& text) {
  const fs::path p = dir / name;
  std::ofstream(p) << text;
  return p;
}

}  // namespace

TEST_CASE("accuracy, pass@k, mean score and length from per-completion scores", "[hf_eval]") {
  hf_eval_report r;
  r.items = {{1, {}, {1.0, 0.05}, {10, 20}}, {2, {}, {0.01, 0.01}, {5, 5}}, {3, {}, {1.0, 1.0}, {3, 7}}};
  summarize(r);
  CHECK(r.prompts == 3);
  CHECK(r.accuracy == Approx(3.0 / 6.0));        // three of six completions score 1
  CHECK(r.pass_at_k == Approx(2.0 / 3.0));       // items 1 and 3 have one
  CHECK(r.mean_score == Approx(3.07 / 6.0));     // partial credits count here only
  CHECK(r.mean_length == Approx(50.0 / 6.0));
  r.items.push_back({4, {}, {1.0}, {}});
  CHECK_THROWS_AS(summarize(r), std::invalid_argument);
}

TEST_CASE("answers are taken from the last answer tags, else the whole completion", "[hf_eval]") {
  CHECK(completion_answer("Let me think. <answer>42</answer>") == "42");
  CHECK(completion_answer("  42 \n") == "42");
  eval_item gsm{"q", "288", {}, 0, 1};
  CHECK(score_answer(answer_checker::first_number, gsm, completion_answer("<answer>288</answer>")) == 1.0);
  CHECK(score_answer(answer_checker::first_number, gsm, completion_answer("It is 287.")) == 0.01);
  CHECK(score_answer(answer_checker::exact, gsm, " 288 ") == 1.0);
  CHECK(score_answer(answer_checker::exact, gsm, "288.0") == 0.0);
  eval_item cd{"q", "94*4 - 61 - 6", {6, 61, 94, 4}, 309, 1};
  CHECK(score_answer(answer_checker::countdown, cd, "4*94 - 6 - 61") == 1.0);
  CHECK(parse_answer_checker("countdown") == answer_checker::countdown);
  CHECK(score_answer(answer_checker::last_number, gsm, completion_answer("3 + 285 = 288")) == 1.0);
  CHECK(score_answer(answer_checker::last_number, gsm,
                     completion_answer("288? <answer>3 + 284 = 287</answer>")) == 0.01);
  CHECK(parse_answer_checker("last_number") == answer_checker::last_number);
  CHECK(to_string(answer_checker::last_number) == "last_number");
  CHECK_THROWS_WITH(parse_answer_checker("regex"),
                    Catch::Contains("known: exact, first_number, last_number, countdown"));
}

TEST_CASE("held-out files are read with their line numbers, errors naming them", "[hf_eval]") {
  const sorl::test::scratch_dir scratch("hf_eval_files");
  const auto good = write_lines(scratch.path, "good.jsonl", R"({"prompt": "2+2?", "answer": 4}

{"prompt": "Make 24", "answer": "8*3", "entry": {"metadata": {"numbers": [8, 3], "target": "24"}}}
)");
  const auto items = load_eval_items(good, answer_checker::exact);
  REQUIRE(items.size() == 2);
  CHECK(items[0].answer == "4");
  CHECK(items[1].line == 3);
  CHECK_THROWS_WITH(load_eval_items(good, answer_checker::countdown),
                    Catch::Contains(":1: field 'entry.metadata': the countdown checker needs numbers and target"));
  const auto bad = write_lines(scratch.path, "bad.jsonl", "{\"prompt\": \"x\", \"answer\": \"1\"}\n{\"answer\": \"1\"}\n");
  CHECK_THROWS_WITH(load_eval_items(bad, answer_checker::exact),
                    Catch::Contains("bad.jsonl:2: field 'prompt': a non-empty string is required"));
  const auto empty = write_lines(scratch.path, "empty.jsonl", "\n\n");
  CHECK_THROWS_WITH(load_eval_items(empty, answer_checker::exact), Catch::Contains("no items"));
}

TEST_CASE("a whole evaluation of an exported model scores its own greedy answers as correct", "[hf_eval]") {
  const sorl::test::scratch_dir scratch("hf_eval_model");
  const fs::path dir = scratch.path / "model";
  save_hf_byte_model(sorl::ml::test::random_policy(preset("tiny"), 3), dir, sorl_prompt_format::chat, at::kFloat);
  const hf_loaded_model m = load_hf_model(dir);
  const prompt_format format = prompt_format::hugging_face(dir, m.config.eos_token_ids);
  std::vector<eval_item> items = {{"1+1=", "x", {}, 0, 1}, {"ls", "x", {}, 0, 2}, {"cat key", "x", {}, 0, 3}};
  hf_eval_options o;
  o.checker = answer_checker::exact;
  o.max_new_tokens = 12;
  std::int64_t calls = 0;
  o.progress = [&](std::int64_t done, std::int64_t all) {
    CHECK(done == ++calls);
    CHECK(all == 3);
  };
  const hf_eval_report first = evaluate_hf_model(m.model, format, items, o);
  CHECK(calls == 3);
  REQUIRE(first.items.size() == 3);
  CHECK(first.accuracy == 0.0);  // "x" is none of a random model's answers
  for (std::size_t i = 0; i < 3; ++i) {
    REQUIRE(first.items[i].completions.size() == 1);
    CHECK(first.items[i].lengths[0] <= 12);
    items[i].answer = completion_answer(first.items[i].completions[0]);
  }
  // Greedy decoding is deterministic: with its own answers as references, everything scores 1.
  o.progress = nullptr;
  const hf_eval_report again = evaluate_hf_model(m.model, format, items, o);
  CHECK(again.accuracy == 1.0);
  CHECK(again.pass_at_k == 1.0);
  CHECK(again.mean_length == first.mean_length);

  o.k = 3;
  o.limit = 2;
  const hf_eval_report sampled = evaluate_hf_model(m.model, format, items, o);
  CHECK(sampled.prompts == 2);
  CHECK(sampled.k == 3);
  for (const auto& it : sampled.items) CHECK(it.scores.size() == 3);
  o.max_batch = 2;  // fewer than k
  CHECK_THROWS_AS(evaluate_hf_model(m.model, format, items, o), std::invalid_argument);
}
