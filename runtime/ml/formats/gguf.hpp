#pragma once

// Reading GGUF, llama.cpp's model file format, so models published as GGUF open here
// (their metadata, tokenizer vocabulary and weights, dequantised to fp32).
//
// Format (the GGUF specification (ggml docs/gguf.md)), everything little-endian:
//   [4 bytes]   magic "GGUF" (0x47 0x47 0x55 0x46)
//   [uint32]    version: 2 or 3 here (1 used 32-bit counts and lengths and is refused)
//   [uint64]    tensor_count, then [uint64] kv_count
//   kv_count ×  key (string), uint32 value type, value        — the metadata
//   tensor_count × name (string), uint32 n_dims (≤ 4), uint64 ne[n_dims],
//               uint32 ggml type, uint64 offset               — the tensor infos
//   [padding]   to the next multiple of `general.alignment` (UINT32 metadata, default 32)
//   [rest]      the data section; each tensor's offset is relative to its start.
// A string is a uint64 byte length and that many bytes (no NUL). An ARRAY value is a
// uint32 element type, a uint64 count and the elements. ne[0] is the fastest-varying
// dimension, so the PyTorch / Hugging Face shape is ne reversed.
//
// The file is untrusted input: every count, length and offset is checked against the
// bytes actually present before anything is allocated or read, and any inconsistency is a
// gguf_error, never a crash or an allocation the file's size doesn't justify: the parsed
// metadata and tensor infos take at most about 8× their size in the file.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace sorl::ml {

/// Thrown for a GGUF file that can't be read or is malformed, and by the accessors when a
/// metadata key or tensor is missing or has another type than asked for. The message is
/// "<label>: <what>"; <what> names the metadata key or tensor at fault and, for structural
/// errors, the byte offset in the file.
class gguf_error : public std::runtime_error {
public:
  gguf_error(std::string label, const std::string& what);

  /// The file concerned (its path, or the label given to gguf_file::parse).
  const std::string& label() const noexcept { return label_; }

private:
  std::string label_;
};

/// A metadata value's type, with the numbering the file uses.
enum class gguf_type : std::uint32_t {
  uint8 = 0,
  int8 = 1,
  uint16 = 2,
  int16 = 3,
  uint32 = 4,
  int32 = 5,
  float32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  uint64 = 10,
  int64 = 11,
  float64 = 12,
};

/// The specification's name of `type` ("UINT8", …, "FLOAT64"), or "" for a value outside
/// the enumeration.
std::string_view gguf_type_name(gguf_type type) noexcept;

/// Whether `type` is one of the eight integer types (BOOL is not one).
bool gguf_type_is_integer(gguf_type type) noexcept;

struct gguf_value;

/// An ARRAY value: its element type and elements, held in the widest C++ type of their
/// kind (e.g. a UINT8 array as uint64 values), so each kind has one representation.
struct gguf_array {
  /// The elements by kind: alternative 0 for unsigned integer element types, 1 for signed
  /// ones, 2 for FLOAT32 / FLOAT64, 3 for BOOL, 4 for STRING, 5 for ARRAY (nested arrays,
  /// each a gguf_value of type ARRAY).
  using storage = std::variant<std::vector<std::uint64_t>, std::vector<std::int64_t>,
                               std::vector<double>, std::vector<bool>, std::vector<std::string>,
                               std::vector<gguf_value>>;

  gguf_type element_type = gguf_type::uint8;
  storage elements;

  /// The number of elements.
  std::size_t size() const noexcept;
};

/// One metadata value. `type` is the file's type; `data` holds it in the alternative of
/// its kind: uint64 for UINT8/16/32/64, int64 for INT8/16/32/64, double for FLOAT32 (exact)
/// and FLOAT64, bool for BOOL, string for STRING (bytes as in the file, not checked to be
/// UTF-8), gguf_array for ARRAY.
struct gguf_value {
  using storage = std::variant<std::uint64_t, std::int64_t, double, bool, std::string, gguf_array>;

  gguf_type type = gguf_type::uint8;
  storage data;

  /// The value as uint64 when it's of an integer type and not negative, else nullopt.
  std::optional<std::uint64_t> to_uint() const noexcept;
  /// The value as int64 when it's of an integer type and at most INT64_MAX, else nullopt.
  std::optional<std::int64_t> to_int() const noexcept;
  /// The value when it's FLOAT32 or FLOAT64, else nullopt (integers are not converted).
  std::optional<double> to_float() const noexcept;
  /// The value when it's BOOL, else nullopt.
  std::optional<bool> to_bool() const noexcept;
  /// The string when the value is a STRING, else nullptr.
  const std::string* string() const noexcept;
  /// The array when the value is an ARRAY, else nullptr.
  const gguf_array* array() const noexcept;
};

/// One metadata entry.
struct gguf_kv {
  std::string key;
  gguf_value value;
};

/// The name ggml gives type id `type` ("F32", "Q4_1", "Q6_K", …), or "" for an id it
/// doesn't define.
std::string_view ggml_type_name(std::uint32_t type) noexcept;

/// Whether gguf_file::dequantize reads tensors of type id `type`: F32 (0), F16 (1),
/// Q4_0 (2), Q4_1 (3), Q8_0 (8) and BF16 (30).
bool ggml_type_dequantizable(std::uint32_t type) noexcept;

/// One tensor info, validated: its byte range lies inside the file and overlaps no other.
struct gguf_tensor_info {
  std::string name;
  std::uint32_t type = 0;          ///< ggml type id (0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 8 Q8_0, …)
  std::string type_name;           ///< ggml_type_name(type)
  std::vector<std::uint64_t> ne;   ///< ggml dimensions, ne[0] fastest-varying; 0 to 4 of them
  std::uint64_t offset = 0;        ///< bytes from the start of the data section
  std::uint64_t bytes = 0;         ///< size of the data in bytes

  /// The PyTorch / Hugging Face shape: ne reversed (ne [576, 49152] → [49152, 576]).
  std::vector<std::int64_t> shape() const;
  /// The number of elements, the product of ne (1 for no dimensions).
  std::int64_t numel() const;
};

/// A whole GGUF file in memory, fully validated on construction (header, metadata, tensor
/// infos, alignment and every tensor's byte range), so the accessors below work on a file
/// already known to be consistent. Tensors of types dequantize doesn't read are listed;
/// only dequantizing them is an error.
class gguf_file {
public:
  /// The deepest nesting of ARRAY values accepted: an array of arrays is depth 2.
  static constexpr int max_array_depth = 8;

  /// Reads and validates the file at `path`; errors are labelled with the path. Throws
  /// gguf_error.
  static gguf_file open(const std::filesystem::path& path);

  /// Validates `bytes`, a whole file's content; `label` names it in errors. Throws
  /// gguf_error.
  static gguf_file parse(std::string bytes, std::string label);

  /// The file's name as errors give it.
  const std::string& label() const noexcept { return label_; }
  /// The format version: 2 or 3.
  std::uint32_t version() const noexcept { return version_; }
  /// `general.alignment`, or 32 when the file doesn't set it; a power of two.
  std::uint64_t alignment() const noexcept { return alignment_; }
  /// Offset of the data section in the file, in bytes.
  std::uint64_t data_offset() const noexcept { return data_offset_; }

  /// Every metadata entry, in file order.
  const std::vector<gguf_kv>& metadata() const noexcept { return metadata_; }
  /// The value of `key`, or nullptr.
  const gguf_value* find(std::string_view key) const;

  /// The value of `key` as an unsigned integer: any integer type whose value isn't
  /// negative. Throws gguf_error naming the key when it is missing, of another type or
  /// negative.
  std::uint64_t get_uint(std::string_view key) const;
  /// The value of `key` as a signed integer: any integer type whose value is at most
  /// INT64_MAX. Throws gguf_error naming the key otherwise.
  std::int64_t get_int(std::string_view key) const;
  /// The value of `key` when FLOAT32 or FLOAT64. Throws gguf_error naming the key otherwise.
  double get_float(std::string_view key) const;
  /// The value of `key` when BOOL. Throws gguf_error naming the key otherwise.
  bool get_bool(std::string_view key) const;
  /// The value of `key` when STRING. Throws gguf_error naming the key otherwise.
  const std::string& get_string(std::string_view key) const;
  /// The elements of `key` when it is an ARRAY of STRING. Throws gguf_error naming the key
  /// otherwise.
  const std::vector<std::string>& get_string_array(std::string_view key) const;
  /// The elements of `key` when it is an ARRAY of an integer type whose values all fit in
  /// int64. Throws gguf_error naming the key otherwise.
  std::vector<std::int64_t> get_int_array(std::string_view key) const;
  /// The elements of `key` when it is an ARRAY of FLOAT32 or FLOAT64. Throws gguf_error
  /// naming the key otherwise.
  std::vector<double> get_float_array(std::string_view key) const;

  /// Every tensor info, in file order.
  const std::vector<gguf_tensor_info>& tensors() const noexcept { return tensors_; }
  /// The tensor called `name`, or nullptr.
  const gguf_tensor_info* find_tensor(std::string_view name) const;

  /// The stored bytes of tensor `name` (quantised blocks as in the file), a view into this
  /// object. Throws gguf_error if there is no such tensor.
  std::string_view tensor_bytes(std::string_view name) const;

  /// Tensor `name` as a new CPU fp32 contiguous tensor of shape ne reversed. F32 is copied,
  /// F16 and BF16 are widened exactly, and quantised blocks are expanded as ggml's
  /// dequantize_row_* functions do (Q4_0: d·(q − 8); Q4_1: d·q + m; Q8_0: d·q; with the fp16
  /// scales widened exactly and the arithmetic in fp32), so results match llama.cpp bit for
  /// bit. Throws gguf_error naming the tensor if it's absent or of a type
  /// ggml_type_dequantizable refuses.
  at::Tensor dequantize(std::string_view name) const;

private:
  gguf_file() = default;

  const gguf_value& require(std::string_view key) const;
  [[noreturn]] void fail_type(std::string_view key, const gguf_value& value,
                              std::string_view wanted) const;

  std::string label_;
  std::string bytes_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<gguf_kv> metadata_;
  std::vector<std::size_t> metadata_index_; ///< metadata_ positions, sorted by key
  std::vector<gguf_tensor_info> tensors_;
  std::vector<std::size_t> tensor_index_;   ///< tensors_ positions, sorted by name
};

} // namespace sorl::ml
