#include "runtime/ml/formats/checkpoint.hpp"
#include "runtime/ml/formats/safetensors.hpp"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>

using namespace sorl::ml;
namespace fs = std::filesystem;

namespace {

// A fresh, empty directory for one test.
fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(SORL_TEST_DATA_DIR) / ("checkpoint_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string bytes_of(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

template <typename T>
at::Tensor from_bits(std::vector<T> bits, at::ScalarType type, std::vector<std::int64_t> shape) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
  REQUIRE(t.nbytes() == bits.size() * sizeof(T));
  if (!bits.empty())
    std::memcpy(t.data_ptr(), bits.data(), t.nbytes());
  return t;
}

// fp32 values whose bits a lossy path would change: -0, ±inf, a NaN payload, a denormal.
at::Tensor tricky_f32() {
  return from_bits<std::uint32_t>({0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001,
                                   0x00000001},
                                  at::kFloat, {2, 3});
}

at::Tensor tricky_bf16() {
  return from_bits<std::uint16_t>({0x3F80, 0x8000, 0x7FC1, 0x0001}, at::kBFloat16, {4});
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file laid out by hand, independent of save_safetensors.
std::string hand_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + data;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Calls f, which must throw checkpoint_error; returns it.
template <typename F>
checkpoint_error expect_error(F&& f) {
  try {
    f();
  } catch (const checkpoint_error& e) {
    return e;
  }
  FAIL("no checkpoint_error thrown");
  throw std::logic_error("unreachable");
}

} // namespace

TEST_CASE("safetensors round trip is bit-exact for fp32, bf16 and a 0-element tensor",
          "[checkpoint]") {
  const fs::path dir = scratch("round_trip");
  const named_tensors saved{
    {"w.f32", tricky_f32()},
    {"w.bf16", tricky_bf16()},
    {"empty", at::empty({0, 4}, at::kFloat)},
    {"ids.i64", from_bits<std::int64_t>({-1, 1LL << 40}, at::kLong, {2})},
    {"ids.i32", from_bits<std::int32_t>({-7}, at::kInt, {1, 1})},
    {"half", from_bits<std::uint16_t>({0x3C00, 0xFC00}, at::kHalf, {2})},
    {"bytes", from_bits<std::uint8_t>({0, 255, 7}, at::kByte, {3})},
    {"scalar", from_bits<std::uint32_t>({0x40490FDB}, at::kFloat, {})},
  };
  const fs::path path = dir / "model.safetensors";
  save_safetensors(path, saved, {{"format", "pt"}, {"note", "héllo"}});

  string_map meta;
  const named_tensors loaded = load_safetensors(path, &meta);
  CHECK(meta == string_map{{"format", "pt"}, {"note", "héllo"}});
  REQUIRE(loaded.size() == saved.size());
  for (const auto& [name, want] : saved) {
    INFO(name);
    const auto it = std::find_if(loaded.begin(), loaded.end(),
                                 [&](const auto& p) { return p.first == name; });
    REQUIRE(it != loaded.end());
    CHECK(it->second.scalar_type() == want.scalar_type());
    CHECK(it->second.sizes().vec() == want.sizes().vec());
    CHECK(bytes_of(it->second) == bytes_of(want));
  }

  // Into existing tensors (one of them non-contiguous): same bits.
  named_tensors dst;
  const at::Tensor transposed = at::zeros({3, 2}, at::kFloat).t(); // [2, 3], non-contiguous
  for (const auto& [name, want] : saved)
    dst.emplace_back(name, name == "w.f32" ? transposed : at::zeros_like(want));
  load_safetensors_into(path, dst);
  for (size_t i = 0; i < saved.size(); ++i)
    CHECK(bytes_of(dst[i].second) == bytes_of(saved[i].second));
}

TEST_CASE("the written file follows the safetensors layout", "[checkpoint]") {
  const fs::path path = scratch("layout") / "t.safetensors";
  save_safetensors(path, {{"u", from_bits<std::uint8_t>({1, 2}, at::kByte, {2})},
                          {"f", from_bits<float>({1.0f}, at::kFloat, {1})}});
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(file.size() >= 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(file[static_cast<size_t>(i)]);
  CHECK(n % 8 == 0); // padded so the data section is 8-byte aligned
  REQUIRE(file.size() == 8 + n + 6);
  const auto header = nlohmann::json::parse(file.substr(8, n));
  // Larger elements first: the F32 tensor, then the U8 one.
  CHECK(header.at("f") == nlohmann::json::parse(
                            R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})"));
  CHECK(header.at("u") == nlohmann::json::parse(
                            R"({"dtype": "U8", "shape": [2], "data_offsets": [4, 6]})"));
  CHECK_FALSE(header.contains("__metadata__"));
  CHECK(file.substr(8 + n) == std::string("\x00\x00\x80\x3F\x01\x02", 6));
}

TEST_CASE("a hand-written safetensors file reads back", "[checkpoint]") {
  const fs::path path = scratch("hand") / "h.safetensors";
  write_bytes(path, hand_file(R"({"__metadata__":{"k":"v"},"x":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                              std::string("\x01\x00\x00\x00\xFF\xFF\xFF\xFF", 8)));
  string_map meta;
  const named_tensors t = load_safetensors(path, &meta);
  REQUIRE(t.size() == 1);
  CHECK(t[0].first == "x");
  CHECK(t[0].second.scalar_type() == at::kInt);
  CHECK(t[0].second[0].item<int>() == 1);
  CHECK(t[0].second[1].item<int>() == -1);
  CHECK(meta.at("k") == "v");
}

TEST_CASE("a truncated file is rejected and the destination left untouched", "[checkpoint]") {
  const fs::path path = scratch("truncated") / "m.safetensors";
  save_safetensors(path, {{"a", tricky_f32()}, {"b", tricky_bf16()}});
  const auto full = fs::file_size(path);
  named_tensors dst{{"a", at::full({2, 3}, 7.0, at::kFloat)},
                    {"b", at::full({4}, 7.0, at::kBFloat16)}};
  const std::string before_a = bytes_of(dst[0].second), before_b = bytes_of(dst[1].second);

  for (const std::uintmax_t size : {full - 1, full - 9, std::uintmax_t{20}, std::uintmax_t{5},
                                    std::uintmax_t{0}}) {
    INFO("truncated to " << size << " of " << full << " bytes");
    save_safetensors(path, {{"a", tricky_f32()}, {"b", tricky_bf16()}});
    fs::resize_file(path, size);
    const checkpoint_error e = expect_error([&] { load_safetensors_into(path, dst); });
    CHECK(e.path() == path.string());
    CHECK(contains(e.what(), path.string()));
    CHECK(contains(e.what(), "truncated"));
    CHECK(bytes_of(dst[0].second) == before_a);
    CHECK(bytes_of(dst[1].second) == before_b);
  }
}

TEST_CASE("a corrupt or inconsistent header is rejected clearly", "[checkpoint]") {
  const fs::path dir = scratch("corrupt");
  const fs::path path = dir / "c.safetensors";
  const std::string data8(8, '\0');
  struct bad_case {
    const char* label;
    std::string bytes;
    const char* message;
    const char* tensor;
  };
  const std::vector<bad_case> cases{
    {"not JSON", hand_file(R"(X"x":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", data8),
     "not valid JSON", ""},
    {"not an object", hand_file("[1, 2]", ""), "expected a JSON object", ""},
    {"huge header length", std::string("\xFF\xFF\xFF\xFF\xFF\xFF\xFF\x7F", 8) + "{}", "exceeds",
     ""},
    {"span disagrees with shape",
     hand_file(R"({"x":{"dtype":"I32","shape":[2],"data_offsets":[0,4]}})", data8.substr(0, 4)),
     "span 4 bytes, but I32 [2] needs 8", "x"},
    {"gap between tensors",
     hand_file(R"({"x":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},)"
               R"("y":{"dtype":"I32","shape":[1],"data_offsets":[8,12]}})",
               std::string(12, '\0')),
     "tile", "y"},
    {"overlapping tensors",
     hand_file(R"({"x":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
               R"("y":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}})",
               data8),
     "tile", "y"},
    {"trailing bytes", hand_file(R"({"x":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", data8),
     "after the last tensor", ""},
    {"duplicate key",
     hand_file(R"({"x":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},)"
               R"("x":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
               data8.substr(0, 4)),
     "duplicate key 'x'", ""},
    {"unknown dtype",
     hand_file(R"({"x":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0')),
     "unsupported dtype", "x"},
    {"negative dim",
     hand_file(R"({"x":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", std::string(1, '\0')),
     "non-negative", "x"},
    {"missing offsets", hand_file(R"({"x":{"dtype":"U8","shape":[1]}})", std::string(1, '\0')), "data_offsets",
     "x"},
    {"bad bool", hand_file(R"({"x":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})",
                           std::string("\x01\x02", 2)),
     "BOOL byte 2", "x"},
    {"metadata not strings", hand_file(R"({"__metadata__":{"k":1}})", ""), "__metadata__", ""},
  };
  for (const auto& c : cases) {
    INFO(c.label);
    write_bytes(path, c.bytes);
    const checkpoint_error e = expect_error([&] { load_safetensors(path); });
    INFO(e.what());
    CHECK(contains(e.what(), path.string()));
    CHECK(contains(e.what(), c.message));
    CHECK(e.tensor() == c.tensor);
  }

  // A byte of a real file's header overwritten.
  save_safetensors(path, {{"a", tricky_f32()}});
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  bytes[8] = '#'; // the header's opening brace
  write_bytes(path, bytes);
  at::Tensor dst = at::full({2, 3}, 7.0, at::kFloat);
  const std::string before = bytes_of(dst);
  const checkpoint_error e = expect_error([&] { load_safetensors_into(path, {{"a", dst}}); });
  CHECK(contains(e.what(), "corrupt header"));
  CHECK(bytes_of(dst) == before);
}

TEST_CASE("a wrong shape, wrong dtype, missing or extra tensor is rejected and nothing copied",
          "[checkpoint]") {
  const fs::path path = scratch("mismatch") / "m.safetensors";
  save_safetensors(path, {{"a", at::ones({2}, at::kFloat)}, {"w", tricky_f32()}});
  at::Tensor a = at::full({2}, 7.0, at::kFloat);
  const std::string before_a = bytes_of(a);

  SECTION("wrong shape") {
    at::Tensor w = at::full({3, 2}, 7.0, at::kFloat);
    const checkpoint_error e = expect_error([&] { load_safetensors_into(path, {{"a", a}, {"w", w}}); });
    CHECK(e.tensor() == "w");
    CHECK(e.path() == path.string());
    CHECK(contains(e.what(), "tensor 'w'"));
    CHECK(contains(e.what(), "shape [2, 3] in the file, expected [3, 2]"));
    CHECK(bytes_of(w) == bytes_of(at::full({3, 2}, 7.0, at::kFloat)));
  }
  SECTION("wrong dtype") {
    at::Tensor w = at::full({2, 3}, 7.0, at::kBFloat16);
    const checkpoint_error e = expect_error([&] { load_safetensors_into(path, {{"a", a}, {"w", w}}); });
    CHECK(e.tensor() == "w");
    CHECK(contains(e.what(), "dtype F32 in the file, expected BF16"));
    CHECK(bytes_of(w) == bytes_of(at::full({2, 3}, 7.0, at::kBFloat16)));
  }
  SECTION("missing tensor") {
    at::Tensor w = at::full({2, 3}, 7.0, at::kFloat);
    at::Tensor b = at::zeros({1}, at::kFloat);
    const checkpoint_error e =
      expect_error([&] { load_safetensors_into(path, {{"a", a}, {"w", w}, {"b", b}}); });
    CHECK(e.tensor() == "b");
    CHECK(contains(e.what(), "1 missing tensor(s): b"));
  }
  SECTION("extra tensor") {
    const checkpoint_error e = expect_error([&] { load_safetensors_into(path, {{"a", a}}); });
    CHECK(e.tensor() == "w");
    CHECK(contains(e.what(), "1 unexpected tensor(s): w"));
  }
  // "a" matched in every case, but nothing may be copied when anything else fails.
  CHECK(bytes_of(a) == before_a);
}

TEST_CASE("save_safetensors rejects bad tensor lists before writing", "[checkpoint]") {
  const fs::path path = scratch("bad_list") / "x.safetensors";
  const at::Tensor t = at::zeros({1}, at::kFloat);
  CHECK_THROWS_AS(save_safetensors(path, {{"a", t}, {"a", t}}), std::invalid_argument);
  CHECK_THROWS_AS(save_safetensors(path, {{"__metadata__", t}}), std::invalid_argument);
  CHECK_THROWS_AS(save_safetensors(path, {{"", t}}), std::invalid_argument);
  CHECK_THROWS_AS(save_safetensors(path, {{"u", at::Tensor()}}), std::invalid_argument);
  CHECK_THROWS_AS(save_safetensors(path, {{"c", at::zeros({1}, at::kComplexFloat)}}),
                  std::invalid_argument);
  CHECK_FALSE(fs::exists(path));
  CHECK(fs::is_empty(path.parent_path())); // no temporary left behind
}

// -- checkpoints ----------------------------------------------------------------------------

namespace {

named_tensors model_tensors() {
  return {{"model.embed_tokens.weight", tricky_f32()},
          {"model.norm.weight", from_bits<float>({1.0f, 2.0f, 3.0f}, at::kFloat, {3})}};
}

named_tensors fresh_model() {
  return {{"model.embed_tokens.weight", at::full({2, 3}, 7.0, at::kFloat)},
          {"model.norm.weight", at::full({3}, 7.0, at::kFloat)}};
}

} // namespace

TEST_CASE("a checkpoint round-trips weights, optimizer tensors and state", "[checkpoint]") {
  const fs::path root = scratch("ckpt_round_trip");
  CHECK_FALSE(latest_checkpoint(root).has_value());

  checkpoint_state state;
  state.step = 123;
  state.rng_states = {{"sampler", "12345 678"}};
  state.metadata = {{"preset", "tiny"}};
  const named_tensors optim{{"exp_avg.0", tricky_bf16()}, {"step", at::zeros({0}, at::kLong)}};
  const fs::path dir = save_checkpoint(root, model_tensors(), optim, state);
  CHECK(dir == root / "step-0000000123");
  CHECK(latest_checkpoint(root) == dir);

  const named_tensors model = fresh_model();
  const loaded_checkpoint got = load_checkpoint(*latest_checkpoint(root), model);
  CHECK(got.state.step == 123);
  CHECK(got.state.rng_states == state.rng_states);
  CHECK(got.state.metadata == state.metadata);
  CHECK(bytes_of(model[0].second) == bytes_of(tricky_f32()));
  CHECK(bytes_of(model[1].second) == bytes_of(model_tensors()[1].second));
  // In data-section order: larger elements first, so the I64 "step" precedes the BF16 one.
  REQUIRE(got.optimizer.size() == 2);
  CHECK(got.optimizer[0].first == "step");
  CHECK(got.optimizer[0].second.numel() == 0);
  CHECK(got.optimizer[1].first == "exp_avg.0");
  CHECK(bytes_of(got.optimizer[1].second) == bytes_of(tricky_bf16()));

  // The model file carries the metadata Hugging Face loaders look for.
  string_map meta;
  load_safetensors(dir / "model.safetensors", &meta);
  CHECK(meta.at("format") == "pt");
  CHECK(meta.at("sorl.step") == "123");

  // Only the step directory and `latest` remain: no temporaries.
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(root))
    names.insert(entry.path().filename().string());
  CHECK(names == std::set<std::string>{"latest", "step-0000000123"});
}

TEST_CASE("latest moves to each new checkpoint and re-saving a step replaces it", "[checkpoint]") {
  const fs::path root = scratch("ckpt_latest");
  checkpoint_state s;
  s.step = 1;
  save_checkpoint(root, model_tensors(), {}, s);
  s.step = 2;
  save_checkpoint(root, model_tensors(), {}, s);
  CHECK(latest_checkpoint(root) == root / "step-0000000002");
  s.step = 1;
  s.metadata = {{"again", "yes"}};
  save_checkpoint(root, model_tensors(), {}, s);
  CHECK(latest_checkpoint(root) == root / "step-0000000001");
  const loaded_checkpoint got = load_checkpoint(root / "step-0000000001", fresh_model());
  CHECK(got.state.metadata.at("again") == "yes");
  CHECK(fs::exists(root / "step-0000000002"));

  // A failing save (undefined optimizer tensor) leaves `latest` and the root as they were.
  s.step = 3;
  CHECK_THROWS_AS(save_checkpoint(root, model_tensors(), {{"bad", at::Tensor()}}, s),
                  std::invalid_argument);
  CHECK(latest_checkpoint(root) == root / "step-0000000001");
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(root))
    names.insert(entry.path().filename().string());
  CHECK(names == std::set<std::string>{"latest", "step-0000000001", "step-0000000002"});
}

TEST_CASE("the next save removes the temporary directories crashed writes left and names them",
          "[checkpoint]") {
  const fs::path root = scratch("ckpt_stale_tmp");
  const auto make_dir = [&](const std::string& name) {
    fs::create_directories(root / name);
    write_bytes(root / name / "model.safetensors", std::string(4096, 'w'));
    return root / name;
  };
  // Stale: no pid in the name, and this process's own pid on a directory no save of it is
  // writing (a crashed process's, the pid since recycled).
  const fs::path crashed = make_dir(".tmp-step-7");
  const fs::path recycled = make_dir(".tmp-step-0000000005-" + std::to_string(::getpid()));
  // Kept: another live process's (pid 1 is always alive), and what is not a save's temporary.
  const fs::path other = make_dir(".tmp-step-0000000009-1");
  const fs::path old = make_dir(".old-step-0000000003-1234");
  write_bytes(root / ".tmp-step-notes", "a file, not a directory");

  checkpoint_state s;
  s.step = 8;
  std::vector<fs::path> removed;
  const fs::path dir = save_checkpoint(root, model_tensors(), {}, s, &removed);
  CHECK(removed == std::vector<fs::path>{recycled, crashed});  // in name order
  CHECK_FALSE(fs::exists(crashed));
  CHECK_FALSE(fs::exists(recycled));
  CHECK(fs::exists(other / "model.safetensors"));
  CHECK(fs::exists(old / "model.safetensors"));
  CHECK(fs::exists(root / ".tmp-step-notes"));
  // The checkpoint itself is whole.
  CHECK(latest_checkpoint(root) == dir);
  const named_tensors model = fresh_model();
  CHECK(load_checkpoint(dir, model).state.step == 8);
  CHECK(bytes_of(model[0].second) == bytes_of(tricky_f32()));

  // A resume sweeps the root the same way; a second sweep finds nothing, a missing root too.
  make_dir(".tmp-step-0000000010-" + std::to_string(::getpid()));
  CHECK(remove_stale_checkpoint_temporaries(root) ==
        std::vector<fs::path>{root / (".tmp-step-0000000010-" + std::to_string(::getpid()))});
  CHECK(remove_stale_checkpoint_temporaries(root).empty());
  CHECK(remove_stale_checkpoint_temporaries(root / "missing").empty());
}

TEST_CASE("saves running at once in one process leave each other's temporary directory alone",
          "[checkpoint]") {
  // Each save's sweep runs while the other thread may be writing its own temporary directory,
  // whose name ends in this same pid: only the in-flight mark keeps it from being taken.
  const fs::path root = scratch("ckpt_concurrent");
  std::vector<fs::path> removed[2];
  std::string errors[2];
  const auto saver = [&](int t) {
    try {
      for (int i = 0; i < 30; ++i) {
        checkpoint_state s;
        s.step = 2 * i + t;
        save_checkpoint(root, model_tensors(), {}, s, &removed[t]);
      }
    } catch (const std::exception& e) {
      errors[t] = e.what();
    }
  };
  std::thread a(saver, 0), b(saver, 1);
  a.join();
  b.join();
  CHECK(errors[0].empty());
  CHECK(errors[1].empty());
  CHECK(removed[0].empty());
  CHECK(removed[1].empty());
  for (int step = 0; step < 60; ++step)
    CHECK(load_checkpoint(root / checkpoint_dir_name(step), fresh_model()).state.step == step);
}

TEST_CASE("a corrupted checkpoint file is rejected and the model left untouched",
          "[checkpoint]") {
  const fs::path root = scratch("ckpt_corrupt");
  checkpoint_state s;
  s.step = 5;
  const fs::path dir = save_checkpoint(root, model_tensors(), {}, s);
  const fs::path model_path = dir / "model.safetensors";
  std::string bytes;
  {
    std::ifstream in(model_path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const named_tensors model = fresh_model();
  const std::string before = bytes_of(model[0].second);

  SECTION("one flipped data bit: a valid safetensors file, caught by the checksum") {
    bytes[bytes.size() - 1] ^= 0x01;
    write_bytes(model_path, bytes);
    const checkpoint_error e = expect_error([&] { load_checkpoint(dir, model); });
    CHECK(e.path() == model_path.string());
    CHECK(contains(e.what(), "checksum mismatch"));
  }
  SECTION("a truncated model file") {
    write_bytes(model_path, bytes.substr(0, bytes.size() - 4));
    const checkpoint_error e = expect_error([&] { load_checkpoint(dir, model); });
    CHECK(contains(e.what(), "truncated"));
  }
  SECTION("a sidecar of a newer format") {
    std::ifstream in(dir / "state.json");
    auto j = nlohmann::json::parse(in);
    in.close();
    j["format_version"] = 2;
    write_bytes(dir / "state.json", j.dump());
    const checkpoint_error e = expect_error([&] { load_checkpoint(dir, model); });
    CHECK(contains(e.what(), "format_version 2"));
  }
  SECTION("sidecar numbers that do not fit their fields") {
    std::ifstream in(dir / "state.json");
    const auto good = nlohmann::json::parse(in);
    in.close();
    const auto with = [&](const char* key, const nlohmann::json& value) {
      auto j = good;
      j[key] = value;
      write_bytes(dir / "state.json", j.dump());
      return std::string(expect_error([&] { load_checkpoint(dir, model); }).what());
    };
    // 2^32 + 1 would become format_version 1 through a plain cast to int.
    CHECK(contains(with("format_version", 4294967297ull), "format_version 4294967297"));
    CHECK(contains(with("format_version", 1.5), "format_version 1.5"));
    CHECK(contains(with("step", 1e300), "\"step\" is 1e+300, not a non-negative"));
    CHECK(contains(with("step", -1), "\"step\" is -1, not a non-negative"));
    CHECK(contains(with("step", 18446744073709551615ull), "\"step\" is 18446744073709551615"));
    auto j = good;
    j["files"]["model.safetensors"]["bytes"] = -5;
    write_bytes(dir / "state.json", j.dump());
    CHECK(contains(expect_error([&] { load_checkpoint(dir, model); }).what(),
                   "the size of model.safetensors is -5, not a byte count"));
    j["files"]["model.safetensors"]["bytes"] = 1e300;
    write_bytes(dir / "state.json", j.dump());
    CHECK(contains(expect_error([&] { load_checkpoint(dir, model); }).what(),
                   "the size of model.safetensors is 1e+300, not a byte count"));
  }
  SECTION("a sidecar that is not JSON") {
    write_bytes(dir / "state.json", "{\"format\": ");
    const checkpoint_error e = expect_error([&] { load_checkpoint(dir, model); });
    CHECK(contains(e.what(), "state.json"));
  }
  SECTION("a model of another shape") {
    const named_tensors other{{"model.embed_tokens.weight", at::full({3, 3}, 7.0, at::kFloat)},
                              {"model.norm.weight", model[1].second}};
    const checkpoint_error e = expect_error([&] { load_checkpoint(dir, other); });
    CHECK(e.tensor() == "model.embed_tokens.weight");
  }
  CHECK(bytes_of(model[0].second) == before);
}

TEST_CASE("a malformed latest pointer is an error", "[checkpoint]") {
  const fs::path root = scratch("ckpt_bad_latest");
  write_bytes(root / "latest", "../../etc\n");
  CHECK_THROWS_AS(latest_checkpoint(root), checkpoint_error);
  write_bytes(root / "latest", "step-0000000009\n");
  const checkpoint_error e = expect_error([&] { latest_checkpoint(root); });
  CHECK(contains(e.what(), "does not exist"));
}
