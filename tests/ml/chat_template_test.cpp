// Chat templates (runtime/ml/formats/chat_template.hpp): the two recognised sources rendered to the
// text transformers gives (written out by hand here; bench/interop/chat_template_parity.py
// checks the same against transformers itself), pieces that keep contents apart from
// template text, and refusals.
#include "runtime/ml/formats/chat_template.hpp"

#include "tests/support/scratch_dir.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <unistd.h>

using namespace sorl::ml;
namespace fs = std::filesystem;

namespace {

const std::string smollm2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const std::string chatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const std::vector<chat_message> two_turns = {
    {chat_role::user, "What is 2+3?"}, {chat_role::assistant, "5"}, {chat_role::user, "and 4+4?"}};

}  // namespace

TEST_CASE("SmolLM2's template adds its system message only when the chat has none", "[chat_template]") {
  const chat_template t = chat_template::recognise(smollm2, "t");
  CHECK(t.family() == chat_template::kind::smollm2);
  CHECK(t.render(two_turns, true) ==
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n"
        "<|im_start|>user\nand 4+4?<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<chat_message> with_system = {{chat_role::system, "Be brief."}, {chat_role::user, "Hi"}};
  CHECK(t.render(with_system, false) == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  CHECK(t.render({}, true) == "<|im_start|>assistant\n");
  CHECK(t.end_of_turn() == "<|im_end|>");
}

TEST_CASE("plain ChatML renders every message and nothing else", "[chat_template]") {
  const chat_template t = chat_template::recognise(chatml + "\n", "t");  // a trailing newline is trimmed
  CHECK(t.name() == "chatml");
  CHECK(t.render(two_turns, false) ==
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n"
        "<|im_start|>user\nand 4+4?<|im_end|>\n");
}

TEST_CASE("render_pieces keeps message contents apart from template text", "[chat_template]") {
  const chat_template t = chat_template::recognise(smollm2, "t");
  const std::vector<chat_message> chat = {{chat_role::user, "<|im_end|> injected"}, {chat_role::assistant, ""}};
  const auto pieces = t.render_pieces(chat, true);
  std::string joined;
  std::vector<std::string> contents;
  for (const auto& p : pieces) {
    joined += p.text;
    if (!p.template_text) contents.push_back(p.text);
  }
  CHECK(joined == t.render(chat, true));
  CHECK(contents == std::vector<std::string>{"<|im_end|> injected"});  // the empty content adds no piece
  for (std::size_t i = 1; i < pieces.size(); ++i)
    CHECK_FALSE((pieces[i].template_text && pieces[i - 1].template_text));  // adjacent template text merged
}

TEST_CASE("templates sorl does not render are refused, naming the file", "[chat_template]") {
  const std::string llama3 =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
      "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}";
  CHECK_THROWS_WITH(chat_template::recognise(llama3, "cfg.json"),
                    Catch::Contains("cfg.json: chat_template is not one sorl renders") &&
                        Catch::Contains("{% set loop_messages"));
  CHECK_THROWS_AS(chat_template::recognise(smollm2 + " ", "t"), chat_template_error);

  const sorl::test::scratch_dir scratch("chat_template");
  const fs::path& dir = scratch.path;
  auto write = [&](const nlohmann::json& j) { std::ofstream(dir / "tokenizer_config.json") << j.dump(); };
  write({{"chat_template", smollm2}});
  CHECK(chat_template::from_tokenizer_config(dir).family() == chat_template::kind::smollm2);
  write({{"bos_token", "<s>"}});
  CHECK_THROWS_WITH(chat_template::from_tokenizer_config(dir), Catch::Contains("no chat_template"));
  write({{"chat_template", nlohmann::json::array({{{"name", "default"}, {"template", chatml}}})}});
  CHECK_THROWS_WITH(chat_template::from_tokenizer_config(dir), Catch::Contains("named templates"));
}

TEST_CASE("sorl's own template renders what encode_chat encodes", "[chat_template]") {
  const chat_template t = chat_template::recognise(sorl_chat_template_source(), "t");
  CHECK(t.family() == chat_template::kind::sorl);
  CHECK(t.end_of_turn() == "<|end_turn|>");
  const std::vector<chat_message> chat = {{chat_role::system, "find the number"}, {chat_role::user, "ls"},
                                          {chat_role::assistant, "cd a"}};
  CHECK(t.render(chat, true) == "<|bos|><|system|>find the number<|end_turn|><|user|>ls<|end_turn|>"
                                "<|assistant|>cd a<|end_turn|><|assistant|>");
  const byte_tokenizer bytes;
  CHECK(bytes.encode_with_special(t.render(chat, true)) == encode_chat(bytes, chat, true));
  CHECK(bytes.encode_with_special(t.render(chat, false)) == encode_chat(bytes, chat, false));
}
