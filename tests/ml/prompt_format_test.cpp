// Prompt encodings (runtime/ml/formats/prompt_format.hpp): sorl's byte format equals the functions
// the rollout pipeline uses today, a Hugging Face directory's format is its chat template's
// text tokenized with contents kept plain, and a sorl policy's export is prompted in the
// format it was trained in.
#include "runtime/ml/formats/prompt_format.hpp"

#include "runtime/ml/formats/checkpoint.hpp"
#include "runtime/ml/formats/hf_model.hpp"
#include "runtime/ml/tasks/tasks.hpp"
#include "runtime/ml/train/evaluate.hpp"
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

TEST_CASE("the byte format is encode_single_turn_prompt and encode_chat", "[prompt_format]") {
  const prompt_format f = prompt_format::byte_level();
  const byte_tokenizer bytes;
  CHECK(f.name() == "byte");
  CHECK(f.single_turn("12+34=") == encode_single_turn_prompt(bytes, "12+34="));
  const std::vector<chat_message> chat = {{chat_role::user, "ls"}, {chat_role::assistant, "cd a"}};
  CHECK(f.chat(chat, true) == encode_chat(bytes, chat, true));
  CHECK(f.stop_ids() == std::vector<token_id>{byte_tokenizer::eos, byte_tokenizer::end_turn});
}

TEST_CASE("a Hugging Face directory's format renders its template, contents as plain text", "[prompt_format]") {
  const sorl::test::scratch_dir scratch("prompt_format");
  const fs::path dir = scratch.path / "model";
  save_hf_byte_model(sorl::ml::test::random_policy(preset("tiny"), 4), dir, sorl_prompt_format::chat, at::kFloat);
  const byte_tokenizer bytes;
  // An exported sorl model: its template is sorl's own, so the chat ids are encode_chat's.
  const prompt_format f = prompt_format::hugging_face(dir, {byte_tokenizer::eos, byte_tokenizer::end_turn});
  CHECK(f.name() == "sorl");
  const std::vector<chat_message> chat = {{chat_role::user, "<|end_turn|> is text here"}};
  CHECK(f.chat(chat, true) == encode_chat(bytes, chat, true));
  // A single-turn prompt is one user message (not <|bos|> + text, the byte format's).
  CHECK(f.single_turn("2+2=") == encode_chat(bytes, {{chat_role::user, "2+2="}}, true));
  // The end-of-turn token first, then the config's eos ids not already there.
  CHECK(f.stop_ids() == std::vector<token_id>{byte_tokenizer::end_turn, byte_tokenizer::eos});
  const prompt_format with_system = prompt_format::hugging_face(dir, {}, "be brief");
  CHECK(with_system.single_turn("2+2=") ==
        encode_chat(bytes, {{chat_role::system, "be brief"}, {chat_role::user, "2+2="}}, true));
  CHECK_THROWS_AS(prompt_format::hugging_face(dir, {99999}), std::invalid_argument);
}

TEST_CASE("a single-turn policy exported and read back is prompted and scored as its checkpoint is",
          "[prompt_format]") {
  const sorl::test::scratch_dir scratch("prompt_format_round_trip");
  // The policy as training leaves it: a checkpoint, loaded into a fresh model.
  const model_dims dims = preset("tiny");
  const policy_model trained = sorl::ml::test::random_policy(dims, 5);
  save_checkpoint(scratch.path / "ckpt", trained.parameters(), {}, checkpoint_state{});
  policy_model checkpoint(dims, 99);
  load_checkpoint(*latest_checkpoint(scratch.path / "ckpt"), checkpoint.parameters());
  // `sorl export-hf` of a single-turn task's policy, in fp32 (the same weights).
  const fs::path dir = scratch.path / "export";
  save_hf_byte_model(checkpoint, dir, sorl_prompt_format::byte, at::kFloat);

  // What `sorl eval DIR` loads, and the format it and `[model] hf_dir = DIR` encode with.
  hf_load_options lo;
  lo.max_seq = 4096;
  const hf_loaded_model exported = load_hf_model(dir, lo);
  const prompt_format via_export = prompt_format::hugging_face(dir, exported.config.eos_token_ids);
  const prompt_format via_checkpoint = prompt_format::byte_level();
  CHECK(via_export.name() == "byte");
  CHECK(via_export.is_byte_level());
  // <|bos|> 1 2 + 3 4 =, as the policy was trained: no <|user|> turn around it.
  const std::vector<token_id> ids = {256, '1', '2', '+', '3', '4', '='};
  CHECK(via_checkpoint.single_turn("12+34=") == ids);
  CHECK(via_export.single_turn("12+34=") == ids);
  CHECK(via_export.stop_ids() == via_checkpoint.stop_ids());

  // `sorl eval`: two of four answers set to the checkpoint's own greedy ones, so accuracy 0.5
  // through the checkpoint, and through the export when it decodes the same completions.
  std::vector<eval_item> items = {{"1+1=", "x", {}, 0, 1}, {"ls", "x", {}, 0, 2},
                                  {"cat key", "x", {}, 0, 3}, {"7*6=", "x", {}, 0, 4}};
  hf_eval_options o;
  o.checker = answer_checker::exact;
  o.max_new_tokens = 8;
  const hf_eval_report first = evaluate_hf_model(checkpoint, via_checkpoint, items, o);
  for (const std::size_t i : {0, 2}) items[i].answer = completion_answer(first.items[i].completions.at(0));
  const hf_eval_report c = evaluate_hf_model(checkpoint, via_checkpoint, items, o);
  const hf_eval_report e = evaluate_hf_model(exported.model, via_export, items, o);
  CHECK(c.accuracy == 0.5);
  CHECK(e.accuracy == 0.5);
  CHECK(e.mean_length == c.mean_length);
  for (std::size_t i = 0; i < items.size(); ++i) CHECK(e.items[i].completions == c.items[i].completions);
  // The same weights prompted through the chat template, as exports were read before they
  // recorded their format, answer otherwise.
  const fs::path chat_dir = scratch.path / "chat";
  save_hf_byte_model(checkpoint, chat_dir, sorl_prompt_format::chat, at::kFloat);
  const hf_eval_report t =
      evaluate_hf_model(exported.model, prompt_format::hugging_face(chat_dir, exported.config.eos_token_ids), items, o);
  CHECK(t.accuracy < 0.5);

  // The learner's held-out evaluation (an hf_dir run's): the same completions and figures.
  const any_task task = make_task("arithmetic", task_options{});
  eval_options eo;
  eo.count = 6;
  eo.max_new_tokens = 6;
  eo.keep_samples = 6;
  const eval_report rc = evaluate(checkpoint, via_checkpoint, task, eo);
  const eval_report re = evaluate(exported.model, via_export, task, eo);
  CHECK(re.accuracy == rc.accuracy);
  CHECK(re.mean_response_tokens == rc.mean_response_tokens);
  REQUIRE(re.samples.size() == 6);
  for (std::size_t i = 0; i < 6; ++i) CHECK(re.samples[i].completion == rc.samples[i].completion);
}

TEST_CASE("a multi-turn policy's export is still prompted through its chat template", "[prompt_format]") {
  const sorl::test::scratch_dir scratch("prompt_format_chat_export");
  const fs::path dir = scratch.path / "model";
  save_hf_byte_model(sorl::ml::test::random_policy(preset("tiny"), 6), dir, sorl_prompt_format::chat, at::kFloat);
  const prompt_format f = prompt_format::hugging_face(dir, {byte_tokenizer::eos, byte_tokenizer::end_turn});
  CHECK(f.name() == "sorl");
  CHECK_FALSE(f.is_byte_level());
  // <|bos|> <|user|> 2 + 2 = <|end_turn|> <|assistant|>: a chat's first turn, as it was trained.
  CHECK(f.single_turn("2+2=") == std::vector<token_id>{256, 260, '2', '+', '2', '=', 262, 261});
}

TEST_CASE("a directory recorded as the byte format takes no system prompt and must hold the byte tokenizer",
          "[prompt_format]") {
  const sorl::test::scratch_dir scratch("prompt_format_byte_checks");
  const fs::path dir = scratch.path / "model";
  save_hf_byte_model(sorl::ml::test::random_policy(preset("tiny"), 7), dir, sorl_prompt_format::byte, at::kFloat);
  CHECK_THROWS_WITH(prompt_format::hugging_face(dir, {}, "be brief"),
                    Catch::Contains(dir.string()) && Catch::Contains("has no system turn"));
  // The same directory with <|bos|> renamed: not sorl's byte tokenizer any more.
  std::string json = read_file_bytes(dir / "tokenizer.json");
  for (auto at = json.find("<|bos|>"); at != std::string::npos; at = json.find("<|bos|>", at))
    json.replace(at, 7, "<|begin|>");
  write_file_atomically(dir / "tokenizer.json", json);
  CHECK_THROWS_WITH(prompt_format::hugging_face(dir, {}),
                    Catch::Contains("tokenizer.json is not sorl's byte tokenizer ('<|bos|>' is not id 256)"));
}
