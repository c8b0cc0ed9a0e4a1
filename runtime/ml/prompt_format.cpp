#include "runtime/ml/prompt_format.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace sorl::ml {

prompt_format prompt_format::byte_level() {
  prompt_format f;
  auto bytes = std::make_shared<const byte_tokenizer>();
  f.stops_ = {bytes->special_id(special_token::eos), bytes->special_id(special_token::end_turn)};
  f.tok_ = std::move(bytes);
  return f;
}

prompt_format prompt_format::hugging_face(const std::filesystem::path& model_dir,
                                          const std::vector<std::int64_t>& eos_token_ids,
                                          std::string system_prompt) {
  prompt_format f;
  f.chat_ = chat_template::from_tokenizer_config(model_dir);
  auto tok = std::make_shared<const hf_tokenizer>(hf_tokenizer::load(model_dir / "tokenizer.json"));
  const auto end = tok->token_to_id(f.chat_->end_of_turn());
  if (!end)
    throw std::invalid_argument(fmt::format("{}: the chat template's end of turn '{}' is not a token of {}",
                                            model_dir.string(), f.chat_->end_of_turn(), tok->label()));
  f.stops_.push_back(*end);
  for (const auto id : eos_token_ids) {
    if (id < 0 || id >= tok->vocab_size())
      throw std::invalid_argument(fmt::format("{}: eos token id {} is outside the vocabulary of {}",
                                              model_dir.string(), id, tok->vocab_size()));
    if (std::find(f.stops_.begin(), f.stops_.end(), id) == f.stops_.end())
      f.stops_.push_back(static_cast<token_id>(id));
  }
  f.tok_ = std::move(tok);
  f.system_prompt_ = std::move(system_prompt);
  return f;
}

std::vector<token_id> prompt_format::single_turn(const std::string& prompt) const {
  if (!chat_) return encode_single_turn_prompt(*tok_, prompt);
  std::vector<chat_message> messages;
  if (!system_prompt_.empty()) messages.push_back({chat_role::system, system_prompt_});
  messages.push_back({chat_role::user, prompt});
  return chat(messages, /*add_generation_prompt=*/true);
}

std::vector<token_id> prompt_format::chat(const std::vector<chat_message>& messages,
                                          bool add_generation_prompt) const {
  if (!chat_) return encode_chat(*tok_, messages, add_generation_prompt);
  std::vector<token_id> ids;
  for (const auto& piece : chat_->render_pieces(messages, add_generation_prompt)) {
    const auto part = piece.template_text ? tok_->encode_with_special(piece.text) : tok_->encode(piece.text);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

std::string_view prompt_format::name() const noexcept { return chat_ ? chat_->name() : "byte"; }

}  // namespace sorl::ml
