#pragma once

// Reading and writing the safetensors format, so sorl's weights open in other tools
// (Hugging Face `safetensors`, `transformers`) and theirs open here.
//
// Format (https://github.com/huggingface/safetensors, "Format" in its README):
//   [8 bytes]  N, the header length, unsigned 64-bit little-endian
//   [N bytes]  UTF-8 JSON object: for each tensor
//                "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}
//              and optionally "__metadata__": {string: string}. Offsets are byte offsets
//              into the data section, end exclusive. The writer pads the header with
//              trailing spaces to a multiple of 8 bytes.
//   [rest]     the data section: tensors' bytes, row-major, little-endian, back to back.
// The reader enforces what the reference implementation enforces: the header fits in
// the file and is at most 100 MB, no duplicate keys, known dtypes, byte ranges that match
// dtype × shape, and ranges that tile the data section exactly (no gaps, no overlap, no
// trailing bytes).

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sorl::ml {

/// Tensors with their names, in the caller's order. Decoupled from any model class: a
/// model hands out its parameters as this list, and loads from it.
using named_tensors = std::vector<std::pair<std::string, at::Tensor>>;

/// String → string metadata, as the safetensors `__metadata__` field holds.
using string_map = std::map<std::string, std::string>;

/// Thrown for any checkpoint file that can't be written or read, is malformed or
/// inconsistent, or doesn't match what the caller expects (missing, extra, wrong dtype,
/// wrong shape). The message names the file and, where one is at fault, the tensor.
/// Whenever this is thrown by a load, the destination tensors are untouched.
class checkpoint_error : public std::runtime_error {
public:
  /// The message is "<path>: tensor '<tensor>': <what>" ("<path>: <what>" without a tensor).
  checkpoint_error(std::string path, std::string tensor, const std::string& what);

  /// The file concerned.
  const std::string& path() const noexcept { return path_; }
  /// The tensor concerned, or "" for file-level errors.
  const std::string& tensor() const noexcept { return tensor_; }

private:
  std::string path_;
  std::string tensor_;
};

/// The safetensors dtype name of `type`: F64, F32, F16, BF16, I64, I32, I16, I8, U8 or
/// BOOL. Throws std::invalid_argument for other scalar types.
std::string_view safetensors_dtype_name(at::ScalarType type);

/// The scalar type of a safetensors dtype name, or nullopt for names sorl doesn't read
/// (e.g. the float8 types).
std::optional<at::ScalarType> safetensors_dtype_from_name(std::string_view name);

/// XXH3-64 (seed 0) of `bytes`: the checksum checkpoint sidecars record per file.
std::uint64_t content_hash(std::string_view bytes);

/// Size and checksum of a file just written.
struct written_file {
  std::uint64_t bytes = 0;
  std::uint64_t xxh3 = 0; ///< content_hash of the whole file
};

/// Writes `tensors` (any device, dtype as listed for safetensors_dtype_name, any layout;
/// copied to CPU contiguous as needed) and `metadata` to `path` atomically: into a
/// temporary file in the same directory, fsync'd, then renamed over `path`, so readers see
/// the old file or the complete new one. Tensors are laid out by descending element size,
/// then name, which keeps every tensor aligned to its element size.
/// Throws std::invalid_argument for an empty, duplicate or reserved ("__metadata__") name,
/// an undefined tensor or an unsupported dtype (before anything is written), and
/// checkpoint_error for I/O failures.
written_file save_safetensors(const std::filesystem::path& path, const named_tensors& tensors,
                              const string_map& metadata = {});

/// One tensor's header entry.
struct safetensors_entry {
  std::string name;
  at::ScalarType dtype = at::ScalarType::Float;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0; ///< byte offset into the data section
  std::uint64_t end = 0;   ///< exclusive
};

/// A whole safetensors file in memory, fully validated on construction: every accessor
/// below works on a file already known to be consistent.
class safetensors_reader {
public:
  /// Reads and validates `path`. Throws checkpoint_error.
  static safetensors_reader open(const std::filesystem::path& path);

  /// Validates `bytes`, a whole file's content; `label` names it in errors. Throws
  /// checkpoint_error.
  static safetensors_reader parse(std::string bytes, std::string label);

  /// The file's name as errors give it.
  const std::string& label() const noexcept { return label_; }
  /// The whole file.
  const std::string& bytes() const noexcept { return bytes_; }
  /// The `__metadata__` map (empty when the file has none).
  const string_map& metadata() const noexcept { return metadata_; }
  /// Entries in data-section order.
  const std::vector<safetensors_entry>& entries() const noexcept { return entries_; }
  /// The entry called `name`, or nullptr.
  const safetensors_entry* find(std::string_view name) const;

  /// A new CPU tensor holding entry `name`'s data. Throws checkpoint_error if absent.
  at::Tensor tensor(std::string_view name) const;

  /// Every tensor as a new CPU tensor, in data-section order.
  named_tensors tensors() const;

  /// Checks that the file holds exactly the names of `expected`, each with the same dtype
  /// and shape as the expected tensor. Throws checkpoint_error naming the first offending
  /// tensor (and listing all missing/extra names); std::invalid_argument for duplicate or
  /// undefined tensors in `expected`.
  void check_matches(const named_tensors& expected) const;

  /// `check_matches(destination)`, then copies every tensor into its destination (any
  /// device and layout; the copy bumps autograd version counters like any in-place op).
  /// Nothing is copied unless everything matches.
  void copy_into(const named_tensors& destination) const;

private:
  safetensors_reader() = default;

  std::string label_;
  std::string bytes_;
  std::uint64_t data_start_ = 0; ///< offset of the data section in bytes_
  string_map metadata_;
  std::vector<safetensors_entry> entries_;
};

/// Every tensor of the file at `path` as new CPU tensors, in data-section order; the
/// metadata into `*metadata` when given. Throws checkpoint_error.
named_tensors load_safetensors(const std::filesystem::path& path, string_map* metadata = nullptr);

/// Loads `path` into `destination` all-or-nothing: the file must hold exactly these names
/// with the same dtypes and shapes (no conversion), else checkpoint_error and the
/// destination is untouched. The metadata goes into `*metadata` when given.
void load_safetensors_into(const std::filesystem::path& path, const named_tensors& destination,
                           string_map* metadata = nullptr);

/// Writes `bytes` to `path` atomically (temporary file in the same directory, fsync,
/// rename, fsync of the directory). Throws checkpoint_error on I/O failure.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

/// A file's whole content. Throws checkpoint_error when it can't be read.
std::string read_file_bytes(const std::filesystem::path& path);

} // namespace sorl::ml
