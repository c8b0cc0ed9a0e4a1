#include "runtime/ml/formats/gguf_import.hpp"

#include "runtime/ml/formats/tokenizer_json.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <map>
#include <set>
#include <stdexcept>
#include <string>

namespace sorl::ml {

namespace {

std::int64_t positive(const gguf_file& f, const std::string& key, std::optional<std::int64_t> fallback = std::nullopt) {
  const std::int64_t v = (f.find(key) == nullptr && fallback) ? *fallback : f.get_int(key);
  if (v <= 0) throw gguf_error(f.label(), fmt::format("metadata '{}': must be > 0, got {}", key, v));
  return v;
}

std::optional<std::int64_t> token_id(const gguf_file& f, const std::string& key) {
  if (f.find(key) == nullptr) return std::nullopt;
  return f.get_int(key);
}

// A float metadata value as the decimal its writer meant: FLOAT32 keys hold e.g. 1e-5 as
// 9.99999974737875e-06, which config.json would otherwise carry forever. The shortest
// decimal that rounds to the same float32 is that float32 exactly, so nothing changes.
double metadata_float(const gguf_file& f, const std::string& key) {
  const double v = f.get_float(key);
  if (f.find(key)->type != gguf_type::float32) return v;
  return std::stod(fmt::format("{}", static_cast<float>(v)));
}

at::Tensor reorder_rope_rows(const at::Tensor& w, std::int64_t n_heads, bool to_hf) {
  if (w.dim() < 1 || n_heads <= 0 || w.size(0) % n_heads != 0 || (w.size(0) / n_heads) % 2 != 0)
    throw std::invalid_argument(fmt::format("rope row reorder: {} rows do not split into {} heads of even size",
                                            w.dim() < 1 ? 0 : w.size(0), n_heads));
  const std::int64_t half = w.size(0) / n_heads / 2;
  std::vector<std::int64_t> shape{n_heads, to_hf ? half : 2, to_hf ? 2 : half};
  for (std::int64_t d = 1; d < w.dim(); ++d) shape.push_back(w.size(d));
  return w.reshape(shape).transpose(1, 2).reshape(w.sizes()).contiguous();
}

}  // namespace

at::Tensor unpermute_rope_rows(const at::Tensor& w, std::int64_t n_heads) { return reorder_rope_rows(w, n_heads, true); }
at::Tensor permute_rope_rows(const at::Tensor& w, std::int64_t n_heads) { return reorder_rope_rows(w, n_heads, false); }

hf_model_config gguf_model_config(const gguf_file& f) {
  const std::string arch = f.get_string("general.architecture");
  hf_model_config out;
  if (arch == "llama") {
    out.family = hf_family::llama;
  } else if (arch == "qwen2") {
    out.family = hf_family::qwen2;
  } else {
    throw gguf_error(f.label(), fmt::format("metadata 'general.architecture': '{}' is not supported "
                                            "(supported: llama, qwen2)", arch));
  }
  const std::string p = arch + ".";
  model_dims& d = out.dims;
  d.n_layers = positive(f, p + "block_count");
  d.d_model = positive(f, p + "embedding_length");
  d.d_ff = positive(f, p + "feed_forward_length");
  d.n_heads = positive(f, p + "attention.head_count");
  d.n_kv_heads = positive(f, p + "attention.head_count_kv", d.n_heads);
  out.max_position_embeddings = positive(f, p + "context_length");
  d.max_seq = out.max_position_embeddings;
  d.rope_theta = f.find(p + "rope.freq_base") ? metadata_float(f, p + "rope.freq_base") : 10000.0;
  d.norm_eps = metadata_float(f, p + "attention.layer_norm_rms_epsilon");
  if (f.find(p + "vocab_size") != nullptr) {
    d.vocab = positive(f, p + "vocab_size");
  } else {
    d.vocab = static_cast<std::int64_t>(f.get_string_array("tokenizer.ggml.tokens").size());
  }
  if (d.d_model % d.n_heads != 0 || d.n_heads % d.n_kv_heads != 0)
    throw gguf_error(f.label(), fmt::format("metadata '{}attention.head_count': {} query / {} key-value heads do not "
                                            "divide embedding_length {}",
                                            p, d.n_heads, d.n_kv_heads, d.d_model));
  if (f.find(p + "rope.dimension_count") != nullptr && f.get_int(p + "rope.dimension_count") != d.head_dim())
    throw gguf_error(f.label(), fmt::format("metadata '{}rope.dimension_count': {} is not supported (RoPE on the "
                                            "whole head, {} dimensions)",
                                            p, f.get_int(p + "rope.dimension_count"), d.head_dim()));
  if (f.find(p + "rope.scaling.type") != nullptr) {
    const std::string type = f.get_string(p + "rope.scaling.type");
    if (type == "linear") {
      d.rope_scaling.type = rope_scaling_config::kind::linear;
      d.rope_scaling.factor = metadata_float(f, p + "rope.scaling.factor");
    } else if (type != "none") {
      throw gguf_error(f.label(), fmt::format("metadata '{}rope.scaling.type': '{}' is not supported (none, linear)",
                                              p, type));
    }
  }
  d.tie_embeddings = f.find_tensor("output.weight") == nullptr;
  d.qkv_bias = out.family == hf_family::qwen2;
  try {
    d.validate();
  } catch (const std::invalid_argument& e) {
    throw gguf_error(f.label(), e.what());
  }
  out.bos_token_id = token_id(f, "tokenizer.ggml.bos_token_id");
  if (const auto eos = token_id(f, "tokenizer.ggml.eos_token_id")) out.eos_token_ids = {*eos};
  out.pad_token_id = token_id(f, "tokenizer.ggml.padding_token_id");
  return out;
}

hf_loaded_model gguf_to_model(const gguf_file& f, std::int64_t max_seq) {
  hf_model_config config = gguf_model_config(f);
  if (max_seq > 0 && max_seq < config.dims.max_seq) config.dims.max_seq = max_seq;
  const model_dims& d = config.dims;
  // llama.cpp's name of every transformers parameter.
  std::map<std::string, std::string> hf_of;
  hf_of["token_embd.weight"] = "model.embed_tokens.weight";
  hf_of["output_norm.weight"] = "model.norm.weight";
  if (!d.tie_embeddings) hf_of["output.weight"] = "lm_head.weight";
  for (std::int64_t l = 0; l < d.n_layers; ++l) {
    const std::string g = fmt::format("blk.{}.", l), h = fmt::format("model.layers.{}.", l);
    hf_of[g + "attn_q.weight"] = h + "self_attn.q_proj.weight";
    hf_of[g + "attn_k.weight"] = h + "self_attn.k_proj.weight";
    hf_of[g + "attn_v.weight"] = h + "self_attn.v_proj.weight";
    if (d.qkv_bias) {
      hf_of[g + "attn_q.bias"] = h + "self_attn.q_proj.bias";
      hf_of[g + "attn_k.bias"] = h + "self_attn.k_proj.bias";
      hf_of[g + "attn_v.bias"] = h + "self_attn.v_proj.bias";
    }
    hf_of[g + "attn_output.weight"] = h + "self_attn.o_proj.weight";
    hf_of[g + "ffn_gate.weight"] = h + "mlp.gate_proj.weight";
    hf_of[g + "ffn_up.weight"] = h + "mlp.up_proj.weight";
    hf_of[g + "ffn_down.weight"] = h + "mlp.down_proj.weight";
    hf_of[g + "attn_norm.weight"] = h + "input_layernorm.weight";
    hf_of[g + "ffn_norm.weight"] = h + "post_attention_layernorm.weight";
  }
  for (const auto& t : f.tensors())
    if (hf_of.count(t.name) == 0)
      throw gguf_error(f.label(), fmt::format("tensor '{}': a {} model has no place for it", t.name,
                                              hf_model_type(config.family)));
  std::map<std::string, std::string> gguf_of;
  for (const auto& [g, h] : hf_of) gguf_of[h] = g;

  // Names, types and shapes first: the model's size comes from metadata, which the
  // tensors must confirm before anything that size is allocated.
  for (const auto& [name, shape] : hf_parameter_shapes(d)) {
    const std::string& g = gguf_of.at(name);
    const gguf_tensor_info* info = f.find_tensor(g);
    if (info == nullptr) throw gguf_error(f.label(), fmt::format("tensor '{}' ({}): missing", g, name));
    if (info->shape() != shape)
      throw gguf_error(f.label(), fmt::format("tensor '{}': shape [{}] does not match the metadata's [{}]", g,
                                              fmt::join(info->shape(), ", "), fmt::join(shape, ", ")));
    if (!ggml_type_dequantizable(info->type))
      throw gguf_error(f.label(), fmt::format("tensor '{}': ggml type {} ({}) is not supported", g, info->type,
                                              info->type_name.empty() ? "unknown" : info->type_name));
  }
  policy_model model(d, /*seed=*/0, /*init_std=*/0.0);
  at::NoGradGuard no_grad;
  const bool llama = config.family == hf_family::llama;
  for (const auto& [name, param] : model.parameters()) {
    const std::string& g = gguf_of.at(name);
    at::Tensor w = f.dequantize(g);
    // llama.cpp's converter reorders only Llama's q/k rows (and the k rows by KV head).
    if (llama && name.find("self_attn.q_proj.weight") != std::string::npos) w = unpermute_rope_rows(w, d.n_heads);
    if (llama && name.find("self_attn.k_proj.weight") != std::string::npos) w = unpermute_rope_rows(w, d.n_kv_heads);
    param.copy_(w);
  }
  model.refresh_compute_weights();
  return hf_loaded_model{std::move(config), std::move(model)};
}

namespace {

using ojson = nlohmann::ordered_json;

ojson byte_level(bool use_regex) { return byte_level_component(use_regex, true); }

ojson split(const char* pattern) {
  return ojson{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
}

std::optional<std::string> token_content(const gguf_file& f, const std::vector<std::string>& tokens,
                                         const std::string& key) {
  if (f.find(key) == nullptr) return std::nullopt;
  const std::int64_t id = f.get_int(key);
  if (id < 0 || id >= static_cast<std::int64_t>(tokens.size()))
    throw gguf_error(f.label(), fmt::format("metadata '{}': id {} is outside the vocabulary of {} tokens", key, id,
                                            tokens.size()));
  return tokens[static_cast<std::size_t>(id)];
}

}  // namespace

std::string gguf_tokenizer_json(const gguf_file& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2")
    throw gguf_error(f.label(), fmt::format("metadata 'tokenizer.ggml.model': '{}' is not supported (supported: "
                                            "gpt2, byte-level BPE)", model));
  const std::string pre = f.find("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "default";
  ojson normalizer = nullptr;
  ojson pre_tokenizer;
  if (pre == "smollm" || pre == "starcoder") {
    pre_tokenizer = {{"type", "Sequence"},
                     {"pretokenizers", {ojson{{"type", "Digits"}, {"individual_digits", true}}, byte_level(true)}}};
  } else if (pre == "gpt-2" || pre == "default") {
    pre_tokenizer = byte_level(true);
  } else if (pre == "llama-bpe") {
    pre_tokenizer = {{"type", "Sequence"}, {"pretokenizers", {split(llama3_split_pattern), byte_level(false)}}};
  } else if (pre == "qwen2") {
    normalizer = {{"type", "NFC"}};
    pre_tokenizer = {{"type", "Sequence"}, {"pretokenizers", {split(qwen2_split_pattern), byte_level(false)}}};
  } else {
    throw gguf_error(f.label(), fmt::format("metadata 'tokenizer.ggml.pre': '{}' is not supported (supported: "
                                            "smollm, starcoder, gpt-2, default, llama-bpe, qwen2)", pre));
  }
  const auto& tokens = f.get_string_array("tokenizer.ggml.tokens");
  const auto& merges = f.get_string_array("tokenizer.ggml.merges");
  std::vector<std::int64_t> types;
  if (f.find("tokenizer.ggml.token_type") != nullptr) {
    types = f.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != tokens.size())
      throw gguf_error(f.label(), fmt::format("metadata 'tokenizer.ggml.token_type': {} types for {} tokens",
                                              types.size(), tokens.size()));
  }
  ojson added = ojson::array();
  ojson vocab = ojson::object();
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::int64_t type = types.empty() ? 1 : types[i];
    if (type == 3 || type == 4) added.push_back(added_token_entry(static_cast<std::int64_t>(i), tokens[i], type == 3));
    if (vocab.contains(tokens[i]))
      throw gguf_error(f.label(), fmt::format("metadata 'tokenizer.ggml.tokens': '{}' appears twice (ids {} and {})",
                                              tokens[i], vocab[tokens[i]].get<std::int64_t>(), i));
    vocab[tokens[i]] = i;
  }
  ojson merge_list = ojson::array();
  for (const auto& m : merges) merge_list.push_back(m);
  const ojson j = byte_level_bpe_document(vocab, merge_list, added, normalizer, pre_tokenizer, byte_level(true),
                                         byte_level(true), pre == "llama-bpe");
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string gguf_tokenizer_config_json(const gguf_file& f) {
  const auto& tokens = f.get_string_array("tokenizer.ggml.tokens");
  ojson j;
  const std::pair<const char*, const char*> named[] = {{"bos_token", "tokenizer.ggml.bos_token_id"},
                                                       {"eos_token", "tokenizer.ggml.eos_token_id"},
                                                       {"unk_token", "tokenizer.ggml.unknown_token_id"},
                                                       {"pad_token", "tokenizer.ggml.padding_token_id"}};
  for (const auto& [field, key] : named)
    if (const auto t = token_content(f, tokens, key)) j[field] = *t;
  j["add_bos_token"] = f.find("tokenizer.ggml.add_bos_token") ? f.get_bool("tokenizer.ggml.add_bos_token") : false;
  j["add_eos_token"] = f.find("tokenizer.ggml.add_eos_token") ? f.get_bool("tokenizer.ggml.add_eos_token") : false;
  j["clean_up_tokenization_spaces"] = false;
  const std::string arch = f.get_string("general.architecture");
  if (f.find(arch + ".context_length") != nullptr) j["model_max_length"] = f.get_int(arch + ".context_length");
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  if (f.find("tokenizer.chat_template") != nullptr) j["chat_template"] = f.get_string("tokenizer.chat_template");
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

gguf_conversion convert_gguf_to_hf(const std::filesystem::path& gguf_path, const std::filesystem::path& out_dir,
                                   at::ScalarType dtype) {
  const gguf_file f = gguf_file::open(gguf_path);
  const bool has_tokenizer = f.find("tokenizer.ggml.model") != nullptr;
  const std::string tokenizer = has_tokenizer ? gguf_tokenizer_json(f) : "";
  const std::string tokenizer_config = has_tokenizer ? gguf_tokenizer_config_json(f) : "";
  hf_loaded_model m = gguf_to_model(f);
  hf_save_options o;
  o.family = m.config.family;
  o.dtype = dtype;
  o.bos_token_id = m.config.bos_token_id;
  o.eos_token_ids = m.config.eos_token_ids;
  o.pad_token_id = m.config.pad_token_id;
  o.max_position_embeddings = m.config.max_position_embeddings;
  save_hf_model(m.model, out_dir, o);
  if (has_tokenizer) {
    write_file_atomically(out_dir / "tokenizer.json", tokenizer);
    write_file_atomically(out_dir / "tokenizer_config.json", tokenizer_config);
  }
  return gguf_conversion{std::move(m.config), has_tokenizer};
}

}  // namespace sorl::ml
