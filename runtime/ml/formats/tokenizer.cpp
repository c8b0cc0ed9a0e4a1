#include "runtime/ml/formats/tokenizer.hpp"

#include <array>
#include <stdexcept>

namespace sorl::ml {

namespace {

constexpr std::string_view replacement_char = "\xEF\xBF\xBD"; // U+FFFD

constexpr std::array<std::string_view, byte_tokenizer::first_reserved - byte_tokenizer::bos>
  named_specials = {"<|bos|>",    "<|eos|>",       "<|pad|>",     "<|system|>",
                    "<|user|>",   "<|assistant|>", "<|end_turn|>"};

std::string reserved_text(token_id id) {
  return "<|reserved_" + std::to_string(id - byte_tokenizer::first_reserved) + "|>";
}

} // namespace

std::vector<token_id> byte_tokenizer::encode(std::string_view text) const {
  std::vector<token_id> ids;
  ids.reserve(text.size());
  for (char c : text)
    ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::vector<token_id> byte_tokenizer::encode_with_special(std::string_view text) const {
  std::vector<token_id> ids;
  ids.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    token_id matched = -1;
    size_t matched_len = 0;
    if (text[i] == '<') {
      for (token_id id = bos; id < size; ++id) {
        std::string spelled = token_text(id);
        if (text.compare(i, spelled.size(), spelled) == 0) {
          matched = id;
          matched_len = spelled.size();
          break;
        }
      }
    }
    if (matched >= 0) {
      ids.push_back(matched);
      i += matched_len;
    } else {
      ids.push_back(static_cast<unsigned char>(text[i]));
      ++i;
    }
  }
  return ids;
}

std::string byte_tokenizer::decode(const std::vector<token_id>& ids,
                                   decode_specials specials) const {
  std::string out;
  out.reserve(ids.size());
  for (token_id id : ids) {
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else if (is_special(id)) {
      if (specials == decode_specials::render)
        out += token_text(id);
    } else {
      out += replacement_char;
    }
  }
  return out;
}

std::int32_t byte_tokenizer::vocab_size() const {
  return size;
}

bool byte_tokenizer::has_special(special_token) const {
  return true;
}

token_id byte_tokenizer::special_id(special_token which) const {
  switch (which) {
    case special_token::bos:
      return bos;
    case special_token::eos:
      return eos;
    case special_token::pad:
      return pad;
    case special_token::system:
      return system;
    case special_token::user:
      return user;
    case special_token::assistant:
      return assistant;
    case special_token::end_turn:
      return end_turn;
  }
  throw std::out_of_range("byte_tokenizer: unknown special_token value "
                          + std::to_string(static_cast<int>(which)));
}

bool byte_tokenizer::is_special(token_id id) const {
  return id >= bos && id < size;
}

std::string byte_tokenizer::token_text(token_id id) const {
  if (id >= 0 && id < 256)
    return std::string(1, static_cast<char>(static_cast<unsigned char>(id)));
  if (id >= bos && id < first_reserved)
    return std::string(named_specials[static_cast<size_t>(id - bos)]);
  if (id >= first_reserved && id < size)
    return reserved_text(id);
  return std::string(replacement_char);
}

special_token turn_marker(chat_role role) {
  switch (role) {
    case chat_role::system:
      return special_token::system;
    case chat_role::user:
      return special_token::user;
    case chat_role::assistant:
      return special_token::assistant;
  }
  throw std::out_of_range("turn_marker: unknown chat_role value "
                          + std::to_string(static_cast<int>(role)));
}

std::vector<token_id> encode_chat(const tokenizer& tok, const std::vector<chat_message>& messages,
                                  bool add_generation_prompt) {
  const token_id end = tok.special_id(special_token::end_turn);
  std::vector<token_id> ids{tok.special_id(special_token::bos)};
  for (const auto& msg : messages) {
    ids.push_back(tok.special_id(turn_marker(msg.role)));
    auto body = tok.encode(msg.content);
    ids.insert(ids.end(), body.begin(), body.end());
    ids.push_back(end);
  }
  if (add_generation_prompt)
    ids.push_back(tok.special_id(special_token::assistant));
  return ids;
}

std::string sanitize_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char b0 = byte(i);
    if (b0 < 0x80) {
      out.push_back(static_cast<char>(b0));
      ++i;
      continue;
    }
    // Length and the allowed range of the second byte per Unicode table 3-7; the narrow
    // ranges after E0, ED, F0 and F4 exclude overlongs, surrogates and > U+10FFFF.
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      len = 3;
      if (b0 == 0xE0)
        lo = 0xA0; // overlong below U+0800
      if (b0 == 0xED)
        hi = 0x9F; // surrogates D800..DFFF
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      len = 4;
      if (b0 == 0xF0)
        lo = 0x90; // overlong below U+10000
      if (b0 == 0xF4)
        hi = 0x8F; // above U+10FFFF
    }
    if (len == 0) { // a stray continuation byte or a byte that never starts a sequence
      out += replacement_char;
      ++i;
      continue;
    }
    size_t n = 1; // bytes of the sequence accepted so far
    while (n < len && i + n < text.size()) {
      const unsigned char b = byte(i + n);
      const unsigned char want_lo = n == 1 ? lo : 0x80;
      const unsigned char want_hi = n == 1 ? hi : 0xBF;
      if (b < want_lo || b > want_hi)
        break;
      ++n;
    }
    if (n == len)
      out.append(text.substr(i, len));
    else
      out += replacement_char; // the maximal ill-formed subpart becomes one U+FFFD
    i += n;
  }
  return out;
}

std::vector<token_id> encode_single_turn_prompt(const tokenizer& tok, const std::string& prompt_text) {
  std::vector<token_id> ids{tok.special_id(special_token::bos)};
  const std::vector<token_id> body = tok.encode(prompt_text);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

} // namespace sorl::ml
