#pragma once

// How one policy turns a task's prompts into token ids, and which tokens end its turns.
// sorl's presets speak the byte tokenizer: a single-turn prompt is `<|bos|>` + its text
// (encode_single_turn_prompt) and a chat is encode_chat's turn format. A Hugging Face model
// speaks its tokenizer.json and its chat template (runtime/ml/formats/chat_template.hpp) for both:
// a single-turn prompt is one user message, after an optional system message. Everything that
// encodes prompts for a policy (rollout workers, the learner's recomputation, evaluation)
// goes through one of these, so that training and scoring see the same ids.
//
// A sorl policy exported by `sorl export-hf` is a Hugging Face directory that records the
// format it was trained in (tokenizer_config.json "sorl_prompt_format",
// runtime/ml/formats/hf_model.hpp sorl_prompt_format): "byte" for a single-turn policy, which reads
// back as the byte format itself, so that its checkpoint and its export are prompted with the same
// ids; "chat" for a multi-turn one, which reads back through the chat template like any Hugging
// Face model.

#include "runtime/ml/formats/chat_template.hpp"
#include "runtime/ml/formats/hf_tokenizer.hpp"
#include "runtime/ml/formats/tokenizer.hpp"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace sorl::ml {

/// A policy's prompt encoding. Immutable after construction; copies share the tokenizer.
class prompt_format {
 public:
  /// sorl's byte tokenizer and turn format; stops at `<|eos|>` and `<|end_turn|>`.
  static prompt_format byte_level();

  /// A Hugging Face model directory's tokenizer.json and tokenizer_config.json chat
  /// template; stops at the template's end-of-turn token and at `eos_token_ids` (the
  /// config's). `system_prompt`, when not empty, precedes every single-turn prompt.
  /// A directory whose tokenizer_config.json records "sorl_prompt_format": "byte" (a
  /// single-turn sorl policy's export) is byte_level() instead: its tokenizer must be sorl's
  /// byte tokenizer, and it takes no system prompt.
  /// Throws tokenizer_error / chat_template_error as loading them does, checkpoint_error as
  /// read_sorl_prompt_format, and std::invalid_argument when the end-of-turn text is not one
  /// token of the vocabulary, or for a "byte" directory whose tokenizer is not the byte
  /// tokenizer or with a system prompt (naming the directory).
  static prompt_format hugging_face(const std::filesystem::path& model_dir,
                                    const std::vector<std::int64_t>& eos_token_ids,
                                    std::string system_prompt = {});

  /// The tokenizer, for decoding completions.
  const tokenizer& tok() const noexcept { return *tok_; }

  /// Token ids of a single-turn prompt, ready for the policy to continue.
  std::vector<token_id> single_turn(const std::string& prompt) const;

  /// Token ids of a chat; with `add_generation_prompt`, ending where the assistant's turn
  /// begins. Message contents are encoded as plain text (tokenizer::encode), so a content
  /// can never produce a special token.
  std::vector<token_id> chat(const std::vector<chat_message>& messages, bool add_generation_prompt) const;

  /// The tokens that end a completion or a turn (eos ids of the generator), without repeats.
  const std::vector<token_id>& stop_ids() const noexcept { return stops_; }

  /// Whether this is sorl's byte format (byte_level()), whose multi-turn layout is encode_chat's.
  bool is_byte_level() const noexcept { return !chat_.has_value(); }

  /// "byte" or the chat template's name ("smollm2", "chatml", "sorl").
  std::string_view name() const noexcept;

 private:
  prompt_format() = default;
  std::shared_ptr<const tokenizer> tok_;
  std::optional<chat_template> chat_;  ///< none: sorl's byte format
  std::string system_prompt_;
  std::vector<token_id> stops_;
};

}  // namespace sorl::ml
