#include "runtime/ml/formats/checkpoint.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <limits>
#include <mutex>
#include <set>
#include <system_error>
#include <type_traits>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

namespace sorl::ml {

namespace fs = std::filesystem;

namespace {

using json = nlohmann::json;

constexpr const char* format_name = "sorl.checkpoint";
constexpr const char* model_file = "model.safetensors";
constexpr const char* optimizer_file = "optimizer.safetensors";
constexpr const char* state_file = "state.json";
constexpr const char* latest_file = "latest";

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

/// `j` as a T, or std::nullopt unless it is a JSON integer within T's range. nlohmann's
/// get<T> converts a float or an out-of-range integer with a plain cast, which for a hostile
/// sidecar ("step": 1e300) is undefined behaviour.
template <class T>
std::optional<T> json_integer(const json& j) {
  static_assert(std::is_integral_v<T>);
  if (j.is_number_unsigned()) {
    const auto v = j.get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(std::numeric_limits<T>::max()))
      return std::nullopt;
    return static_cast<T>(v);
  }
  if (j.is_number_integer()) {
    const auto v = j.get<std::int64_t>();
    if (v < 0 ? (std::is_unsigned_v<T>
                 || v < static_cast<std::int64_t>(std::numeric_limits<T>::min()))
              : static_cast<std::uint64_t>(v)
                  > static_cast<std::uint64_t>(std::numeric_limits<T>::max()))
      return std::nullopt;
    return static_cast<T>(v);
  }
  return std::nullopt;
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec)
    throw checkpoint_error(to.string(), "",
                           "cannot rename " + from.string() + " into place: " + ec.message());
}

/// Removes a directory tree when destroyed, unless released: cleans up a half-written
/// temporary checkpoint when an exception leaves save_checkpoint.
class dir_cleanup {
public:
  explicit dir_cleanup(fs::path dir) : dir_(std::move(dir)) {}
  dir_cleanup(const dir_cleanup&) = delete;
  dir_cleanup& operator=(const dir_cleanup&) = delete;
  ~dir_cleanup() {
    if (!dir_.empty()) {
      std::error_code ec;
      fs::remove_all(dir_, ec);
    }
  }
  void release() { dir_.clear(); }

private:
  fs::path dir_;
};

constexpr std::string_view tmp_prefix = ".tmp-step-";

// The temporary directories this process's saves are writing now (absolute, normalised):
// a save's cleanup of stale ones must not take a concurrent save's directory.
std::mutex in_flight_mutex;
std::set<fs::path> in_flight;

fs::path in_flight_key(const fs::path& dir) {
  std::error_code ec;
  const fs::path abs = fs::absolute(dir, ec);
  return (ec ? dir : abs).lexically_normal();
}

/// Marks a temporary directory as being written by this process while it lives.
class in_flight_mark {
public:
  explicit in_flight_mark(const fs::path& dir) : key_(in_flight_key(dir)) {
    const std::lock_guard lock(in_flight_mutex);
    in_flight.insert(key_);
  }
  in_flight_mark(const in_flight_mark&) = delete;
  in_flight_mark& operator=(const in_flight_mark&) = delete;
  ~in_flight_mark() {
    const std::lock_guard lock(in_flight_mutex);
    in_flight.erase(key_);
  }

private:
  fs::path key_;
};

// Whether `name` (".tmp-step-0000000123-<pid>") ends in the pid of another process that is
// alive on this host. A name without a pid, or with this process's own (a crashed process's,
// recycled), is nobody else's.
bool another_live_process_writes(const std::string& name) {
  const auto dash = name.rfind('-');
  if (dash == std::string::npos || dash + 1 >= name.size() || dash < tmp_prefix.size()) return false;
  long pid = 0;
  const char* first = name.data() + dash + 1;
  const char* last = name.data() + name.size();
  const auto [end, err] = std::from_chars(first, last, pid);
  if (err != std::errc{} || end != last || pid <= 0 || pid == static_cast<long>(::getpid())) return false;
  if (pid > static_cast<long>(std::numeric_limits<pid_t>::max())) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

bool valid_dir_name(const std::string& name) {
  if (name.size() != 15 || name.compare(0, 5, "step-") != 0)
    return false;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9')
      return false;
  return true;
}

} // namespace

std::string checkpoint_dir_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%010lld", static_cast<long long>(step));
  return buf;
}

std::vector<fs::path> remove_stale_checkpoint_temporaries(const fs::path& root) {
  std::vector<fs::path> stale;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (name.compare(0, tmp_prefix.size(), tmp_prefix) != 0 || !it->is_directory(type_ec)) continue;
    if (another_live_process_writes(name)) continue;
    stale.push_back(it->path());
  }
  std::sort(stale.begin(), stale.end());
  std::vector<fs::path> removed;
  const std::lock_guard lock(in_flight_mutex);
  for (const auto& dir : stale) {
    if (in_flight.count(in_flight_key(dir)) != 0) continue;
    std::error_code rm_ec;
    // Nothing removed: a concurrent save of this process renamed it into place meanwhile.
    if (fs::remove_all(dir, rm_ec) > 0 && !rm_ec) removed.push_back(dir);
  }
  return removed;
}

fs::path save_checkpoint(const fs::path& root, const named_tensors& model,
                         const named_tensors& optimizer, const checkpoint_state& state,
                         std::vector<fs::path>* removed_stale) {
  if (state.step < 0 || state.step > 9'999'999'999LL)
    throw std::invalid_argument("save_checkpoint: step must be in [0, 9999999999], got "
                                + std::to_string(state.step));
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec)
    throw checkpoint_error(root.string(), "", "cannot create the checkpoint root: " + ec.message());

  const std::string name = checkpoint_dir_name(state.step);
  const std::string tag = std::to_string(::getpid());
  const fs::path tmp = root / (".tmp-" + name + "-" + tag);
  // Marked before the sweep, so that a concurrent save's sweep leaves this one alone too.
  const in_flight_mark writing(tmp);
  auto removed = remove_stale_checkpoint_temporaries(root);
  if (removed_stale != nullptr)
    removed_stale->insert(removed_stale->end(), removed.begin(), removed.end());
  fs::remove_all(tmp, ec); // left over by a crashed process with a recycled pid
  if (!fs::create_directory(tmp, ec) || ec)
    throw checkpoint_error(tmp.string(), "", "cannot create: " + ec.message());
  dir_cleanup cleanup_tmp(tmp);

  string_map model_meta{{"format", "pt"}, {"sorl.step", std::to_string(state.step)}};
  const written_file model_info = save_safetensors(tmp / model_file, model, model_meta);
  const written_file optim_info = save_safetensors(tmp / optimizer_file, optimizer, {});

  json sidecar = {
    {"format", format_name},
    {"format_version", checkpoint_format_version},
    {"step", state.step},
    {"rng_states", state.rng_states},
    {"metadata", state.metadata},
    {"files",
     {{model_file, {{"bytes", model_info.bytes}, {"xxh3_64", hex64(model_info.xxh3)}}},
      {optimizer_file, {{"bytes", optim_info.bytes}, {"xxh3_64", hex64(optim_info.xxh3)}}}}},
  };
  std::string text;
  try {
    text = sidecar.dump(2) + "\n";
  } catch (const json::exception& e) {
    throw std::invalid_argument(std::string("save_checkpoint: an rng state or metadata string is "
                                            "not valid UTF-8 (")
                                + e.what() + ")");
  }
  write_file_atomically(tmp / state_file, text);
  fsync_dir(tmp);

  // Move the finished directory into place; an existing one for this step stays (renamed
  // aside) until `latest` has moved, so `latest` never names a missing directory.
  const fs::path final_dir = root / name;
  const fs::path old = root / (".old-" + name + "-" + tag);
  const bool replacing = fs::exists(final_dir, ec);
  if (replacing) {
    fs::remove_all(old, ec);
    rename_or_throw(final_dir, old);
  }
  rename_or_throw(tmp, final_dir);
  cleanup_tmp.release();
  fsync_dir(root);
  write_file_atomically(root / latest_file, name + "\n");
  if (replacing)
    fs::remove_all(old, ec); // best effort: a leftover .old-* directory is harmless
  return final_dir;
}

std::optional<fs::path> latest_checkpoint(const fs::path& root) {
  const fs::path latest = root / latest_file;
  std::error_code ec;
  if (!fs::exists(latest, ec))
    return std::nullopt;
  std::string name = read_file_bytes(latest);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' '))
    name.pop_back();
  if (!valid_dir_name(name))
    throw checkpoint_error(latest.string(), "",
                           "malformed: expected a name like step-0000000123, got \""
                             + name.substr(0, 40) + "\"");
  const fs::path dir = root / name;
  if (!fs::is_directory(dir, ec))
    throw checkpoint_error(latest.string(), "", "names " + dir.string() + ", which does not exist");
  return dir;
}

loaded_checkpoint load_checkpoint(const fs::path& dir, const named_tensors& model) {
  const fs::path state_path = dir / state_file;
  const std::string state_label = state_path.string();
  const auto fail = [&](const std::string& what) { throw checkpoint_error(state_label, "", what); };

  json sidecar;
  try {
    sidecar = json::parse(read_file_bytes(state_path));
  } catch (const json::exception& e) {
    fail(std::string("corrupt: not valid JSON (") + e.what() + ")");
  }
  loaded_checkpoint out;
  out.dir = dir;
  try {
    if (!sidecar.is_object() || sidecar.value("format", std::string()) != format_name)
      fail(std::string("not a sorl checkpoint sidecar (\"format\" is not \"") + format_name + "\")");
    const json& version = sidecar.at("format_version");
    if (json_integer<int>(version) != checkpoint_format_version)
      fail("format_version " + version.dump() + " is not supported (this build reads "
           + std::to_string(checkpoint_format_version) + ")");
    const std::optional<std::int64_t> step = json_integer<std::int64_t>(sidecar.at("step"));
    if (!step || *step < 0)
      fail("corrupt: \"step\" is " + sidecar.at("step").dump()
           + ", not a non-negative 64-bit integer");
    out.state.step = *step;
    out.state.rng_states = sidecar.at("rng_states").get<string_map>();
    out.state.metadata = sidecar.at("metadata").get<string_map>();
  } catch (const json::exception& e) {
    fail(std::string("corrupt: missing or mistyped field (") + e.what() + ")");
  }

  // Read and verify both files in full before touching the model.
  const auto verified = [&](const char* file) {
    const fs::path path = dir / file;
    std::uint64_t want_bytes = 0;
    std::string want_hash;
    try {
      const json& entry = sidecar.at("files").at(file);
      const std::optional<std::uint64_t> bytes = json_integer<std::uint64_t>(entry.at("bytes"));
      if (!bytes)
        fail(std::string("corrupt: the size of ") + file + " is " + entry.at("bytes").dump()
             + ", not a byte count");
      want_bytes = *bytes;
      want_hash = entry.at("xxh3_64").get<std::string>();
    } catch (const json::exception& e) {
      fail(std::string("corrupt: no size/checksum for ") + file + " (" + e.what() + ")");
    }
    std::string bytes = read_file_bytes(path);
    if (bytes.size() != want_bytes)
      throw checkpoint_error(path.string(), "",
                             (bytes.size() < want_bytes ? "truncated: " : "wrong size: ")
                               + std::to_string(bytes.size()) + " bytes, the sidecar records "
                               + std::to_string(want_bytes));
    const std::string got_hash = hex64(content_hash(bytes));
    if (got_hash != want_hash)
      throw checkpoint_error(path.string(), "",
                             "checksum mismatch: xxh3_64 " + got_hash + ", the sidecar records "
                               + want_hash + " (the file is corrupt)");
    return safetensors_reader::parse(std::move(bytes), path.string());
  };
  const safetensors_reader model_reader = verified(model_file);
  const safetensors_reader optim_reader = verified(optimizer_file);
  model_reader.check_matches(model);
  out.optimizer = optim_reader.tensors();
  model_reader.copy_into(model);
  return out;
}

} // namespace sorl::ml
