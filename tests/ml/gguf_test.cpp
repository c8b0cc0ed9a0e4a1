#include "runtime/ml/formats/gguf.hpp"

#include "tests/ml/gguf_test_util.hpp"

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>

using namespace sorl::ml;
using namespace sorl::ml::test;
namespace fs = std::filesystem;

namespace {

// fp16 bit patterns used below.
constexpr std::uint16_t h_half = 0x3800;       // 0.5
constexpr std::uint16_t h_quarter = 0x3400;    // 0.25
constexpr std::uint16_t h_minus_one = 0xBC00;  // -1.0

/// Q4_0 / Q4_1 nibbles: qs[j] = j | (15 − j) << 4, so element j holds j and element j + 16
/// holds 15 − j.
std::string ramp_nibbles() {
  std::string qs;
  for (int j = 0; j < 16; ++j)
    qs += static_cast<char>(j | ((15 - j) << 4));
  return qs;
}

std::vector<float> values(const at::Tensor& t) {
  REQUIRE(t.scalar_type() == at::kFloat);
  REQUIRE(t.is_contiguous());
  const float* p = t.data_ptr<float>();
  return std::vector<float>(p, p + t.numel());
}

std::uint32_t bits(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

/// A valid file with metadata of several types and one tensor of each readable type.
gguf_builder sample_file() {
  std::string q8 = le(h_quarter);
  for (int j = 0; j < 32; ++j)
    q8 += static_cast<char>(static_cast<std::int8_t>(j - 16));
  gguf_builder b;
  b.kv("general.architecture", t_str, str("llama"))
    .kv("llama.block_count", t_u32, le<std::uint32_t>(30))
    .kv("tokenizer.ggml.tokens", t_arr, le<std::uint32_t>(t_str) + le<std::uint64_t>(2) + str("a") + str("bc"))
    .tensor({"f32", {3, 2}, g_f32, f32_bytes({1, 2, 3, 4, 5, 6}), {}})
    .tensor({"q4_0", {32}, g_q4_0, le(h_half) + ramp_nibbles(), {}})
    .tensor({"q4_1", {32}, g_q4_1, le(h_half) + le(h_minus_one) + ramp_nibbles(), {}})
    .tensor({"q8_0", {32}, g_q8_0, q8, {}})
    .tensor({"f16", {2}, g_f16, u16_bytes({0x3C00, 0xC000}), {}})
    .tensor({"bf16", {2}, g_bf16, u16_bytes({0x3F80, 0xC040}), {}});
  return b;
}

gguf_file parse(const std::string& bytes) {
  return gguf_file::parse(bytes, "mem.gguf");
}

/// parse(bytes) must throw a gguf_error whose message contains every one of `parts`.
void require_refused(const std::string& bytes, std::initializer_list<std::string_view> parts) {
  try {
    parse(bytes);
  } catch (const gguf_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.rfind("mem.gguf: ", 0) == 0);
    for (auto part : parts)
      CHECK(what.find(part) != std::string::npos);
    return;
  }
  FAIL("parsed without error");
}

} // namespace

TEST_CASE("gguf reads metadata of every type in file order", "[gguf]") {
  gguf_builder b;
  b.kv("u8", t_u8, le<std::uint8_t>(200))
    .kv("i8", t_i8, le<std::int8_t>(-5))
    .kv("u16", t_u16, le<std::uint16_t>(65535))
    .kv("i16", t_i16, le<std::int16_t>(-30000))
    .kv("u32", t_u32, le<std::uint32_t>(4000000000u))
    .kv("i32", t_i32, le<std::int32_t>(-2000000000))
    .kv("f32", t_f32, le(0.1f))
    .kv("bool", t_bool, le<std::uint8_t>(1))
    .kv("str", t_str, str("hello"))
    .kv("u64", t_u64, le<std::uint64_t>(std::numeric_limits<std::uint64_t>::max()))
    .kv("i64", t_i64, le<std::int64_t>(std::numeric_limits<std::int64_t>::min()))
    .kv("f64", t_f64, le(-2.5e300))
    .kv("strings", t_arr, le<std::uint32_t>(t_str) + le<std::uint64_t>(3) + str("") + str("x") + str("yz"))
    .kv("ints", t_arr, le<std::uint32_t>(t_i32) + le<std::uint64_t>(3) + le<std::int32_t>(-1) + le<std::int32_t>(0) + le<std::int32_t>(7))
    .kv("bytes", t_arr, le<std::uint32_t>(t_u8) + le<std::uint64_t>(2) + le<std::uint8_t>(255) + le<std::uint8_t>(0))
    .kv("floats", t_arr, le<std::uint32_t>(t_f32) + le<std::uint64_t>(2) + le(1.5f) + le(-0.25f))
    .kv("bools", t_arr, le<std::uint32_t>(t_bool) + le<std::uint64_t>(2) + le<std::uint8_t>(0) + le<std::uint8_t>(1))
    .kv("empty", t_arr, le<std::uint32_t>(t_u64) + le<std::uint64_t>(0))
    .kv("nested", t_arr, le<std::uint32_t>(t_arr) + le<std::uint64_t>(2)
                           + le<std::uint32_t>(t_u16) + le<std::uint64_t>(1) + le<std::uint16_t>(9)
                           + le<std::uint32_t>(t_str) + le<std::uint64_t>(1) + str("deep"));
  const gguf_file f = parse(b.build());

  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.tensors().empty());
  const std::vector<std::string> order = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                          "str", "u64", "i64", "f64", "strings", "ints", "bytes",
                                          "floats", "bools", "empty", "nested"};
  REQUIRE(f.metadata().size() == order.size());
  for (size_t i = 0; i < order.size(); ++i)
    CHECK(f.metadata()[i].key == order[i]);

  CHECK(f.find("u8")->type == gguf_type::uint8);
  CHECK(f.find("f64")->type == gguf_type::float64);
  CHECK(f.find("missing") == nullptr);

  CHECK(f.get_uint("u8") == 200);
  CHECK(f.get_int("u8") == 200); // any integer type whose value fits
  CHECK(f.get_int("i8") == -5);
  CHECK(f.get_uint("u16") == 65535);
  CHECK(f.get_int("i16") == -30000);
  CHECK(f.get_uint("u32") == 4000000000u);
  CHECK(f.get_int("i32") == -2000000000);
  CHECK(f.get_float("f32") == static_cast<double>(0.1f)); // widened exactly
  CHECK(f.get_bool("bool"));
  CHECK(f.get_string("str") == "hello");
  CHECK(f.get_uint("u64") == std::numeric_limits<std::uint64_t>::max());
  CHECK(f.get_int("i64") == std::numeric_limits<std::int64_t>::min());
  CHECK(f.get_float("f64") == -2.5e300);
  CHECK(f.get_string_array("strings") == std::vector<std::string>{"", "x", "yz"});
  CHECK(f.get_int_array("ints") == std::vector<std::int64_t>{-1, 0, 7});
  CHECK(f.get_int_array("bytes") == std::vector<std::int64_t>{255, 0});
  CHECK(f.find("bytes")->array()->element_type == gguf_type::uint8);
  CHECK(f.get_float_array("floats") == std::vector<double>{1.5, -0.25});
  CHECK(std::get<std::vector<bool>>(f.find("bools")->array()->elements) == std::vector<bool>{false, true});
  CHECK(f.find("empty")->array()->size() == 0);
  CHECK(f.find("empty")->array()->element_type == gguf_type::uint64);
  CHECK(f.get_int_array("empty").empty());

  const gguf_array& nested = *f.find("nested")->array();
  REQUIRE(nested.element_type == gguf_type::array);
  const auto& inner = std::get<std::vector<gguf_value>>(nested.elements);
  REQUIRE(inner.size() == 2);
  CHECK(inner[0].array()->element_type == gguf_type::uint16);
  CHECK(std::get<std::vector<std::uint64_t>>(inner[0].array()->elements) == std::vector<std::uint64_t>{9});
  CHECK(std::get<std::vector<std::string>>(inner[1].array()->elements) == std::vector<std::string>{"deep"});

  // Wrong types and missing keys name the key.
  CHECK_THROWS_WITH(f.get_uint("i8"), Catch::Contains("'i8'") && Catch::Contains("-5"));
  CHECK_THROWS_WITH(f.get_int("u64"), Catch::Contains("'u64'") && Catch::Contains("int64"));
  CHECK_THROWS_WITH(f.get_string("u32"), Catch::Contains("'u32'") && Catch::Contains("UINT32"));
  CHECK_THROWS_WITH(f.get_float("u32"), Catch::Contains("'u32'"));
  CHECK_THROWS_WITH(f.get_bool("str"), Catch::Contains("'str'") && Catch::Contains("STRING"));
  CHECK_THROWS_WITH(f.get_uint("strings"), Catch::Contains("ARRAY of STRING"));
  CHECK_THROWS_WITH(f.get_string_array("ints"), Catch::Contains("'ints'") && Catch::Contains("ARRAY of INT32"));
  CHECK_THROWS_WITH(f.get_int_array("floats"), Catch::Contains("'floats'"));
  CHECK_THROWS_AS(f.get_string("missing"), gguf_error);
  CHECK_THROWS_WITH(f.get_string("missing"), "mem.gguf: metadata key 'missing' is missing");
}

TEST_CASE("gguf dequantises each readable type to exact fp32 values", "[gguf]") {
  const gguf_file f = parse(sample_file().build());
  REQUIRE(f.tensors().size() == 6);

  SECTION("F32 is copied, with the shape ne reversed") {
    const at::Tensor t = f.dequantize("f32");
    CHECK(t.sizes().vec() == std::vector<std::int64_t>{2, 3});
    CHECK(values(t) == std::vector<float>{1, 2, 3, 4, 5, 6});
    CHECK(t[1][0].item<float>() == 4); // ne[0] = 3 is the fastest-varying dimension
  }
  SECTION("Q4_0: d * (q - 8)") {
    const at::Tensor t = f.dequantize("q4_0");
    CHECK(t.sizes().vec() == std::vector<std::int64_t>{32});
    std::vector<float> want(32);
    for (int j = 0; j < 16; ++j) {
      want[j] = 0.5f * static_cast<float>(j - 8);             // -4.0, -3.5, …, 3.5
      want[j + 16] = 0.5f * static_cast<float>(15 - j - 8);   // 3.5, 3.0, …, -4.0
    }
    CHECK(values(t) == want);
    CHECK(values(t)[0] == -4.0f);
    CHECK(values(t)[15] == 3.5f);
    CHECK(values(t)[16] == 3.5f);
    CHECK(values(t)[31] == -4.0f);
  }
  SECTION("Q4_1: d * q + m with d = 0.5, m = -1") {
    const std::vector<float> got = values(f.dequantize("q4_1"));
    const std::vector<float> want = {
      -1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 4.5f, 5.0f, 5.5f, 6.0f, 6.5f,
      6.5f, 6.0f, 5.5f, 5.0f, 4.5f, 4.0f, 3.5f, 3.0f, 2.5f, 2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f};
    CHECK(got == want);
  }
  SECTION("Q8_0: d * q with signed bytes") {
    const std::vector<float> got = values(f.dequantize("q8_0"));
    REQUIRE(got.size() == 32);
    CHECK(got[0] == -4.0f);  // -16 * 0.25
    CHECK(got[15] == -0.25f);
    CHECK(got[16] == 0.0f);
    CHECK(got[17] == 0.25f);
    CHECK(got[31] == 3.75f); // 15 * 0.25
  }
  SECTION("F16 and BF16 are widened") {
    CHECK(values(f.dequantize("f16")) == std::vector<float>{1.0f, -2.0f});
    CHECK(values(f.dequantize("bf16")) == std::vector<float>{1.0f, -3.0f});
  }
  SECTION("tensor infos") {
    const gguf_tensor_info* t = f.find_tensor("q4_1");
    REQUIRE(t != nullptr);
    CHECK(t->type == g_q4_1);
    CHECK(t->type_name == "Q4_1");
    CHECK(t->ne == std::vector<std::uint64_t>{32});
    CHECK(t->bytes == 20);
    CHECK(t->offset % 32 == 0);
    CHECK(f.tensor_bytes("q4_1").size() == 20);
    CHECK(f.find_tensor("f32")->shape() == std::vector<std::int64_t>{2, 3});
    CHECK(f.find_tensor("f32")->numel() == 6);
    CHECK(f.find_tensor("absent") == nullptr);
    CHECK_THROWS_WITH(f.dequantize("absent"), Catch::Contains("'absent'"));
  }
}

TEST_CASE("gguf widens fp16 and bf16 exactly with specials included", "[gguf]") {
  const std::vector<std::uint16_t> f16 = {
    0x0000, 0x8000, // ±0
    0x0001, 0x03FF, // smallest and largest subnormal
    0x0400,         // smallest normal, 2^-14
    0x3555,         // 0.333251953125
    0x7BFF,         // 65504, the largest finite
    0x7C00, 0xFC00, // ±inf
    0x7E00,         // a quiet NaN
  };
  const std::vector<std::uint16_t> bf16 = {0x3EAB, 0x0001, 0xFF80, 0x7FC1};
  gguf_builder b;
  b.tensor({"f16", {f16.size()}, g_f16, u16_bytes(f16), {}})
    .tensor({"bf16", {bf16.size()}, g_bf16, u16_bytes(bf16), {}});
  const gguf_file f = parse(b.build());

  const std::vector<float> h = values(f.dequantize("f16"));
  CHECK(bits(h[0]) == 0x00000000u);
  CHECK(bits(h[1]) == 0x80000000u);
  CHECK(h[2] == 0x1p-24f);
  CHECK(h[3] == 1023 * 0x1p-24f);
  CHECK(h[4] == 0x1p-14f);
  CHECK(h[5] == 0.333251953125f);
  CHECK(h[6] == 65504.0f);
  CHECK(h[7] == std::numeric_limits<float>::infinity());
  CHECK(h[8] == -std::numeric_limits<float>::infinity());
  CHECK(bits(h[9]) == 0x7FC00000u);

  const std::vector<float> g = values(f.dequantize("bf16"));
  CHECK(bits(g[0]) == 0x3EAB0000u);
  CHECK(bits(g[1]) == 0x00010000u); // a bf16 subnormal stays one
  CHECK(bits(g[2]) == 0xFF800000u);
  CHECK(bits(g[3]) == 0x7FC10000u); // NaN payload kept
}

TEST_CASE("gguf Q4_1 rounds d times q plus m once in fp32", "[gguf]") {
  // d = 2047 / 2^18 (fp16 0x1FFF), m = 1000 (fp16 0x63D0): 15 * d = 1919.0625 / 2^14 and
  // fp32 near 1000 has a resolution of 2^-14, so 1000 + 15·d rounds to 1000 + 1919 / 2^14.
  std::string qs(16, '\0');
  qs[0] = static_cast<char>(0xF0 | 0x0F); // elements 0 and 16: q = 15
  qs[1] = static_cast<char>(0x01);        // element 1: q = 1; element 17: q = 0
  gguf_builder b;
  b.tensor({"w", {32}, g_q4_1, le<std::uint16_t>(0x1FFF) + le<std::uint16_t>(0x63D0) + qs, {}});
  const std::vector<float> got = values(parse(b.build()).dequantize("w"));
  CHECK(got[0] == 1000.0f + 1919.0f / 16384.0f);
  CHECK(got[16] == got[0]);
  CHECK(got[1] == 1000.0f + 128.0f / 16384.0f); // 2047 / 2^18 = 127.9375 / 2^14 → 128
  CHECK(got[17] == 1000.0f);
}

TEST_CASE("gguf reverses ne into the PyTorch shape", "[gguf]") {
  std::vector<float> v(24);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(i);
  std::string q8;
  for (int block = 0; block < 3; ++block) {
    q8 += le<std::uint16_t>(0x3C00); // d = 1
    for (int j = 0; j < 32; ++j)
      q8 += static_cast<char>(block * 32 + j - 48);
  }
  gguf_builder b;
  b.tensor({"w", {4, 3, 2}, g_f32, f32_bytes(v), {}})
    .tensor({"e", {32, 3}, g_q8_0, q8, {}})
    .tensor({"v", {5}, g_f32, f32_bytes({1, 2, 3, 4, 5}), {}});
  const gguf_file f = parse(b.build());

  const at::Tensor w = f.dequantize("w");
  CHECK(w.sizes().vec() == std::vector<std::int64_t>{2, 3, 4});
  CHECK(w[1][2][3].item<float>() == 23.0f); // flat index i0 + 4·i1 + 12·i2
  CHECK(w[0][1][0].item<float>() == 4.0f);

  const at::Tensor e = f.dequantize("e"); // an embedding: one row of 32 per block
  CHECK(e.sizes().vec() == std::vector<std::int64_t>{3, 32});
  CHECK(e[2][0].item<float>() == 16.0f);  // 64 - 48
  CHECK(e[0][31].item<float>() == -17.0f);

  CHECK(f.dequantize("v").sizes().vec() == std::vector<std::int64_t>{5});
}

TEST_CASE("gguf honours general.alignment", "[gguf]") {
  gguf_builder b;
  b.alignment = 64;
  b.kv("general.alignment", t_u32, le<std::uint32_t>(64))
    .tensor({"a", {10}, g_f32, f32_bytes({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}), {}})
    .tensor({"b", {2}, g_f32, f32_bytes({-1, -2}), {}});
  REQUIRE(b.offsets() == std::vector<std::uint64_t>{0, 64});
  const std::string bytes = b.build();
  const gguf_file f = parse(bytes);
  CHECK(f.alignment() == 64);
  CHECK(f.data_offset() % 64 == 0);
  CHECK(f.data_offset() > 32);
  CHECK(f.find_tensor("b")->offset == 64);
  CHECK(values(f.dequantize("a"))[9] == 10.0f);
  CHECK(values(f.dequantize("b")) == std::vector<float>{-1.0f, -2.0f});

  SECTION("an offset aligned to 32 but not 64 is refused") {
    b.tensors[1].offset = 96;
    require_refused(b.build(), {"tensor 'b'", "offset 96", "alignment 64"});
  }
  SECTION("an alignment that isn't a power of two is refused") {
    b.kvs[0] = str("general.alignment") + le<std::uint32_t>(t_u32) + le<std::uint32_t>(48);
    require_refused(b.build(), {"general.alignment", "48", "power of two"});
  }
  SECTION("an alignment of another type than UINT32 is refused") {
    b.kvs[0] = str("general.alignment") + le<std::uint32_t>(t_u64) + le<std::uint64_t>(64);
    require_refused(b.build(), {"general.alignment", "UINT32", "UINT64"});
  }
}

TEST_CASE("gguf reads version 2 and files from disk", "[gguf]") {
  gguf_builder b = sample_file();
  b.version = 2;
  CHECK(parse(b.build()).version() == 2);

  const fs::path dir = fs::path(SORL_TEST_DATA_DIR) / "gguf";
  fs::create_directories(dir);
  const fs::path path = dir / "sample.gguf";
  {
    const std::string bytes = sample_file().build();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const gguf_file f = gguf_file::open(path);
  CHECK(f.label() == path.string());
  CHECK(f.get_string("general.architecture") == "llama");
  CHECK(f.get_uint("llama.block_count") == 30);
  CHECK(f.get_string_array("tokenizer.ggml.tokens") == std::vector<std::string>{"a", "bc"});
  CHECK(values(f.dequantize("bf16")) == std::vector<float>{1.0f, -3.0f});

  CHECK_THROWS_WITH(gguf_file::open(dir / "absent.gguf"),
                    Catch::StartsWith((dir / "absent.gguf").string() + ": cannot open"));
  CHECK_THROWS_WITH(gguf_file::open(dir), Catch::Contains("not a regular file"));
}

TEST_CASE("gguf refuses every truncation of a valid file", "[gguf]") {
  const std::string bytes = sample_file().build();
  REQUIRE_NOTHROW(parse(bytes));
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("prefix of " << n << " bytes");
    CHECK_THROWS_AS(parse(bytes.substr(0, n)), gguf_error);
  }
}

TEST_CASE("gguf survives every single-byte corruption of a valid file", "[gguf]") {
  // Each corrupted file either parses (and then dequantises) or throws gguf_error; nothing
  // else may escape, and nothing may crash or allocate beyond the file's size.
  const std::string bytes = sample_file().build();
  int refused = 0;
  for (size_t i = 0; i < bytes.size(); ++i)
    for (unsigned char value : {0x01, 0x02, 0x7F, 0x80, 0xFF}) {
      std::string bad = bytes;
      bad[i] = static_cast<char>(value ^ static_cast<unsigned char>(bytes[i]));
      INFO("byte " << i << " xor " << int(value));
      try {
        const gguf_file f = parse(bad);
        for (const auto& t : f.tensors())
          if (ggml_type_dequantizable(t.type))
            CHECK(f.dequantize(t.name).numel() == t.numel());
      } catch (const gguf_error&) {
        ++refused;
      }
    }
  CHECK(refused > 0);
}

TEST_CASE("gguf refuses malformed headers and metadata with a clear error", "[gguf]") {
  SECTION("bad magic") {
    gguf_builder b = sample_file();
    b.magic = "GGUX";
    require_refused(b.build(), {"not a GGUF file", "47 47 55 58"});
  }
  SECTION("version 1") {
    gguf_builder b = sample_file();
    b.version = 1;
    require_refused(b.build(), {"unsupported GGUF version 1", "2 and 3"});
  }
  SECTION("a big-endian file") {
    gguf_builder b = sample_file();
    b.version = 0x03000000;
    require_refused(b.build(), {"big-endian"});
  }
  SECTION("a key length of 2^63") {
    gguf_builder b = sample_file();
    b.kvs[1] = le<std::uint64_t>(std::uint64_t{1} << 63) + "llama.block_count";
    require_refused(b.build(), {"metadata entry 1", "length 9223372036854775808"});
  }
  SECTION("a string value length of 2^63") {
    gguf_builder b = sample_file();
    b.kvs[0] = str("general.architecture") + le<std::uint32_t>(t_str)
               + le<std::uint64_t>(std::uint64_t{1} << 63) + "llama";
    require_refused(b.build(), {"'general.architecture'", "9223372036854775808"});
  }
  SECTION("a tensor count of 2^62") {
    gguf_builder b = sample_file();
    b.tensor_count = std::uint64_t{1} << 62;
    require_refused(b.build(), {"tensor count", "4611686018427387904"});
  }
  SECTION("a metadata count of 2^62") {
    gguf_builder b = sample_file();
    b.kv_count = std::uint64_t{1} << 62;
    require_refused(b.build(), {"metadata count", "4611686018427387904"});
  }
  SECTION("an array count larger than the file") {
    gguf_builder b;
    b.kv("big", t_arr, le<std::uint32_t>(t_u32) + le<std::uint64_t>(std::uint64_t{1} << 60));
    require_refused(b.build(), {"'big'", "array length", "1152921504606846976"});
  }
  SECTION("a duplicate key") {
    gguf_builder b = sample_file();
    b.kv("llama.block_count", t_u32, le<std::uint32_t>(31));
    require_refused(b.build(), {"'llama.block_count'", "duplicate key"});
  }
  SECTION("an unknown value type") {
    gguf_builder b = sample_file();
    b.kv("odd", 13, le<std::uint32_t>(0));
    require_refused(b.build(), {"'odd'", "13", "not a GGUF value type"});
  }
  SECTION("a BOOL other than 0 or 1") {
    gguf_builder b = sample_file();
    b.kv("flag", t_bool, le<std::uint8_t>(2));
    require_refused(b.build(), {"'flag'", "BOOL", "not 0 or 1"});
  }
  SECTION("arrays nested too deep") {
    std::string value = le<std::uint32_t>(t_u8) + le<std::uint64_t>(0);
    for (int depth = 1; depth < gguf_file::max_array_depth; ++depth)
      value = le<std::uint32_t>(t_arr) + le<std::uint64_t>(1) + value;
    gguf_builder ok;
    ok.kv("deep", t_arr, value);
    CHECK_NOTHROW(parse(ok.build())); // exactly max_array_depth levels
    gguf_builder b;
    b.kv("deep", t_arr, le<std::uint32_t>(t_arr) + le<std::uint64_t>(1) + value);
    require_refused(b.build(), {"'deep'", "nests deeper"});
  }
  SECTION("an empty key") {
    gguf_builder b;
    b.kv("", t_u8, le<std::uint8_t>(0));
    require_refused(b.build(), {"empty key"});
  }
}

TEST_CASE("gguf refuses inconsistent tensor infos with a clear error", "[gguf]") {
  gguf_builder b = sample_file();
  SECTION("an offset past the end of the file") {
    b.tensors[5].offset = 1 << 20;
    b.tensors[5].write = false;
    require_refused(b.build(), {"tensor 'bf16'", "past the end"});
  }
  SECTION("an offset of 2^64 - 32, whose end overflows") {
    b.tensors[5].offset = std::numeric_limits<std::uint64_t>::max() - 31;
    b.tensors[5].write = false;
    require_refused(b.build(), {"tensor 'bf16'", "past the end"});
  }
  SECTION("a misaligned offset") {
    b.tensors[1].offset = 36;
    require_refused(b.build(), {"tensor 'q4_0'", "offset 36", "multiple of the alignment 32"});
  }
  SECTION("overlapping tensors") {
    b.tensors[3].offset = b.offsets()[2]; // q8_0 onto q4_1
    require_refused(b.build(), {"overlaps", "'q4_1'", "'q8_0'"});
  }
  SECTION("ne[0] not a multiple of the block size") {
    b.tensors[1].ne = {33};
    require_refused(b.build(), {"tensor 'q4_0'", "ne[0] = 33", "Q4_0"});
  }
  SECTION("five dimensions") {
    b.tensors[0].ne = {3, 2, 1, 1, 1};
    require_refused(b.build(), {"tensor 'f32'", "5 dimensions"});
  }
  SECTION("a dimension above INT64_MAX") {
    b.tensors[0].ne = {3, std::uint64_t{1} << 63};
    require_refused(b.build(), {"tensor 'f32'", "INT64_MAX"});
  }
  SECTION("an element count that overflows") {
    b.tensors[0].ne = {std::uint64_t{1} << 32, std::uint64_t{1} << 32};
    require_refused(b.build(), {"tensor 'f32'", "overflows"});
  }
  SECTION("a duplicate tensor name") {
    b.tensors[4].name = "f32";
    require_refused(b.build(), {"tensor 'f32'", "duplicate tensor name"});
  }
  SECTION("an unknown ggml type") {
    b.tensors[0].type = 99;
    require_refused(b.build(), {"tensor 'f32'", "unknown ggml type id 99"});
  }
  SECTION("Q6_K is listed but not dequantised") {
    std::string block(210, '\0');
    b.tensor({"output.weight", {256}, g_q6_k, block, {}});
    const gguf_file f = parse(b.build());
    const gguf_tensor_info* t = f.find_tensor("output.weight");
    REQUIRE(t != nullptr);
    CHECK(t->type_name == "Q6_K");
    CHECK(t->bytes == 210);
    CHECK_FALSE(ggml_type_dequantizable(g_q6_k));
    CHECK_THROWS_AS(f.dequantize("output.weight"), gguf_error);
    CHECK_THROWS_WITH(f.dequantize("output.weight"),
                      Catch::StartsWith("mem.gguf: tensor 'output.weight': ")
                        && Catch::Contains("ggml type 14 (Q6_K) is unsupported"));
  }
  SECTION("Q6_K with its data missing") {
    b.tensor({"output.weight", {256}, g_q6_k, std::string(200, '\0'), {}});
    require_refused(b.build(), {"tensor 'output.weight'", "past the end"});
  }
}

TEST_CASE("gguf names ggml types and metadata types", "[gguf]") {
  CHECK(ggml_type_name(0) == "F32");
  CHECK(ggml_type_name(3) == "Q4_1");
  CHECK(ggml_type_name(6) == "Q5_0");
  CHECK(ggml_type_name(7) == "Q5_1");
  CHECK(ggml_type_name(10) == "Q2_K");
  CHECK(ggml_type_name(15) == "Q8_K");
  CHECK(ggml_type_name(30) == "BF16");
  CHECK(ggml_type_name(4).empty());
  CHECK(ggml_type_name(1000).empty());
  CHECK(gguf_type_name(gguf_type::float64) == "FLOAT64");
  CHECK(gguf_type_name(static_cast<gguf_type>(13)).empty());
  CHECK(gguf_type_is_integer(gguf_type::int8));
  CHECK_FALSE(gguf_type_is_integer(gguf_type::boolean));
}
