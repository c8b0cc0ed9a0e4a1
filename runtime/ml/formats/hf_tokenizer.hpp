#pragma once

// Hugging Face `tokenizer.json` byte-level BPE tokenizers (the serialisation of the
// `tokenizers` library, https://github.com/huggingface/tokenizers), as SmolLM2 / GPT-2,
// Llama 3 and Qwen2 ship them, giving the ids `tokenizers` gives.
//
// The pipeline `tokenizers` runs for `Tokenizer.encode(text, add_special_tokens=False)`:
//   1. added tokens with `normalized: false` are cut out of the raw text (leftmost-longest
//      match, then single_word / lstrip / rstrip);
//   2. every remaining piece is normalised (NFC or nothing) and added tokens with
//      `normalized: true` are cut out of it, matched against their normalised content;
//   3. every remaining piece is pre-tokenized (Split / Digits, then ByteLevel, which maps
//      each UTF-8 byte through GPT-2's bytes_to_unicode table and may split with the GPT-2
//      pattern);
//   4. every pre-token goes through BPE: lowest merge rank first, leftmost on ties.
// `post_processor` is read and ignored (sorl adds BOS itself), and so are `truncation` and
// `padding` (sorl bounds lengths itself).
//
// Supported, and nothing else (anything else is refused with the JSON path of the field):
//   normalizer     null, NFC, Sequence of those
//   pre_tokenizer  ByteLevel (last, once), optionally preceded by Split (Regex or String
//                  pattern, any behavior, invert) and Digits, alone or in a Sequence
//   model          BPE: byte_fallback false, dropout null or 0, continuing_subword_prefix
//                  and end_of_word_suffix null or "", ignore_merges, unk_token, fuse_unk
//   decoder        ByteLevel
//
// Regular expressions run on PCRE2 (UTF, UCP and MULTILINE, JIT where available);
// `tokenizers` runs them on Oniguruma (Ruby syntax). The escapes whose meaning differs
// (\s, \w, \b, \h, \uHHHH, and \p{L} / \p{N} for letters newer than PCRE2's Unicode tables)
// are respelled so that the two agree; Oniguruma-only constructs such as `(?m)` (dot-all
// there, multi-line here) or nested classes are not translated, and \X (grapheme clusters)
// follows each library's Unicode version. NFC follows the Unicode 9.0 tables
// `tokenizers` normalises with, not utf8proc's newer ones. bench/interop/tokenizer_parity.py
// checks the ids against the Python library.

#include "runtime/ml/formats/tokenizer.hpp"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sorl::ml {

/// Thrown for a `tokenizer.json` that can't be read, isn't valid JSON, is inconsistent, or
/// uses a feature hf_tokenizer doesn't implement, and for a regular expression that fails
/// while matching (PCRE2's heap or JIT stack limit on pathological input).
class tokenizer_error : public std::runtime_error {
public:
  /// The message is "<label>: field '<field>': <what>" ("<label>: <what>" without a field).
  tokenizer_error(std::string label, std::string field, const std::string& what);

  /// The file concerned, as the caller named it.
  const std::string& label() const noexcept { return label_; }
  /// The JSON path of the field at fault (e.g. "model.merges[12]"), or "".
  const std::string& field() const noexcept { return field_; }

private:
  std::string label_;
  std::string field_;
};

/// Which tokens play sorl's special roles, named by content (an added token's `content`, or
/// else a key of `model.vocab`), e.g. ChatML: eos = end_turn = "<|im_end|>". A role left
/// empty is one the tokenizer doesn't have (has_special is false). system / user / assistant
/// are rarely single tokens in these families; name them only where they are.
struct hf_special_tokens {
  std::optional<std::string> bos;
  std::optional<std::string> eos;
  std::optional<std::string> pad;
  std::optional<std::string> system;
  std::optional<std::string> user;
  std::optional<std::string> assistant;
  std::optional<std::string> end_turn;
};

/// A byte-level BPE tokenizer read from a Hugging Face `tokenizer.json` (see the file
/// comment for the supported subset). Immutable after construction and safe to share
/// between threads; copies share the same tables.
///
/// Against the `tokenizer` contract:
/// - `encode` gives the ids of Python `tokenizers` with `encode_special_tokens = True`:
///   added tokens with `special: true` are ordinary text, non-special added tokens still
///   match. `encode_with_special` gives those of the default `encode(text,
///   add_special_tokens=False)`: every added token matches.
/// - No merge, byte symbol or ignore_merges lookup ever yields a special token (such merges
///   are dropped at load, and an unk_token that is special is refused), so plain text can't
///   produce one even where Python would; real vocabularies have no such merges.
/// - Input that isn't valid UTF-8 is first made valid as `sanitize_utf8` does (U+FFFD per
///   maximal ill-formed subpart), as Python's `bytes.decode("utf-8", "replace")` does.
/// - `decode` maps each token back through bytes_to_unicode; a token with a character
///   outside that table (a non-special added token "<a b>", whose space isn't in it) decodes
///   to its UTF-8 as it is, as the ByteLevel decoder does. Special tokens render as their
///   content or are skipped; non-special added tokens always render. Unlike Python, invalid
///   UTF-8 in the result is kept, not replaced.
/// - `encode` and `encode_with_special` throw tokenizer_error only where PCRE2 gives up on
///   a pattern (its match limit, on pathological input); 1 MB runs of one character are fine.
/// - `vocab_size` is one more than the largest id in `model.vocab` and `added_tokens`; ids
///   below it that name no token decode to U+FFFD.
class hf_tokenizer final : public tokenizer {
public:
  /// Largest vocabulary accepted (ids must be below this): bounds what an untrusted file
  /// can make the loader allocate per id.
  static constexpr std::int32_t max_vocab = 1 << 24;

  /// Builds the tokenizer from the text of a `tokenizer.json`; `label` names it in errors.
  /// Throws tokenizer_error naming the field at fault for malformed JSON, a field of the
  /// wrong type, an unknown field, an unsupported type or option, an id that is negative,
  /// at least max_vocab or used twice, a merge whose parts or result are not in the
  /// vocabulary, an added token whose id disagrees with model.vocab, an invalid regular
  /// expression, or a token named in `specials` that the tokenizer doesn't have.
  static hf_tokenizer from_json(std::string_view json_text, const std::string& label,
                                const hf_special_tokens& specials = {});

  /// Reads `tokenizer_json` and builds the tokenizer as from_json (the path is the label).
  /// Throws tokenizer_error, also when the file can't be read.
  static hf_tokenizer load(const std::filesystem::path& tokenizer_json,
                           const hf_special_tokens& specials = {});

  std::vector<token_id> encode(std::string_view text) const override;
  std::vector<token_id> encode_with_special(std::string_view text) const override;
  std::string decode(const std::vector<token_id>& ids,
                     decode_specials specials = decode_specials::render) const override;
  std::int32_t vocab_size() const override;
  bool has_special(special_token which) const override;
  token_id special_id(special_token which) const override;
  bool is_special(token_id id) const override;
  std::string token_text(token_id id) const override;

  /// The id of the token whose content is `content` (an added token's content, else a
  /// `model.vocab` key as the file spells it, i.e. in bytes_to_unicode form), or nullopt.
  std::optional<token_id> token_to_id(std::string_view content) const;

  /// The name given to from_json (or the path given to load).
  const std::string& label() const noexcept;

private:
  struct impl;  // the tables; defined in hf_tokenizer.cpp, so PCRE2 stays out of this header

  explicit hf_tokenizer(std::shared_ptr<const impl> state);

  std::shared_ptr<const impl> impl_;
};

/// The character GPT-2's bytes_to_unicode maps `byte` to, as UTF-8 (openai/gpt-2
/// src/encoder.py): printable Latin-1 bytes stand for themselves, the other 68 for U+0100
/// onwards. A byte-level vocabulary spells its tokens in these characters.
std::string byte_level_symbol(std::uint8_t byte);

/// The `tokenizer.json` of byte_tokenizer: a byte-level BPE without merges whose 256 base
/// tokens are the bytes (id = byte value) and whose specials and reserved tokens are special
/// added tokens with byte_tokenizer's ids and spellings (`<|bos|>` = 256, ...). Loaded by
/// hf_tokenizer or Python `tokenizers`, it gives byte_tokenizer's ids, so a sorl model
/// exported to Hugging Face keeps its tokenizer. Its post-processor prepends `<|bos|>` when
/// special tokens are added (transformers' `tokenizer(text)`), which gives sorl's
/// single-turn prompt encoding (encode_single_turn_prompt).
std::string byte_tokenizer_json();

}  // namespace sorl::ml
