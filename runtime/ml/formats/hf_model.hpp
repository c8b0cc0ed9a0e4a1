#pragma once

// Hugging Face model directories in and out: the `config.json` + `model.safetensors` (or
// sharded `model-0000k-of-0000n.safetensors` + `model.safetensors.index.json`) layout that
// `transformers` `from_pretrained` / `save_pretrained` use, for the two decoder families
// policy_model implements: Llama (`LlamaForCausalLM`) and Qwen2 (`Qwen2ForCausalLM`).
//
// Reading is strict: a config field that would change the model's arithmetic and that
// policy_model does not implement (another activation, an o_proj or MLP bias, sliding-window
// attention, partial rotary, a head_dim other than hidden_size / num_attention_heads, a
// rope_scaling kind other than linear and llama3) is refused with the field's name, never
// ignored. Fields that only describe the checkpoint (torch_dtype, transformers_version, ...)
// are ignored.

#include "runtime/ml/formats/safetensors.hpp"
#include "runtime/ml/policy/model.hpp"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sorl::ml {

/// The family a Hugging Face config names.
enum class hf_family {
  llama,  ///< model_type "llama", LlamaForCausalLM (also SmolLM, Mistral-free Llama clones)
  qwen2,  ///< model_type "qwen2", Qwen2ForCausalLM: q/k/v biases, no o_proj bias
};

/// What a Hugging Face `config.json` says: the model's shape and the token ids generation
/// needs. Token ids are absent when the config has none (or null).
struct hf_model_config {
  hf_family family = hf_family::llama;
  model_dims dims;  ///< max_seq = max_position_embeddings unless a loader caps it
  std::int64_t max_position_embeddings = 0;  ///< as the config says, tokens
  std::optional<std::int64_t> bos_token_id;
  std::vector<std::int64_t> eos_token_ids;  ///< the config's eos_token_id (an int or a list)
  std::optional<std::int64_t> pad_token_id;
};

/// The `model_type` string of a family: "llama" or "qwen2".
std::string_view hf_model_type(hf_family family);

/// Parses the text of a `config.json`. `label` names the file in errors.
/// Throws checkpoint_error whose tensor() is empty and whose message names the field at
/// fault ("<label>: field 'rope_scaling.rope_type': 'yarn' is not supported ...") for
/// malformed JSON, a missing required field (hidden_size, intermediate_size,
/// num_hidden_layers, num_attention_heads, vocab_size), a field of the wrong JSON type or out
/// of range, an architecture or model_type other than Llama / Qwen2, or an unsupported
/// feature (see the file comment).
hf_model_config parse_hf_config(std::string_view json_text, const std::string& label);

/// Reads `<dir>/config.json`. Throws checkpoint_error as parse_hf_config, or when the file
/// cannot be read.
hf_model_config read_hf_config(const std::filesystem::path& dir);

/// The `config.json` text save_hf_model writes for `config` (pretty-printed JSON): the
/// family's architecture and model_type, every shape field, rope_theta, rope_scaling when
/// set, rms_norm_eps, tie_word_embeddings, hidden_act "silu", attention_bias false (Llama) /
/// use_sliding_window false (Qwen2), torch_dtype `torch_dtype` ("bfloat16" or "float32").
std::string hf_config_json(const hf_model_config& config, std::string_view torch_dtype);

/// The tensors a Hugging Face checkpoint of a model with `dims` holds, name and shape, in
/// policy_model::parameters() order (a tied LM head is not listed). Computed without
/// allocating, so loaders can check a file's headers against a config before trusting its
/// sizes. Throws std::invalid_argument for inconsistent dims.
std::vector<std::pair<std::string, std::vector<std::int64_t>>> hf_parameter_shapes(const model_dims& dims);

/// Options of load_hf_model.
struct hf_load_options {
  /// Cap on the loaded model's max_seq (the KV cache's and RoPE tables' length), tokens;
  /// 0 = the config's max_position_embeddings, however long. The default keeps a
  /// million-token config from costing million-row RoPE tables.
  std::int64_t max_seq = 32768;
  c10::Device device = c10::kCPU;
};

/// A model loaded from a Hugging Face directory, with its config.
struct hf_loaded_model {
  hf_model_config config;
  policy_model model;  ///< fp32 weights on the requested device
};

/// Loads a Hugging Face model directory: config.json, then the weights from
/// `model.safetensors`, or from the shards that `model.safetensors.index.json`'s weight_map
/// names. Tensors may be F32, F16 or BF16 (converted to fp32 exactly) and must have the
/// shapes the config implies. Every parameter must be present once; a tied model's
/// `lm_head.weight`, if the file has one, is ignored (transformers ties it to the
/// embedding too), and so are `*.rotary_emb.inv_freq` buffers of older exports. Any other
/// extra tensor is an error.
/// Throws checkpoint_error naming the file and the tensor or field at fault.
hf_loaded_model load_hf_model(const std::filesystem::path& dir, const hf_load_options& options = {});

/// Options of save_hf_model.
struct hf_save_options {
  hf_family family = hf_family::llama;   ///< must be qwen2 when the model has qkv_bias
  at::ScalarType dtype = at::kBFloat16;  ///< kBFloat16 (round to nearest even) or kFloat
  std::optional<std::int64_t> bos_token_id;
  std::vector<std::int64_t> eos_token_ids;
  std::optional<std::int64_t> pad_token_id;
  /// max_position_embeddings to write; 0 = the model's max_seq.
  std::int64_t max_position_embeddings = 0;
};

/// Writes `model` as a Hugging Face directory that `from_pretrained` loads unchanged:
/// `config.json`, `generation_config.json` (token ids only) and one `model.safetensors`
/// (metadata {"format": "pt"}; a tied embedding stored once, as transformers saves it),
/// each file written atomically. `dir` is created if needed; existing files of these names
/// are replaced. Throws std::invalid_argument for a Llama family with qkv_bias (Llama's
/// `attention_bias` would add an o_proj bias policy_model lacks) or an unsupported dtype,
/// checkpoint_error for I/O failures.
void save_hf_model(const policy_model& model, const std::filesystem::path& dir,
                   const hf_save_options& options = {});

/// How a sorl byte model was trained to read a single-turn prompt. A sorl policy trained on a
/// single-turn task only ever saw `<|bos|>` + text; one trained on a multi-turn task only ever
/// saw chats in sorl's turn format. Its exported directory records which in
/// `tokenizer_config.json` as "sorl_prompt_format" (save_hf_byte_model), and
/// prompt_format::hugging_face reads it back, so that `sorl eval DIR` and `[model] hf_dir`
/// prompt the policy as it was trained (runtime/ml/formats/prompt_format.hpp).
enum class sorl_prompt_format {
  byte,  ///< "byte": sorl's byte format, a single-turn prompt is `<|bos|>` + its text
  chat,  ///< "chat": a single-turn prompt is one user turn of the chat template
};

/// "byte" or "chat", the values of tokenizer_config.json's "sorl_prompt_format".
std::string_view to_string(sorl_prompt_format format) noexcept;

/// The "sorl_prompt_format" `<dir>/tokenizer_config.json` records; nullopt when the file or
/// the key is absent (a directory sorl did not export, or one exported before the key
/// existed: it reads as "chat", the chat template it carries). Throws checkpoint_error naming
/// the file (and the field) for a file that is not a JSON object or a value other than "byte"
/// and "chat".
std::optional<sorl_prompt_format> read_sorl_prompt_format(const std::filesystem::path& dir);

/// Writes a model that speaks byte_tokenizer (every sorl preset) as a Hugging Face
/// directory: save_hf_model (Llama family, `dtype`, bos and pad = byte_tokenizer's, eos =
/// `<|eos|>` and `<|end_turn|>`, so that generation stops at the end of a turn too),
/// then `tokenizer.json` (byte_tokenizer_json, runtime/ml/formats/hf_tokenizer.hpp) and a
/// `tokenizer_config.json` naming its specials, with sorl's turn format as chat_template
/// (sorl_chat_template_source, runtime/ml/formats/chat_template.hpp) and `trained_as` as
/// "sorl_prompt_format" (the format the policy was trained in; see sorl_prompt_format).
/// transformers loads the directory unchanged and tokenizes as sorl does. Throws as
/// save_hf_model, and std::invalid_argument when the model's vocabulary is not
/// byte_tokenizer's (272).
void save_hf_byte_model(const policy_model& model, const std::filesystem::path& dir,
                        sorl_prompt_format trained_as, at::ScalarType dtype = at::kBFloat16);

}  // namespace sorl::ml
