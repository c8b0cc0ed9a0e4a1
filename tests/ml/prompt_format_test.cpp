// Prompt encodings (runtime/ml/prompt_format.hpp): sorl's byte format equals the functions
// the rollout pipeline uses today, and a Hugging Face directory's format is its chat
// template's text tokenized with contents kept plain.
#include "runtime/ml/prompt_format.hpp"

#include "runtime/ml/hf_model.hpp"
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
  save_hf_byte_model(sorl::ml::test::random_policy(preset("tiny"), 4), dir, at::kFloat);
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
