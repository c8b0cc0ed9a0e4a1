#include "tests/fuzz/fuzz_entry.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

#include <ATen/ATen.h>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/execution_unit.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "messages/rollout.capnp.h"
#include "messages/smoke.capnp.h"
#include "messages/sync.capnp.h"
#include "messages/train.capnp.h"
#include "runtime/config.hpp"
#include "runtime/envelope.hpp"
#include "runtime/ml/formats/gguf.hpp"
#include "runtime/ml/formats/gguf_import.hpp"
#include "runtime/ml/formats/hf_model.hpp"
#include "runtime/ml/formats/hf_tokenizer.hpp"
#include "runtime/ml/tasks/jsonl_task.hpp"
#include "runtime/ml/formats/tokenizer_json.hpp"
#include "tests/ml/gguf_test_util.hpp"
#include "runtime/ml/formats/safetensors.hpp"
#include "runtime/sync/delta_codec.hpp"

namespace sorl::fuzz {

namespace fs = std::filesystem;

namespace {

outcome accepted() {
  return {true, {}};
}
outcome refused(std::string why) {
  if (why.empty())
    why = "(no message)";
  return {false, std::move(why)};
}
[[noreturn]] void broken_promise(const std::string& what) {
  throw std::logic_error("broken promise: " + what);
}

/// A scratch file of this process (the JSONL and safetensors code reads and writes paths).
fs::path scratch_file(const char* name) {
  return fs::temp_directory_path() / fmt::format("sorl-fuzz-{}-{}", ::getpid(), name);
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buf;
  buf << in.rdbuf();
  return std::move(buf).str();
}

void write_all(const fs::path& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out)
    throw std::runtime_error("cannot write " + path.string());
}

// -- envelope ------------------------------------------------------------------------------

template <class... Schemas>
struct schema_list {};

using known_schemas =
  schema_list<msg::Ping, msg::Pong, msg::GenerateRequest, msg::RolloutEvent, msg::Trajectory,
              msg::AbortRollouts, msg::TensorMeta, msg::WeightVersion, msg::WeightBucket,
              msg::WeightAck, msg::VersionReady, msg::GroupSizeQuery, msg::GroupSizeDecision,
              msg::TrainBatch, msg::TrainResult, msg::LearnerReady>;

/// Opens `e` as the schema its id names and walks every pointer (capnp's totalSize), under
/// the default limits; an unknown id is opened as the last schema (wrong_schema).
template <class S, class... Rest>
caf::error open_and_walk(const envelope& e, schema_list<S, Rest...>) {
  if constexpr (sizeof...(Rest) > 0)
    if (e.schema_id() != capnp::typeId<S>())
      return open_and_walk(e, schema_list<Rest...>{});
  return with_envelope<S>(e, [](typename S::Reader r) { (void)r.totalSize(); });
}

std::string wire_bytes(const envelope& e) {
  std::vector<char> buf;
  caf::binary_serializer sink{static_cast<caf::execution_unit*>(nullptr), buf};
  if (auto err = inspect(static_cast<caf::serializer&>(sink), const_cast<envelope&>(e)))
    throw std::runtime_error("cannot serialize a seed envelope: " + describe(err));
  return {buf.begin(), buf.end()};
}

outcome run_envelope(const uint8_t* data, size_t size) {
  envelope e;
  caf::binary_deserializer source{static_cast<caf::execution_unit*>(nullptr),
                                  reinterpret_cast<const char*>(data), size};
  if (auto err = inspect(static_cast<caf::deserializer&>(source), e))
    return refused(describe(err));
  if (auto err = open_and_walk(e, known_schemas{}))
    return refused(describe(err));
  return accepted();
}

std::vector<std::string> envelope_seeds() {
  std::vector<std::string> out;
  out.push_back(wire_bytes(build_envelope<msg::Ping>([](msg::Ping::Builder b) {
    b.setRound(7);
    b.setSentNs(-3);
    auto p = b.initPayload(24);
    for (unsigned i = 0; i < p.size(); ++i)
      p[i] = static_cast<uint8_t>(i);
  })));
  out.push_back(wire_bytes(build_envelope<msg::Trajectory>([](msg::Trajectory::Builder b) {
    b.setRequestId(11);
    b.setGroupId(3);
    auto prompt = b.initPromptTokens(4);
    for (unsigned i = 0; i < 4; ++i)
      prompt.set(i, static_cast<int32_t>(100 + i));
    auto response = b.initResponseTokens(3);
    for (unsigned i = 0; i < 3; ++i)
      response.set(i, static_cast<int32_t>(7 * i));
    auto mask = b.initLossMask(3);
    for (unsigned i = 0; i < 3; ++i)
      mask[i] = 1;
  })));
  out.push_back(wire_bytes(build_envelope<msg::WeightVersion>([](msg::WeightVersion::Builder b) {
    b.setVersion(5);
    b.setBucketCount(2);
    auto tensors = b.initTensors(2);
    tensors[0].setName("w");
    auto shape = tensors[0].initShape(2);
    shape.set(0, 3);
    shape.set(1, 4);
    tensors[1].setName("b");
    tensors[1].initShape(1).set(0, 4);
  })));
  out.push_back(wire_bytes(build_envelope<msg::WeightBucket>([](msg::WeightBucket::Builder b) {
    b.setVersion(5);
    b.setIndex(1);
    auto chunks = b.initChunks(1);
    chunks[0].setTensor(1);
    chunks[0].setOffset(2);
    auto d = chunks[0].initData(8);
    for (unsigned i = 0; i < 8; ++i)
      d[i] = static_cast<uint8_t>(0xA0 + i);
  })));
  return out;
}

// -- delta buckets ---------------------------------------------------------------------------

constexpr uint64_t delta_base_version = 4, delta_version = 5;

/// splitmix64, so that the fixed model is the same in every build.
uint64_t mix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// The receiving model every fuzzed bucket is checked against: three bf16 tensors.
const std::vector<std::vector<uint16_t>>& delta_base() {
  static const auto base = [] {
    uint64_t s = 1;
    std::vector<std::vector<uint16_t>> t;
    for (size_t n : {1000u, 37u, 5000u}) {
      std::vector<uint16_t> v(n);
      for (auto& x : v)
        x = static_cast<uint16_t>(mix(s));
      t.push_back(std::move(v));
    }
    return t;
  }();
  return base;
}

std::vector<sync::delta_target> targets_of(std::vector<std::vector<uint16_t>>& bits) {
  std::vector<sync::delta_target> out;
  for (size_t i = 0; i < bits.size(); ++i)
    out.push_back({static_cast<uint32_t>(i), bits[i].data(), bits[i].size()});
  return out;
}

outcome run_delta(const uint8_t* data, size_t size) {
  auto checked = delta_base();
  auto checked_targets = targets_of(checked);
  (void)sync::read_delta_bucket_info(data, size);
  if (auto err = sync::check_delta_bucket(data, size, delta_base_version, delta_version,
                                          checked_targets)) {
    if (!sync::apply_delta_bucket(data, size, delta_base_version, delta_version,
                                  checked_targets))
      broken_promise("apply_delta_bucket accepted a bucket check_delta_bucket refused");
    if (checked != delta_base())
      broken_promise("a refused bucket changed the targets");
    return refused(*err);
  }
  if (auto err = sync::apply_delta_bucket(data, size, delta_base_version, delta_version,
                                          checked_targets))
    broken_promise("a checked bucket failed to apply: " + *err);
  auto fast = delta_base();
  auto fast_targets = targets_of(fast);
  if (auto err = sync::apply_checked_delta_bucket(data, size, delta_base_version, delta_version,
                                                  fast_targets))
    broken_promise("apply_checked_delta_bucket failed on a checked bucket: " + *err);
  if (fast != checked)
    broken_promise("apply_checked_delta_bucket and apply_delta_bucket disagree");
  return accepted();
}

std::vector<std::string> delta_seeds() {
  const auto& base = delta_base();
  auto next = base;
  uint64_t s = 2;
  for (auto& t : next)
    for (auto& x : t) {
      const uint64_t r = mix(s) % 100;
      if (r < 8)
        x = static_cast<uint16_t>(x + (r % 2 ? 1 : -1)); // ±1 ULP: the common step
      else if (r < 10)
        x = static_cast<uint16_t>(mix(s)); // escapes
    }
  for (auto& x : next[1])
    x = static_cast<uint16_t>(mix(s)); // every element changed: a dense entry
  std::vector<sync::delta_source> sources;
  for (size_t i = 0; i < base.size(); ++i)
    sources.push_back({static_cast<uint32_t>(i), base[i].data(), next[i].data(), base[i].size()});
  std::vector<std::string> out;
  for (uint64_t bucket_bytes : {uint64_t{256}, uint64_t{1024}, uint64_t{1} << 20}) {
    sync::delta_options o;
    o.bucket_bytes = bucket_bytes;
    for (auto& b : sync::encode_delta(delta_base_version, delta_version, sources, o))
      out.emplace_back(b.begin(), b.end());
  }
  // A version without changes: one empty bucket.
  std::vector<sync::delta_source> same;
  for (size_t i = 0; i < base.size(); ++i)
    same.push_back({static_cast<uint32_t>(i), base[i].data(), base[i].data(), base[i].size()});
  for (auto& b : sync::encode_delta(delta_base_version, delta_version, same, {}))
    out.emplace_back(b.begin(), b.end());
  return out;
}

// -- TOML config -----------------------------------------------------------------------------

const std::set<std::string>& fuzz_roles() {
  static const std::set<std::string> roles{"ping",      "pong",           "trainer",
                                           "learner",   "rollout_worker", "scheduler",
                                           "sagc_controller", "sync_publisher"};
  return roles;
}

outcome run_toml(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    (void)parse_config(text, "fuzz.toml", fuzz_roles(), SORL_SOURCE_DIR "/configs");
  } catch (const config_exception& e) {
    if (e.errors().empty())
      broken_promise("a config_exception without errors");
    std::string all;
    for (const auto& err : e.errors())
      all += err.to_string() + "\n";
    return refused(all);
  }
  return accepted();
}

std::vector<std::string> toml_seeds() {
  std::vector<std::string> out;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(SORL_SOURCE_DIR "/configs"))
    if (entry.path().extension() == ".toml")
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::string text = read_all(f);
    // A config of a fetched model loads only once scripts/fetch-model has run; seeds must load
    // on a clean clone (tests/runtime/topology_test.cpp covers that config).
    if (text.find("hf_dir") == std::string::npos)
      out.push_back(std::move(text));
  }
  out.push_back("[[node]]\nname = \"main\"\nactors = [\"ping\", \"pong\"]\n");
  return out;
}

// -- safetensors ------------------------------------------------------------------------------

outcome run_safetensors(const uint8_t* data, size_t size) {
  try {
    const auto r = ml::safetensors_reader::parse(
      std::string(reinterpret_cast<const char*>(data), size), "fuzz.safetensors");
    (void)r.tensors();
  } catch (const ml::checkpoint_error& e) {
    return refused(e.what());
  }
  return accepted();
}

std::vector<std::string> safetensors_seeds() {
  std::vector<std::string> out;
  const fs::path path = scratch_file("seed.safetensors");
  const std::vector<ml::named_tensors> files{
    {{"w", at::arange(12, at::kFloat).reshape({3, 4})},
     {"b", at::full({4}, 0.5, at::kBFloat16)},
     {"empty", at::zeros({0, 2}, at::kFloat)}},
    {{"mask", at::tensor({1, 0, 1}, at::kByte).to(at::kBool)}, {"ids", at::arange(5, at::kLong)}},
  };
  for (const auto& tensors : files) {
    ml::save_safetensors(path, tensors, {{"format", "pt"}});
    out.push_back(read_all(path));
  }
  fs::remove(path);
  return out;
}

// -- GGUF model files ------------------------------------------------------------------------

outcome run_gguf(const uint8_t* data, size_t size) {
  try {
    const auto f = ml::gguf_file::parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz.gguf");
    for (const auto& t : f.tensors())
      if (ml::ggml_type_dequantizable(t.type) && t.numel() <= (1 << 20)) {
        const at::Tensor x = f.dequantize(t.name);
        if (x.numel() != t.numel())
          broken_promise(fmt::format("tensor '{}' dequantised to {} of {} elements", t.name, x.numel(), t.numel()));
      }
    if (const auto* arch = f.find("general.architecture"); arch != nullptr && arch->string() != nullptr) {
      const auto config = ml::gguf_model_config(f);
      // Small models only: the converter's cost is the model's size, which the tensors
      // confirm before it is allocated, so a large claim is refused or costs file-sized work.
      if (config.dims.parameter_count() <= (1 << 20)) (void)ml::gguf_to_model(f, 256);
    }
  } catch (const ml::gguf_error& e) {
    return refused(e.what());
  }
  return accepted();
}

// Small models written as llama.cpp writes them (tests/ml/gguf_test_util.hpp): every
// metadata key the converter reads, F32 tensors under llama.cpp's names; a tied Llama and a
// Qwen2 with q/k/v biases and its own output head.
std::vector<std::string> gguf_seeds() {
  using namespace ml::test;
  const std::uint64_t d = 8, ff = 16, vocab = 6;
  std::vector<std::string> out;
  for (const std::string arch : {"llama", "qwen2"}) {
    gguf_builder b;
    b.kv("general.architecture", t_str, str(arch))
      .kv(arch + ".block_count", t_u32, le<std::uint32_t>(1))
      .kv(arch + ".context_length", t_u32, le<std::uint32_t>(64))
      .kv(arch + ".embedding_length", t_u32, le<std::uint32_t>(d))
      .kv(arch + ".feed_forward_length", t_u32, le<std::uint32_t>(ff))
      .kv(arch + ".attention.head_count", t_u32, le<std::uint32_t>(2))
      .kv(arch + ".attention.head_count_kv", t_u32, le<std::uint32_t>(1))
      .kv(arch + ".rope.freq_base", t_f32, le<float>(10000.0f))
      .kv(arch + ".attention.layer_norm_rms_epsilon", t_f32, le<float>(1e-5f))
      .kv(arch + ".vocab_size", t_u32, le<std::uint32_t>(vocab));
    std::vector<std::pair<std::string, std::vector<std::uint64_t>>> tensors = {
      {"token_embd.weight", {d, vocab}},  {"output_norm.weight", {d}},
      {"blk.0.attn_q.weight", {d, d}},    {"blk.0.attn_k.weight", {d, 4}},
      {"blk.0.attn_v.weight", {d, 4}},    {"blk.0.attn_output.weight", {d, d}},
      {"blk.0.ffn_gate.weight", {d, ff}}, {"blk.0.ffn_up.weight", {d, ff}},
      {"blk.0.ffn_down.weight", {ff, d}}, {"blk.0.attn_norm.weight", {d}},
      {"blk.0.ffn_norm.weight", {d}},
    };
    if (arch == "qwen2") {
      tensors.push_back({"blk.0.attn_q.bias", {d}});
      tensors.push_back({"blk.0.attn_k.bias", {4}});
      tensors.push_back({"blk.0.attn_v.bias", {4}});
      tensors.push_back({"output.weight", {d, vocab}});
    }
    for (const auto& [name, ne] : tensors) {
      std::vector<float> values;
      for (std::uint64_t i = 0; i < ne[0] * (ne.size() > 1 ? ne[1] : 1); ++i)
        values.push_back(0.01f * static_cast<float>(i % 17) - 0.05f);
      b.tensor({name, ne, g_f32, f32_bytes(values), {}});
    }
    out.push_back(b.build());
  }
  return out;
}

// -- Hugging Face config.json ------------------------------------------------------------------

outcome run_hf_config(const uint8_t* data, size_t size) {
  try {
    const auto c = ml::parse_hf_config(std::string_view(reinterpret_cast<const char*>(data), size), "config.json");
    // What a loader does next with it: the tensor list, from sizes alone.
    (void)ml::hf_parameter_shapes(c.dims);
  } catch (const ml::checkpoint_error& e) {
    return refused(e.what());
  }
  return accepted();
}

std::vector<std::string> hf_config_seeds() {
  ml::hf_model_config c;
  c.dims = ml::preset("tiny");
  c.max_position_embeddings = 512;
  c.bos_token_id = 1;
  c.eos_token_ids = {2, 3};
  std::vector<std::string> out{ml::hf_config_json(c, "bfloat16")};
  c.family = ml::hf_family::qwen2;
  c.dims.qkv_bias = true;
  c.dims.rope_scaling.type = ml::rope_scaling_config::kind::llama3;
  c.dims.rope_scaling.factor = 8.0;
  out.push_back(ml::hf_config_json(c, "float32"));
  return out;
}

// -- Hugging Face tokenizer.json --------------------------------------------------------------

outcome run_tokenizer_json(const uint8_t* data, size_t size) {
  std::optional<ml::hf_tokenizer> tok;
  try {
    tok.emplace(ml::hf_tokenizer::from_json(std::string_view(reinterpret_cast<const char*>(data), size),
                                            "tokenizer.json"));
  } catch (const ml::tokenizer_error& e) {
    return refused(e.what());
  }
  // An accepted tokenizer keeps the interface's promises on text it has never seen.
  for (const std::string text : {"Hello, world! 12345", "  tabs\tand\r\nnewlines  ", "caf\xc3\xa9 \xe6\x9d\xb1 \xff",
                                 "<|endoftext|><|im_start|>user"}) {
    for (const bool special : {false, true}) {
      const auto ids = special ? tok->encode_with_special(text) : tok->encode(text);
      for (const auto id : ids) {
        if (id < 0 || id >= tok->vocab_size())
          broken_promise(fmt::format("id {} outside the vocabulary of {}", id, tok->vocab_size()));
        if (!special && tok->is_special(id)) broken_promise(fmt::format("plain text gave special id {}", id));
      }
      (void)tok->decode(ids);
    }
  }
  return accepted();
}

// The byte-level alphabet plus a few merges and added tokens, in the three pre-tokenizer
// pipelines of the supported families, written by runtime/ml/formats/tokenizer_json.hpp.
std::vector<std::string> tokenizer_json_seeds() {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  std::int64_t next = 0;
  auto symbol = [](int b) { return ml::byte_level_symbol(static_cast<std::uint8_t>(b)); };
  for (int b = 0; b < 256; ++b) vocab[symbol(b)] = next++;
  const std::vector<std::pair<std::string, std::string>> merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"},
                                                                  {symbol(' '), "w"}, {"1", "2"}};
  nlohmann::ordered_json merge_list = nlohmann::ordered_json::array();
  for (const auto& [a, b] : merges) {
    vocab[a + b] = next++;
    merge_list.push_back(a + " " + b);
  }
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (const char* t : {"<|endoftext|>", "<|im_start|>"}) {
    added.push_back(ml::added_token_entry(next, t, true));
    vocab[t] = next++;
  }
  const nlohmann::ordered_json digits = {{"type", "Digits"}, {"individual_digits", true}};
  const nlohmann::ordered_json split = {
    {"type", "Split"}, {"pattern", {{"Regex", ml::llama3_split_pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
  const std::vector<std::pair<nlohmann::ordered_json, nlohmann::ordered_json>> pipelines = {
    {nullptr, {{"type", "Sequence"}, {"pretokenizers", {digits, ml::byte_level_component(true, true)}}}},
    {nullptr, {{"type", "Sequence"}, {"pretokenizers", {split, ml::byte_level_component(false, true)}}}},
    {{{"type", "NFC"}}, ml::byte_level_component(true, true)},
  };
  std::vector<std::string> out;
  for (const auto& [normalizer, pre] : pipelines)
    out.push_back(ml::byte_level_bpe_document(vocab, merge_list, added, normalizer, pre, nullptr,
                                              ml::byte_level_component(true, true), false)
                    .dump());
  return out;
}

// -- JSONL tasks -----------------------------------------------------------------------------

outcome run_jsonl(const uint8_t* data, size_t size) {
  const fs::path path = scratch_file("task.jsonl");
  write_all(path, data, size);
  outcome result = accepted();
  for (auto match : {ml::answer_match::exact, ml::answer_match::integer, ml::answer_match::first_number,
                     ml::answer_match::last_number, ml::answer_match::countdown}) {
    const bool reasoning = match == ml::answer_match::first_number
                           || match == ml::answer_match::last_number
                           || match == ml::answer_match::countdown;
    ml::jsonl_options o;
    o.path = path.string();
    o.match = match;
    std::unique_ptr<ml::jsonl_task> task;
    try {
      task = std::make_unique<ml::jsonl_task>(o, 0.5);
    } catch (const ml::task_data_error& e) {
      if (match == ml::answer_match::exact)
        result = refused(e.what());
      continue;
    }
    for (auto split : {ml::task_split::train, ml::task_split::eval}) {
      const uint64_t n = task->size(split).value_or(0);
      for (uint64_t i = 0; i < n; ++i) {
        const ml::task_prompt p = task->prompt(split, i);
        if (reasoning) {
          // reasoning-gym's rules give partial credit and need not accept the reference's
          // spelling; a score is in [0, 1] whatever the text.
          for (const std::string& text : {p.reference, p.prompt, "<answer>" + p.reference + "</answer>"}) {
            const double r = task->score(p, text).reward;
            if (!(r >= 0.0 && r <= 1.0))
              broken_promise("a reasoning score outside [0, 1] for: " + text);
          }
          (void)task->wrong_completion(p, i);
          continue;
        }
        if (task->score(p, p.reference).reward != 1.0)
          broken_promise("a reference does not score as correct: " + p.reference);
        const std::optional<std::string> wrong = task->wrong_completion(p, i);
        if (!wrong)
          broken_promise("a JSONL task has no wrong demonstration for: " + p.prompt);
        else if (task->score(p, *wrong).reward != 0.0)
          broken_promise("a wrong demonstration scores: " + *wrong);
      }
    }
  }
  fs::remove(path);
  return result;
}

std::vector<std::string> jsonl_seeds() {
  return {
    "{\"prompt\": \"2+3=\", \"answer\": 5}\n{\"prompt\": \"7-9=\", \"answer\": \"-2\"}\n",
    "{\"prompt\": \"capital of France?\", \"answer\": \"Paris\"}\r\n\r\n"
    "{\"prompt\": \"capital of Italy?\", \"answer\": \" Rome \"}\n",
    "{\"prompt\": \"big\", \"answer\": 123456789012}\n",
  };
}

} // namespace

const std::vector<target>& targets() {
  static const std::vector<target> all{
    {"envelope", run_envelope, envelope_seeds},
    {"delta", run_delta, delta_seeds},
    {"toml", run_toml, toml_seeds},
    {"safetensors", run_safetensors, safetensors_seeds},
    {"jsonl", run_jsonl, jsonl_seeds},
    {"gguf", run_gguf, gguf_seeds},
    {"hf_config", run_hf_config, hf_config_seeds},
    {"tokenizer_json", run_tokenizer_json, tokenizer_json_seeds},
  };
  return all;
}

const target& find_target(std::string_view name) {
  for (const auto& t : targets())
    if (t.name == name)
      return t;
  throw std::invalid_argument(fmt::format("no fuzz target \"{}\"", name));
}

} // namespace sorl::fuzz
