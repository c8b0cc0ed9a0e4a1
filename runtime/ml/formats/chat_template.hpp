#pragma once

// Chat templates as Hugging Face tokenizers ship them (`chat_template` in
// tokenizer_config.json, a Jinja template that transformers' apply_chat_template renders).
// sorl does not run Jinja: it recognises the templates of the families it supports by their
// exact source and renders each with a fixed function that produces the same text as
// transformers does (bench/interop/chat_template_parity.py checks this against
// transformers itself). Any other template is refused by name, never approximated: a
// prompt rendered differently from the model's training format silently costs accuracy.

#include "runtime/ml/formats/tokenizer.hpp"

#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sorl::ml {

/// Thrown for a chat template sorl does not recognise, or a tokenizer_config.json without
/// one; the message names the file and lists the supported templates.
class chat_template_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A recognised chat template. Immutable; cheap to copy.
class chat_template {
 public:
  /// The template families sorl renders.
  enum class kind {
    chatml,   ///< `<|im_start|>{role}\n{content}<|im_end|>\n` per message, no default system
    smollm2,  ///< ChatML with SmolLM2-Instruct's default system message when there is none
    sorl,     ///< sorl's own turn format (encode_chat): `<|bos|>`, `<|role|>content<|end_turn|>`
  };

  /// Recognises `source`, the text of a chat_template. `label` names where it came from in
  /// errors. Throws chat_template_error when it is none of the supported templates.
  static chat_template recognise(std::string_view source, const std::string& label);

  /// The chat_template of a tokenizer_config.json (the file, or the directory holding it).
  /// Throws chat_template_error when there is none or it is not recognised, and
  /// std::runtime_error when the file cannot be read or is not JSON.
  static chat_template from_tokenizer_config(const std::filesystem::path& path);

  kind family() const noexcept { return kind_; }
  /// "chatml", "smollm2" or "sorl".
  std::string_view name() const noexcept;

  /// The text apply_chat_template(messages, tokenize=False,
  /// add_generation_prompt=add_generation_prompt) gives. Message contents are inserted
  /// verbatim (a content that spells `<|im_end|>` is the caller's to keep out: tokenize the
  /// result with tokenizer::encode_with_special only when contents are trusted, else
  /// render_pieces). Never throws.
  std::string render(const std::vector<chat_message>& messages, bool add_generation_prompt) const;

  /// A rendered chat split into template text and message contents, in order: pieces
  /// alternate between template text (`template_text` true: tokenize with
  /// encode_with_special) and a message's content (false: tokenize with encode, so that a
  /// content can never produce a special token). Concatenated, the texts equal render().
  struct piece {
    std::string text;
    bool template_text = true;
  };
  std::vector<piece> render_pieces(const std::vector<chat_message>& messages, bool add_generation_prompt) const;

  /// The text that closes an assistant turn in this template ("<|im_end|>", sorl's
  /// "<|end_turn|>"): generation stops at its token.
  std::string_view end_of_turn() const noexcept;

 private:
  explicit chat_template(kind k) : kind_(k) {}
  kind kind_;
};

/// The Jinja source of sorl's own turn format, the chat template of models sorl exports with
/// its byte tokenizer: renders what encode_chat encodes.
std::string_view sorl_chat_template_source() noexcept;

/// The role's name in chat templates: "system", "user" or "assistant".
std::string_view chat_role_name(chat_role role) noexcept;

}  // namespace sorl::ml
