#include "runtime/ml/formats/chat_template.hpp"

#include "runtime/ml/formats/safetensors.hpp"  // read_file_bytes

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace sorl::ml {

namespace {

// The sources, byte for byte as the models ship them. transformers renders with
// trim_blocks and lstrip_blocks; neither changes these one-line templates.
constexpr std::string_view chatml_source =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

constexpr std::string_view smollm2_source =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

constexpr std::string_view sorl_source =
    "{{ '<|bos|>' }}{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + "
    "'<|end_turn|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}";

constexpr std::string_view smollm2_system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

// A template as users' files hold it may end with one newline, which trim_blocks removes
// after the final block tag: accept it.
bool same_source(std::string_view given, std::string_view known) {
  if (given == known) return true;
  return given.size() == known.size() + 1 && given.back() == '\n' && given.substr(0, known.size()) == known;
}

}  // namespace

std::string_view sorl_chat_template_source() noexcept { return sorl_source; }

std::string_view chat_role_name(chat_role role) noexcept {
  switch (role) {
    case chat_role::system:
      return "system";
    case chat_role::user:
      return "user";
    case chat_role::assistant:
      return "assistant";
  }
  return "user";
}

chat_template chat_template::recognise(std::string_view source, const std::string& label) {
  if (same_source(source, smollm2_source)) return chat_template(kind::smollm2);
  if (same_source(source, chatml_source)) return chat_template(kind::chatml);
  if (same_source(source, sorl_source)) return chat_template(kind::sorl);
  throw chat_template_error(fmt::format(
      "{}: chat_template is not one sorl renders (supported: SmolLM2-Instruct's, plain ChatML and sorl's "
      "own, matched exactly); its first line: '{}'",
      label, source.substr(0, std::min<std::size_t>(source.find('\n'), 120))));
}

chat_template chat_template::from_tokenizer_config(const std::filesystem::path& path) {
  const std::filesystem::path file =
      std::filesystem::is_directory(path) ? path / "tokenizer_config.json" : path;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file_bytes(file));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("{}: not valid JSON: {}", file.string(), e.what()));
  }
  if (!j.is_object() || !j.contains("chat_template"))
    throw chat_template_error(fmt::format("{}: no chat_template", file.string()));
  if (!j["chat_template"].is_string())
    throw chat_template_error(fmt::format(
        "{}: field 'chat_template': named templates (a list) are not supported; expected one template string",
        file.string()));
  return recognise(j["chat_template"].get<std::string>(), file.string() + ": field 'chat_template'");
}

std::string_view chat_template::name() const noexcept {
  switch (kind_) {
    case kind::chatml:
      return "chatml";
    case kind::smollm2:
      return "smollm2";
    case kind::sorl:
      return "sorl";
  }
  return "chatml";
}

std::string_view chat_template::end_of_turn() const noexcept {
  return kind_ == kind::sorl ? "<|end_turn|>" : "<|im_end|>";
}

std::vector<chat_template::piece> chat_template::render_pieces(const std::vector<chat_message>& messages,
                                                               bool add_generation_prompt) const {
  std::vector<piece> out;
  auto text = [&](std::string_view t) {
    if (!out.empty() && out.back().template_text) {
      out.back().text += t;
    } else {
      out.push_back(piece{std::string(t), true});
    }
  };
  if (kind_ == kind::sorl) {
    text("<|bos|>");
    for (const auto& m : messages) {
      text("<|");
      text(chat_role_name(m.role));
      text("|>");
      if (!m.content.empty()) out.push_back(piece{m.content, false});
      text("<|end_turn|>");
    }
    if (add_generation_prompt) text("<|assistant|>");
    return out;
  }
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (kind_ == kind::smollm2 && i == 0 && messages[0].role != chat_role::system) {
      text("<|im_start|>system\n");
      text(smollm2_system);
      text("<|im_end|>\n");
    }
    text("<|im_start|>");
    text(chat_role_name(messages[i].role));
    text("\n");
    if (!messages[i].content.empty()) out.push_back(piece{messages[i].content, false});
    text("<|im_end|>\n");
  }
  if (add_generation_prompt) text("<|im_start|>assistant\n");
  return out;
}

std::string chat_template::render(const std::vector<chat_message>& messages, bool add_generation_prompt) const {
  std::string s;
  for (const auto& p : render_pieces(messages, add_generation_prompt)) s += p.text;
  return s;
}

}  // namespace sorl::ml
