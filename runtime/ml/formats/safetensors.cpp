#include "runtime/ml/formats/safetensors.hpp"

#include <ATen/ops/empty.h>
#include <nlohmann/json.hpp>

// Header-only use of xxHash: its functions become static to this file, so nothing has to
// agree on which libxxhash to link.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#  error "sorl's safetensors I/O copies tensor bytes as they are: it needs a little-endian host"
#endif

namespace sorl::ml {

namespace fs = std::filesystem;

namespace {

using json = nlohmann::json;

/// The reference implementation's limit on the header length (safetensors MAX_HEADER_SIZE).
constexpr std::uint64_t max_header_bytes = 100'000'000;

struct dtype_info {
  std::string_view name;
  at::ScalarType type;
};

constexpr dtype_info dtype_table[] = {
  {"F64", at::ScalarType::Double}, {"F32", at::ScalarType::Float},
  {"F16", at::ScalarType::Half},   {"BF16", at::ScalarType::BFloat16},
  {"I64", at::ScalarType::Long},   {"I32", at::ScalarType::Int},
  {"I16", at::ScalarType::Short},  {"I8", at::ScalarType::Char},
  {"U8", at::ScalarType::Byte},    {"BOOL", at::ScalarType::Bool},
};

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string dtype_text(at::ScalarType type) {
  for (const auto& d : dtype_table)
    if (d.type == type)
      return std::string(d.name);
  return c10::toString(type);
}

std::string errno_text() {
  return std::strerror(errno);
}

/// A file written under a temporary name and renamed into place by commit(); removed
/// if destroyed uncommitted (an exception on the way), so no partial file is ever
/// visible under the final name.
class atomic_file {
public:
  explicit atomic_file(fs::path path) : path_(std::move(path)) {
    static std::atomic<unsigned> counter{0};
    const fs::path dir = path_.has_parent_path() ? path_.parent_path() : fs::path(".");
    tmp_ = dir
           / ("." + path_.filename().string() + ".tmp." + std::to_string(::getpid()) + "."
              + std::to_string(counter.fetch_add(1)));
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw checkpoint_error(path_.string(), "",
                             "cannot create temporary file " + tmp_.string() + ": " + errno_text());
    XXH3_64bits_reset(&hash_);
  }

  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;

  ~atomic_file() {
    if (fd_ >= 0)
      ::close(fd_);
    if (!committed_)
      ::unlink(tmp_.c_str());
  }

  void write(const void* data, size_t n) {
    XXH3_64bits_update(&hash_, data, n);
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t k = ::write(fd_, p, n);
      if (k < 0) {
        if (errno == EINTR)
          continue;
        throw checkpoint_error(path_.string(), "", "write failed: " + errno_text());
      }
      p += k;
      n -= static_cast<size_t>(k);
      bytes_ += static_cast<std::uint64_t>(k);
    }
  }

  written_file commit() {
    if (::fsync(fd_) != 0)
      throw checkpoint_error(path_.string(), "", "fsync failed: " + errno_text());
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0)
      throw checkpoint_error(path_.string(), "", "close failed: " + errno_text());
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      throw checkpoint_error(path_.string(), "",
                             "cannot rename " + tmp_.string() + " into place: " + errno_text());
    committed_ = true;
    // Persist the rename itself; failure here leaves a complete file, so it's not fatal.
    const fs::path dir = path_.has_parent_path() ? path_.parent_path() : fs::path(".");
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
    return {bytes_, XXH3_64bits_digest(&hash_)};
  }

private:
  fs::path path_;
  fs::path tmp_;
  int fd_ = -1;
  bool committed_ = false;
  std::uint64_t bytes_ = 0;
  XXH3_state_t hash_;
};

struct tensor_to_write {
  std::string name;
  at::Tensor data; // CPU, contiguous
  std::string_view dtype;
  size_t item_size = 0;
};

} // namespace

checkpoint_error::checkpoint_error(std::string path, std::string tensor, const std::string& what)
  : std::runtime_error(path + (tensor.empty() ? "" : ": tensor '" + tensor + "'") + ": " + what),
    path_(std::move(path)),
    tensor_(std::move(tensor)) {}

std::string_view safetensors_dtype_name(at::ScalarType type) {
  for (const auto& d : dtype_table)
    if (d.type == type)
      return d.name;
  throw std::invalid_argument(std::string("safetensors: unsupported dtype ") + c10::toString(type));
}

std::optional<at::ScalarType> safetensors_dtype_from_name(std::string_view name) {
  for (const auto& d : dtype_table)
    if (d.name == name)
      return d.type;
  return std::nullopt;
}

std::uint64_t content_hash(std::string_view bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

void write_file_atomically(const fs::path& path, std::string_view bytes) {
  atomic_file out(path);
  out.write(bytes.data(), bytes.size());
  out.commit();
}

std::string read_file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw checkpoint_error(path.string(), "", "cannot open: " + errno_text());
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad())
    throw checkpoint_error(path.string(), "", "read error: " + errno_text());
  return std::move(buf).str();
}

written_file save_safetensors(const fs::path& path, const named_tensors& tensors,
                              const string_map& metadata) {
  // Validate and stage everything before creating the file.
  std::vector<tensor_to_write> items;
  items.reserve(tensors.size());
  std::set<std::string> seen;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty())
      throw std::invalid_argument("save_safetensors(" + path.string() + "): empty tensor name");
    if (name == "__metadata__")
      throw std::invalid_argument("save_safetensors(" + path.string()
                                  + "): \"__metadata__\" is reserved by the format");
    if (!seen.insert(name).second)
      throw std::invalid_argument("save_safetensors(" + path.string() + "): duplicate tensor '"
                                  + name + "'");
    if (!tensor.defined())
      throw std::invalid_argument("save_safetensors(" + path.string() + "): tensor '" + name
                                  + "' is undefined");
    tensor_to_write item;
    item.name = name;
    item.dtype = safetensors_dtype_name(tensor.scalar_type());
    item.data = tensor.detach().to(at::kCPU).contiguous();
    item.item_size = item.data.element_size();
    items.push_back(std::move(item));
  }
  // Largest elements first keeps each tensor aligned to its element size, given the
  // 8-byte aligned data section; names make the layout independent of the input order.
  std::sort(items.begin(), items.end(), [](const tensor_to_write& a, const tensor_to_write& b) {
    return a.item_size != b.item_size ? a.item_size > b.item_size : a.name < b.name;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& meta = header["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata)
      meta[k] = v;
  }
  std::uint64_t offset = 0;
  for (const auto& item : items) {
    const auto nbytes = static_cast<std::uint64_t>(item.data.nbytes());
    header[item.name] = {{"dtype", item.dtype},
                         {"shape", item.data.sizes().vec()},
                         {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("save_safetensors(" + path.string()
                                + "): a tensor name or metadata string is not valid UTF-8 ("
                                + e.what() + ")");
  }
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i)
    prefix[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(header_text.size()) >> (8 * i));

  atomic_file out(path);
  out.write(prefix, sizeof prefix);
  out.write(header_text.data(), header_text.size());
  for (const auto& item : items)
    if (item.data.nbytes() > 0)
      out.write(item.data.data_ptr(), item.data.nbytes());
  return out.commit();
}

// -- reading ------------------------------------------------------------------------------

safetensors_reader safetensors_reader::open(const fs::path& path) {
  return parse(read_file_bytes(path), path.string());
}

safetensors_reader safetensors_reader::parse(std::string bytes, std::string label) {
  safetensors_reader r;
  r.label_ = std::move(label);
  r.bytes_ = std::move(bytes);
  const auto fail = [&](const std::string& tensor, const std::string& what) {
    throw checkpoint_error(r.label_, tensor, what);
  };
  const std::uint64_t size = r.bytes_.size();
  if (size < 8)
    fail("", "truncated: the file is " + std::to_string(size)
               + " bytes, shorter than the 8-byte header length");
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | static_cast<unsigned char>(r.bytes_[static_cast<size_t>(i)]);
  if (header_len > max_header_bytes)
    fail("", "corrupt: header length " + std::to_string(header_len) + " exceeds the "
               + std::to_string(max_header_bytes) + "-byte limit");
  if (header_len > size - 8)
    fail("", "truncated: header length " + std::to_string(header_len) + " but only "
               + std::to_string(size - 8) + " bytes follow the length prefix");
  r.data_start_ = 8 + header_len;
  const std::uint64_t data_size = size - r.data_start_;

  // Parse, noting duplicate keys (nlohmann keeps the last silently, the format forbids them).
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  const json::parser_callback_t track_keys = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open_objects.empty())
        open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second && duplicate.empty())
        duplicate = key;
    }
    return true;
  };
  json header;
  const char* hbegin = r.bytes_.data() + 8;
  try {
    header = json::parse(hbegin, hbegin + header_len, track_keys);
  } catch (const json::exception& e) {
    fail("", std::string("corrupt header: not valid JSON (") + e.what() + ")");
  }
  if (!duplicate.empty())
    fail("", "corrupt header: duplicate key '" + duplicate + "'");
  if (!header.is_object())
    fail("", std::string("corrupt header: expected a JSON object, got ") + header.type_name());

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        fail("", "corrupt header: __metadata__ must be an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          fail("", "corrupt header: __metadata__ value of '" + mk + "' must be a string, got "
                     + mv.type_name());
        r.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    if (!value.is_object())
      fail(key, "corrupt header: entry must be an object");
    safetensors_entry e;
    e.name = key;
    const auto dtype = value.find("dtype");
    if (dtype == value.end() || !dtype->is_string())
      fail(key, "corrupt header: missing or non-string \"dtype\"");
    const auto type = safetensors_dtype_from_name(dtype->get_ref<const std::string&>());
    if (!type)
      fail(key, "unsupported dtype \"" + dtype->get<std::string>() + "\"");
    e.dtype = *type;
    const auto shape = value.find("shape");
    if (shape == value.end() || !shape->is_array())
      fail(key, "corrupt header: missing or non-array \"shape\"");
    std::uint64_t numel = 1;
    for (const auto& dim : *shape) {
      if (!dim.is_number_unsigned()
          || dim.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail(key, "corrupt header: shape entries must be non-negative integers, got " + dim.dump());
      const auto d = dim.get<std::uint64_t>();
      if (__builtin_mul_overflow(numel, d, &numel))
        fail(key, "corrupt header: shape " + shape->dump() + " overflows");
      e.shape.push_back(static_cast<std::int64_t>(d));
    }
    const auto offsets = value.find("data_offsets");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2
        || !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned())
      fail(key, "corrupt header: \"data_offsets\" must be two non-negative integers");
    e.begin = (*offsets)[0].get<std::uint64_t>();
    e.end = (*offsets)[1].get<std::uint64_t>();
    if (e.end < e.begin)
      fail(key, "corrupt header: data_offsets [" + std::to_string(e.begin) + ", "
                  + std::to_string(e.end) + "] end before they begin");
    std::uint64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(c10::elementSize(e.dtype)), &nbytes))
      fail(key, "corrupt header: shape " + shape->dump() + " overflows");
    if (e.end - e.begin != nbytes)
      fail(key, "corrupt header: data_offsets [" + std::to_string(e.begin) + ", "
                  + std::to_string(e.end) + "] span " + std::to_string(e.end - e.begin)
                  + " bytes, but " + dtype_text(e.dtype) + " " + shape_text(e.shape) + " needs "
                  + std::to_string(nbytes));
    r.entries_.push_back(std::move(e));
  }

  std::sort(r.entries_.begin(), r.entries_.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Truncation shows as data running past the end of the file; report it as such first.
  for (const auto& e : r.entries_)
    if (e.end > data_size)
      fail(e.name, "truncated: data ends at byte " + std::to_string(e.end)
                     + " of the data section, which has only " + std::to_string(data_size)
                     + " bytes");
  std::uint64_t expected_begin = 0;
  for (const auto& e : r.entries_) {
    if (e.begin != expected_begin)
      fail(e.name, "corrupt header: data begins at byte " + std::to_string(e.begin) + ", expected "
                     + std::to_string(expected_begin)
                     + " (tensors must tile the data section without gaps or overlap)");
    expected_begin = e.end;
  }
  if (expected_begin != data_size)
    fail("", "corrupt: " + std::to_string(data_size - expected_begin)
               + " bytes after the last tensor's data");
  for (const auto& e : r.entries_) {
    if (e.dtype != at::ScalarType::Bool)
      continue;
    const char* p = r.bytes_.data() + r.data_start_ + e.begin;
    for (std::uint64_t i = 0; i < e.end - e.begin; ++i)
      if (static_cast<unsigned char>(p[i]) > 1)
        fail(e.name, "corrupt data: BOOL byte " + std::to_string(static_cast<unsigned char>(p[i]))
                       + " at element " + std::to_string(i));
  }
  return r;
}

const safetensors_entry* safetensors_reader::find(std::string_view name) const {
  for (const auto& e : entries_)
    if (e.name == name)
      return &e;
  return nullptr;
}

at::Tensor safetensors_reader::tensor(std::string_view name) const {
  const safetensors_entry* e = find(name);
  if (!e)
    throw checkpoint_error(label_, std::string(name), "no such tensor in the file");
  at::Tensor t = at::empty(e->shape, at::TensorOptions().dtype(e->dtype).device(at::kCPU));
  if (e->end > e->begin)
    std::memcpy(t.data_ptr(), bytes_.data() + data_start_ + e->begin, e->end - e->begin);
  return t;
}

named_tensors safetensors_reader::tensors() const {
  named_tensors out;
  out.reserve(entries_.size());
  for (const auto& e : entries_)
    out.emplace_back(e.name, tensor(e.name));
  return out;
}

void safetensors_reader::check_matches(const named_tensors& expected) const {
  std::set<std::string_view> expected_names;
  for (const auto& [name, t] : expected) {
    if (!t.defined())
      throw std::invalid_argument("check_matches(" + label_ + "): expected tensor '" + name
                                  + "' is undefined");
    if (!expected_names.insert(name).second)
      throw std::invalid_argument("check_matches(" + label_ + "): expected tensor '" + name
                                  + "' is listed twice");
  }
  std::vector<std::string> missing, extra;
  for (const auto& [name, t] : expected)
    if (!find(name))
      missing.push_back(name);
  for (const auto& e : entries_)
    if (!expected_names.count(e.name))
      extra.push_back(e.name);
  if (!missing.empty() || !extra.empty()) {
    const auto list = [](const std::vector<std::string>& names) {
      std::string out;
      const size_t shown = std::min<size_t>(names.size(), 8);
      for (size_t i = 0; i < shown; ++i)
        out += (i ? ", " : "") + names[i];
      if (names.size() > shown)
        out += ", and " + std::to_string(names.size() - shown) + " more";
      return out;
    };
    std::string what;
    if (!missing.empty())
      what += std::to_string(missing.size()) + " missing tensor(s): " + list(missing);
    if (!extra.empty())
      what += std::string(what.empty() ? "" : "; ") + std::to_string(extra.size())
              + " unexpected tensor(s): " + list(extra);
    throw checkpoint_error(label_, missing.empty() ? extra.front() : missing.front(), what);
  }
  for (const auto& [name, t] : expected) {
    const safetensors_entry& e = *find(name);
    if (e.dtype != t.scalar_type())
      throw checkpoint_error(label_, name, "dtype " + dtype_text(e.dtype) + " in the file, expected "
                                             + dtype_text(t.scalar_type()));
    const std::vector<std::int64_t> want = t.sizes().vec();
    if (e.shape != want)
      throw checkpoint_error(label_, name, "shape " + shape_text(e.shape) + " in the file, expected "
                                             + shape_text(want));
  }
}

void safetensors_reader::copy_into(const named_tensors& destination) const {
  check_matches(destination);
  for (const auto& [name, dst] : destination)
    dst.detach().copy_(tensor(name));
}

named_tensors load_safetensors(const fs::path& path, string_map* metadata) {
  const safetensors_reader r = safetensors_reader::open(path);
  if (metadata)
    *metadata = r.metadata();
  return r.tensors();
}

void load_safetensors_into(const fs::path& path, const named_tensors& destination,
                           string_map* metadata) {
  const safetensors_reader r = safetensors_reader::open(path);
  r.copy_into(destination);
  if (metadata)
    *metadata = r.metadata();
}

} // namespace sorl::ml
