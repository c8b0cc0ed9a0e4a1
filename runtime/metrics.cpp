#include "runtime/metrics.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <type_traits>

namespace sorl {

namespace {

using json = nlohmann::ordered_json;

constexpr const char* file_name = "metrics.jsonl";

bool is_numeric(metric::kind k) {
  return k == metric::kind::number || k == metric::kind::count || k == metric::kind::flag;
}

bool is_member(metric::kind k) {
  return k == metric::kind::member_int || k == metric::kind::member_number
         || k == metric::kind::member_numbers;
}

bool is_schema_key(const std::string& key) {
  const auto* row = metric::find(key);
  return row != nullptr && is_member(row->kind);
}

const char* group_title(metric::group g) {
  switch (g) {
    case metric::group::step: return "step";
    case metric::group::group_control: return "group-size control";
    case metric::group::rollout: return "rollout";
    case metric::group::speculation: return "speculative decoding";
    case metric::group::kv_cache: return "prefix cache and load";
    case metric::group::groups: return "groups (DAPO)";
    case metric::group::timing: return "timing";
    case metric::group::learner: return "learner loss";
    case metric::group::sync: return "sync";
    case metric::group::heldout: return "held-out evaluation";
  }
  return "?";
}

const char* kind_title(metric::kind k) {
  switch (k) {
    case metric::kind::member_int: return "int";
    case metric::kind::member_number: return "number";
    case metric::kind::member_numbers: return "[number]";
    case metric::kind::number: return "number";
    case metric::kind::count: return "count";
    case metric::kind::flag: return "0 / 1";
    case metric::kind::text: return "text";
  }
  return "?";
}

json number(double v) {
  // nlohmann would write NaN as null too; say it here rather than rely on it.
  return std::isfinite(v) ? json(v) : json(nullptr);
}

template <class T>
void put(json& j, const char* key, const std::optional<T>& v) {
  if (!v)
    return;
  if constexpr (std::is_floating_point_v<T>)
    j[key] = number(*v);
  else
    j[key] = *v;
}

std::optional<double> get_double(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null())
    return std::nullopt;
  if (!it->is_number())
    throw std::invalid_argument(std::string("metrics record: \"") + key + "\" must be a number");
  return it->get<double>();
}

std::optional<int64_t> get_int(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null())
    return std::nullopt;
  if (!it->is_number_integer())
    throw std::invalid_argument(std::string("metrics record: \"") + key
                                + "\" must be an integer");
  return it->get<int64_t>();
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string errno_text() {
  return std::strerror(errno);
}

} // namespace

namespace metric {

const std::vector<row>& schema() {
#define SORL_METRIC_ROW(id, key, grp, knd, unit, meaning) {key, group::grp, kind::knd, unit, meaning},
  static const std::vector<row> rows{SORL_METRICS(SORL_METRIC_ROW)};
#undef SORL_METRIC_ROW
  return rows;
}

const row* find(std::string_view key) {
  for (const auto& r : schema())
    if (key == r.key)
      return &r;
  return nullptr;
}

std::string markdown() {
  auto cell = [](std::string_view text) {
    std::string out;
    for (char c : text) {
      if (c == '|')
        out += '\\';
      out += c;
    }
    return out;
  };
  std::string out = "| key | group | type | unit | meaning |\n|---|---|---|---|---|\n";
  for (const auto& r : schema())
    out += "| `" + std::string(r.key) + "` | " + group_title(r.group) + " | "
           + kind_title(r.kind) + " | " + cell(r.unit) + " | " + cell(r.meaning) + " |\n";
  return out;
}

std::string schema_json() {
  json rows = json::array();
  for (const auto& r : schema())
    rows.push_back({{"key", r.key},
                    {"group", group_title(r.group)},
                    {"type", kind_title(r.kind)},
                    {"unit", r.unit},
                    {"meaning", r.meaning}});
  return json{{"metrics", std::move(rows)}}.dump(2) + "\n";
}

} // namespace metric

void metrics_record::set_numeric(std::string_view key, double v) {
  const auto* row = metric::find(key);
  if (row == nullptr || !is_numeric(row->kind))
    throw std::invalid_argument("metrics record: \"" + std::string(key)
                                + "\" is not a numeric key of the metric schema (SORL_METRICS "
                                  "in runtime/metrics.hpp)");
  extra[row->key] = v;
}

std::string to_json_line(const metrics_record& r) {
  json j;
  j[metric::step.key] = r.step;
  put(j, metric::wall_s.key, r.wall_s);
  put(j, metric::rollout_s.key, r.rollout_s);
  put(j, metric::learn_s.key, r.learn_s);
  put(j, metric::sync_s.key, r.sync_s);
  put(j, metric::group_size.key, r.group_size);
  put(j, metric::reward_mean.key, r.reward_mean);
  if (!r.reward_per_group.empty()) {
    json a = json::array();
    for (double v : r.reward_per_group)
      a.push_back(number(v));
    j[metric::reward_per_group.key] = std::move(a);
  }
  put(j, metric::resp_len_p50.key, r.resp_len_p50);
  put(j, metric::resp_len_p99.key, r.resp_len_p99);
  put(j, metric::resp_len_max.key, r.resp_len_max);
  put(j, metric::tokens_per_s.key, r.tokens_per_s);
  put(j, metric::stragglers.key, r.stragglers);
  auto check_key = [](const std::string& key, bool text) {
    const auto* row = metric::find(key);
    if (row != nullptr && is_member(row->kind))
      throw std::invalid_argument("metrics record: extra key \"" + key
                                  + "\" repeats a schema key; set the member instead");
    if (row == nullptr || (text ? row->kind != metric::kind::text : !is_numeric(row->kind)))
      throw std::invalid_argument("metrics record: " + std::string(text ? "text" : "numeric")
                                  + " key \"" + key
                                  + "\" has no such row in the metric schema (SORL_METRICS "
                                    "in runtime/metrics.hpp)");
  };
  for (const auto& [key, v] : r.extra) {
    check_key(key, false);
    j[key] = number(v);
  }
  for (const auto& [key, v] : r.extra_text) {
    check_key(key, true);
    j[key] = v;
  }
  return j.dump();
}

metrics_record parse_metrics_line(std::string_view line) {
  json j = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw std::invalid_argument("metrics record: not valid JSON");
  if (!j.is_object())
    throw std::invalid_argument("metrics record: not a JSON object");
  metrics_record r;
  auto step = get_int(j, "step");
  if (!step)
    throw std::invalid_argument("metrics record: no integer \"step\"");
  r.step = *step;
  r.wall_s = get_double(j, metric::wall_s.key);
  r.rollout_s = get_double(j, metric::rollout_s.key);
  r.learn_s = get_double(j, metric::learn_s.key);
  r.sync_s = get_double(j, metric::sync_s.key);
  r.group_size = get_int(j, metric::group_size.key);
  r.reward_mean = get_double(j, metric::reward_mean.key);
  if (auto it = j.find("reward_per_group"); it != j.end() && !it->is_null()) {
    if (!it->is_array())
      throw std::invalid_argument("metrics record: \"reward_per_group\" must be an array");
    for (const auto& v : *it) {
      if (v.is_null())
        r.reward_per_group.push_back(std::nan(""));
      else if (v.is_number())
        r.reward_per_group.push_back(v.get<double>());
      else
        throw std::invalid_argument("metrics record: \"reward_per_group\" holds a non-number");
    }
  }
  r.resp_len_p50 = get_int(j, metric::resp_len_p50.key);
  r.resp_len_p99 = get_int(j, metric::resp_len_p99.key);
  r.resp_len_max = get_int(j, metric::resp_len_max.key);
  r.tokens_per_s = get_double(j, metric::tokens_per_s.key);
  r.stragglers = get_int(j, metric::stragglers.key);
  for (const auto& [key, v] : j.items()) {
    if (is_schema_key(key))
      continue;
    if (v.is_number())
      r.extra[key] = v.get<double>();
    else if (v.is_string())
      r.extra_text[key] = v.get<std::string>();
  }
  return r;
}

std::optional<double> reward_trailing_mean(const std::vector<double>& values,
                                           std::size_t window) {
  std::size_t k = std::min(window, values.size());
  if (k == 0)
    return std::nullopt;
  double sum = 0;
  for (auto it = values.end() - static_cast<std::ptrdiff_t>(k); it != values.end(); ++it)
    sum += *it;
  return sum / static_cast<double>(k);
}

std::string progress_line(const metrics_record& r, int64_t total_steps,
                          std::optional<double> reward_smoothed) {
  std::vector<std::string> parts;
  parts.push_back("step " + std::to_string(r.step)
                  + (total_steps > 0 ? "/" + std::to_string(total_steps) : ""));
  if (r.reward_mean)
    parts.push_back("reward " + fmt("%.2f", *r.reward_mean)
                    + (reward_smoothed ? " (mean" + std::to_string(reward_mean_window) + " "
                                           + fmt("%.2f", *reward_smoothed) + ")"
                                       : ""));
  if (r.group_size)
    parts.push_back("G " + std::to_string(*r.group_size));
  std::string split;
  auto add_split = [&](const char* name, const std::optional<double>& v) {
    if (!v)
      return;
    split += (split.empty() ? "" : " | ") + std::string(name) + " " + fmt("%.1f", *v);
  };
  add_split("rollout", r.rollout_s);
  add_split("learn", r.learn_s);
  add_split("sync", r.sync_s);
  std::string time;
  if (r.wall_s)
    time = "step " + fmt("%.1f", *r.wall_s) + "s";
  if (!split.empty())
    time += (time.empty() ? "(" : " (") + split + ")";
  if (!time.empty())
    parts.push_back(time);
  if (r.tokens_per_s)
    parts.push_back(fmt("%.0f", *r.tokens_per_s) + " tok/s");
  if (r.stragglers && *r.stragglers > 0)
    parts.push_back("stragglers " + std::to_string(*r.stragglers));
  std::string out;
  for (const auto& p : parts)
    out += (out.empty() ? "" : "  ") + p;
  return out;
}

// -- metrics_sink -------------------------------------------------------------------------

void metrics_sink::file_closer::operator()(std::FILE* f) const {
  if (f != nullptr)
    std::fclose(f);
}

metrics_sink::metrics_sink(const std::filesystem::path& run_dir, metrics_open_mode mode,
                           std::optional<int64_t> keep_through_step)
  : path_(run_dir / file_name) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec)
    throw std::runtime_error("metrics: cannot create run directory " + run_dir.string() + ": "
                             + ec.message());
  if (mode == metrics_open_mode::resume)
    open_resume(keep_through_step);
  file_.reset(std::fopen(path_.c_str(), mode == metrics_open_mode::fresh ? "wb" : "ab"));
  if (!file_)
    throw std::runtime_error("metrics: cannot open " + path_.string() + ": " + errno_text());
}

metrics_sink::~metrics_sink() = default;
metrics_sink::metrics_sink(metrics_sink&&) noexcept = default;
metrics_sink& metrics_sink::operator=(metrics_sink&&) noexcept = default;

void metrics_sink::open_resume(std::optional<int64_t> keep_through_step) {
  std::error_code access;
  if (!std::filesystem::exists(path_, access)) {
    if (access)
      throw std::runtime_error("metrics: cannot access " + path_.string() + ": "
                               + access.message());
    return;
  }
  std::ifstream in(path_, std::ios::binary);
  if (!in)
    throw std::runtime_error("metrics: cannot read " + path_.string() + ": " + errno_text());
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();

  std::string kept;
  size_t pos = 0;
  int64_t line_no = 0;
  bool rewrite = false;
  while (pos < text.size()) {
    ++line_no;
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) {
      // No newline: the process died inside the write of this record.
      ++dropped_on_open_;
      rewrite = true;
      break;
    }
    std::string_view line(text.data() + pos, nl - pos);
    pos = nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) {
      ++dropped_on_open_;
      rewrite = true;
      continue;
    }
    metrics_record r;
    try {
      r = parse_metrics_line(line);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(path_.string() + ":" + std::to_string(line_no) + ": " + e.what()
                               + "; refusing to resume over a damaged record");
    }
    if (last_step_ && r.step <= *last_step_)
      throw std::runtime_error(path_.string() + ":" + std::to_string(line_no) + ": step "
                               + std::to_string(r.step) + " does not follow step "
                               + std::to_string(*last_step_));
    if (keep_through_step && r.step > *keep_through_step) {
      // Steps increase, so everything from here on is after the checkpoint too.
      ++dropped_on_open_;
      rewrite = true;
      continue;
    }
    kept.append(line.data(), line.size());
    kept += '\n';
    last_step_ = r.step;
    ++records_;
  }
  if (!rewrite)
    return;
  // Write the kept records beside the file and rename over it: a crash leaves either the
  // old file or the new one, never half of each.
  auto tmp = path_;
  tmp += ".tmp";
  {
    std::unique_ptr<std::FILE, file_closer> out(std::fopen(tmp.c_str(), "wb"));
    if (!out)
      throw std::runtime_error("metrics: cannot write " + tmp.string() + ": " + errno_text());
    if (std::fwrite(kept.data(), 1, kept.size(), out.get()) != kept.size()
        || std::fflush(out.get()) != 0)
      throw std::runtime_error("metrics: cannot write " + tmp.string() + ": " + errno_text());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path_, ec);
  if (ec)
    throw std::runtime_error("metrics: cannot replace " + path_.string() + ": "
                             + ec.message());
}

void metrics_sink::write(const metrics_record& record) {
  if (record.step < 1)
    throw std::invalid_argument("metrics_sink::write: step " + std::to_string(record.step)
                                + " < 1 (steps are 1-based)");
  if (last_step_ && record.step <= *last_step_)
    throw std::invalid_argument("metrics_sink::write: step " + std::to_string(record.step)
                                + " does not follow the last recorded step "
                                + std::to_string(*last_step_) + " in " + path_.string());
  if (!file_)
    throw std::logic_error("metrics_sink::write on a moved-from sink");
  std::string line = to_json_line(record);
  line += '\n';
  // One fwrite per record, flushed at once: a crash leaves whole lines plus at most one
  // torn line without its newline, which resume drops.
  if (std::fwrite(line.data(), 1, line.size(), file_.get()) != line.size()
      || std::fflush(file_.get()) != 0)
    throw std::runtime_error("metrics: cannot write " + path_.string() + ": " + errno_text());
  last_step_ = record.step;
  ++records_;
}

} // namespace sorl
