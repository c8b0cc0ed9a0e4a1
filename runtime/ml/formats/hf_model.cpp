#include "runtime/ml/formats/hf_model.hpp"

#include "runtime/ml/formats/chat_template.hpp"
#include "runtime/ml/formats/hf_tokenizer.hpp"

#include "runtime/ml/policy/torch_compat.hpp"
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>

namespace sorl::ml {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// tokenizer_config.json's record of the format a sorl byte model was trained in; transformers
// keeps unknown keys of the file as they are.
constexpr const char* sorl_prompt_format_key = "sorl_prompt_format";

[[noreturn]] void field_error(const std::string& label, std::string_view field, const std::string& what) {
  throw checkpoint_error(label, "", fmt::format("field '{}': {}", field, what));
}

// Typed access to one JSON object's fields, every error naming the field (with `prefix`, e.g.
// "rope_scaling.", for nested objects).
class fields {
 public:
  fields(const json& obj, const std::string& label, std::string prefix = "")
      : obj_(obj), label_(label), prefix_(std::move(prefix)) {}

  // The field, or nullptr when absent or JSON null.
  const json* find(std::string_view key) const {
    const auto it = obj_.find(std::string(key));
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<std::int64_t> opt_int(std::string_view key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (v->is_number_unsigned()) {
      const auto u = v->get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail(key, fmt::format("{} is out of range", u));
      return static_cast<std::int64_t>(u);
    }
    if (v->is_number_integer()) return v->get<std::int64_t>();
    fail(key, fmt::format("expected an integer, got {}", v->dump()));
  }

  std::int64_t required_int(std::string_view key) const {
    const auto v = opt_int(key);
    if (!v) fail(key, "required, missing");
    return *v;
  }

  std::int64_t positive_int(std::string_view key, std::optional<std::int64_t> fallback = std::nullopt) const {
    const auto v = find(key) != nullptr ? opt_int(key) : fallback;
    if (!v) fail(key, "required, missing");
    if (*v <= 0) fail(key, fmt::format("must be > 0, got {}", *v));
    return *v;
  }

  std::optional<double> opt_number(std::string_view key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) fail(key, fmt::format("expected a number, got {}", v->dump()));
    const double d = v->get<double>();
    if (!std::isfinite(d)) fail(key, "must be finite");
    return d;
  }

  double number(std::string_view key, double fallback) const { return opt_number(key).value_or(fallback); }

  double required_number(std::string_view key) const {
    const auto v = opt_number(key);
    if (!v) fail(key, "required, missing");
    return *v;
  }

  bool boolean(std::string_view key, bool fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail(key, fmt::format("expected true or false, got {}", v->dump()));
    return v->get<bool>();
  }

  std::optional<std::string> opt_string(std::string_view key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) fail(key, fmt::format("expected a string, got {}", v->dump()));
    return v->get<std::string>();
  }

  [[noreturn]] void fail(std::string_view key, const std::string& what) const {
    field_error(label_, prefix_ + std::string(key), what);
  }

 private:
  const json& obj_;
  const std::string& label_;
  std::string prefix_;
};

rope_scaling_config parse_rope_scaling(const json& rs, const std::string& label, const std::string& where,
                                       std::int64_t max_position_embeddings) {
  if (!rs.is_object()) field_error(label, where, fmt::format("expected an object or null, got {}", rs.dump()));
  const fields f(rs, label, where + ".");
  std::optional<std::string> kind = f.opt_string("rope_type");
  std::string kind_key = "rope_type";
  if (!kind) {
    kind = f.opt_string("type");  // the key's name before transformers 4.45
    kind_key = "type";
  }
  rope_scaling_config out;
  if (!kind || *kind == "default") return out;
  if (*kind == "linear") {
    out.type = rope_scaling_config::kind::linear;
    out.factor = f.required_number("factor");
    if (!(out.factor > 0.0)) f.fail("factor", fmt::format("must be > 0, got {}", out.factor));
    return out;
  }
  if (*kind == "llama3") {
    out.type = rope_scaling_config::kind::llama3;
    out.factor = f.required_number("factor");
    out.low_freq_factor = f.required_number("low_freq_factor");
    out.high_freq_factor = f.required_number("high_freq_factor");
    out.original_max_position =
        f.positive_int("original_max_position_embeddings", max_position_embeddings);
    if (!(out.factor > 0.0)) f.fail("factor", fmt::format("must be > 0, got {}", out.factor));
    if (!(out.low_freq_factor > 0.0 && out.high_freq_factor > out.low_freq_factor))
      f.fail("high_freq_factor", fmt::format("need 0 < low_freq_factor ({}) < high_freq_factor ({})",
                                             out.low_freq_factor, out.high_freq_factor));
    return out;
  }
  f.fail(kind_key, fmt::format("'{}' is not supported (supported: default, linear, llama3; \"dynamic\", "
                               "\"yarn\" and \"longrope\" change attention beyond the frequencies)",
                               *kind));
}

std::vector<std::int64_t> eos_ids(const fields& f, const json* v) {
  if (v == nullptr) return {};
  if (v->is_array()) {
    std::vector<std::int64_t> out;
    for (const auto& e : *v) {
      if (!e.is_number_integer()) f.fail("eos_token_id", fmt::format("expected integers, got {}", e.dump()));
      out.push_back(e.get<std::int64_t>());
    }
    return out;
  }
  return {*f.opt_int("eos_token_id")};
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool ignored_tensor(const std::string& name, const model_dims& d) {
  return (d.tie_embeddings && name == "lm_head.weight") || ends_with(name, ".rotary_emb.inv_freq");
}

std::string shape_text(const std::vector<std::int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// A JSON file's document. Throws checkpoint_error naming the file when it cannot be read or
// is not valid JSON.
json read_json(const fs::path& path) {
  try {
    return json::parse(read_file_bytes(path));
  } catch (const json::exception& e) {
    throw checkpoint_error(path.string(), "", fmt::format("not valid JSON: {}", e.what()));
  }
}

// The shard files a model directory's weights live in, with the tensors each must hold
// (empty for the single-file layout: whatever the file holds is checked against the model).
std::vector<std::pair<fs::path, std::set<std::string>>> weight_files(const fs::path& dir) {
  const fs::path single = dir / "model.safetensors";
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(single)) return {{single, {}}};
  if (!fs::exists(index))
    throw checkpoint_error(dir.string(), "", "no model.safetensors or model.safetensors.index.json");
  const std::string label = index.string();
  const json j = read_json(index);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    field_error(label, "weight_map", "required: an object from tensor name to shard file");
  std::map<std::string, std::set<std::string>> by_file;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) field_error(label, "weight_map." + name, "expected a file name");
    const std::string f = file.get<std::string>();
    // A plain file name in the same directory: an index must not reach outside it.
    if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos || f == "." ||
        f == "..")
      field_error(label, "weight_map." + name, fmt::format("'{}' is not a file name in the model directory", f));
    by_file[f].insert(name);
  }
  if (by_file.empty()) field_error(label, "weight_map", "is empty");
  std::vector<std::pair<fs::path, std::set<std::string>>> out;
  for (auto& [f, names] : by_file) out.emplace_back(dir / f, std::move(names));
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::vector<std::int64_t>>> hf_parameter_shapes(const model_dims& d) {
  d.validate();
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> s;
  const std::int64_t q = d.n_heads * d.head_dim(), kv = d.n_kv_heads * d.head_dim();
  s.emplace_back("model.embed_tokens.weight", std::vector<std::int64_t>{d.vocab, d.d_model});
  for (std::int64_t l = 0; l < d.n_layers; ++l) {
    const std::string pre = fmt::format("model.layers.{}.", l);
    s.emplace_back(pre + "self_attn.q_proj.weight", std::vector<std::int64_t>{q, d.d_model});
    if (d.qkv_bias) s.emplace_back(pre + "self_attn.q_proj.bias", std::vector<std::int64_t>{q});
    s.emplace_back(pre + "self_attn.k_proj.weight", std::vector<std::int64_t>{kv, d.d_model});
    if (d.qkv_bias) s.emplace_back(pre + "self_attn.k_proj.bias", std::vector<std::int64_t>{kv});
    s.emplace_back(pre + "self_attn.v_proj.weight", std::vector<std::int64_t>{kv, d.d_model});
    if (d.qkv_bias) s.emplace_back(pre + "self_attn.v_proj.bias", std::vector<std::int64_t>{kv});
    s.emplace_back(pre + "self_attn.o_proj.weight", std::vector<std::int64_t>{d.d_model, q});
    s.emplace_back(pre + "mlp.gate_proj.weight", std::vector<std::int64_t>{d.d_ff, d.d_model});
    s.emplace_back(pre + "mlp.up_proj.weight", std::vector<std::int64_t>{d.d_ff, d.d_model});
    s.emplace_back(pre + "mlp.down_proj.weight", std::vector<std::int64_t>{d.d_model, d.d_ff});
    s.emplace_back(pre + "input_layernorm.weight", std::vector<std::int64_t>{d.d_model});
    s.emplace_back(pre + "post_attention_layernorm.weight", std::vector<std::int64_t>{d.d_model});
  }
  s.emplace_back("model.norm.weight", std::vector<std::int64_t>{d.d_model});
  if (!d.tie_embeddings) s.emplace_back("lm_head.weight", std::vector<std::int64_t>{d.vocab, d.d_model});
  return s;
}

std::string_view hf_model_type(hf_family family) { return family == hf_family::qwen2 ? "qwen2" : "llama"; }

hf_model_config parse_hf_config(std::string_view json_text, const std::string& label) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw checkpoint_error(label, "", fmt::format("not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw checkpoint_error(label, "", "expected a JSON object");
  const fields f(j, label);

  hf_model_config out;
  const auto model_type = f.opt_string("model_type");
  if (!model_type) f.fail("model_type", "required, missing (supported: \"llama\", \"qwen2\")");
  if (*model_type == "llama") {
    out.family = hf_family::llama;
  } else if (*model_type == "qwen2") {
    out.family = hf_family::qwen2;
  } else {
    f.fail("model_type", fmt::format("'{}' is not supported (supported: \"llama\", \"qwen2\")", *model_type));
  }
  const bool qwen = out.family == hf_family::qwen2;
  if (const json* arch = f.find("architectures")) {
    const std::string expected = qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
    if (!arch->is_array()) f.fail("architectures", "expected a list of class names");
    for (const auto& a : *arch)
      if (!a.is_string() || a.get<std::string>() != expected)
        f.fail("architectures", fmt::format("{} is not supported for model_type '{}' (supported: {})", a.dump(),
                                            *model_type, expected));
  }

  const std::string act = f.opt_string("hidden_act").value_or("silu");
  if (act != "silu") f.fail("hidden_act", fmt::format("'{}' is not supported (policy_model's MLP is SwiGLU: silu)", act));
  if (!qwen && f.boolean("attention_bias", false))
    f.fail("attention_bias", "true is not supported (it adds an o_proj bias; policy_model has q/k/v biases only)");
  if (f.boolean("mlp_bias", false)) f.fail("mlp_bias", "true is not supported (policy_model's MLP has no biases)");
  if (qwen && f.boolean("use_sliding_window", false))
    f.fail("use_sliding_window", "true is not supported (policy_model attends to the whole sequence)");
  if (const auto prf = f.opt_number("partial_rotary_factor"); prf && *prf != 1.0)
    f.fail("partial_rotary_factor", fmt::format("{} is not supported (only 1: RoPE on the whole head)", *prf));

  model_dims& d = out.dims;
  d.d_model = f.positive_int("hidden_size");
  d.d_ff = f.positive_int("intermediate_size");
  d.n_layers = f.positive_int("num_hidden_layers");
  d.n_heads = f.positive_int("num_attention_heads");
  d.n_kv_heads = f.positive_int("num_key_value_heads", d.n_heads);
  d.vocab = f.positive_int("vocab_size");
  out.max_position_embeddings = f.positive_int("max_position_embeddings", qwen ? 32768 : 2048);
  d.max_seq = out.max_position_embeddings;
  if (d.d_model % d.n_heads != 0)
    f.fail("num_attention_heads", fmt::format("hidden_size {} is not a multiple of it ({})", d.d_model, d.n_heads));
  if (d.n_heads % d.n_kv_heads != 0)
    f.fail("num_key_value_heads",
           fmt::format("num_attention_heads {} is not a multiple of it ({})", d.n_heads, d.n_kv_heads));
  if (const auto hd = f.opt_int("head_dim"); hd && *hd != d.head_dim())
    f.fail("head_dim", fmt::format("{} is not supported (policy_model's head_dim is hidden_size / "
                                   "num_attention_heads = {})",
                                   *hd, d.head_dim()));
  d.norm_eps = f.number("rms_norm_eps", 1e-6);
  d.tie_embeddings = f.boolean("tie_word_embeddings", false);
  d.qkv_bias = qwen;

  // RoPE: rope_theta and rope_scaling at the top level, or both inside rope_parameters
  // (transformers 5's layout).
  const json* rope_params = f.find("rope_parameters");
  d.rope_theta = f.number("rope_theta", 10000.0);
  if (rope_params != nullptr) {
    if (!rope_params->is_object()) f.fail("rope_parameters", "expected an object");
    d.rope_theta = fields(*rope_params, label, "rope_parameters.").number("rope_theta", d.rope_theta);
    d.rope_scaling = parse_rope_scaling(*rope_params, label, "rope_parameters", out.max_position_embeddings);
  }
  if (const json* rs = f.find("rope_scaling"))
    d.rope_scaling = parse_rope_scaling(*rs, label, "rope_scaling", out.max_position_embeddings);
  if (!(d.rope_theta > 0.0)) f.fail("rope_theta", fmt::format("must be > 0, got {}", d.rope_theta));
  if (!(d.norm_eps > 0.0)) f.fail("rms_norm_eps", fmt::format("must be > 0, got {}", d.norm_eps));
  if (d.head_dim() % 2 != 0)
    f.fail("num_attention_heads", fmt::format("head_dim {} must be even for RoPE", d.head_dim()));

  out.bos_token_id = f.opt_int("bos_token_id");
  out.eos_token_ids = eos_ids(f, f.find("eos_token_id"));
  out.pad_token_id = f.opt_int("pad_token_id");
  try {
    d.validate();
  } catch (const std::invalid_argument& e) {
    throw checkpoint_error(label, "", e.what());
  }
  return out;
}

hf_model_config read_hf_config(const fs::path& dir) {
  const fs::path p = dir / "config.json";
  return parse_hf_config(read_file_bytes(p), p.string());
}

std::string hf_config_json(const hf_model_config& config, std::string_view torch_dtype) {
  const model_dims& d = config.dims;
  const bool qwen = config.family == hf_family::qwen2;
  nlohmann::ordered_json j;
  j["architectures"] = {qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = std::string(hf_model_type(config.family));
  j["hidden_size"] = d.d_model;
  j["intermediate_size"] = d.d_ff;
  j["num_hidden_layers"] = d.n_layers;
  j["num_attention_heads"] = d.n_heads;
  j["num_key_value_heads"] = d.n_kv_heads;
  j["head_dim"] = d.head_dim();
  j["vocab_size"] = d.vocab;
  j["max_position_embeddings"] = config.max_position_embeddings > 0 ? config.max_position_embeddings : d.max_seq;
  j["rope_theta"] = d.rope_theta;
  const rope_scaling_config& rs = d.rope_scaling;
  switch (rs.type) {
    case rope_scaling_config::kind::none:
      j["rope_scaling"] = nullptr;
      break;
    case rope_scaling_config::kind::linear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rs.factor}};
      break;
    case rope_scaling_config::kind::llama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", rs.factor},
                           {"low_freq_factor", rs.low_freq_factor},
                           {"high_freq_factor", rs.high_freq_factor},
                           {"original_max_position_embeddings", rs.original_max_position}};
      break;
  }
  j["rms_norm_eps"] = d.norm_eps;
  j["tie_word_embeddings"] = d.tie_embeddings;
  j["hidden_act"] = "silu";
  j["initializer_range"] = 0.02;
  if (qwen) {
    j["use_sliding_window"] = false;
  } else {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  }
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
  j["torch_dtype"] = std::string(torch_dtype);
  if (config.bos_token_id) j["bos_token_id"] = *config.bos_token_id;
  if (config.eos_token_ids.size() == 1) j["eos_token_id"] = config.eos_token_ids.front();
  if (config.eos_token_ids.size() > 1) j["eos_token_id"] = config.eos_token_ids;
  if (config.pad_token_id) j["pad_token_id"] = *config.pad_token_id;
  return j.dump(2) + "\n";
}

hf_loaded_model load_hf_model(const fs::path& dir, const hf_load_options& options) {
  hf_model_config config = read_hf_config(dir);
  if (options.max_seq < 0)
    throw std::invalid_argument(fmt::format("hf_load_options.max_seq must be >= 0, got {}", options.max_seq));
  if (options.max_seq > 0 && options.max_seq < config.dims.max_seq) config.dims.max_seq = options.max_seq;
  const model_dims& d = config.dims;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (auto& [name, shape] : hf_parameter_shapes(d)) shapes.emplace(name, std::move(shape));

  // Read and check every shard before the model is allocated: a config that disagrees with
  // its weights fails on the headers alone.
  const auto files = weight_files(dir);
  std::vector<safetensors_reader> readers;
  std::map<std::string, std::pair<std::size_t, const safetensors_entry*>> found;  // name -> reader, entry
  readers.reserve(files.size());
  for (const auto& [path, listed] : files) {
    readers.push_back(safetensors_reader::open(path));
    const safetensors_reader& r = readers.back();
    for (const auto& e : r.entries()) {
      if (!listed.empty() && listed.count(e.name) == 0)
        throw checkpoint_error(r.label(), e.name, "not assigned to this file by model.safetensors.index.json");
      if (ignored_tensor(e.name, d)) continue;
      const auto it = shapes.find(e.name);
      if (it == shapes.end())
        throw checkpoint_error(r.label(), e.name,
                               fmt::format("unexpected tensor: a {} model with this config has no such parameter",
                                           hf_model_type(config.family)));
      if (e.dtype != at::kFloat && e.dtype != at::kBFloat16 && e.dtype != at::kHalf)
        throw checkpoint_error(r.label(), e.name,
                               fmt::format("dtype {} is not supported (F32, F16, BF16)", safetensors_dtype_name(e.dtype)));
      if (e.shape != it->second)
        throw checkpoint_error(r.label(), e.name,
                               fmt::format("shape {} does not match the config's {}", shape_text(e.shape),
                                           shape_text(it->second)));
      if (!found.emplace(e.name, std::make_pair(readers.size() - 1, &e)).second)
        throw checkpoint_error(r.label(), e.name, "appears in more than one file");
    }
    for (const auto& name : listed)
      if (r.find(name) == nullptr)
        throw checkpoint_error(r.label(), name, "listed by model.safetensors.index.json but not in the file");
  }
  std::vector<std::string> missing;
  for (const auto& [name, shape] : shapes)
    if (found.count(name) == 0) missing.push_back(name);
  if (!missing.empty())
    throw checkpoint_error(dir.string(), missing.front(),
                           fmt::format("missing ({} missing in all: {})", missing.size(),
                                       fmt::join(missing.begin(), missing.begin() + std::min<std::size_t>(missing.size(), 8), ", ")));

  policy_model model(d, /*seed=*/0, /*init_std=*/0.0, options.device);
  at::NoGradGuard no_grad;
  for (const auto& [name, param] : model.parameters()) {
    const auto& [reader_index, entry] = found.at(name);
    param.copy_(readers[reader_index].tensor(entry->name).to(at::kFloat));
  }
  model.refresh_compute_weights();
  return hf_loaded_model{std::move(config), std::move(model)};
}

void save_hf_model(const policy_model& model, const fs::path& dir, const hf_save_options& options) {
  const model_dims& d = model.dims();
  if (d.qkv_bias && options.family != hf_family::qwen2)
    throw std::invalid_argument(
        "save_hf_model: a model with q/k/v biases is a Qwen2 model (Llama's attention_bias also "
        "biases o_proj); use hf_family::qwen2");
  if (!d.qkv_bias && options.family == hf_family::qwen2)
    throw std::invalid_argument("save_hf_model: a Qwen2 model has q/k/v biases; this model has none");
  if (options.dtype != at::kBFloat16 && options.dtype != at::kFloat)
    throw std::invalid_argument("save_hf_model: dtype must be BFloat16 or Float");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw checkpoint_error(dir.string(), "", fmt::format("cannot create the directory: {}", ec.message()));

  named_tensors tensors;
  {
    at::NoGradGuard no_grad;
    for (const auto& [name, t] : model.parameters()) tensors.emplace_back(name, t.detach().to(options.dtype));
  }
  save_safetensors(dir / "model.safetensors", tensors, {{"format", "pt"}});

  hf_model_config config;
  config.family = options.family;
  config.dims = d;
  config.max_position_embeddings = options.max_position_embeddings > 0 ? options.max_position_embeddings : d.max_seq;
  config.bos_token_id = options.bos_token_id;
  config.eos_token_ids = options.eos_token_ids;
  config.pad_token_id = options.pad_token_id;
  write_file_atomically(dir / "config.json",
                        hf_config_json(config, options.dtype == at::kBFloat16 ? "bfloat16" : "float32"));
  nlohmann::ordered_json g;
  if (options.bos_token_id) g["bos_token_id"] = *options.bos_token_id;
  if (options.eos_token_ids.size() == 1) g["eos_token_id"] = options.eos_token_ids.front();
  if (options.eos_token_ids.size() > 1) g["eos_token_id"] = options.eos_token_ids;
  if (options.pad_token_id) g["pad_token_id"] = *options.pad_token_id;
  write_file_atomically(dir / "generation_config.json", (g.empty() ? std::string("{}") : g.dump(2)) + "\n");
}

std::string_view to_string(sorl_prompt_format format) noexcept {
  return format == sorl_prompt_format::chat ? "chat" : "byte";
}

std::optional<sorl_prompt_format> read_sorl_prompt_format(const fs::path& dir) {
  const fs::path path = dir / "tokenizer_config.json";
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  const std::string label = path.string();
  const json j = read_json(path);
  if (!j.is_object()) throw checkpoint_error(label, "", "expected a JSON object");
  const auto value = fields(j, label).opt_string(sorl_prompt_format_key);
  if (!value) return std::nullopt;
  for (const auto f : {sorl_prompt_format::byte, sorl_prompt_format::chat})
    if (*value == to_string(f)) return f;
  field_error(label, sorl_prompt_format_key, fmt::format("'{}' is not a prompt format (\"byte\" or \"chat\")", *value));
}

void save_hf_byte_model(const policy_model& model, const fs::path& dir, sorl_prompt_format trained_as,
                        at::ScalarType dtype) {
  if (model.dims().vocab != byte_tokenizer::size)
    throw std::invalid_argument(fmt::format("save_hf_byte_model: the model's vocabulary is {}, byte_tokenizer's {}",
                                            model.dims().vocab, byte_tokenizer::size));
  const byte_tokenizer bytes;
  hf_save_options o;
  o.dtype = dtype;
  o.bos_token_id = byte_tokenizer::bos;
  // Generation stops at either, as sorl's own does: <|eos|> ends a single-turn completion,
  // <|end_turn|> a turn of a chat.
  o.eos_token_ids = {byte_tokenizer::eos, byte_tokenizer::end_turn};
  o.pad_token_id = byte_tokenizer::pad;
  save_hf_model(model, dir, o);
  write_file_atomically(dir / "tokenizer.json", byte_tokenizer_json());
  nlohmann::ordered_json t;
  t["bos_token"] = bytes.token_text(byte_tokenizer::bos);
  t["eos_token"] = bytes.token_text(byte_tokenizer::eos);
  t["pad_token"] = bytes.token_text(byte_tokenizer::pad);
  t["add_bos_token"] = true;  // what the tokenizer.json post-processor does
  t["add_eos_token"] = false;
  t["clean_up_tokenization_spaces"] = false;
  t["model_max_length"] = model.dims().max_seq;
  t["tokenizer_class"] = "PreTrainedTokenizerFast";
  t["chat_template"] = std::string(sorl_chat_template_source());
  t[sorl_prompt_format_key] = std::string(to_string(trained_as));
  write_file_atomically(dir / "tokenizer_config.json", t.dump(2) + "\n");
}

}  // namespace sorl::ml
