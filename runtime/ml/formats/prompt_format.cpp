#include "runtime/ml/formats/prompt_format.hpp"

#include "runtime/ml/formats/hf_model.hpp"

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

namespace {

// Throws unless `model_dir`'s tokenizer.json gives byte_tokenizer's vocabulary and specials:
// a directory that says it was trained in the byte format is read with byte_tokenizer.
void require_byte_tokenizer(const std::filesystem::path& model_dir) {
  const auto tok = hf_tokenizer::load(model_dir / "tokenizer.json");
  const byte_tokenizer bytes;
  std::string why;
  if (tok.vocab_size() != byte_tokenizer::size)
    why = fmt::format("its vocabulary is {}, the byte tokenizer's {}", tok.vocab_size(), byte_tokenizer::size);
  for (token_id id = byte_tokenizer::bos; why.empty() && id < byte_tokenizer::first_reserved; ++id)
    if (tok.token_to_id(bytes.token_text(id)) != id)
      why = fmt::format("'{}' is not id {}", bytes.token_text(id), id);
  if (!why.empty())
    throw std::invalid_argument(fmt::format(
        "{}: tokenizer_config.json records sorl_prompt_format \"byte\", but tokenizer.json is not sorl's byte "
        "tokenizer ({})",
        model_dir.string(), why));
}

}  // namespace

prompt_format prompt_format::hugging_face(const std::filesystem::path& model_dir,
                                          const std::vector<std::int64_t>& eos_token_ids,
                                          std::string system_prompt) {
  if (read_sorl_prompt_format(model_dir) == sorl_prompt_format::byte) {
    require_byte_tokenizer(model_dir);
    if (!system_prompt.empty())
      throw std::invalid_argument(fmt::format(
          "{}: a system prompt needs a chat template; this single-turn sorl policy was trained in the byte "
          "format, which has no system turn",
          model_dir.string()));
    return byte_level();
  }
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
