#pragma once

// Writing `tokenizer.json` documents (the Hugging Face `tokenizers` serialisation, version
// 1.0) for byte-level BPE tokenizers: the frame shared by byte_tokenizer_json
// (runtime/ml/formats/hf_tokenizer.hpp) and gguf_tokenizer_json
// (runtime/ml/formats/gguf_import.hpp). hf_tokenizer reads what these write.

#include <nlohmann/json.hpp>

namespace sorl::ml {

/// The Split patterns of the families' tokenizer.json files: Llama 3 keeps up to three
/// digits together, Qwen2 one.
inline constexpr const char* llama3_split_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr const char* qwen2_split_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

/// A ByteLevel component (pre-tokenizer, decoder or post-processor: `tokenizers` uses one
/// object for all three) without a prefix space.
nlohmann::ordered_json byte_level_component(bool use_regex, bool trim_offsets);

/// A whole byte-level BPE tokenizer.json: `vocab` (token → id), `merges` (strings "a b"),
/// `added_tokens` (the tokenizers objects), and the pipeline around the model. The BPE
/// options are those of byte-level vocabularies: no dropout, unk token, subword affixes or
/// byte fallback.
nlohmann::ordered_json byte_level_bpe_document(nlohmann::ordered_json vocab, nlohmann::ordered_json merges,
                                               nlohmann::ordered_json added_tokens, nlohmann::ordered_json normalizer,
                                               nlohmann::ordered_json pre_tokenizer,
                                               nlohmann::ordered_json post_processor, nlohmann::ordered_json decoder,
                                               bool ignore_merges);

/// One entry of `added_tokens`: not single-word, no stripping, not normalised.
nlohmann::ordered_json added_token_entry(std::int64_t id, const std::string& content, bool special);

}  // namespace sorl::ml
