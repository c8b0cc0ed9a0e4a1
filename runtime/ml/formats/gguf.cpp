#include "runtime/ml/formats/gguf.hpp"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#  error "sorl's GGUF reader copies little-endian file bytes into host values: it needs a little-endian host"
#endif

namespace sorl::ml {

namespace fs = std::filesystem;

namespace {

/// The data section's alignment when the file doesn't set `general.alignment`.
constexpr std::uint64_t default_alignment = 32;

/// The specification's limit on a metadata key's length (keys are at most 2^16 − 1 bytes).
constexpr std::uint64_t max_key_bytes = 65535;

/// ggml's GGML_MAX_DIMS: tensors have at most four dimensions.
constexpr std::uint32_t max_dims = 4;

/// A ggml type's storage: `block` elements take `size` bytes.
struct ggml_traits {
  std::string_view name;
  std::uint32_t block = 0;
  std::uint32_t size = 0;
};

// ggml's type table (ggml.h enum ggml_type and type_traits in ggml.c), indexed by type id.
// Every type's size is known so that files holding types dequantize doesn't read can still
// be validated and listed. Ids without a name were retired from ggml and never
// appear in files ggml can read.
constexpr ggml_traits ggml_table[] = {
  {"F32", 1, 4},         // 0
  {"F16", 1, 2},         // 1
  {"Q4_0", 32, 18},      // 2
  {"Q4_1", 32, 20},      // 3
  {},                    // 4  (Q4_2, removed)
  {},                    // 5  (Q4_3, removed)
  {"Q5_0", 32, 22},      // 6
  {"Q5_1", 32, 24},      // 7
  {"Q8_0", 32, 34},      // 8
  {"Q8_1", 32, 36},      // 9  (two fp16 and 32 int8; older ggml used two fp32, 40 bytes)
  {"Q2_K", 256, 84},     // 10
  {"Q3_K", 256, 110},    // 11
  {"Q4_K", 256, 144},    // 12
  {"Q5_K", 256, 176},    // 13
  {"Q6_K", 256, 210},    // 14
  {"Q8_K", 256, 292},    // 15
  {"IQ2_XXS", 256, 66},  // 16
  {"IQ2_XS", 256, 74},   // 17
  {"IQ3_XXS", 256, 98},  // 18
  {"IQ1_S", 256, 50},    // 19
  {"IQ4_NL", 32, 18},    // 20
  {"IQ3_S", 256, 110},   // 21
  {"IQ2_S", 256, 82},    // 22
  {"IQ4_XS", 256, 136},  // 23
  {"I8", 1, 1},          // 24
  {"I16", 1, 2},         // 25
  {"I32", 1, 4},         // 26
  {"I64", 1, 8},         // 27
  {"F64", 1, 8},         // 28
  {"IQ1_M", 256, 56},    // 29
  {"BF16", 1, 2},        // 30
  {},                    // 31 (Q4_0_4_4, removed)
  {},                    // 32 (Q4_0_4_8, removed)
  {},                    // 33 (Q4_0_8_8, removed)
  {"TQ1_0", 256, 54},    // 34
  {"TQ2_0", 256, 66},    // 35
  {},                    // 36 (IQ4_NL_4_4, removed)
  {},                    // 37 (IQ4_NL_4_8, removed)
  {},                    // 38 (IQ4_NL_8_8, removed)
  {"MXFP4", 32, 17},     // 39
  {"NVFP4", 64, 36},     // 40
  {"Q1_0", 128, 18},     // 41
};

constexpr std::uint32_t type_f32 = 0;
constexpr std::uint32_t type_f16 = 1;
constexpr std::uint32_t type_q4_0 = 2;
constexpr std::uint32_t type_q4_1 = 3;
constexpr std::uint32_t type_q8_0 = 8;
constexpr std::uint32_t type_bf16 = 30;

const ggml_traits* ggml_traits_of(std::uint32_t type) {
  if (type >= std::size(ggml_table) || ggml_table[type].name.empty())
    return nullptr;
  return &ggml_table[type];
}

/// The size in the file of one value of a fixed-size metadata type; 0 for STRING and ARRAY.
std::uint64_t fixed_size(gguf_type type) {
  switch (type) {
  case gguf_type::uint8:
  case gguf_type::int8:
  case gguf_type::boolean:
    return 1;
  case gguf_type::uint16:
  case gguf_type::int16:
    return 2;
  case gguf_type::uint32:
  case gguf_type::int32:
  case gguf_type::float32:
    return 4;
  case gguf_type::uint64:
  case gguf_type::int64:
  case gguf_type::float64:
    return 8;
  case gguf_type::string:
  case gguf_type::array:
    return 0;
  }
  return 0;
}

/// The fewest bytes a value of `type` takes in the file: the bound that keeps a claimed
/// element count honest before anything is reserved for it.
std::uint64_t min_size(gguf_type type) {
  if (type == gguf_type::string)
    return 8; // the length alone
  if (type == gguf_type::array)
    return 12; // element type and count
  return fixed_size(type);
}

bool is_unsigned(gguf_type type) {
  return type == gguf_type::uint8 || type == gguf_type::uint16 || type == gguf_type::uint32
         || type == gguf_type::uint64;
}

bool is_signed(gguf_type type) {
  return type == gguf_type::int8 || type == gguf_type::int16 || type == gguf_type::int32
         || type == gguf_type::int64;
}

std::string type_text(gguf_type type) {
  const std::string_view name = gguf_type_name(type);
  return name.empty() ? "type " + std::to_string(static_cast<std::uint32_t>(type))
                      : std::string(name);
}

std::string ggml_type_text(std::uint32_t type) {
  const std::string_view name = ggml_type_name(type);
  return "ggml type " + std::to_string(type) + (name.empty() ? "" : " (" + std::string(name) + ")");
}

/// Positions 0..n-1 of `items` sorted by `name_of` (stable: equal names keep file order),
/// the lookup index of a gguf_file; a sorted vector costs 8 bytes an entry, where a map
/// would cost ten times that.
template <typename T, typename NameOf>
std::vector<std::size_t> sorted_index(const std::vector<T>& items, NameOf name_of) {
  std::vector<std::size_t> index(items.size());
  std::iota(index.begin(), index.end(), std::size_t{0});
  std::stable_sort(index.begin(), index.end(), [&](std::size_t a, std::size_t b) {
    return name_of(items[a]) < name_of(items[b]);
  });
  return index;
}

/// The first two positions with the same name in a sorted_index, or nullopt.
template <typename T, typename NameOf>
std::optional<std::pair<std::size_t, std::size_t>> first_duplicate(const std::vector<T>& items,
                                                                   const std::vector<std::size_t>& index,
                                                                   NameOf name_of) {
  std::optional<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t k = 1; k < index.size(); ++k)
    if (name_of(items[index[k - 1]]) == name_of(items[index[k]])
        && (!out || index[k] < out->second))
      out = std::pair{index[k - 1], index[k]};
  return out;
}

template <typename T, typename NameOf>
const T* lookup(const std::vector<T>& items, const std::vector<std::size_t>& index,
                std::string_view name, NameOf name_of) {
  const auto it = std::lower_bound(index.begin(), index.end(), name,
                                   [&](std::size_t i, std::string_view n) { return name_of(items[i]) < n; });
  if (it == index.end() || name_of(items[*it]) != name)
    return nullptr;
  return &items[*it];
}

std::string_view key_of(const gguf_kv& kv) {
  return kv.key;
}

std::string_view tensor_name_of(const gguf_tensor_info& t) {
  return t.name;
}

std::string errno_text() {
  return std::strerror(errno);
}

/// Reads the file front to back, checking every read against the bytes left, so a
/// truncated or lying file fails at the first field that doesn't fit.
class cursor {
public:
  cursor(const std::string& bytes, const std::string& label) : bytes_(bytes), label_(label) {}

  std::uint64_t pos() const { return pos_; }
  std::uint64_t left() const { return bytes_.size() - pos_; }

  /// `context` (e.g. "metadata key 'x'") prefixes every error until changed.
  void set_context(std::string context) { context_ = std::move(context); }

  [[noreturn]] void fail(const std::string& what) const {
    throw gguf_error(label_, context_.empty() ? what : context_ + ": " + what);
  }

  void need(std::uint64_t n, std::string_view field) const {
    if (n > left())
      fail("truncated: " + std::string(field) + " at byte " + std::to_string(pos_) + " needs "
           + std::to_string(n) + " bytes, but the file ends after " + std::to_string(left()));
  }

  template <typename T>
  T read(std::string_view field) {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T), field);
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  std::string read_string(std::string_view field) {
    const std::uint64_t at = pos_;
    const auto length = read<std::uint64_t>(field);
    if (length > left())
      fail("truncated or corrupt: " + std::string(field) + " at byte " + std::to_string(at)
           + " has length " + std::to_string(length) + ", but the file ends after "
           + std::to_string(left()) + " more bytes");
    std::string out(bytes_.data() + pos_, static_cast<std::size_t>(length));
    pos_ += length;
    return out;
  }

  /// A count of items of at least `min_bytes` each, refused when that many can't fit in
  /// what's left of the file, so the caller may reserve it.
  std::uint64_t read_count(std::string_view field, std::uint64_t min_bytes) {
    const std::uint64_t at = pos_;
    const auto count = read<std::uint64_t>(field);
    if (min_bytes > 0 && count > left() / min_bytes)
      fail("corrupt: " + std::string(field) + " at byte " + std::to_string(at) + " is "
           + std::to_string(count) + ", but " + std::to_string(count)
           + " items of at least " + std::to_string(min_bytes)
           + " bytes can't fit in the " + std::to_string(left()) + " bytes left");
    return count;
  }

  void skip_to(std::uint64_t pos) { pos_ = pos; }

private:
  const std::string& bytes_;
  const std::string& label_;
  std::string context_;
  std::uint64_t pos_ = 0;
};

gguf_type read_type(cursor& in, std::string_view field) {
  const std::uint64_t at = in.pos();
  const auto raw = in.read<std::uint32_t>(field);
  if (raw > static_cast<std::uint32_t>(gguf_type::float64))
    in.fail("corrupt: " + std::string(field) + " at byte " + std::to_string(at) + " is "
            + std::to_string(raw) + ", not a GGUF value type (0 to 12)");
  return static_cast<gguf_type>(raw);
}

template <typename T>
T read_scalar(cursor& in, gguf_type type) {
  return in.read<T>(gguf_type_name(type));
}

bool read_bool(cursor& in) {
  const std::uint64_t at = in.pos();
  const auto raw = in.read<std::uint8_t>("BOOL");
  // The specification: "0 is false and 1 is true. Anything else is invalid".
  if (raw > 1)
    in.fail("corrupt: BOOL at byte " + std::to_string(at) + " is " + std::to_string(raw)
            + ", not 0 or 1");
  return raw == 1;
}

gguf_value read_value(cursor& in, gguf_type type, int depth);

gguf_array read_array(cursor& in, int depth) {
  if (depth > gguf_file::max_array_depth)
    in.fail("corrupt: ARRAY at byte " + std::to_string(in.pos()) + " nests deeper than "
            + std::to_string(gguf_file::max_array_depth) + " levels");
  gguf_array out;
  out.element_type = read_type(in, "array element type");
  const std::uint64_t count = in.read_count("array length", min_size(out.element_type));
  const auto n = static_cast<std::size_t>(count);
  switch (out.element_type) {
  case gguf_type::uint8:
  case gguf_type::uint16:
  case gguf_type::uint32:
  case gguf_type::uint64: {
    std::vector<std::uint64_t> v;
    v.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      v.push_back(*read_value(in, out.element_type, depth).to_uint());
    out.elements = std::move(v);
    break;
  }
  case gguf_type::int8:
  case gguf_type::int16:
  case gguf_type::int32:
  case gguf_type::int64: {
    std::vector<std::int64_t> v;
    v.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      v.push_back(*read_value(in, out.element_type, depth).to_int());
    out.elements = std::move(v);
    break;
  }
  case gguf_type::float32:
  case gguf_type::float64: {
    std::vector<double> v;
    v.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      v.push_back(*read_value(in, out.element_type, depth).to_float());
    out.elements = std::move(v);
    break;
  }
  case gguf_type::boolean: {
    std::vector<bool> v;
    v.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      v.push_back(read_bool(in));
    out.elements = std::move(v);
    break;
  }
  case gguf_type::string: {
    std::vector<std::string> v;
    v.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      v.push_back(in.read_string("string array element"));
    out.elements = std::move(v);
    break;
  }
  case gguf_type::array: {
    std::vector<gguf_value> v;
    v.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      v.push_back(read_value(in, gguf_type::array, depth + 1));
    out.elements = std::move(v);
    break;
  }
  }
  return out;
}

/// One value of `type`; `depth` is the nesting level an ARRAY read here would have.
gguf_value read_value(cursor& in, gguf_type type, int depth) {
  gguf_value v;
  v.type = type;
  switch (type) {
  case gguf_type::uint8: v.data = std::uint64_t{read_scalar<std::uint8_t>(in, type)}; break;
  case gguf_type::uint16: v.data = std::uint64_t{read_scalar<std::uint16_t>(in, type)}; break;
  case gguf_type::uint32: v.data = std::uint64_t{read_scalar<std::uint32_t>(in, type)}; break;
  case gguf_type::uint64: v.data = std::uint64_t{read_scalar<std::uint64_t>(in, type)}; break;
  case gguf_type::int8: v.data = std::int64_t{read_scalar<std::int8_t>(in, type)}; break;
  case gguf_type::int16: v.data = std::int64_t{read_scalar<std::int16_t>(in, type)}; break;
  case gguf_type::int32: v.data = std::int64_t{read_scalar<std::int32_t>(in, type)}; break;
  case gguf_type::int64: v.data = std::int64_t{read_scalar<std::int64_t>(in, type)}; break;
  case gguf_type::float32: v.data = double{read_scalar<float>(in, type)}; break;
  case gguf_type::float64: v.data = read_scalar<double>(in, type); break;
  case gguf_type::boolean: v.data = read_bool(in); break;
  case gguf_type::string: v.data = in.read_string("STRING"); break;
  case gguf_type::array: v.data = read_array(in, depth); break;
  }
  return v;
}

/// fp16 bits to fp32, exactly (every fp16 value, subnormals included, is an fp32 value;
/// NaN payloads are kept, as numpy and ggml's table do).
float half_to_float(std::uint16_t h) {
  const bool negative = (h & 0x8000u) != 0;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu;
  const std::uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa · 2^-24, a product of small integers and a power of two,
    // so exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return negative ? -magnitude : magnitude;
  }
  std::uint32_t bits = (negative ? 0x80000000u : 0u) | (mantissa << 13);
  if (exponent == 0x1F)
    bits |= 0x7F800000u; // infinity or NaN
  else
    bits |= (exponent + (127 - 15)) << 23;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

float bf16_to_float(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

std::uint16_t load_u16(const unsigned char* p) {
  std::uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The quantised formats. In each, d·q multiplies an fp16 value (11 significant bits) by an
// integer of at most 8 bits, so the product is exact in fp32: whether a compiler fuses
// d·q + m into one fma or not, the result is the same single rounding, and so is
// llama.cpp's and numpy's.

void dequantize_q4_0(const unsigned char* src, float* dst, std::int64_t blocks) {
  at::parallel_for(0, blocks, 1024, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t b = begin; b < end; ++b) {
      const unsigned char* block = src + b * 18;
      const float d = half_to_float(load_u16(block));
      const unsigned char* qs = block + 2;
      float* y = dst + b * 32;
      for (int j = 0; j < 16; ++j) {
        y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
        y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
      }
    }
  });
}

void dequantize_q4_1(const unsigned char* src, float* dst, std::int64_t blocks) {
  at::parallel_for(0, blocks, 1024, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t b = begin; b < end; ++b) {
      const unsigned char* block = src + b * 20;
      const float d = half_to_float(load_u16(block));
      const float m = half_to_float(load_u16(block + 2));
      const unsigned char* qs = block + 4;
      float* y = dst + b * 32;
      for (int j = 0; j < 16; ++j) {
        y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
        y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
      }
    }
  });
}

void dequantize_q8_0(const unsigned char* src, float* dst, std::int64_t blocks) {
  at::parallel_for(0, blocks, 1024, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t b = begin; b < end; ++b) {
      const unsigned char* block = src + b * 34;
      const float d = half_to_float(load_u16(block));
      float* y = dst + b * 32;
      for (int j = 0; j < 32; ++j)
        y[j] = static_cast<float>(static_cast<std::int8_t>(block[2 + j])) * d;
    }
  });
}

template <float (*convert)(std::uint16_t)>
void widen_16(const unsigned char* src, float* dst, std::int64_t n) {
  at::parallel_for(0, n, 32768, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i)
      dst[i] = convert(load_u16(src + 2 * i));
  });
}

} // namespace

gguf_error::gguf_error(std::string label, const std::string& what)
  : std::runtime_error(label + ": " + what), label_(std::move(label)) {}

std::string_view gguf_type_name(gguf_type type) noexcept {
  switch (type) {
  case gguf_type::uint8: return "UINT8";
  case gguf_type::int8: return "INT8";
  case gguf_type::uint16: return "UINT16";
  case gguf_type::int16: return "INT16";
  case gguf_type::uint32: return "UINT32";
  case gguf_type::int32: return "INT32";
  case gguf_type::float32: return "FLOAT32";
  case gguf_type::boolean: return "BOOL";
  case gguf_type::string: return "STRING";
  case gguf_type::array: return "ARRAY";
  case gguf_type::uint64: return "UINT64";
  case gguf_type::int64: return "INT64";
  case gguf_type::float64: return "FLOAT64";
  }
  return "";
}

bool gguf_type_is_integer(gguf_type type) noexcept {
  return is_unsigned(type) || is_signed(type);
}

std::size_t gguf_array::size() const noexcept {
  return std::visit([](const auto& v) { return v.size(); }, elements);
}

std::optional<std::uint64_t> gguf_value::to_uint() const noexcept {
  if (const auto* u = std::get_if<std::uint64_t>(&data))
    return *u;
  if (const auto* i = std::get_if<std::int64_t>(&data); i && *i >= 0)
    return static_cast<std::uint64_t>(*i);
  return std::nullopt;
}

std::optional<std::int64_t> gguf_value::to_int() const noexcept {
  if (const auto* i = std::get_if<std::int64_t>(&data))
    return *i;
  if (const auto* u = std::get_if<std::uint64_t>(&data);
      u && *u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    return static_cast<std::int64_t>(*u);
  return std::nullopt;
}

std::optional<double> gguf_value::to_float() const noexcept {
  if (const auto* f = std::get_if<double>(&data))
    return *f;
  return std::nullopt;
}

std::optional<bool> gguf_value::to_bool() const noexcept {
  if (const auto* b = std::get_if<bool>(&data))
    return *b;
  return std::nullopt;
}

const std::string* gguf_value::string() const noexcept {
  return std::get_if<std::string>(&data);
}

const gguf_array* gguf_value::array() const noexcept {
  return std::get_if<gguf_array>(&data);
}

std::string_view ggml_type_name(std::uint32_t type) noexcept {
  const ggml_traits* t = ggml_traits_of(type);
  return t ? t->name : std::string_view();
}

bool ggml_type_dequantizable(std::uint32_t type) noexcept {
  return type == type_f32 || type == type_f16 || type == type_q4_0 || type == type_q4_1
         || type == type_q8_0 || type == type_bf16;
}

std::vector<std::int64_t> gguf_tensor_info::shape() const {
  // Validated on parse: every dimension fits in int64.
  return std::vector<std::int64_t>(ne.rbegin(), ne.rend());
}

std::int64_t gguf_tensor_info::numel() const {
  return std::accumulate(ne.begin(), ne.end(), std::int64_t{1},
                         [](std::int64_t a, std::uint64_t d) { return a * static_cast<std::int64_t>(d); });
}

// -- reading ------------------------------------------------------------------------------

gguf_file gguf_file::open(const fs::path& path) {
  const std::string label = path.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw gguf_error(label, "cannot open: " + errno_text());
  struct fd_closer {
    int fd;
    ~fd_closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw gguf_error(label, "cannot stat: " + errno_text());
  // A directory or device reports a size that says nothing about its content.
  if (!S_ISREG(st.st_mode))
    throw gguf_error(label, "not a regular file");
  std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t k = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (k < 0) {
      if (errno == EINTR)
        continue;
      throw gguf_error(label, "read error: " + errno_text());
    }
    if (k == 0) // shrunk while being read: parse what there is, which will be refused if cut
      break;
    done += static_cast<std::size_t>(k);
  }
  bytes.resize(done);
  return parse(std::move(bytes), label);
}

gguf_file gguf_file::parse(std::string bytes, std::string label) {
  gguf_file f;
  f.label_ = std::move(label);
  f.bytes_ = std::move(bytes);
  f.alignment_ = default_alignment;
  const std::uint64_t size = f.bytes_.size();
  cursor in(f.bytes_, f.label_);

  // -- header
  in.need(4, "magic");
  static constexpr unsigned char magic[4] = {0x47, 0x47, 0x55, 0x46};
  if (std::memcmp(f.bytes_.data(), magic, 4) != 0) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string got;
    for (int i = 0; i < 4; ++i) {
      const auto c = static_cast<unsigned char>(f.bytes_[static_cast<std::size_t>(i)]);
      got += (i ? " " : "") + std::string{hex[c >> 4], hex[c & 0x0F]};
    }
    in.fail("not a GGUF file: magic bytes are " + got + ", expected 47 47 55 46 (\"GGUF\")");
  }
  in.skip_to(4);
  f.version_ = in.read<std::uint32_t>("version");
  if (f.version_ != 2 && f.version_ != 3) {
    std::string what = "unsupported GGUF version " + std::to_string(f.version_)
                       + " (this reader reads versions 2 and 3";
    if (f.version_ == 1)
      what += "; version 1 used 32-bit counts and lengths";
    else if ((f.version_ & 0xFFFFu) == 0)
      what += "; a byte-swapped version like this one suggests a big-endian file";
    in.fail(what + ")");
  }
  // A key with an empty value is at least 8 + 4 + 1 bytes; a tensor info with no
  // dimensions 8 + 4 + 4 + 8.
  const std::uint64_t tensor_count_at = in.pos();
  const auto tensor_count = in.read<std::uint64_t>("tensor count");
  const std::uint64_t kv_count = in.read_count("metadata count", 13);
  // The tensor infos follow the metadata, so both must fit in what's left.
  if (tensor_count > (in.left() - std::min(in.left(), kv_count * 13)) / 24)
    in.fail("corrupt: tensor count at byte " + std::to_string(tensor_count_at) + " is "
            + std::to_string(tensor_count) + ", but that many tensor infos can't fit in the "
            + std::to_string(in.left()) + " bytes left");

  // -- metadata
  f.metadata_.reserve(static_cast<std::size_t>(kv_count));
  std::vector<std::uint64_t> key_at; // byte offsets, for the duplicate-key error
  key_at.reserve(static_cast<std::size_t>(kv_count));
  for (std::uint64_t i = 0; i < kv_count; ++i) {
    in.set_context("metadata entry " + std::to_string(i) + " of " + std::to_string(kv_count));
    const std::uint64_t at = in.pos();
    std::string key = in.read_string("key");
    if (key.empty())
      in.fail("corrupt: empty key at byte " + std::to_string(at));
    if (key.size() > max_key_bytes)
      in.fail("corrupt: key at byte " + std::to_string(at) + " is " + std::to_string(key.size())
              + " bytes long, more than the specification's " + std::to_string(max_key_bytes));
    in.set_context("metadata key '" + key + "'");
    const gguf_type type = read_type(in, "value type");
    gguf_value value = read_value(in, type, 1);
    key_at.push_back(at);
    f.metadata_.push_back({std::move(key), std::move(value)});
  }
  in.set_context("");
  f.metadata_index_ = sorted_index(f.metadata_, key_of);
  if (const auto dup = first_duplicate(f.metadata_, f.metadata_index_, key_of))
    in.fail("metadata key '" + f.metadata_[dup->second].key + "': corrupt: duplicate key at byte "
            + std::to_string(key_at[dup->second]) + " (entries " + std::to_string(dup->first)
            + " and " + std::to_string(dup->second) + ")");

  if (const gguf_value* a = f.find("general.alignment")) {
    // The specification fixes the type; llama.cpp refuses others too.
    if (a->type != gguf_type::uint32)
      in.fail("metadata key 'general.alignment': must be UINT32, got " + type_text(a->type));
    const std::uint64_t alignment = *a->to_uint();
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
      in.fail("metadata key 'general.alignment': " + std::to_string(alignment)
              + " is not a power of two");
    f.alignment_ = alignment;
  }

  // -- tensor infos
  struct range {
    std::uint64_t begin, end;
    std::size_t tensor;
  };
  std::vector<range> ranges;
  std::vector<std::uint64_t> info_at; // byte offsets, for the duplicate-name error
  f.tensors_.reserve(static_cast<std::size_t>(tensor_count));
  ranges.reserve(static_cast<std::size_t>(tensor_count));
  info_at.reserve(static_cast<std::size_t>(tensor_count));
  for (std::uint64_t i = 0; i < tensor_count; ++i) {
    in.set_context("tensor info " + std::to_string(i) + " of " + std::to_string(tensor_count));
    const std::uint64_t at = in.pos();
    gguf_tensor_info t;
    t.name = in.read_string("name");
    in.set_context("tensor '" + t.name + "'");
    const std::uint64_t dims_at = in.pos();
    const auto n_dims = in.read<std::uint32_t>("dimension count");
    if (n_dims > max_dims)
      in.fail("corrupt: " + std::to_string(n_dims) + " dimensions at byte " + std::to_string(dims_at)
              + ", more than ggml's " + std::to_string(max_dims));
    std::uint64_t numel = 1; // product of the non-zero dimensions, for the overflow check
    bool empty = false;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const std::uint64_t ne_at = in.pos();
      const auto ne = in.read<std::uint64_t>("dimension");
      if (ne > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        in.fail("corrupt: ne[" + std::to_string(d) + "] = " + std::to_string(ne) + " at byte "
                + std::to_string(ne_at) + " exceeds INT64_MAX");
      t.ne.push_back(ne);
      empty = empty || ne == 0;
      if (ne != 0
          && (__builtin_mul_overflow(numel, ne, &numel)
              || numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())))
        in.fail("corrupt: the element count of its " + std::to_string(n_dims)
                + " dimensions overflows int64");
    }
    if (empty)
      numel = 0;
    const std::uint64_t type_at = in.pos();
    t.type = in.read<std::uint32_t>("type");
    const ggml_traits* traits = ggml_traits_of(t.type);
    if (!traits)
      in.fail("unknown ggml type id " + std::to_string(t.type) + " at byte "
              + std::to_string(type_at));
    t.type_name = std::string(traits->name);
    const std::uint64_t offset_at = in.pos();
    t.offset = in.read<std::uint64_t>("offset");

    const std::uint64_t ne0 = t.ne.empty() ? 1 : t.ne[0];
    if (ne0 % traits->block != 0)
      in.fail("corrupt: ne[0] = " + std::to_string(ne0) + " is not a multiple of "
              + std::to_string(traits->block) + ", the block size of " + ggml_type_text(t.type));
    // numel < 2^63 and size ≤ 292, so this can't overflow 64 bits.
    t.bytes = numel / traits->block * traits->size;
    if (t.offset % f.alignment_ != 0)
      in.fail("corrupt: offset " + std::to_string(t.offset) + " (at byte "
              + std::to_string(offset_at) + ") is not a multiple of the alignment "
              + std::to_string(f.alignment_));
    ranges.push_back({t.offset, 0, f.tensors_.size()});
    info_at.push_back(at);
    f.tensors_.push_back(std::move(t));
  }
  in.set_context("");
  f.tensor_index_ = sorted_index(f.tensors_, tensor_name_of);
  if (const auto dup = first_duplicate(f.tensors_, f.tensor_index_, tensor_name_of))
    in.fail("tensor '" + f.tensors_[dup->second].name + "': corrupt: duplicate tensor name at byte "
            + std::to_string(info_at[dup->second]) + " (tensor infos " + std::to_string(dup->first)
            + " and " + std::to_string(dup->second) + ")");

  // -- data section
  const std::uint64_t infos_end = in.pos();
  // infos_end ≤ size < 2^63 in practice, alignment ≤ 2^32: no overflow.
  f.data_offset_ = (infos_end + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  for (range& r : ranges) {
    const gguf_tensor_info& t = f.tensors_[r.tensor];
    std::uint64_t begin = 0, end = 0;
    if (__builtin_add_overflow(f.data_offset_, t.offset, &begin)
        || __builtin_add_overflow(begin, t.bytes, &end) || end > size)
      throw gguf_error(f.label_, "tensor '" + t.name + "': truncated or corrupt: its "
                                   + std::to_string(t.bytes) + " bytes at data offset "
                                   + std::to_string(t.offset) + " (file byte "
                                   + std::to_string(f.data_offset_) + " + offset) run past the end of the "
                                   + std::to_string(size) + "-byte file");
    r.begin = t.offset;
    r.end = t.offset + t.bytes;
  }
  // Empty tensors occupy nothing, so they can't overlap anything.
  ranges.erase(std::remove_if(ranges.begin(), ranges.end(),
                              [](const range& r) { return r.begin == r.end; }),
               ranges.end());
  std::sort(ranges.begin(), ranges.end(), [](const range& a, const range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (std::size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].begin < ranges[i - 1].end) {
      const gguf_tensor_info& a = f.tensors_[ranges[i - 1].tensor];
      const gguf_tensor_info& b = f.tensors_[ranges[i].tensor];
      throw gguf_error(f.label_, "tensor '" + b.name + "': corrupt: its data ["
                                   + std::to_string(ranges[i].begin) + ", "
                                   + std::to_string(ranges[i].end) + ") overlaps tensor '" + a.name
                                   + "' at [" + std::to_string(ranges[i - 1].begin) + ", "
                                   + std::to_string(ranges[i - 1].end)
                                   + ") (data-section offsets)");
    }
  return f;
}

// -- metadata accessors -------------------------------------------------------------------

const gguf_value* gguf_file::find(std::string_view key) const {
  const gguf_kv* kv = lookup(metadata_, metadata_index_, key, key_of);
  return kv ? &kv->value : nullptr;
}

const gguf_value& gguf_file::require(std::string_view key) const {
  const gguf_value* v = find(key);
  if (!v)
    throw gguf_error(label_, "metadata key '" + std::string(key) + "' is missing");
  return *v;
}

void gguf_file::fail_type(std::string_view key, const gguf_value& value,
                          std::string_view wanted) const {
  std::string got = type_text(value.type);
  if (const gguf_array* a = value.array())
    got += " of " + type_text(a->element_type);
  throw gguf_error(label_, "metadata key '" + std::string(key) + "': expected " + std::string(wanted)
                             + ", got " + got);
}

std::uint64_t gguf_file::get_uint(std::string_view key) const {
  const gguf_value& v = require(key);
  if (!gguf_type_is_integer(v.type))
    fail_type(key, v, "an unsigned integer");
  const auto out = v.to_uint();
  if (!out)
    throw gguf_error(label_, "metadata key '" + std::string(key) + "': expected an unsigned integer, got "
                               + type_text(v.type) + " " + std::to_string(*v.to_int()));
  return *out;
}

std::int64_t gguf_file::get_int(std::string_view key) const {
  const gguf_value& v = require(key);
  if (!gguf_type_is_integer(v.type))
    fail_type(key, v, "an integer");
  const auto out = v.to_int();
  if (!out)
    throw gguf_error(label_, "metadata key '" + std::string(key) + "': " + type_text(v.type) + " "
                               + std::to_string(*v.to_uint()) + " doesn't fit in int64");
  return *out;
}

double gguf_file::get_float(std::string_view key) const {
  const gguf_value& v = require(key);
  const auto out = v.to_float();
  if (!out)
    fail_type(key, v, "FLOAT32 or FLOAT64");
  return *out;
}

bool gguf_file::get_bool(std::string_view key) const {
  const gguf_value& v = require(key);
  const auto out = v.to_bool();
  if (!out)
    fail_type(key, v, "BOOL");
  return *out;
}

const std::string& gguf_file::get_string(std::string_view key) const {
  const gguf_value& v = require(key);
  const std::string* out = v.string();
  if (!out)
    fail_type(key, v, "STRING");
  return *out;
}

const std::vector<std::string>& gguf_file::get_string_array(std::string_view key) const {
  const gguf_value& v = require(key);
  const gguf_array* a = v.array();
  const auto* out = a ? std::get_if<std::vector<std::string>>(&a->elements) : nullptr;
  if (!out)
    fail_type(key, v, "ARRAY of STRING");
  return *out;
}

std::vector<std::int64_t> gguf_file::get_int_array(std::string_view key) const {
  const gguf_value& v = require(key);
  const gguf_array* a = v.array();
  if (const auto* s = a ? std::get_if<std::vector<std::int64_t>>(&a->elements) : nullptr)
    return *s;
  const auto* u = a ? std::get_if<std::vector<std::uint64_t>>(&a->elements) : nullptr;
  if (!u)
    fail_type(key, v, "ARRAY of an integer type");
  std::vector<std::int64_t> out;
  out.reserve(u->size());
  for (std::size_t i = 0; i < u->size(); ++i) {
    if ((*u)[i] > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      throw gguf_error(label_, "metadata key '" + std::string(key) + "': element " + std::to_string(i)
                                 + " (" + std::to_string((*u)[i]) + ") doesn't fit in int64");
    out.push_back(static_cast<std::int64_t>((*u)[i]));
  }
  return out;
}

std::vector<double> gguf_file::get_float_array(std::string_view key) const {
  const gguf_value& v = require(key);
  const gguf_array* a = v.array();
  const auto* out = a ? std::get_if<std::vector<double>>(&a->elements) : nullptr;
  if (!out)
    fail_type(key, v, "ARRAY of FLOAT32 or FLOAT64");
  return *out;
}

// -- tensors ------------------------------------------------------------------------------

const gguf_tensor_info* gguf_file::find_tensor(std::string_view name) const {
  return lookup(tensors_, tensor_index_, name, tensor_name_of);
}

std::string_view gguf_file::tensor_bytes(std::string_view name) const {
  const gguf_tensor_info* t = find_tensor(name);
  if (!t)
    throw gguf_error(label_, "tensor '" + std::string(name) + "': no such tensor in the file");
  return std::string_view(bytes_).substr(static_cast<std::size_t>(data_offset_ + t->offset),
                                         static_cast<std::size_t>(t->bytes));
}

at::Tensor gguf_file::dequantize(std::string_view name) const {
  const gguf_tensor_info* t = find_tensor(name);
  if (!t)
    throw gguf_error(label_, "tensor '" + std::string(name) + "': no such tensor in the file");
  if (!ggml_type_dequantizable(t->type))
    throw gguf_error(label_, "tensor '" + t->name + "': " + ggml_type_text(t->type)
                               + " is unsupported (dequantize reads F32, F16, BF16, Q4_0, Q4_1 and Q8_0)");
  const std::int64_t n = t->numel();
  at::Tensor out = at::empty({n}, at::TensorOptions().dtype(at::kFloat).device(at::kCPU));
  const auto* src = reinterpret_cast<const unsigned char*>(bytes_.data() + data_offset_ + t->offset);
  float* dst = out.data_ptr<float>();
  if (n > 0) {
    switch (t->type) {
    case type_f32: std::memcpy(dst, src, static_cast<std::size_t>(t->bytes)); break;
    case type_f16: widen_16<half_to_float>(src, dst, n); break;
    case type_bf16: widen_16<bf16_to_float>(src, dst, n); break;
    case type_q4_0: dequantize_q4_0(src, dst, n / 32); break;
    case type_q4_1: dequantize_q4_1(src, dst, n / 32); break;
    case type_q8_0: dequantize_q8_0(src, dst, n / 32); break;
    default: break; // refused above
    }
  }
  return out.view(t->shape());
}

} // namespace sorl::ml
