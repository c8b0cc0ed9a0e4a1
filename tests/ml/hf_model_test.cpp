// Hugging Face model directories (runtime/ml/formats/hf_model.hpp): config.json fields as the two
// supported families write them, refusals that name the field, save/load round trips (one
// file and sharded), and the RoPE scaling rules against hand-computed frequencies.
#include "runtime/ml/formats/hf_model.hpp"

#include "runtime/ml/formats/chat_template.hpp"
#include "runtime/ml/formats/hf_tokenizer.hpp"

#include "tests/ml/policy_test_util.hpp"

#include <ATen/ATen.h>
#include "tests/support/scratch_dir.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

using namespace sorl::ml;
using sorl::ml::test::small_dims;
using sorl::ml::test::random_policy;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// SmolLM2-135M-Instruct's config.json as published (nanotron-era fields included).
const char* smollm2_config = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 576,
  "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": true,
  "max_position_embeddings": 8192, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3, "pad_token_id": 2,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": false, "rope_scaling": null,
  "rope_theta": 100000, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3", "use_cache": true, "vocab_size": 49152})";

// Qwen2.5-0.5B-Instruct's config.json as published.
const char* qwen25_config = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

// The message of the checkpoint_error parse_hf_config throws for `text`.
std::string config_error(const std::string& text) {
  try {
    parse_hf_config(text, "cfg/config.json");
  } catch (const checkpoint_error& e) {
    return e.what();
  }
  FAIL("parse_hf_config accepted " << text);
  return {};
}

std::string with(const char* base, const std::string& key, const json& value) {
  json j = json::parse(base);
  if (value.is_discarded()) {
    j.erase(key);
  } else {
    j[key] = value;
  }
  return j.dump();
}

void require_same_weights(const policy_model& a, const policy_model& b) {
  REQUIRE(a.parameters().size() == b.parameters().size());
  for (std::size_t i = 0; i < a.parameters().size(); ++i) {
    INFO(a.parameters()[i].first);
    REQUIRE(a.parameters()[i].first == b.parameters()[i].first);
    REQUIRE(at::equal(a.parameters()[i].second, b.parameters()[i].second));
  }
}

}  // namespace

TEST_CASE("SmolLM2-135M-Instruct's config.json gives its shape", "[hf]") {
  const hf_model_config c = parse_hf_config(smollm2_config, "config.json");
  CHECK(c.family == hf_family::llama);
  CHECK(c.dims.vocab == 49152);
  CHECK(c.dims.d_model == 576);
  CHECK(c.dims.n_layers == 30);
  CHECK(c.dims.n_heads == 9);
  CHECK(c.dims.n_kv_heads == 3);
  CHECK(c.dims.head_dim() == 64);
  CHECK(c.dims.d_ff == 1536);
  CHECK(c.dims.max_seq == 8192);
  CHECK(c.dims.rope_theta == 100000.0);
  CHECK(c.dims.norm_eps == 1e-5);
  CHECK(c.dims.tie_embeddings);
  CHECK_FALSE(c.dims.qkv_bias);
  CHECK(c.dims.rope_scaling.type == rope_scaling_config::kind::none);
  // 134,515,008: the published parameter count of SmolLM2-135M (embedding counted once).
  CHECK(c.dims.parameter_count() == 134515008);
  CHECK(c.bos_token_id == 1);
  CHECK(c.eos_token_ids == std::vector<std::int64_t>{2});
  CHECK(c.pad_token_id == 2);
}

TEST_CASE("Qwen2.5-0.5B-Instruct's config.json gives a Qwen2 shape with q/k/v biases", "[hf]") {
  const hf_model_config c = parse_hf_config(qwen25_config, "config.json");
  CHECK(c.family == hf_family::qwen2);
  CHECK(c.dims.qkv_bias);
  CHECK(c.dims.head_dim() == 64);
  CHECK(c.dims.n_kv_heads == 2);
  CHECK(c.dims.rope_theta == 1e6);
  CHECK(c.dims.norm_eps == 1e-6);
  CHECK(c.dims.max_seq == 32768);
  CHECK(c.eos_token_ids == std::vector<std::int64_t>{151645});
  CHECK_FALSE(c.pad_token_id.has_value());
  // 494,032,768: Qwen2.5-0.5B's published parameter count (tied embedding once).
  CHECK(c.dims.parameter_count() == 494032768);
}

TEST_CASE("config fields sorl does not implement are refused by name", "[hf]") {
  const json drop = json::value_t::discarded;
  struct refusal {
    std::string text;
    std::string needle;
  };
  const std::vector<refusal> cases = {
      {with(smollm2_config, "model_type", "mistral"), "field 'model_type': 'mistral' is not supported"},
      {with(smollm2_config, "model_type", drop), "field 'model_type': required"},
      {with(smollm2_config, "architectures", json::array({"LlamaForSequenceClassification"})),
       "field 'architectures'"},
      {with(smollm2_config, "hidden_act", "gelu"), "field 'hidden_act': 'gelu'"},
      {with(smollm2_config, "attention_bias", true), "field 'attention_bias'"},
      {with(smollm2_config, "mlp_bias", true), "field 'mlp_bias'"},
      {with(smollm2_config, "head_dim", 128), "field 'head_dim': 128"},
      {with(smollm2_config, "partial_rotary_factor", 0.5), "field 'partial_rotary_factor'"},
      {with(smollm2_config, "rope_scaling", json{{"rope_type", "yarn"}, {"factor", 4.0}}),
       "field 'rope_scaling.rope_type': 'yarn' is not supported"},
      {with(smollm2_config, "rope_scaling", json{{"type", "dynamic"}, {"factor", 2.0}}),
       "field 'rope_scaling.type': 'dynamic' is not supported"},
      {with(smollm2_config, "rope_scaling", json{{"rope_type", "linear"}}), "field 'rope_scaling.factor': required"},
      {with(smollm2_config, "rope_scaling", json{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0},
                                                {"high_freq_factor", 1.0}}),
       "field 'rope_scaling.high_freq_factor'"},
      {with(smollm2_config, "hidden_size", drop), "field 'hidden_size': required"},
      {with(smollm2_config, "hidden_size", "576"), "field 'hidden_size': expected an integer"},
      {with(smollm2_config, "vocab_size", 0), "field 'vocab_size': must be > 0"},
      {with(smollm2_config, "vocab_size", std::int64_t{1} << 62), "more than 2^50"},
      {with(smollm2_config, "num_key_value_heads", 2), "field 'num_key_value_heads'"},
      {with(smollm2_config, "num_attention_heads", 7), "field 'num_attention_heads'"},
      {with(smollm2_config, "rms_norm_eps", -1.0), "field 'rms_norm_eps'"},
      {with(smollm2_config, "tie_word_embeddings", 1), "field 'tie_word_embeddings': expected true or false"},
      {with(smollm2_config, "eos_token_id", json::array({2, "x"})), "field 'eos_token_id'"},
      {with(qwen25_config, "use_sliding_window", true), "field 'use_sliding_window'"},
      {"{\"model_type\": ", "not valid JSON"},
      {"[1, 2]", "expected a JSON object"},
  };
  for (const auto& c : cases) {
    const std::string msg = config_error(c.text);
    INFO(msg);
    CHECK(msg.rfind("cfg/config.json: ", 0) == 0);
    CHECK(msg.find(c.needle) != std::string::npos);
  }
}

TEST_CASE("config.json variants that change nothing are accepted", "[hf]") {
  // An eos list, transformers 5's rope_parameters, the pre-4.45 rope_scaling key "type", and
  // rope_type "default" all parse to what they mean.
  const auto list = parse_hf_config(with(smollm2_config, "eos_token_id", json::array({2, 7})), "c");
  CHECK(list.eos_token_ids == std::vector<std::int64_t>{2, 7});
  json v5 = json::parse(smollm2_config);
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 12345.0}};
  const auto c5 = parse_hf_config(v5.dump(), "c");
  CHECK(c5.dims.rope_theta == 12345.0);
  CHECK(c5.dims.rope_scaling.type == rope_scaling_config::kind::none);
  const auto old = parse_hf_config(with(smollm2_config, "rope_scaling", json{{"type", "linear"}, {"factor", 2.0}}), "c");
  CHECK(old.dims.rope_scaling.type == rope_scaling_config::kind::linear);
  CHECK(old.dims.rope_scaling.factor == 2.0);
  // Defaults when absent: num_key_value_heads = num_attention_heads, rms_norm_eps 1e-6,
  // untied, Llama context 2048.
  json bare = json::parse(smollm2_config);
  for (const char* k : {"num_key_value_heads", "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings",
                        "rope_theta", "hidden_act"})
    bare.erase(k);
  const auto b = parse_hf_config(bare.dump(), "c");
  CHECK(b.dims.n_kv_heads == 9);
  CHECK(b.dims.norm_eps == 1e-6);
  CHECK_FALSE(b.dims.tie_embeddings);
  CHECK(b.dims.max_seq == 2048);
  CHECK(b.dims.rope_theta == 10000.0);
}

TEST_CASE("RoPE scaling: linear and llama3 frequencies against hand-computed values", "[hf]") {
  model_dims d = small_dims();
  d.d_model = 16;  // head_dim 8 with 2 heads: inv_freq 1, 0.1, 0.01, 0.001 at theta 1e4
  d.n_heads = 2;
  d.n_kv_heads = 1;
  d.rope_theta = 10000.0;
  const auto plain = rope_inv_freq(d);
  REQUIRE(plain.size() == 4);
  CHECK(plain[0] == 1.0);
  CHECK(plain[1] == Approx(0.1).epsilon(1e-15));
  CHECK(plain[3] == Approx(0.001).epsilon(1e-15));

  d.rope_scaling.type = rope_scaling_config::kind::linear;
  d.rope_scaling.factor = 2.0;
  const auto lin = rope_inv_freq(d);
  for (std::size_t i = 0; i < 4; ++i) CHECK(lin[i] == plain[i] / 2.0);

  // llama3 with original context 1024, low 1, high 4, factor 8: wavelengths 2*pi/f are
  // 6.28 and 62.8 (under 1024/4 = 256: kept), 628.3 (between: s = (1024/628.3 - 1)/3 =
  // 0.209916, f' = (1-s)*0.01/8 + s*0.01 = 0.00308676) and 6283 (over 1024: f/8).
  d.rope_scaling.type = rope_scaling_config::kind::llama3;
  d.rope_scaling.factor = 8.0;
  d.rope_scaling.low_freq_factor = 1.0;
  d.rope_scaling.high_freq_factor = 4.0;
  d.rope_scaling.original_max_position = 1024;
  const auto l3 = rope_inv_freq(d);
  CHECK(l3[0] == plain[0]);
  CHECK(l3[1] == plain[1]);
  CHECK(l3[2] == Approx(0.003086760967011274).epsilon(1e-12));
  CHECK(l3[3] == Approx(0.000125).epsilon(1e-12));

  // The model's tables are cos/sin of position x these frequencies.
  const auto [cos, sin] = rope_tables(d);
  CHECK(cos.size(0) == d.max_seq);
  CHECK(cos[10][2].item<float>() == static_cast<float>(std::cos(10.0 * l3[2])));
  CHECK(sin[33][3].item<float>() == static_cast<float>(std::sin(33.0 * l3[3])));
}

TEST_CASE("save_hf_model then load_hf_model gives the same weights and logits", "[hf]") {
  const bool tie = GENERATE(true, false);
  const bool qwen = GENERATE(false, true);
  model_dims d = small_dims();
  d.tie_embeddings = tie;
  d.qkv_bias = qwen;
  d.rope_theta = 50000.0;
  const policy_model m = random_policy(d, 11);
  // The shapes loaders check headers against are the model's own, in its order.
  const auto shapes = hf_parameter_shapes(d);
  REQUIRE(shapes.size() == m.parameters().size());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    CHECK(shapes[i].first == m.parameters()[i].first);
    CHECK(shapes[i].second == m.parameters()[i].second.sizes().vec());
  }
  sorl::test::scratch_dir dir(std::string("rt-") + (tie ? "t" : "u") + (qwen ? "q" : "l"));
  hf_save_options o;
  o.family = qwen ? hf_family::qwen2 : hf_family::llama;
  o.dtype = at::kFloat;
  o.bos_token_id = 3;
  o.eos_token_ids = {4};
  save_hf_model(m, dir.path, o);
  const auto saved = load_safetensors(dir.path / "model.safetensors");
  CHECK(saved.size() == m.parameters().size());  // a tied head stored once

  const hf_loaded_model back = load_hf_model(dir.path);
  CHECK(back.config.family == o.family);
  CHECK(back.config.dims.rope_theta == 50000.0);
  CHECK(back.config.dims.tie_embeddings == tie);
  CHECK(back.config.bos_token_id == 3);
  CHECK(back.config.eos_token_ids == std::vector<std::int64_t>{4});
  require_same_weights(m, back.model);
  const auto ids = sorl::ml::test::tokens(20, d.vocab, 5);
  CHECK(at::equal(sorl::ml::test::full_logits(m, ids), sorl::ml::test::full_logits(back.model, ids)));

  // bf16 export: the loaded weights are the bf16 rounding of the originals.
  sorl::test::scratch_dir bf(std::string("bf-") + (tie ? "t" : "u") + (qwen ? "q" : "l"));
  o.dtype = at::kBFloat16;
  save_hf_model(m, bf.path, o);
  const hf_loaded_model b16 = load_hf_model(bf.path);
  for (std::size_t i = 0; i < m.parameters().size(); ++i)
    CHECK(at::equal(b16.model.parameters()[i].second,
                    m.parameters()[i].second.to(at::kBFloat16).to(at::kFloat)));
  const json cfg = json::parse(read_file_bytes(bf.path / "config.json"));
  CHECK(cfg["torch_dtype"] == "bfloat16");
  CHECK(cfg["model_type"] == (qwen ? "qwen2" : "llama"));
}

TEST_CASE("a written config.json reads back as the same dims, rope scaling included", "[hf]") {
  hf_model_config c = parse_hf_config(smollm2_config, "c");
  c.dims.rope_scaling.type = rope_scaling_config::kind::llama3;
  c.dims.rope_scaling.factor = 32.0;
  c.dims.rope_scaling.low_freq_factor = 1.0;
  c.dims.rope_scaling.high_freq_factor = 4.0;
  c.dims.rope_scaling.original_max_position = 8192;
  const hf_model_config back = parse_hf_config(hf_config_json(c, "bfloat16"), "c");
  CHECK(back.dims.parameter_count() == c.dims.parameter_count());
  CHECK(back.dims.rope_scaling == c.dims.rope_scaling);
  CHECK(back.dims.rope_theta == c.dims.rope_theta);
  CHECK(back.dims.norm_eps == c.dims.norm_eps);
  CHECK(back.max_position_embeddings == 8192);
  CHECK(back.pad_token_id == 2);
}

TEST_CASE("sharded weights load through model.safetensors.index.json", "[hf]") {
  model_dims d = small_dims();
  d.tie_embeddings = false;
  const policy_model m = random_policy(d, 12);
  sorl::test::scratch_dir dir("shard");
  hf_save_options o;
  o.dtype = at::kFloat;
  save_hf_model(m, dir.path, o);
  fs::remove(dir.path / "model.safetensors");
  // Two shards in half precision: fp16 values load exactly as their fp32 conversion.
  named_tensors a, b;
  json map = json::object();
  const auto& ps = m.parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const bool first = i < ps.size() / 2;
    (first ? a : b).emplace_back(ps[i].first, ps[i].second.to(at::kHalf));
    map[ps[i].first] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  save_safetensors(dir.path / "model-00001-of-00002.safetensors", a);
  save_safetensors(dir.path / "model-00002-of-00002.safetensors", b);
  const fs::path index = dir.path / "model.safetensors.index.json";
  write_text(index, json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump());
  const hf_loaded_model back = load_hf_model(dir.path);
  for (std::size_t i = 0; i < ps.size(); ++i)
    CHECK(at::equal(back.model.parameters()[i].second, ps[i].second.to(at::kHalf).to(at::kFloat)));

  SECTION("an index entry that leaves the directory is refused") {
    json bad = map;
    bad["model.norm.weight"] = "../model-00002-of-00002.safetensors";
    write_text(index, json{{"weight_map", bad}}.dump());
    CHECK_THROWS_WITH(load_hf_model(dir.path), Catch::Contains("weight_map.model.norm.weight") &&
                                                   Catch::Contains("not a file name in the model directory"));
  }
  SECTION("a tensor the index puts in the other shard is refused") {
    json bad = map;
    bad[ps.front().first] = "model-00002-of-00002.safetensors";
    write_text(index, json{{"weight_map", bad}}.dump());
    CHECK_THROWS_WITH(load_hf_model(dir.path), Catch::Contains(ps.front().first));
  }
}

TEST_CASE("weights that do not fit the config are refused by tensor name", "[hf]") {
  const model_dims d = small_dims();
  const policy_model m = random_policy(d, 13);
  sorl::test::scratch_dir dir("bad");
  hf_save_options o;
  o.dtype = at::kFloat;
  save_hf_model(m, dir.path, o);
  named_tensors ts = load_safetensors(dir.path / "model.safetensors");
  const fs::path file = dir.path / "model.safetensors";
  auto expect_refusal = [&](const named_tensors& tensors, const std::string& tensor, const std::string& what) {
    save_safetensors(file, tensors);
    try {
      load_hf_model(dir.path);
      FAIL("loaded");
    } catch (const checkpoint_error& e) {
      INFO(e.what());
      CHECK(e.tensor() == tensor);
      CHECK(std::string(e.what()).find(what) != std::string::npos);
    }
  };
  SECTION("missing") {
    named_tensors t = ts;
    t.erase(t.begin() + 3);
    expect_refusal(t, ts[3].first, "missing");
  }
  SECTION("extra") {
    named_tensors t = ts;
    t.emplace_back("model.layers.9.mlp.up_proj.weight", at::zeros({2}));
    expect_refusal(t, "model.layers.9.mlp.up_proj.weight", "unexpected tensor");
  }
  SECTION("wrong shape") {
    named_tensors t = ts;
    for (auto& [name, x] : t)
      if (name == "model.norm.weight") x = at::zeros({d.d_model + 1});
    expect_refusal(t, "model.norm.weight", "shape [33] does not match the config's [32]");
  }
  SECTION("integer dtype") {
    named_tensors t = ts;
    for (auto& [name, x] : t)
      if (name == "model.norm.weight") x = at::zeros({d.d_model}, at::kInt);
    expect_refusal(t, "model.norm.weight", "dtype I32 is not supported");
  }
  SECTION("a tied model's stored lm_head and old rotary buffers are ignored, as transformers does") {
    named_tensors t = ts;
    t.emplace_back("lm_head.weight", at::zeros({d.vocab, d.d_model}));
    t.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", at::zeros({4}));
    save_safetensors(file, t);
    require_same_weights(m, load_hf_model(dir.path).model);
  }
}

TEST_CASE("load_hf_model caps max_seq, and save refuses a Llama with q/k/v biases", "[hf]") {
  model_dims d = small_dims();
  const policy_model m = random_policy(d, 14);
  sorl::test::scratch_dir dir("cap");
  hf_save_options o;
  o.max_position_embeddings = 4096;
  save_hf_model(m, dir.path, o);
  hf_load_options lo;
  lo.max_seq = 128;
  const auto back = load_hf_model(dir.path, lo);
  CHECK(back.config.max_position_embeddings == 4096);
  CHECK(back.model.dims().max_seq == 128);
  d.qkv_bias = true;
  const policy_model q = random_policy(d, 15);
  CHECK_THROWS_WITH(save_hf_model(q, dir.path, hf_save_options{}), Catch::Contains("Qwen2"));
}

TEST_CASE("save_hf_byte_model writes a directory that speaks sorl's byte tokenizer", "[hf]") {
  const model_dims d = preset("tiny");
  const policy_model m = random_policy(d, 16);
  sorl::test::scratch_dir dir("bytes");
  save_hf_byte_model(m, dir.path, sorl_prompt_format::byte, at::kFloat);
  require_same_weights(m, load_hf_model(dir.path).model);
  const json gen = json::parse(read_file_bytes(dir.path / "generation_config.json"));
  CHECK(gen["bos_token_id"] == byte_tokenizer::bos);
  CHECK(gen["eos_token_id"] == json::array({byte_tokenizer::eos, byte_tokenizer::end_turn}));
  CHECK(gen["pad_token_id"] == byte_tokenizer::pad);
  // The tokenizer gives byte_tokenizer's ids, adds <|bos|> when transformers adds special
  // tokens, and the chat template is sorl's own.
  const hf_tokenizer tok = hf_tokenizer::load(dir.path / "tokenizer.json");
  CHECK(tok.encode("12+34=") == byte_tokenizer{}.encode("12+34="));
  const json t = json::parse(read_file_bytes(dir.path / "tokenizer.json"));
  CHECK(t["post_processor"]["single"][0]["SpecialToken"]["id"] == "<|bos|>");
  CHECK(t["post_processor"]["special_tokens"]["<|bos|>"]["ids"] == json::array({byte_tokenizer::bos}));
  CHECK(chat_template::from_tokenizer_config(dir.path).family() == chat_template::kind::sorl);
  const json tc = json::parse(read_file_bytes(dir.path / "tokenizer_config.json"));
  CHECK(tc["bos_token"] == "<|bos|>");
  CHECK(tc["eos_token"] == "<|eos|>");
  CHECK(tc["model_max_length"] == d.max_seq);
  CHECK(tc["sorl_prompt_format"] == "byte");
  CHECK(read_sorl_prompt_format(dir.path) == sorl_prompt_format::byte);

  model_dims other = small_dims();  // vocabulary 40, not the byte tokenizer's 272
  CHECK_THROWS_AS(save_hf_byte_model(random_policy(other, 17), dir.path, sorl_prompt_format::byte),
                  std::invalid_argument);
}

TEST_CASE("the prompt format an export records reads back, and a bad one is refused by name", "[hf]") {
  sorl::test::scratch_dir dir("prompt_format_key");
  save_hf_byte_model(random_policy(preset("tiny"), 18), dir.path, sorl_prompt_format::chat, at::kFloat);
  CHECK(read_sorl_prompt_format(dir.path) == sorl_prompt_format::chat);
  const fs::path config = dir.path / "tokenizer_config.json";
  json tc = json::parse(read_file_bytes(config));
  CHECK(tc["sorl_prompt_format"] == "chat");
  // A directory sorl did not export (or exported before the key) records none.
  tc.erase("sorl_prompt_format");
  write_file_atomically(config, tc.dump());
  CHECK_FALSE(read_sorl_prompt_format(dir.path).has_value());
  tc["sorl_prompt_format"] = "bytes";
  write_file_atomically(config, tc.dump());
  CHECK_THROWS_WITH(read_sorl_prompt_format(dir.path),
                    Catch::Contains("tokenizer_config.json") &&
                      Catch::Contains("field 'sorl_prompt_format': 'bytes' is not a prompt format"));
  fs::remove(config);
  CHECK_FALSE(read_sorl_prompt_format(dir.path).has_value());
}
