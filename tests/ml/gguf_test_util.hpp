#pragma once

// A small GGUF writer for tests, byte by byte, so every field of a test's file is visible
// (the layout: runtime/ml/formats/gguf.hpp). Tests corrupt fields through gguf_builder's members.

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sorl::ml::test {

template <typename T>
inline std::string le(T value) {
  std::string out(sizeof(T), '\0');
  std::memcpy(out.data(), &value, sizeof(T));
  return out;
}

inline std::string str(std::string_view s) {
  return le<std::uint64_t>(s.size()) + std::string(s);
}

// Metadata value types, as numbered by the file.
enum : std::uint32_t {
  t_u8 = 0, t_i8 = 1, t_u16 = 2, t_i16 = 3, t_u32 = 4, t_i32 = 5, t_f32 = 6, t_bool = 7,
  t_str = 8, t_arr = 9, t_u64 = 10, t_i64 = 11, t_f64 = 12,
};

// ggml tensor types.
enum : std::uint32_t {
  g_f32 = 0, g_f16 = 1, g_q4_0 = 2, g_q4_1 = 3, g_q8_0 = 8, g_q6_k = 14, g_bf16 = 30,
};

struct tensor_spec {
  std::string name;
  std::vector<std::uint64_t> ne;
  std::uint32_t type = g_f32;
  std::string data;
  std::optional<std::uint64_t> offset; // default: packed after the previous, aligned
  bool write = true;                    // false: the info claims data the file lacks
};

/// Lays out a file as the specification does; fields the hostile tests corrupt can be
/// overridden.
struct gguf_builder {
  std::string magic = "GGUF";
  std::uint32_t version = 3;
  std::uint64_t alignment = 32; // the layout's; general.alignment must be added as a kv
  std::optional<std::uint64_t> tensor_count, kv_count;
  std::vector<std::string> kvs; // encoded entries
  std::vector<tensor_spec> tensors;

  gguf_builder& kv(std::string_view key, std::uint32_t type, const std::string& value) {
    kvs.push_back(str(key) + le<std::uint32_t>(type) + value);
    return *this;
  }
  gguf_builder& tensor(tensor_spec t) {
    tensors.push_back(std::move(t));
    return *this;
  }

  /// The offsets build() gives the tensors.
  std::vector<std::uint64_t> offsets() const {
    std::vector<std::uint64_t> out;
    std::uint64_t next = 0;
    for (const auto& t : tensors) {
      const std::uint64_t at = t.offset ? *t.offset : next;
      out.push_back(at);
      next = (at + t.data.size() + alignment - 1) / alignment * alignment;
    }
    return out;
  }

  std::string build() const {
    std::string out = magic + le(version) + le<std::uint64_t>(tensor_count.value_or(tensors.size()))
                      + le<std::uint64_t>(kv_count.value_or(kvs.size()));
    for (const auto& kv : kvs)
      out += kv;
    const auto offs = offsets();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = tensors[i];
      out += str(t.name) + le<std::uint32_t>(static_cast<std::uint32_t>(t.ne.size()));
      for (auto d : t.ne)
        out += le(d);
      out += le(t.type) + le(offs[i]);
    }
    out.append((alignment - out.size() % alignment) % alignment, '\0');
    const size_t data_start = out.size();
    // No padding after the last tensor: every proper prefix of the file is then missing
    // tensor bytes, which the truncation test relies on.
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!tensors[i].write)
        continue;
      if (out.size() < data_start + offs[i])
        out.resize(data_start + offs[i], '\0');
      const size_t at = data_start + offs[i];
      if (out.size() < at + tensors[i].data.size())
        out.resize(at + tensors[i].data.size(), '\0');
      out.replace(at, tensors[i].data.size(), tensors[i].data);
    }
    return out;
  }
};

inline std::string f32_bytes(const std::vector<float>& v) {
  std::string out;
  for (float x : v)
    out += le(x);
  return out;
}

inline std::string u16_bytes(const std::vector<std::uint16_t>& v) {
  std::string out;
  for (auto x : v)
    out += le(x);
  return out;
}

}  // namespace sorl::ml::test
