#include "bench/record.hpp"

#include "runtime/version.hpp"

#include <nlohmann/json.hpp>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string_view>

namespace sorl::bench {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// The value after "key<spaces>:" on the first line of `path` that starts with `key`, or "".
std::string proc_field(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0)
      continue;
    const std::size_t colon = line.find(':', key.size());
    if (colon == std::string::npos)
      continue;
    const std::size_t begin = line.find_first_not_of(" \t", colon + 1);
    return begin == std::string::npos ? "" : line.substr(begin);
  }
  return "";
}

bool valid_key(const std::string& key) {
  if (key.empty())
    return false;
  for (const char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok)
      return false;
  }
  return true;
}

json cell_json(const record_cell& c) {
  if (const double* v = std::get_if<double>(&c.value)) {
    if (!std::isfinite(*v))
      return json(nullptr);
    // Counts stay integers in the file (a batch of 8, not 8.0).
    if (std::trunc(*v) == *v && std::fabs(*v) < 9.0e15)
      return json(static_cast<std::int64_t>(*v));
    return json(*v);
  }
  if (const std::string* s = std::get_if<std::string>(&c.value))
    return json(*s);
  return json(nullptr);
}

json text_or_null(const std::string& s) {
  return s.empty() ? json(nullptr) : json(s);
}

/// argv[0] as the reader would type it: relative to the working directory when under it.
std::string command_name(const std::string& argv0) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::path(argv0), ec);
  const fs::path cwd = fs::current_path(ec);
  if (ec || !p.is_absolute())
    return argv0;
  const fs::path rel = p.lexically_relative(cwd);
  if (rel.empty() || *rel.begin() == "..")
    return argv0;
  return rel.string();
}

/// $SORL_BENCH_START, "YYYY-MM-DDTHH:MM:SSZ LOAD" (bench/record.sh sets it when a driver
/// starts): the date and load of the driver's start, which the record reports instead of this
/// process's. False when unset or malformed.
bool driver_start(std::string& date, double& load, std::time_t& epoch) {
  const char* env = std::getenv("SORL_BENCH_START");
  if (env == nullptr)
    return false;
  const std::string text = env;
  const std::size_t space = text.find(' ');
  if (space != 20 || text[19] != 'Z')
    return false;
  std::tm tm{};
  if (strptime(text.substr(0, 19).c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr)
    return false;
  char* end = nullptr;
  const double l = std::strtod(text.c_str() + space + 1, &end);
  if (end == text.c_str() + space + 1)
    return false;
  date = text.substr(0, 20);
  load = l;
  epoch = timegm(&tm);
  return true;
}

} // namespace

void record_table::add_row(std::vector<record_cell> cells) {
  if (cells.size() != columns.size())
    throw std::invalid_argument("bench record table '" + name + "': a row of " +
                                std::to_string(cells.size()) + " cells for " +
                                std::to_string(columns.size()) + " columns");
  rows.push_back(std::move(cells));
}

std::string record_gpu_models(const std::string& folder) {
  // The NVIDIA driver's own listing: no CUDA library needed, and a machine without the
  // driver has no folder.
  std::set<std::string> models;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string model = proc_field((entry.path() / "information").string(), "Model");
    if (!model.empty())
      models.insert(model);
  }
  std::string out;
  for (const std::string& m : models)
    out += (out.empty() ? "" : ", ") + m;
  return out.empty() ? "none" : out;
}

record_machine read_record_machine() {
  record_machine m;
  m.cpu_model = proc_field("/proc/cpuinfo", "model name");
  if (m.cpu_model.empty())
    m.cpu_model = "unknown";
  m.cores_online = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  cpu_set_t set;
  CPU_ZERO(&set);
  m.cores_available =
    sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : m.cores_online;
  std::ifstream loadavg("/proc/loadavg");
  if (!(loadavg >> m.load_1min))
    m.load_1min = -1;
  const std::string mem = proc_field("/proc/meminfo", "MemTotal"); // "24576000 kB"
  m.memory_gib = std::strtod(mem.c_str(), nullptr) / (1024.0 * 1024.0);
  m.gpu = record_gpu_models();
  return m;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string shell_quote(const std::string& arg) {
  bool plain = !arg.empty();
  for (const char c : arg) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    std::string_view("_-./,:=+@%").find(c) != std::string_view::npos;
    plain = plain && ok;
  }
  if (plain)
    return arg;
  std::string out = "'";
  for (const char c : arg)
    out += c == '\'' ? std::string("'\"'\"'") : std::string(1, c); // as Python's shlex.quote
  return out + "'";
}

std::string record_path(const std::string& bench, const std::string& flag) {
  if (!flag.empty())
    return flag;
  if (const char* env = std::getenv("SORL_BENCH_RECORD"); env != nullptr && *env != '\0')
    return env;
  std::string stamp = utc_now(); // 2026-12-07T10:11:12Z -> 20261207T101112Z
  std::string compact;
  for (const char c : stamp)
    if (c != '-' && c != ':')
      compact += c;
  return "runs/bench/" + bench + "-" + compact + ".json";
}

bench_record::bench_record(std::string bench, int argc, char** argv)
  : bench_(std::move(bench)), date_(utc_now()), start_s_(steady_seconds()),
    machine_(read_record_machine()) {
  std::time_t epoch = 0;
  if (driver_start(date_, machine_.load_1min, epoch))
    start_s_ = steady_seconds() - static_cast<double>(std::time(nullptr) - epoch);
  for (int i = 0; i < argc; ++i)
    argv_.emplace_back(argv[i]);
  if (const char* env = std::getenv("SORL_BENCH_COMMAND"); env != nullptr && *env != '\0') {
    command_ = env;
  } else {
    for (std::size_t i = 0; i < argv_.size(); ++i)
      command_ += (i == 0 ? "" : " ") + shell_quote(i == 0 ? command_name(argv_[0]) : argv_[i]);
  }
}

void bench_record::set_threads(int threads) {
  threads_ = threads;
}

void bench_record::set_runtime(record_runtime runtime) {
  runtime_ = std::move(runtime);
}

void bench_record::set_parameter(const std::string& key, record_cell value) {
  for (auto& [k, v] : parameters_)
    if (k == key) {
      v = std::move(value);
      return;
    }
  parameters_.emplace_back(key, std::move(value));
}

record_table& bench_record::add_table(std::string name, std::string title,
                                      std::vector<record_column> columns) {
  if (!valid_key(name))
    throw std::invalid_argument("bench record: table name '" + name +
                                "' must be letters, digits, '_', '.' or '-'");
  for (const record_table& t : tables_)
    if (t.name == name)
      throw std::invalid_argument("bench record: a second table named '" + name + "'");
  std::set<std::string> keys;
  for (const record_column& c : columns) {
    if (!valid_key(c.key))
      throw std::invalid_argument("bench record table '" + name + "': column key '" + c.key +
                                  "' must be letters, digits, '_', '.' or '-'");
    if (!keys.insert(c.key).second)
      throw std::invalid_argument("bench record table '" + name + "': column key '" + c.key +
                                  "' repeated");
  }
  record_table& t = tables_.emplace_back();
  t.name = std::move(name);
  t.title = std::move(title);
  t.columns = std::move(columns);
  return t;
}

std::string bench_record::to_json() const {
  json j;
  j["format"] = "sorl-bench-record";
  j["format_version"] = record_format_version;
  j["bench"] = bench_;
  j["command"] = command_;
  j["argv"] = argv_;
  j["date_utc"] = date_;
  j["duration_s"] = std::round((steady_seconds() - start_s_) * 10.0) / 10.0;
  j["sorl"] = {{"version", sorl::version()},
               {"commit", sorl::build_commit()},
               {"dirty", sorl::build_dirty()},
               {"source", "built into the measured binary"}};
  j["machine"] = {
    {"cpu_model", machine_.cpu_model},
    {"cores_online", machine_.cores_online},
    {"cores_available", machine_.cores_available},
    {"threads_used", threads_ > 0 ? json(threads_) : json(nullptr)},
    {"load_1min_at_start", machine_.load_1min >= 0 ? json(machine_.load_1min) : json(nullptr)},
    {"memory_gib", std::round(machine_.memory_gib * 10.0) / 10.0},
    {"gpu", machine_.gpu}};
  j["runtime"] = {{"libtorch", text_or_null(runtime_.libtorch)},
                  {"blas", text_or_null(runtime_.blas)},
                  {"cpu_kernels", text_or_null(runtime_.cpu_kernels)}};
  json params = json::object();
  for (const auto& [k, v] : parameters_)
    params[k] = cell_json(v);
  j["parameters"] = params;
  json tables = json::array();
  for (const record_table& t : tables_) {
    json cols = json::array();
    for (const record_column& c : t.columns) {
      json col = {{"key", c.key}, {"label", c.label}, {"unit", c.unit}};
      if (c.digits >= 0)
        col["digits"] = c.digits;
      if (c.baseline)
        col["baseline"] = true;
      if (c.significant > 0)
        col["significant"] = c.significant;
      cols.push_back(col);
    }
    json rows = json::array();
    for (const auto& r : t.rows) {
      json row = json::array();
      for (const record_cell& c : r)
        row.push_back(cell_json(c));
      rows.push_back(row);
    }
    json tj = {{"name", t.name}, {"title", t.title}, {"columns", cols}, {"rows", rows}};
    if (!t.baseline_rows.empty())
      tj["baseline_rows"] = t.baseline_rows;
    tables.push_back(tj);
  }
  j["tables"] = tables;
  return j.dump(1) + "\n";
}

bool bench_record::write(const std::string& path) const {
  if (path == "none")
    return false;
  std::error_code ec;
  const fs::path p(path);
  if (p.has_parent_path())
    fs::create_directories(p.parent_path(), ec);
  if (ec)
    throw std::runtime_error("bench record: cannot create the folder of " + path + ": " +
                             ec.message());
  const std::string text = to_json();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out)
    throw std::runtime_error("bench record: cannot write " + path);
  return true;
}

} // namespace sorl::bench
