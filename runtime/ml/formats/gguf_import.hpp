#pragma once

// GGUF model files (runtime/ml/formats/gguf.hpp) as Hugging Face model directories
// (runtime/ml/formats/hf_model.hpp): the metadata becomes config.json, the tensors are dequantised,
// renamed from llama.cpp's names to transformers' and, for Llama, their query and key rows
// put back in transformers' rotary order. Supported: general.architecture "llama" and
// "qwen2" with tensor types gguf_file::dequantize reads.

#include "runtime/ml/formats/gguf.hpp"
#include "runtime/ml/formats/hf_model.hpp"

#include <filesystem>

namespace sorl::ml {

/// The hf_model_config a GGUF file's metadata describes: `<arch>.block_count`,
/// `.embedding_length`, `.feed_forward_length`, `.attention.head_count`,
/// `.attention.head_count_kv` (default: head_count), `.context_length`,
/// `.rope.freq_base` (default 10000), `.attention.layer_norm_rms_epsilon`,
/// `.rope.scaling.type` ("none" or "linear" with `.rope.scaling.factor`), the vocabulary
/// size (`<arch>.vocab_size`, else the length of `tokenizer.ggml.tokens`), and bos / eos /
/// padding ids from `tokenizer.ggml.*_token_id`. Tied embeddings when there is no
/// `output.weight` tensor. Throws gguf_error naming the key for another architecture, a
/// missing or malformed key, `.rope.dimension_count` other than the head size, or other
/// rope scaling.
hf_model_config gguf_model_config(const gguf_file& file);

/// Undoes llama.cpp's reordering of a Llama query or key projection. Its converter
/// interleaves each head's two rotary halves row by row (rows (h, i, j) of [n_heads, 2,
/// head_dim/2] stored as (h, j, i)) so that its RoPE kernel rotates adjacent pairs;
/// transformers rotates the halves. w: [n_heads * head_dim, in] any dtype → same shape,
/// rows in transformers' order. Throws std::invalid_argument when the rows do not split
/// into n_heads heads of even size.
at::Tensor unpermute_rope_rows(const at::Tensor& w, std::int64_t n_heads);

/// The inverse of unpermute_rope_rows: transformers' order to llama.cpp's.
at::Tensor permute_rope_rows(const at::Tensor& w, std::int64_t n_heads);

/// The model of a GGUF file with fp32 weights (dequantised), laid out as transformers'
/// checkpoint of the same model; its max_seq is the context length capped at `max_seq`
/// tokens (the config keeps the full length). Every tensor's name, type and shape is checked
/// before the model is allocated. Throws gguf_error naming the tensor that is missing, of
/// an unsupported type or of the wrong shape, or a tensor policy_model has no place for
/// (e.g. `rope_freqs.weight`, llama.cpp's Llama 3.1 frequency factors).
hf_loaded_model gguf_to_model(const gguf_file& file, std::int64_t max_seq = 4096);

/// The `tokenizer.json` (the Hugging Face `tokenizers` serialisation) of a GGUF file's
/// byte-level BPE vocabulary (`tokenizer.ggml.model` "gpt2"): vocab and merges as stored,
/// control tokens (token_type 3) as special added tokens, user-defined ones (4) as
/// non-special added tokens, and the normaliser and pre-tokeniser that
/// `tokenizer.ggml.pre` names, as the original model's tokenizer.json has them:
/// "smollm" / "starcoder" (digits split one by one, then GPT-2's byte-level split),
/// "gpt-2" / "default" (GPT-2's), "llama-bpe" (Llama 3's pattern), "qwen2" (NFC, Qwen2's
/// pattern). Throws gguf_error naming the key for another tokenizer model or pre-tokeniser.
std::string gguf_tokenizer_json(const gguf_file& file);

/// The `tokenizer_config.json` of a GGUF file: bos / eos / unk / pad tokens by content
/// from `tokenizer.ggml.*_token_id`, `add_bos_token`, the context length as
/// model_max_length and `tokenizer.chat_template` when the file has one.
/// Throws gguf_error naming the key when an id is outside the vocabulary.
std::string gguf_tokenizer_config_json(const gguf_file& file);

/// What convert_gguf_to_hf wrote.
struct gguf_conversion {
  hf_model_config config;
  bool tokenizer = false;  ///< tokenizer.json and tokenizer_config.json were written
};

/// Converts the GGUF file at `gguf_path` into a Hugging Face model directory at `out_dir`
/// (save_hf_model: config.json, generation_config.json, model.safetensors in `dtype`; and,
/// when the file has a `tokenizer.ggml.model`, tokenizer.json and tokenizer_config.json,
/// above). Throws gguf_error / checkpoint_error as the steps do; nothing is written when
/// the tokenizer or the model is refused.
gguf_conversion convert_gguf_to_hf(const std::filesystem::path& gguf_path, const std::filesystem::path& out_dir,
                                   at::ScalarType dtype = at::kBFloat16);

}  // namespace sorl::ml
