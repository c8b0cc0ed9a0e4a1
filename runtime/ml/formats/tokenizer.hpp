#pragma once

// Tokenizers: the interface the rollout workers and the learner see, and a byte-level
// implementation with special tokens for multi-turn chats.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sorl::ml {

/// A token id; the dtype the model's embedding takes (int32, widened to int64 at the
/// model boundary where libtorch wants it).
using token_id = std::int32_t;

/// Special tokens a tokenizer may carry. A BPE tokenizer maps these to whatever its
/// vocabulary calls them (e.g. `<|im_start|>`); `has_special` says which it has.
enum class special_token {
  bos,       ///< start of a sequence
  eos,       ///< end of a sequence: single-turn completions stop here
  pad,       ///< fills ragged batches; never sampled on purpose
  system,    ///< opens a system turn
  user,      ///< opens a user turn (the environment's observations in multi-turn tasks)
  assistant, ///< opens an assistant turn (the policy's actions)
  end_turn,  ///< closes any turn: multi-turn generations stop here
};

/// Speakers in a chat; each maps to the special token that opens its turn.
enum class chat_role { system, user, assistant };

/// One turn of a chat.
struct chat_message {
  chat_role role;
  std::string content;
};

/// How `decode` treats special tokens.
enum class decode_specials {
  render, ///< written as their literal text (`<|eos|>`): for logs and debugging
  skip,   ///< dropped: for handing a completion to a reward check
};

/// Text ↔ token ids. Implementations are immutable after construction, so one instance
/// may be shared by all threads.
///
/// Contract shared by every implementation:
/// - `encode` treats its input as plain text: it never yields a special id, even where the
///   text spells a special token literally (`"<|eos|>"` is eight ordinary characters).
///   Prompts and environment observations therefore can't inject turn markers.
/// - `encode_with_special` recognises the literal spellings of the special tokens and is
///   for trusted, hand-written templates only.
/// - `decode` never throws: bytes that aren't valid UTF-8 pass through as they are (use
///   `sanitize_utf8` before putting text into JSON), and ids outside [0, vocab_size) decode
///   to U+FFFD, since a model whose embedding is wider than the tokenizer can sample them.
class tokenizer {
public:
  virtual ~tokenizer() = default;

  /// Encodes plain text; never produces special ids (see the class comment).
  virtual std::vector<token_id> encode(std::string_view text) const = 0;

  /// Encodes text in which literal special-token spellings (as `token_text` returns
  /// them) become their ids. For trusted templates only.
  virtual std::vector<token_id> encode_with_special(std::string_view text) const = 0;

  /// Decodes ids to text (bytes; possibly invalid UTF-8). Never throws.
  virtual std::string decode(const std::vector<token_id>& ids,
                             decode_specials specials = decode_specials::render) const
    = 0;

  /// Number of ids the tokenizer defines: every id it produces is below this.
  virtual std::int32_t vocab_size() const = 0;

  /// Whether the tokenizer defines `which`.
  virtual bool has_special(special_token which) const = 0;

  /// The id of `which`. Throws std::out_of_range if `has_special(which)` is false.
  virtual token_id special_id(special_token which) const = 0;

  /// Whether `id` is a special (non-text) token; false for ids outside the vocabulary.
  virtual bool is_special(token_id id) const = 0;

  /// Readable form of one id: the literal spelling of a special token, the bytes of a
  /// text token, or U+FFFD for an id outside the vocabulary. Never throws.
  virtual std::string token_text(token_id id) const = 0;
};

/// The byte-level tokenizer: ids 0..255 are the bytes of the (UTF-8) text, then special
/// tokens, then reserved ids, 272 in all (the model presets' vocabulary):
///
/// | id      | token            |
/// |---------|------------------|
/// | 0..255  | byte value       |
/// | 256     | `<|bos|>`        |
/// | 257     | `<|eos|>`        |
/// | 258     | `<|pad|>`        |
/// | 259     | `<|system|>`     |
/// | 260     | `<|user|>`       |
/// | 261     | `<|assistant|>`  |
/// | 262     | `<|end_turn|>`   |
/// | 263..271| `<|reserved_0|>` .. `<|reserved_8|>` (special; never produced by encode) |
///
/// The reserved ids fill the vocabulary up to 272 so that every id a 272-wide model can
/// sample has a defined meaning; they are special and are skipped like the others.
class byte_tokenizer final : public tokenizer {
public:
  static constexpr token_id bos = 256;
  static constexpr token_id eos = 257;
  static constexpr token_id pad = 258;
  static constexpr token_id system = 259;
  static constexpr token_id user = 260;
  static constexpr token_id assistant = 261;
  static constexpr token_id end_turn = 262;
  static constexpr token_id first_reserved = 263;
  static constexpr std::int32_t size = 272;

  std::vector<token_id> encode(std::string_view text) const override;
  std::vector<token_id> encode_with_special(std::string_view text) const override;
  std::string decode(const std::vector<token_id>& ids,
                     decode_specials specials = decode_specials::render) const override;
  std::int32_t vocab_size() const override;
  bool has_special(special_token which) const override;
  token_id special_id(special_token which) const override;
  bool is_special(token_id id) const override;
  std::string token_text(token_id id) const override;
};

/// The special token that opens a turn of `role`.
special_token turn_marker(chat_role role);

/// Encodes a chat in sorl's turn format:
///
///     <|bos|> { <|role|> content <|end_turn|> }*  [<|assistant|>]
///
/// Contents are encoded as plain text (no special ids from content). With
/// `add_generation_prompt`, the sequence ends with an open assistant turn for the
/// policy to continue; the policy closes it with `<|end_turn|>`. Throws
/// std::out_of_range if the tokenizer lacks a marker this format needs.
std::vector<token_id> encode_chat(const tokenizer& tok, const std::vector<chat_message>& messages,
                                  bool add_generation_prompt);

/// Returns `text` with every byte sequence that isn't well-formed UTF-8 (per the Unicode
/// standard, table 3-7: no overlongs, surrogates or code points above U+10FFFF) replaced
/// by U+FFFD, one replacement per maximal ill-formed subpart. Valid text is unchanged.
std::string sanitize_utf8(std::string_view text);

/// The token ids a single-turn prompt is decoded from: <|bos|> then encode(prompt_text). The
/// worker, the evaluator and the JSONL loader's context check all count a prompt this way.
/// Throws std::out_of_range if the tokenizer has no BOS.
std::vector<token_id> encode_single_turn_prompt(const tokenizer& tok, const std::string& prompt_text);

} // namespace sorl::ml
