// GGUF files as Hugging Face models (runtime/ml/formats/gguf_import.hpp): llama.cpp's rotary row
// order undone on hand-made rows, and whole small models written as GGUF the way llama.cpp's
// converter writes them, read back weight for weight.
#include "runtime/ml/formats/gguf_import.hpp"

#include "tests/ml/gguf_test_util.hpp"
#include "tests/ml/policy_test_util.hpp"

#include <ATen/ATen.h>
#include "tests/support/scratch_dir.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <unistd.h>

using namespace sorl::ml;
using namespace sorl::ml::test;
namespace fs = std::filesystem;

namespace {

std::vector<float> floats(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// The llama.cpp name of each transformers parameter (layer index filled in).
std::string gguf_name(const std::string& hf) {
  static const std::vector<std::pair<std::string, std::string>> suffixes = {
      {"self_attn.q_proj.weight", "attn_q.weight"},   {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},   {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},       {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.weight", "attn_output.weight"}, {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},        {"mlp.down_proj.weight", "ffn_down.weight"},
      {"input_layernorm.weight", "attn_norm.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"}};
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  const std::string pre = "model.layers.";
  const auto dot = hf.find('.', pre.size());
  const std::string layer = hf.substr(pre.size(), dot - pre.size());
  const std::string rest = hf.substr(dot + 1);
  for (const auto& [h, g] : suffixes)
    if (rest == h) return "blk." + layer + "." + g;
  FAIL("no GGUF name for " << hf);
  return {};
}

// `m` as llama.cpp's converter writes it: F32 tensors under llama.cpp's names, ne = the shape
// reversed, Llama q/k rows permuted; metadata for `arch` ("llama" or "qwen2").
gguf_builder as_gguf(const policy_model& m, const std::string& arch) {
  const model_dims& d = m.dims();
  gguf_builder b;
  const auto u32 = [](std::int64_t v) { return le<std::uint32_t>(static_cast<std::uint32_t>(v)); };
  b.kv("general.architecture", t_str, str(arch))
      .kv(arch + ".block_count", t_u32, u32(d.n_layers))
      .kv(arch + ".context_length", t_u32, u32(d.max_seq))
      .kv(arch + ".embedding_length", t_u32, u32(d.d_model))
      .kv(arch + ".feed_forward_length", t_u32, u32(d.d_ff))
      .kv(arch + ".attention.head_count", t_u32, u32(d.n_heads))
      .kv(arch + ".attention.head_count_kv", t_u32, u32(d.n_kv_heads))
      .kv(arch + ".rope.freq_base", t_f32, le<float>(static_cast<float>(d.rope_theta)))
      .kv(arch + ".attention.layer_norm_rms_epsilon", t_f32, le<float>(1e-5f))
      .kv(arch + ".rope.dimension_count", t_u32, u32(d.head_dim()))
      .kv(arch + ".vocab_size", t_u32, u32(d.vocab))
      .kv("tokenizer.ggml.bos_token_id", t_u32, u32(1))
      .kv("tokenizer.ggml.eos_token_id", t_u32, u32(2));
  for (const auto& [name, t] : m.parameters()) {
    at::Tensor w = t;
    if (arch == "llama" && name.find("q_proj.weight") != std::string::npos) w = permute_rope_rows(w, d.n_heads);
    if (arch == "llama" && name.find("k_proj.weight") != std::string::npos) w = permute_rope_rows(w, d.n_kv_heads);
    std::vector<std::uint64_t> ne;
    for (auto it = w.sizes().rbegin(); it != w.sizes().rend(); ++it) ne.push_back(static_cast<std::uint64_t>(*it));
    b.tensor({gguf_name(name), ne, g_f32, f32_bytes(floats(w)), {}});
  }
  return b;
}

std::string refusal(const gguf_builder& b) {
  try {
    gguf_to_model(gguf_file::parse(b.build(), "m.gguf"));
  } catch (const gguf_error& e) {
    return e.what();
  }
  FAIL("accepted");
  return {};
}

}  // namespace

TEST_CASE("llama.cpp's rotary row order, by hand", "[gguf_import]") {
  // One head of 4 rows: halves (0 1)(2 3) are stored interleaved as 0 2 1 3; two heads as
  // 0 2 1 3 4 6 5 7.
  const at::Tensor one = at::arange(4, at::kFloat).unsqueeze(1);
  CHECK(floats(permute_rope_rows(one, 1)) == std::vector<float>{0, 2, 1, 3});
  CHECK(floats(unpermute_rope_rows(permute_rope_rows(one, 1), 1)) == std::vector<float>{0, 1, 2, 3});
  const at::Tensor two = at::arange(8, at::kFloat).unsqueeze(1);
  CHECK(floats(permute_rope_rows(two, 2)) == std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7});
  // Head size 6: halves (0 1 2)(3 4 5) → 0 3 1 4 2 5; columns travel with their rows.
  const at::Tensor six = at::arange(12, at::kFloat).reshape({6, 2});
  CHECK(floats(permute_rope_rows(six, 1)) == std::vector<float>{0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11});
  const at::Tensor w = at::randn({24, 5});
  CHECK(at::equal(unpermute_rope_rows(permute_rope_rows(w, 3), 3), w));
  CHECK_THROWS_AS(permute_rope_rows(at::zeros({6, 2}), 2), std::invalid_argument);  // heads of 3 rows
}

TEST_CASE("a model written as llama.cpp writes it converts back weight for weight", "[gguf_import]") {
  const bool tie = GENERATE(true, false);
  const bool qwen = GENERATE(false, true);
  model_dims d = small_dims();
  d.tie_embeddings = tie;
  d.qkv_bias = qwen;
  d.rope_theta = 100000.0;
  const policy_model m = random_policy(d, 21);
  const gguf_file f = gguf_file::parse(as_gguf(m, qwen ? "qwen2" : "llama").build(), "m.gguf");
  const hf_loaded_model back = gguf_to_model(f);
  CHECK(back.config.family == (qwen ? hf_family::qwen2 : hf_family::llama));
  CHECK(back.config.dims.tie_embeddings == tie);
  CHECK(back.config.dims.rope_theta == 100000.0);
  CHECK(back.config.dims.norm_eps == 1e-5);  // the float32 1e-5, written back as the decimal meant
  CHECK(back.config.bos_token_id == 1);
  CHECK(back.config.eos_token_ids == std::vector<std::int64_t>{2});
  REQUIRE(back.model.parameters().size() == m.parameters().size());
  for (std::size_t i = 0; i < m.parameters().size(); ++i) {
    INFO(m.parameters()[i].first);
    CHECK(at::equal(back.model.parameters()[i].second, m.parameters()[i].second));
  }

  // The same through a file and a Hugging Face directory.
  const sorl::test::scratch_dir scratch(fmt::format("gguf_import_{}{}", tie, qwen));
  const fs::path& dir = scratch.path;
  {
    std::ofstream out(dir / "m.gguf", std::ios::binary);
    out << as_gguf(m, qwen ? "qwen2" : "llama").build();
  }
  CHECK_FALSE(convert_gguf_to_hf(dir / "m.gguf", dir / "hf", at::kFloat).tokenizer);  // none in the file
  CHECK_FALSE(fs::exists(dir / "hf" / "tokenizer.json"));
  const hf_loaded_model hf = load_hf_model(dir / "hf");
  const auto ids = tokens(16, d.vocab, 3);
  CHECK(at::equal(full_logits(hf.model, ids), full_logits(m, ids)));
}

TEST_CASE("GGUF models sorl cannot represent are refused by key or tensor", "[gguf_import]") {
  const model_dims d = small_dims();
  const policy_model m = random_policy(d, 22);
  SECTION("another architecture") {
    gguf_builder b = as_gguf(m, "llama");
    b.kvs[0] = str("general.architecture") + le<std::uint32_t>(t_str) + str("gpt2");
    CHECK_THAT(refusal(b), Catch::Contains("'general.architecture': 'gpt2' is not supported"));
  }
  SECTION("a tensor with no place in the model") {
    gguf_builder b = as_gguf(m, "llama");
    b.tensor({"rope_freqs.weight", {4}, g_f32, f32_bytes({1, 1, 1, 1}), {}});
    CHECK_THAT(refusal(b), Catch::Contains("tensor 'rope_freqs.weight': a llama model has no place for it"));
  }
  SECTION("a missing tensor") {
    gguf_builder b = as_gguf(m, "llama");
    b.tensors.erase(b.tensors.begin() + 2);
    CHECK_THAT(refusal(b), Catch::Contains("missing"));
  }
  SECTION("RoPE on part of the head") {
    gguf_builder b = as_gguf(m, "llama");
    b.kv("llama.rope.dimension_count", t_u32, le<std::uint32_t>(4));
    b.kvs.erase(b.kvs.begin() + 9);  // the original dimension_count
    CHECK_THAT(refusal(b), Catch::Contains("'llama.rope.dimension_count': 4 is not supported"));
  }
  SECTION("rope scaling other than linear") {
    gguf_builder b = as_gguf(m, "llama");
    b.kv("llama.rope.scaling.type", t_str, str("yarn"));
    CHECK_THAT(refusal(b), Catch::Contains("'llama.rope.scaling.type': 'yarn' is not supported"));
  }
  SECTION("a missing key") {
    gguf_builder b = as_gguf(m, "llama");
    b.kvs.erase(b.kvs.begin() + 1);  // block_count
    CHECK_THAT(refusal(b), Catch::Contains("llama.block_count"));
  }
}

namespace {

// A GGUF holding only a byte-level BPE vocabulary: tokens, merges, types and the named ids.
gguf_builder vocab_only(const std::string& pre) {
  const std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "a", "b", "ab", "Ġ", "<x>"};
  std::string toks = le<std::uint32_t>(t_str) + le<std::uint64_t>(tokens.size());
  for (const auto& t : tokens) toks += str(t);
  std::string types = le<std::uint32_t>(t_i32) + le<std::uint64_t>(tokens.size());
  for (std::int32_t t : {3, 3, 1, 1, 1, 1, 4}) types += le<std::int32_t>(t);
  gguf_builder b;
  b.kv("general.architecture", t_str, str("llama"))
      .kv("llama.context_length", t_u32, le<std::uint32_t>(2048))
      .kv("tokenizer.ggml.model", t_str, str("gpt2"))
      .kv("tokenizer.ggml.pre", t_str, str(pre))
      .kv("tokenizer.ggml.tokens", t_arr, toks)
      .kv("tokenizer.ggml.token_type", t_arr, types)
      .kv("tokenizer.ggml.merges", t_arr, le<std::uint32_t>(t_str) + le<std::uint64_t>(1) + str("a b"))
      .kv("tokenizer.ggml.bos_token_id", t_u32, le<std::uint32_t>(1))
      .kv("tokenizer.ggml.eos_token_id", t_u32, le<std::uint32_t>(0))
      .kv("tokenizer.chat_template", t_str, str("{{ messages }}"));
  return b;
}

}  // namespace

TEST_CASE("a GGUF vocabulary becomes the tokenizer.json its family ships", "[gguf_import]") {
  const gguf_file f = gguf_file::parse(vocab_only("smollm").build(), "v.gguf");
  const auto j = nlohmann::json::parse(gguf_tokenizer_json(f));
  CHECK(j["model"]["type"] == "BPE");
  CHECK(j["model"]["vocab"]["ab"] == 4);
  CHECK(j["model"]["vocab"].size() == 7);
  CHECK(j["model"]["merges"] == nlohmann::json::array({"a b"}));
  CHECK(j["model"]["byte_fallback"] == false);
  // Control tokens are special added tokens; user-defined ones are added but not special.
  REQUIRE(j["added_tokens"].size() == 3);
  CHECK(j["added_tokens"][0]["content"] == "<|endoftext|>");
  CHECK(j["added_tokens"][0]["special"] == true);
  CHECK(j["added_tokens"][2]["id"] == 6);
  CHECK(j["added_tokens"][2]["special"] == false);
  // SmolLM2 (StarCoder's convention): single digits, then GPT-2's byte-level split.
  CHECK(j["normalizer"].is_null());
  CHECK(j["pre_tokenizer"]["pretokenizers"][0] ==
        nlohmann::json{{"type", "Digits"}, {"individual_digits", true}});
  CHECK(j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] == true);
  CHECK(j["decoder"]["type"] == "ByteLevel");

  const auto q = nlohmann::json::parse(gguf_tokenizer_json(gguf_file::parse(vocab_only("qwen2").build(), "q")));
  CHECK(q["normalizer"]["type"] == "NFC");
  CHECK(q["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"].get<std::string>().find(R"(\p{N}|)") !=
        std::string::npos);
  CHECK(q["pre_tokenizer"]["pretokenizers"][1]["use_regex"] == false);
  const auto l = nlohmann::json::parse(gguf_tokenizer_json(gguf_file::parse(vocab_only("llama-bpe").build(), "l")));
  CHECK(l["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"].get<std::string>().find(R"(\p{N}{1,3})") !=
        std::string::npos);
  CHECK(l["model"]["ignore_merges"] == true);

  const auto c = nlohmann::json::parse(gguf_tokenizer_config_json(f));
  CHECK(c["bos_token"] == "<|im_start|>");
  CHECK(c["eos_token"] == "<|endoftext|>");
  CHECK_FALSE(c.contains("pad_token"));
  CHECK(c["chat_template"] == "{{ messages }}");
  CHECK(c["model_max_length"] == 2048);
}

TEST_CASE("GGUF tokenizers sorl does not know are refused by key", "[gguf_import]") {
  CHECK_THROWS_WITH(gguf_tokenizer_json(gguf_file::parse(vocab_only("deepseek-coder").build(), "v.gguf")),
                    Catch::Contains("'tokenizer.ggml.pre': 'deepseek-coder' is not supported"));
  gguf_builder spm = vocab_only("smollm");
  spm.kvs[2] = str("tokenizer.ggml.model") + le<std::uint32_t>(t_str) + str("llama");
  CHECK_THROWS_WITH(gguf_tokenizer_json(gguf_file::parse(spm.build(), "v.gguf")),
                    Catch::Contains("'tokenizer.ggml.model': 'llama' is not supported"));
  gguf_builder bad_id = vocab_only("smollm");
  bad_id.kv("tokenizer.ggml.padding_token_id", t_u32, le<std::uint32_t>(99));
  CHECK_THROWS_WITH(gguf_tokenizer_config_json(gguf_file::parse(bad_id.build(), "v.gguf")),
                    Catch::Contains("'tokenizer.ggml.padding_token_id': id 99 is outside the vocabulary"));
}
