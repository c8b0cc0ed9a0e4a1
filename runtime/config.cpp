#include "runtime/config.hpp"

#include "runtime/ml/policy/sampler.hpp"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "runtime/toml.hpp"

namespace sorl {

// -- config_error / config_exception -------------------------------------------------------

std::string config_error::to_string() const {
  std::string out = file;
  if (line > 0) {
    out += fmt::format(":{}", line);
    if (column > 0)
      out += fmt::format(":{}", column);
  }
  out += ": ";
  if (!key.empty())
    out += fmt::format("key '{}': ", key);
  out += message;
  return out;
}

namespace {

std::string join_errors(const std::vector<config_error>& errors) {
  std::string out;
  for (const auto& e : errors) {
    if (!out.empty())
      out += '\n';
    out += e.to_string();
  }
  return out;
}

} // namespace

config_exception::config_exception(std::vector<config_error> errors)
  : std::runtime_error(join_errors(errors)), errors_(std::move(errors)) {
}

// -- endpoint ------------------------------------------------------------------------------

bool endpoint::is_loopback() const {
  if (host == "localhost")
    return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1)
    return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

std::string endpoint::to_string() const {
  if (host.find(':') != std::string::npos)
    return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

std::string network_config::plaintext_refusal(const endpoint& ep, std::string_view verb) const {
  if (ep.is_loopback() || tls_enabled() || insecure)
    return "";
  return fmt::format("refusing to {} non-loopback address {} without TLS: set "
                     "network.tls_certificate, tls_key and tls_ca_file, or "
                     "network.insecure = true to accept plaintext",
                     verb, ep.to_string());
}

std::optional<endpoint> endpoint::parse(std::string_view text, std::string* why) {
  auto fail = [&](std::string reason) -> std::optional<endpoint> {
    if (why)
      *why = std::move(reason);
    return std::nullopt;
  };
  std::string_view host;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return fail("expected \"[ipv6]:port\"");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos)
      return fail("expected \"host:port\", e.g. \"127.0.0.1:4242\"");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos)
      return fail("an IPv6 host must be written in brackets: \"[::1]:4242\"");
  }
  if (host.empty())
    return fail("the host is empty");
  if (port.empty() || port.size() > 5)
    return fail("the port must be a number in [0, 65535]");
  uint32_t value = 0;
  for (char c : port) {
    if (c < '0' || c > '9')
      return fail("the port must be a number in [0, 65535]");
    value = value * 10 + static_cast<uint32_t>(c - '0');
  }
  if (value > 65535)
    return fail("the port must be a number in [0, 65535]");
  endpoint result;
  result.host = std::string{host};
  result.port = static_cast<uint16_t>(value);
  return result;
}

// -- experiment_config ---------------------------------------------------------------------

const node_config* experiment_config::hub() const {
  for (const auto& n : nodes)
    if (n.listen)
      return &n;
  return nullptr;
}

const node_config* experiment_config::find_node(std::string_view name) const {
  for (const auto& n : nodes)
    if (n.name == name)
      return &n;
  return nullptr;
}

int64_t experiment_config::count_role(std::string_view role) const {
  int64_t total = 0;
  for (const auto& n : nodes)
    for (const auto& a : n.actors)
      if (a.role == role)
        total += a.count;
  return total;
}

// -- parsing -------------------------------------------------------------------------------

namespace {

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    default:
      return "nothing";
  }
}

/// Collects errors; parsing goes on after an error so the user sees all of them at once.
struct error_sink {
  std::string file;
  std::vector<config_error> errors;
  /// When set, every key a reader looks up is recorded under its table's kind (see
  /// table_kind): how known_config_keys() learns the keys from the parser itself.
  std::map<std::string, std::set<std::string>>* known = nullptr;

  void add(const toml::source_region& where, std::string key, std::string message) {
    errors.push_back(config_error{file, static_cast<int>(where.begin.line),
                                  static_cast<int>(where.begin.column), std::move(key),
                                  std::move(message)});
  }
};

/// "node[2].actors[1]" → "node.actors": the kind of table a reader reads, the unit in which
/// known keys are recorded and suggested.
std::string table_kind(std::string_view prefix) {
  std::string out;
  bool in_index = false;
  for (char c : prefix) {
    if (c == '[')
      in_index = true;
    else if (c == ']')
      in_index = false;
    else if (!in_index)
      out += c;
  }
  return out;
}

/// Edits (insert, delete, substitute, swap two neighbours) from `a` to `b`, ASCII case
/// folded: the optimal-string-alignment variant of the Damerau-Levenshtein distance.
size_t edit_distance(std::string_view a, std::string_view b) {
  auto low = [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i)
    d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j)
    d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = low(a[i - 1]) == low(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && low(a[i - 1]) == low(b[j - 2]) && low(a[i - 2]) == low(b[j - 1]))
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

/// The candidates nearest to `word`, in their order, when near enough to be a typo of it: at
/// most one edit per three characters of `word`, and at least one (the rule rustc and cargo
/// use for their suggestions). Empty when nothing is that near.
std::vector<std::string> nearest(std::string_view word, const std::vector<std::string>& candidates) {
  size_t limit = std::max<size_t>(word.size(), 3) / 3;
  size_t best = limit + 1;
  std::vector<std::string> out;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best) {
      best = d;
      out.clear();
    }
    if (d == best && std::find(out.begin(), out.end(), c) == out.end())
      out.push_back(c);
  }
  return out;
}

/// How a table kind is written in a suggestion.
std::string kind_label(const std::string& kind) {
  if (kind == "node")
    return "[[node]]";
  if (kind == "node.actors")
    return "[[node]] actors entries";
  return "[" + kind + "]";
}

std::string or_list(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i)
    out += (i == 0 ? "" : i + 1 == items.size() ? " or " : ", ") + items[i];
  return out;
}

/// "; did you mean \"x\"?" naming the nearest of `candidates` to `word`, or "".
std::string value_hint(std::string_view word, const std::vector<std::string>& candidates) {
  std::vector<std::string> quoted;
  for (const auto& c : nearest(word, candidates))
    quoted.push_back(fmt::format("\"{}\"", c));
  return quoted.empty() ? "" : fmt::format("; did you mean {}?", or_list(quoted));
}

/// "; did you mean `temperature` in [algorithm]?" for an unknown `key` of a table of `kind`
/// ("" = the top level), or "" when no known key is near. A near key of the same table wins;
/// otherwise the same or a near name in any other table (a key written in the wrong table).
std::string key_hint(const std::string& kind, std::string_view key) {
  const auto& known = known_config_keys();
  if (auto it = known.find(kind); it != known.end()) {
    std::vector<std::string> near;
    for (const auto& k : nearest(key, {it->second.begin(), it->second.end()}))
      near.push_back(kind.empty() ? kind_label(k) : fmt::format("`{}`", k));
    if (!near.empty())
      return fmt::format("; did you mean {}?", or_list(near));
  }
  std::string lower{key};
  for (auto& c : lower)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto& peers = peer_config_names();
  if (auto it = peers.find(lower); it != peers.end()) {
    const auto& [table, name] = it->second;
    return table == kind ? fmt::format("; did you mean `{}` (sorl's name for {})?", name, key)
                         : fmt::format("; did you mean `{}` in [{}] (sorl's name for {})?", name,
                                       table, key);
  }
  std::vector<std::string> names;
  for (const auto& [other, keys] : known)
    if (other != kind && !other.empty())
      names.insert(names.end(), keys.begin(), keys.end());
  std::vector<std::string> phrases;
  for (const auto& name : nearest(key, names)) {
    std::vector<std::string> tables;
    for (const auto& [other, keys] : known)
      if (other != kind && !other.empty() && keys.count(name))
        tables.push_back(kind_label(other));
    phrases.push_back(fmt::format("`{}` in {}", name, or_list(tables)));
  }
  return phrases.empty() ? "" : fmt::format("; did you mean {}?", or_list(phrases));
}

namespace fs = std::filesystem;

/// What a configured path must be.
enum class path_role {
  input_file,       ///< exists now and is readable (datasets, TLS files)
  directory_to_make ///< a directory now or creatable later (run directory, checkpoint root)
};

/// Why `p` cannot serve as `role`, or "" when it can. Never throws: every std::filesystem
/// call takes an error_code, so a long name, a denied permission or a symlink loop is a
/// config error with a location instead of an exception escaping the loader.
std::string path_problem(const std::string& p, path_role role) {
  // Checked by hand: the kernel's ENAMETOOLONG does not say which component, and a missing
  // parent directory would hide it until the directory is created.
  auto shown = [](const std::string& s, size_t n) { return s.size() > n ? s.substr(0, n) + "..." : s; };
  for (const auto& part : fs::path{p}) {
    const auto& name = part.native();
    if (name.size() > NAME_MAX)
      return fmt::format("\"{}\": the component \"{}\" is {} bytes long; a file name may "
                         "have at most {}",
                         shown(p, 64), shown(name, 24), name.size(), NAME_MAX);
  }
  if (p.size() >= PATH_MAX)
    return fmt::format("\"{}\": the path is {} bytes long; at most {} are allowed",
                       shown(p, 64), p.size(), PATH_MAX - 1);
  std::error_code ec;
  auto st = fs::status(p, ec);
  if (ec == std::errc::no_such_file_or_directory)
    return role == path_role::input_file ? fmt::format("file \"{}\" does not exist", p) : "";
  if (ec)
    return fmt::format("cannot access \"{}\": {}", p, ec.message());
  if (role == path_role::directory_to_make)
    return fs::is_directory(st) ? "" : fmt::format("\"{}\" exists and is not a directory", p);
  if (fs::is_directory(st))
    return fmt::format("\"{}\" is a directory, not a file", p);
  if (::access(p.c_str(), R_OK) != 0)
    return fmt::format("cannot read \"{}\": {}", p, std::error_code{errno, std::generic_category()}.message());
  return "";
}

/// Reads the keys of one table, remembering which were consumed so that whatever is left
/// at finish() is reported as unknown.
class table_reader {
public:
  table_reader(const toml::table& tbl, std::string prefix, error_sink& sink)
    : tbl_(tbl), prefix_(std::move(prefix)), sink_(sink) {
  }

  std::string path(std::string_view key) const {
    return prefix_.empty() ? std::string{key} : prefix_ + "." + std::string{key};
  }

  const toml::node* find(std::string_view key) {
    seen_.emplace(key);
    if (sink_.known)
      (*sink_.known)[table_kind(prefix_)].emplace(key);
    return tbl_.get(key);
  }

  void wrong_type(std::string_view key, const toml::node& n, const char* expected) {
    sink_.add(n.source(), path(key), fmt::format("expected {}, got {}", expected, type_name(n)));
  }

  void error(std::string_view key, const toml::node& n, std::string message) {
    sink_.add(n.source(), path(key), std::move(message));
  }

  void missing(std::string_view key, std::string message) {
    sink_.add(tbl_.source(), path(key), std::move(message));
  }

  /// A value that is fine alone but not together with another key: reported at `key` when
  /// the file sets it, else at the table.
  void conflict(std::string_view key, std::string message) {
    auto* n = tbl_.get(key);
    sink_.add(n ? n->source() : tbl_.source(), path(key), std::move(message));
  }

  template <class Int>
  void integer(std::string_view key, Int& out, int64_t lo, int64_t hi) {
    auto* n = find(key);
    if (!n)
      return;
    auto* v = n->as_integer();
    if (!v) {
      wrong_type(key, *n, "an integer");
      return;
    }
    auto x = v->get();
    if (x < lo || x > hi) {
      error(key, *n, fmt::format("{} is out of range [{}, {}]", x, lo, hi));
      return;
    }
    out = static_cast<Int>(x);
  }

  void number(std::string_view key, double& out, double lo, double hi, bool lo_open = false) {
    auto* n = find(key);
    if (!n)
      return;
    double x = 0;
    if (auto* f = n->as_floating_point())
      x = f->get();
    else if (auto* i = n->as_integer())
      x = static_cast<double>(i->get());
    else {
      wrong_type(key, *n, "a number");
      return;
    }
    bool below = lo_open ? !(x > lo) : !(x >= lo);
    if (std::isnan(x) || below || x > hi) {
      error(key, *n,
            fmt::format("{} is out of range {}{}, {}]", x, lo_open ? "(" : "[", lo, hi));
      return;
    }
    out = x;
  }

  void boolean(std::string_view key, bool& out) {
    auto* n = find(key);
    if (!n)
      return;
    if (auto* b = n->as_boolean())
      out = b->get();
    else
      wrong_type(key, *n, "a boolean (true or false)");
  }

  /// Returns the node too, so callers can validate the string's content at its location.
  const toml::node* string(std::string_view key, std::string& out) {
    auto* n = find(key);
    if (!n)
      return nullptr;
    if (auto* s = n->as_string()) {
      out = s->get();
      return n;
    }
    wrong_type(key, *n, "a string");
    return nullptr;
  }

  /// An array of strings; `non_empty` refuses an empty string as an element.
  const toml::node* string_list(std::string_view key, std::vector<std::string>& out, bool non_empty) {
    auto* n = find(key);
    if (!n)
      return nullptr;
    auto* arr = n->as_array();
    if (!arr) {
      wrong_type(key, *n, "an array of strings");
      return nullptr;
    }
    std::vector<std::string> items;
    for (size_t i = 0; i < arr->size(); ++i) {
      const auto* s = arr->get(i)->as_string();
      if (!s) {
        error(key, *n, fmt::format("element {} is {}, not a string", i + 1, type_name(*arr->get(i))));
        return nullptr;
      }
      if (non_empty && s->get().empty()) {
        error(key, *n, fmt::format("element {} is an empty string", i + 1));
        return nullptr;
      }
      items.push_back(s->get());
    }
    out = std::move(items);
    return n;
  }

  void choice(std::string_view key, std::string& out,
              std::initializer_list<std::string_view> allowed) {
    std::string value;
    auto* n = string(key, value);
    if (!n)
      return;
    for (auto a : allowed) {
      if (a == value) {
        out = value;
        return;
      }
    }
    not_one_of(key, *n, value, {allowed.begin(), allowed.end()});
  }

  /// An enumerated setting (config_names<E>).
  template <class E>
  void choice(std::string_view key, E& out) {
    std::string value;
    auto* n = string(key, value);
    if (!n)
      return;
    std::vector<std::string> names;
    for (const auto& [v, name] : config_names<E>::values) {
      if (name == value) {
        out = v;
        return;
      }
      names.emplace_back(name);
    }
    not_one_of(key, *n, value, names);
  }

  void not_one_of(std::string_view key, const toml::node& n, const std::string& value,
                  const std::vector<std::string>& allowed) {
    std::string list;
    for (const auto& a : allowed)
      list += (list.empty() ? "" : ", ") + fmt::format("\"{}\"", a);
    error(key, n,
          fmt::format("\"{}\" is not one of {}{}", value, list, value_hint(value, allowed)));
  }

  void finish() {
    for (auto&& [k, v] : tbl_) {
      if (seen_.count(std::string{k.str()}) == 0)
        sink_.add(k.source(), path(k.str()),
                  "unknown key" + key_hint(table_kind(prefix_), k.str()));
    }
  }

  const toml::table& table() const {
    return tbl_;
  }

private:
  const toml::table& tbl_;
  std::string prefix_;
  error_sink& sink_;
  std::set<std::string, std::less<>> seen_;
};

/// Why `program` (a command's argv[0]) cannot be started, or "" when it can: with a '/' it is
/// a path from sorl's working directory (not from the config file, as the reward process runs
/// it), else it is looked up in PATH. Checked now so that a typo fails before any model loads.
std::string program_problem(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    if (::access(program.c_str(), X_OK) == 0)
      return "";
    return fmt::format("cannot run \"{}\": {} (a path is taken from sorl's working directory, "
                       "not from the config file)",
                       program, std::error_code{errno, std::generic_category()}.message());
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  size_t from = 0;
  while (from <= dirs.size()) {
    size_t to = dirs.find(':', from);
    if (to == std::string::npos)
      to = dirs.size();
    std::string dir = dirs.substr(from, to - from);
    if (dir.empty())
      dir = ".";
    if (::access((dir + "/" + program).c_str(), X_OK) == 0)
      return "";
    from = to + 1;
  }
  return fmt::format("\"{}\" is not a program in PATH", program);
}

constexpr int64_t max_i64 = std::numeric_limits<int64_t>::max();
constexpr double inf = std::numeric_limits<double>::infinity();

std::string resolve(const std::string& base_dir, const std::string& p) {
  if (p.empty())
    return p;
  std::filesystem::path path{p};
  if (path.is_absolute())
    return p;
  return (std::filesystem::path{base_dir} / path).lexically_normal().string();
}

/// Settings the design names but this build does not implement yet: refused rather than
/// silently ignored.
void not_yet(table_reader& r, std::string_view key, bool used, const std::string& what) {
  if (!used)
    return;
  auto* n = r.table().get(key);
  if (n)
    r.error(key, *n, what + " is not implemented yet");
}

/// Why `name` is no device sorl can name ("" when it is one): the spelling only; whether this
/// build's libtorch has the device is for the role that uses it (runtime/ml/policy/device.hpp).
std::string device_problem(const std::string& name) {
  if (name == "cpu" || name == "cuda")
    return "";
  if (name.rfind("cuda:", 0) == 0 && name.size() > 5 && name.size() <= 8
      && std::all_of(name.begin() + 5, name.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
    return "";
  return fmt::format("\"{}\" is no device: expected \"cpu\", \"cuda\" or \"cuda:N\"", name);
}

void parse_run(table_reader& r, run_config& c) {
  r.string("name", c.name);
  r.integer("seed", c.seed, 0, max_i64);
  r.integer("steps", c.steps, 0, 100'000'000);
  r.string("output_dir", c.output_dir);
  r.integer("checkpoint_every", c.checkpoint_every, 0, 100'000'000);
  r.integer("eval_every", c.eval_every, 0, 100'000'000);
  r.integer("threads", c.threads, 0, 1024);
  r.choice("kernels", c.kernels);
  r.string("device", c.device);
  if (auto why = device_problem(c.device); !why.empty())
    r.conflict("device", why);
  // The run directory is made when the run starts; refuse now what could never be made.
  if (auto why = path_problem(c.output_dir, path_role::directory_to_make); !why.empty())
    r.conflict("output_dir", why);
  else if (auto why = path_problem(c.run_dir(), path_role::directory_to_make); !why.empty())
    r.conflict("name", why);
}

void parse_model(table_reader& r, model_config& c, const std::string& base) {
  r.choice("preset", c.preset, {"tiny", "tiny-2k", "50m"});
  r.string("checkpoint", c.checkpoint);
  c.checkpoint = resolve(base, c.checkpoint);
  if (!c.checkpoint.empty())
    if (auto why = path_problem(c.checkpoint, path_role::directory_to_make); !why.empty())
      r.conflict("checkpoint", why);
  r.boolean("warm_start", c.warm_start);
  r.choice("rollout_dtype", c.rollout_dtype, {"bf16", "fp32"});
  not_yet(r, "rollout_dtype", c.rollout_dtype != "bf16", "rollout_dtype \"fp32\"");
  if (c.warm_start && c.checkpoint.empty())
    r.missing("checkpoint", "warm_start = true needs a checkpoint directory to create");
  r.string("hf_dir", c.hf_dir);
  c.hf_dir = resolve(base, c.hf_dir);
  r.integer("max_seq", c.max_seq, 0, int64_t{1} << 20);
  if (!c.hf_dir.empty()) {
    if (auto why = path_problem(c.hf_dir + "/config.json", path_role::input_file); !why.empty())
      r.conflict("hf_dir", why + " (a Hugging Face model directory holds config.json; "
                                 "scripts/fetch-model makes one)");
    if (r.table().get("preset"))
      r.conflict("preset", "preset and hf_dir both name the model; keep one");
    if (c.warm_start)
      r.conflict("warm_start", "the warm start trains a byte-tokenizer preset; a model from "
                               "hf_dir starts from its own weights");
  } else if (c.max_seq > 0) {
    r.conflict("max_seq", "max_seq applies to a model from hf_dir; a preset fixes its own");
  }
}

void parse_task(table_reader& r, task_config& c, const std::string& base) {
  r.choice("name", c.name, {"arithmetic", "number_guess", "file_search", "jsonl"});
  r.string("path", c.path);
  r.string("eval_path", c.eval_path);
  r.choice("match", c.match);
  r.integer("min_digits", c.min_digits, 1, 9);
  r.integer("max_digits", c.max_digits, 1, 9);
  if (auto* n = r.string("operators", c.operators)) {
    bool ok = !c.operators.empty();
    for (char ch : c.operators)
      ok = ok && std::string_view{"+-*/"}.find(ch) != std::string_view::npos;
    if (!ok)
      r.error("operators", *n, fmt::format("\"{}\" must be a non-empty subset of \"+-*/\"",
                                           c.operators));
  }
  r.boolean("allow_negative", c.allow_negative);
  r.choice("wrong_answers", c.wrong_answers, {"near", "dropped_carry"});
  r.integer("lo", c.lo, std::numeric_limits<int64_t>::min() / 4, max_i64 / 4);
  r.integer("hi", c.hi, std::numeric_limits<int64_t>::min() / 4, max_i64 / 4);
  r.integer("max_turns", c.max_turns, 1, 1 << 16);
  r.integer("depth", c.depth, 1, 4);
  r.integer("max_dirs", c.max_dirs, 1, 8);
  r.integer("max_files", c.max_files, 1, 8);
  r.integer("max_episode_tokens", c.max_episode_tokens, 64, 1 << 30);
  r.number("detour_rate", c.detour_rate, 0.0, 1.0);
  r.choice("wrong_episodes", c.wrong_episodes, {"wander", "give_up"});
  r.number("wander_share", c.wander_share, 0.0, 1.0);
  r.integer("preamble_bytes", c.preamble_bytes, 0, 1 << 16);
  r.integer("preamble_families", c.preamble_families, 1, 1 << 16);
  r.number("eval_fraction", c.eval_fraction, 0.0, 0.99);
  r.integer("max_new_tokens", c.max_new_tokens, 1, 1 << 20);
  r.integer("eval_prompts", c.eval_prompts, 0, 1 << 24);
  r.string_list("reward_command", c.reward_command, true);
  r.integer("reward_timeout_ms", c.reward_timeout_ms, 1, 3'600'000);
  r.string("system_prompt", c.system_prompt);
  if (!c.reward_command.empty() && c.name != "jsonl")
    r.conflict("reward_command", fmt::format("a reward command scores task \"jsonl\"; task \"{}\" "
                                             "has its own verifier", c.name));
  if (!c.reward_command.empty())
    if (auto why = program_problem(c.reward_command.front()); !why.empty())
      r.conflict("reward_command", why);
  if (c.min_digits > c.max_digits)
    r.conflict("min_digits", fmt::format("min_digits = {} exceeds max_digits = {}", c.min_digits,
                                        c.max_digits));
  if (c.wander_share > 0.0 && c.wrong_episodes != "give_up")
    r.conflict("wander_share", fmt::format("wander_share = {} applies to wrong_episodes = \"give_up\"; "
                                          "with \"{}\" every wrong demonstration wanders",
                                          c.wander_share, c.wrong_episodes));
  if (c.lo > c.hi)
    r.conflict("lo", fmt::format("lo = {} exceeds hi = {}", c.lo, c.hi));
  if (c.name == "jsonl" && c.path.empty())
    r.missing("path", "task \"jsonl\" needs a path to a JSONL prompts file");
  c.path = resolve(base, c.path);
  c.eval_path = resolve(base, c.eval_path);
  for (auto [key, value] : {std::pair{"path", &c.path}, std::pair{"eval_path", &c.eval_path}})
    if (!value->empty())
      if (auto why = path_problem(*value, path_role::input_file); !why.empty())
        r.conflict(key, why);
}

void parse_sft(table_reader& r, sft_config& c, const std::string& base) {
  r.integer("steps", c.steps, 1, 100'000'000);
  r.integer("batch_size", c.batch_size, 1, 1 << 20);
  r.number("lr", c.lr, 0.0, 1.0, true);
  r.integer("warmup_steps", c.warmup_steps, 0, 100'000'000);
  r.number("wrong_fraction", c.wrong_fraction, 0.0, 1.0);
  r.integer("eval_count", c.eval_count, 0, 1 << 24);
  r.integer("group_by_length", c.group_by_length, 0, 1 << 16);
  r.string("init_checkpoint", c.init_checkpoint);
  c.init_checkpoint = resolve(base, c.init_checkpoint);
  // It may be written later (another config's warm start): only what could never be one is
  // refused now; run_sft names it if it is still missing then.
  if (!c.init_checkpoint.empty())
    if (auto why = path_problem(c.init_checkpoint, path_role::directory_to_make); !why.empty())
      r.conflict("init_checkpoint", why);
}

void parse_algorithm(table_reader& r, algorithm_config& c) {
  r.choice("name", c.name);
  r.integer("prompts_per_step", c.prompts_per_step, 1, 1 << 20);
  r.boolean("dynamic_sampling", c.dynamic_sampling);
  r.integer("max_refill_rounds", c.max_refill_rounds, 0, 1000);
  r.choice("overlong", c.overlong);
  r.integer("overlong_cache", c.overlong_cache, 1, 1 << 20);
  r.choice("on_reward_failure", c.on_reward_failure);
  r.integer("epochs", c.epochs, 1, 1000);
  r.integer("minibatches", c.minibatches, 1, 1 << 16);
  r.integer("micro_batch_tokens", c.micro_batch_tokens, 0, int64_t{1} << 40);
  r.number("lr", c.lr, 0.0, 1.0); // 0: a frozen policy (learner_options::lr)
  r.number("clip_eps_low", c.clip_eps_low, 0.0, 1.0);
  if (c.clip_eps_low >= 1.0) // the ratio floor 1 − ε_low must stay above 0
    r.conflict("clip_eps_low", fmt::format("{} is out of range [0, 1)", c.clip_eps_low));
  r.number("clip_eps_high", c.clip_eps_high, 0.0, 10.0);
  r.number("kl_coef", c.kl_coef, 0.0, 1e6);
  r.choice("loss_norm", c.loss_norm);
  r.boolean("scale_advantages", c.scale_advantages);
  r.number("max_grad_norm", c.max_grad_norm, 0.0, inf);
  r.number("weight_decay", c.weight_decay, 0.0, 1.0);
  if (c.lr * c.weight_decay >= 1.0) // decoupled decay multiplies weights by 1 − lr·λ
    r.conflict("weight_decay", fmt::format("lr × weight_decay = {} must be < 1 (it would zero "
                                           "the weights every update)",
                                           c.lr * c.weight_decay));
  r.number("temperature", c.temperature, 0.0, 100.0);
  // Below the floor the learner's fp32 log-probs of logits / T overflow
  // (runtime/ml/policy/sampler.hpp).
  if (c.temperature > 0.0 && c.temperature < ml::min_temperature)
    r.conflict("temperature", fmt::format("{} is out of range: 0 (greedy) or [{}, 100]; smaller "
                                          "temperatures overflow the learner's fp32 log-probs",
                                          c.temperature, ml::min_temperature));
  r.number("top_p", c.top_p, 0.0, 1.0);
  r.integer("top_k", c.top_k, 0, 1 << 30);
  r.choice("learner_weights", c.learner_weights);
  r.choice("old_logprobs", c.old_logprobs);
  r.number("tis_cap", c.tis_cap, 0.0, 1e6);
  if (c.tis_cap > 0.0 && c.tis_cap < 1.0)
    r.conflict("tis_cap", fmt::format("{} is out of range: 0 (off) or [1, 1e6]", c.tis_cap));
  if (c.tis_cap > 0.0 && c.old_logprobs == old_logprobs_kind::rollout)
    r.conflict("tis_cap", "truncated IS needs old_logprobs = \"recompute\" (with the rollout's "
                          "log-probs as pi_old every weight is 1)");
  r.number("mismatch_warn", c.mismatch_warn, 0.0, inf, true);
  // "dapo" means DAPO's defaults (Yu et al. 2025): clip-higher, dynamic sampling, soft
  // overlong punishment, token-level loss; any of them can still be set explicitly.
  if (c.name == algorithm_kind::dapo) {
    const auto& t = r.table();
    auto preset = [&](const char* key, auto& field, auto value) {
      if (t.contains(key))
        return;
      field = value;
      c.preset_keys.emplace_back(key);
    };
    preset("clip_eps_high", c.clip_eps_high, 0.28);
    preset("dynamic_sampling", c.dynamic_sampling, true);
    preset("overlong", c.overlong, overlong_kind::shape);
    preset("loss_norm", c.loss_norm, loss_norm_kind::token);
  }
}

void parse_sagc(table_reader& r, sagc_config& c) {
  r.choice("policy", c.policy);
  // A group of one has advantage 0 whatever its reward (GRPO compares siblings): no signal.
  r.integer("group_size", c.group_size, 2, 1 << 16);
  r.integer("g_min", c.g_min, 2, 1 << 16);
  r.integer("g_max", c.g_max, 2, 1 << 16);
  r.number("kappa", c.kappa, 1.0, 1e6);
  r.number("target_rate", c.target_rate, 0.0, 1.0);
  r.integer("window", c.window, 1, 1 << 24);
  r.number("v", c.v, 1e-9, 1e12);
  r.number("deadline_kappa", c.deadline_kappa, 1e-3, 1e6);
  if (c.g_min > c.g_max)
    r.conflict("g_min", fmt::format("g_min = {} exceeds g_max = {}", c.g_min, c.g_max));
  else if (c.policy != group_policy_kind::fixed &&
           (c.group_size < c.g_min || c.group_size > c.g_max))
    r.conflict("group_size", fmt::format("group_size = {} is outside [g_min, g_max] = [{}, {}]",
                                        c.group_size, c.g_min, c.g_max));
}

void parse_salt(table_reader& r, salt_config& c) {
  r.boolean("enabled", c.enabled);
  r.number("eta", c.eta, 0.0, 1.0, /*lo_open=*/true);
  r.number("beta", c.beta, 0.0, 1e6);
  r.number("c0", c.c0, 0.0, 1e6, /*lo_open=*/true);
  r.number("gamma_max", c.gamma_max, 1.0, 1e6);
  r.integer("layers", c.layers, -1, 1 << 16);
  r.choice("gram", c.gram);
}

void parse_sync(table_reader& r, sync_config& c) {
  r.choice("mode", c.mode);
  r.integer("bucket_bytes", c.bucket_bytes, 4096, 1ll << 29);
  r.integer("full_every", c.full_every, 0, 1 << 30);
}

void parse_rollout(table_reader& r, rollout_config& c) {
  r.integer("max_batch", c.max_batch, 1, 1 << 20);
  r.integer("chunk_tokens", c.chunk_tokens, 0, 1 << 20);
  r.integer("prefix_cache_bytes", c.prefix_cache_bytes, 0, 1ll << 40);
  r.choice("speculative", c.speculative, {"off", "on", "auto"});
  r.integer("draft_max_tokens", c.draft_max_tokens, 1, 256);
  r.number("draft_min_token_prob", c.draft_min_token_prob, 0.0, 1.0);
  r.number("draft_spec_factor", c.draft_spec_factor, 0.0, 64.0);
  r.integer("suffix_max_depth", c.suffix_max_depth, 2, 256);
  r.integer("suffix_global_bytes", c.suffix_global_bytes, 0, 1ll << 40);
  r.number("watchdog_s", c.watchdog_s, 0.0, 1e9, true);
  r.string("device", c.device);
  if (!c.device.empty())
    if (auto why = device_problem(c.device); !why.empty())
      r.conflict("device", why);
}

void parse_scheduler(table_reader& r, scheduler_config& c) {
  r.choice("policy", c.policy);
  r.number("imbalance_threshold", c.imbalance_threshold, 1.0, 1e6);
  r.number("cache_threshold", c.cache_threshold, 0.0, 1.0);
  r.number("cache_imbalance_threshold", c.cache_imbalance_threshold, 0.0, 1e6);
}

void parse_network(table_reader& r, network_config& c, const std::string& base) {
  r.integer("heartbeat_ms", c.heartbeat_ms, 0, 3'600'000);
  r.integer("connection_timeout_ms", c.connection_timeout_ms, 0, 3'600'000);
  r.integer("connect_timeout_ms", c.connect_timeout_ms, 0, 3'600'000);
  r.integer("join_timeout_ms", c.join_timeout_ms, 1, 86'400'000);
  r.integer("stop_grace_ms", c.stop_grace_ms, 1, 3'600'000);
  r.boolean("insecure", c.insecure);
  auto* cert = r.string("tls_certificate", c.tls_certificate);
  auto* key = r.string("tls_key", c.tls_key);
  auto* ca = r.string("tls_ca_file", c.tls_ca_file);
  r.string("tls_passphrase", c.tls_passphrase);
  if (c.heartbeat_ms > 0 && c.connection_timeout_ms > 0
      && c.connection_timeout_ms <= c.heartbeat_ms)
    r.conflict("connection_timeout_ms",
              fmt::format("connection_timeout_ms = {} must exceed heartbeat_ms = {}",
                          c.connection_timeout_ms, c.heartbeat_ms));
  // TLS needs all three files; each must exist now, not when the first peer connects.
  bool any = !c.tls_certificate.empty() || !c.tls_key.empty() || !c.tls_ca_file.empty();
  if (any) {
    struct item {
      const char* key;
      std::string* value;
      const toml::node* node;
    };
    for (auto [k, v, n] : {item{"tls_certificate", &c.tls_certificate, cert},
                           item{"tls_key", &c.tls_key, key},
                           item{"tls_ca_file", &c.tls_ca_file, ca}}) {
      if (v->empty()) {
        r.missing(k, "TLS needs tls_certificate, tls_key and tls_ca_file together");
        continue;
      }
      *v = resolve(base, *v);
      if (auto why = path_problem(*v, path_role::input_file); !why.empty() && n)
        r.error(k, *n, why);
    }
  }
}

void parse_smoke(table_reader& r, smoke_config& c) {
  r.integer("rounds", c.rounds, 1, 1 << 30);
  r.integer("interval_ms", c.interval_ms, 0, 3'600'000);
  r.integer("payload_bytes", c.payload_bytes, 0, 64 << 20);
}

bool valid_node_name(const std::string& s) {
  if (s.empty() || s.size() > 64)
    return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return false;
  return true;
}

void parse_role(const toml::node& n, const std::string& key, error_sink& sink,
                const std::set<std::string>& known_roles, node_config& node) {
  role_spec spec;
  spec.line = static_cast<int>(n.source().begin.line);
  const toml::node* name_node = &n;
  if (auto* s = n.as_string()) {
    spec.role = s->get();
  } else if (auto* t = n.as_table()) {
    table_reader r{*t, key, sink};
    name_node = r.string("role", spec.role);
    if (!r.table().contains("role"))
      r.missing("role", "an actor entry needs a role");
    r.integer("count", spec.count, 0, 4096);
    r.finish();
    if (!name_node)
      return;
  } else {
    sink.add(n.source(), key,
             fmt::format("expected a role name or {{ role = \"...\", count = N }}, got {}",
                         type_name(n)));
    return;
  }
  if (known_roles.count(spec.role) == 0) {
    std::string list;
    for (const auto& r : known_roles)
      list += (list.empty() ? "" : ", ") + r;
    sink.add(name_node->source(), key,
             fmt::format("unknown role \"{}\" (known roles: {}){}", spec.role, list,
                         value_hint(spec.role, {known_roles.begin(), known_roles.end()})));
    return;
  }
  node.actors.push_back(std::move(spec));
}

void parse_nodes(const toml::node* n, error_sink& sink, const std::set<std::string>& known_roles,
                 experiment_config& cfg) {
  if (!n)
    return;
  auto* arr = n->as_array();
  if (!arr || !arr->is_array_of_tables()) {
    sink.add(n->source(), "node", "expected [[node]] tables");
    return;
  }
  std::map<std::string, int> first_line;
  for (size_t i = 0; i < arr->size(); ++i) {
    const auto& tbl = *arr->get(i)->as_table();
    std::string prefix = fmt::format("node[{}]", i + 1);
    table_reader r{tbl, prefix, sink};
    node_config node;
    node.line = static_cast<int>(tbl.source().begin.line);
    auto* name_node = r.string("name", node.name);
    if (!tbl.contains("name")) {
      r.missing("name", "every [[node]] needs a name");
    } else if (name_node && !valid_node_name(node.name)) {
      r.error("name", *name_node,
              fmt::format("\"{}\" is not a valid node name (letters, digits, '-', '_', '.')",
                          node.name));
    } else if (name_node) {
      auto [it, fresh] = first_line.emplace(node.name, name_node->source().begin.line);
      if (!fresh)
        r.error("name", *name_node,
                fmt::format("duplicate node name \"{}\" (first defined on line {})", node.name,
                            it->second));
    }
    std::string listen;
    if (auto* ln = r.string("listen", listen)) {
      std::string why;
      if (auto ep = endpoint::parse(listen, &why))
        node.listen = *ep;
      else
        r.error("listen", *ln, fmt::format("\"{}\": {}", listen, why));
    }
    r.string("connect", node.connect);
    if (auto* an = r.find("actors")) {
      if (auto* list = an->as_array()) {
        for (size_t j = 0; j < list->size(); ++j)
          parse_role(*list->get(j), fmt::format("{}.actors[{}]", prefix, j + 1), sink,
                     known_roles, node);
      } else {
        r.wrong_type("actors", *an, "an array of roles");
      }
    }
    r.finish();
    cfg.nodes.push_back(std::move(node));
  }
}

/// Cross-node rules: one hub, resolvable connect targets, and no plaintext off loopback.
void check_topology(const toml::table& root, error_sink& sink, experiment_config& cfg) {
  auto node_src = [&](size_t i, std::string_view key) {
    auto* arr = root["node"].as_array();
    auto* tbl = arr->get(i)->as_table();
    if (auto* n = tbl->get(key))
      return n->source();
    return tbl->source();
  };
  if (cfg.nodes.empty())
    return;
  std::vector<size_t> hubs;
  for (size_t i = 0; i < cfg.nodes.size(); ++i)
    if (cfg.nodes[i].listen)
      hubs.push_back(i);
  if (hubs.size() > 1)
    sink.add(node_src(hubs[1], "listen"), fmt::format("node[{}].listen", hubs[1] + 1),
             fmt::format("only one node may listen (node \"{}\" already does)",
                         cfg.nodes[hubs[0]].name));
  if (cfg.nodes.size() > 1 && hubs.empty())
    sink.add(root["node"].node()->source(), "node",
             "a file with several nodes needs one node with `listen = \"host:port\"`");
  for (size_t i = 0; i < cfg.nodes.size(); ++i) {
    auto& n = cfg.nodes[i];
    if (!n.connect.empty()) {
      auto* target = cfg.find_node(n.connect);
      if (!target || !target->listen)
        sink.add(node_src(i, "connect"), fmt::format("node[{}].connect", i + 1),
                 fmt::format("\"{}\" is not a node with `listen`", n.connect));
    }
    if (n.listen)
      if (auto why = cfg.network.plaintext_refusal(*n.listen, "listen on"); !why.empty())
        sink.add(node_src(i, "listen"), fmt::format("node[{}].listen", i + 1), why);
  }
}

/// Everything after the TOML syntax: fills the structs from `root`, adding every problem to
/// `sink` (the caller throws).
experiment_config parse_root(const toml::table& root, error_sink& sink,
                             const std::set<std::string>& known_roles,
                             const std::string& base_dir) {
  experiment_config cfg;
  std::set<std::string> seen;
  auto section = [&](std::string_view name, auto&& fn) {
    seen.emplace(name);
    auto* n = root.get(name);
    if (!n)
      return;
    auto* t = n->as_table();
    if (!t) {
      sink.add(n->source(), std::string{name},
               fmt::format("expected a table [{}], got {}", name, type_name(*n)));
      return;
    }
    table_reader r{*t, std::string{name}, sink};
    fn(r);
    r.finish();
  };
  section("run", [&](table_reader& r) { parse_run(r, cfg.run); });
  section("model", [&](table_reader& r) { parse_model(r, cfg.model, base_dir); });
  section("task", [&](table_reader& r) { parse_task(r, cfg.task, base_dir); });
  section("sft", [&](table_reader& r) { parse_sft(r, cfg.sft, base_dir); });
  section("algorithm", [&](table_reader& r) { parse_algorithm(r, cfg.algorithm); });
  section("sagc", [&](table_reader& r) { parse_sagc(r, cfg.sagc); });
  section("salt", [&](table_reader& r) { parse_salt(r, cfg.salt); });
  section("sync", [&](table_reader& r) { parse_sync(r, cfg.sync); });
  section("rollout", [&](table_reader& r) { parse_rollout(r, cfg.rollout); });
  section("scheduler", [&](table_reader& r) { parse_scheduler(r, cfg.scheduler); });
  section("network", [&](table_reader& r) { parse_network(r, cfg.network, base_dir); });
  section("smoke", [&](table_reader& r) { parse_smoke(r, cfg.smoke); });
  // Keys of two sections that must agree.
  auto source_of = [&](const char* table, const char* key) {
    const auto* t = root.get(table) ? root.get(table)->as_table() : nullptr;
    const auto* n = t ? t->get(key) : nullptr;
    return n ? n->source() : root.source();
  };
  if (!cfg.model.hf_dir.empty() && (cfg.task.name == "number_guess" || cfg.task.name == "file_search"))
    sink.add(source_of("model", "hf_dir"), "model.hf_dir",
             fmt::format("a model from hf_dir trains single-turn tasks (jsonl, arithmetic); "
                         "task \"{}\" is multi-turn and speaks sorl's byte turn format",
                         cfg.task.name));
  if (cfg.model.hf_dir.empty() && !cfg.task.system_prompt.empty())
    sink.add(source_of("task", "system_prompt"), "task.system_prompt",
             "a system message needs a chat template: set model.hf_dir (sorl's byte presets "
             "have no system turn)");
  seen.emplace("node");
  if (sink.known)
    (*sink.known)[""].insert(seen.begin(), seen.end());
  parse_nodes(root.get("node"), sink, known_roles, cfg);
  for (auto&& [k, v] : root)
    if (seen.count(std::string{k.str()}) == 0)
      sink.add(k.source(), std::string{k.str()},
               "unknown section or key" + key_hint("", k.str()));
  if (sink.errors.empty()) {
    if (cfg.nodes.empty())
      sink.add(root.source(), "node", "the file defines no [[node]]: nothing would run");
    else
      check_topology(root, sink, cfg);
  }
  return cfg;
}

} // namespace

const std::map<std::string, std::set<std::string>>& known_config_keys() {
  // Read off the parser: every section empty, one [[node]] with one table entry in actors,
  // so each reader looks up each of its keys once. No path is set, so nothing touches disk.
  // A first pass over an empty file yields the section names.
  static const auto keys = [] {
    std::map<std::string, std::set<std::string>> known;
    error_sink sink{"<known keys>", {}, &known};
    parse_root(toml::table{}, sink, {}, ".");
    toml::table probe;
    for (const auto& name : known[""])
      if (name != "node")
        probe.insert(name, toml::table{});
    toml::table node;
    node.insert("actors", toml::array{toml::table{}});
    probe.insert("node", toml::array{std::move(node)});
    parse_root(probe, sink, {}, ".");
    return known;
  }();
  return keys;
}

const std::map<std::string, std::pair<std::string, std::string>>& peer_config_names() {
  static const std::map<std::string, std::pair<std::string, std::string>> names = {
    {"learning_rate", {"algorithm", "lr"}},
    {"num_generations", {"sagc", "group_size"}},
    {"n_samples_per_prompt", {"sagc", "group_size"}},
    {"rollout_n", {"sagc", "group_size"}},
    {"max_completion_length", {"task", "max_new_tokens"}},
    {"max_response_length", {"task", "max_new_tokens"}},
    {"generate_max_len", {"task", "max_new_tokens"}},
    {"beta", {"algorithm", "kl_coef"}},
    {"init_kl_coef", {"algorithm", "kl_coef"}},
    {"epsilon", {"algorithm", "clip_eps_low"}},
    {"clip_ratio_low", {"algorithm", "clip_eps_low"}},
    {"epsilon_high", {"algorithm", "clip_eps_high"}},
    {"clip_ratio_high", {"algorithm", "clip_eps_high"}},
    {"rollout_batch_size", {"algorithm", "prompts_per_step"}},
    {"num_iterations", {"algorithm", "epochs"}},
    {"ppo_epochs", {"algorithm", "epochs"}},
    {"max_steps", {"run", "steps"}},
    {"test_freq", {"run", "eval_every"}},
    {"eval_steps", {"run", "eval_every"}},
  };
  return names;
}

experiment_config parse_config(std::string_view text, const std::string& file,
                               const std::set<std::string>& known_roles,
                               const std::string& base_dir) {
  error_sink sink{file, {}};
  toml::table root;
  try {
    root = parse_toml(text, file);
  } catch (const toml::parse_error& e) {
    sink.add(e.source(), "", fmt::format("TOML syntax error: {}", e.description()));
    throw config_exception(std::move(sink.errors));
  }
  auto cfg = parse_root(root, sink, known_roles, base_dir);
  cfg.file = file;
  if (!sink.errors.empty())
    throw config_exception(std::move(sink.errors));
  return cfg;
}

experiment_config load_config(const std::string& path,
                              const std::set<std::string>& known_roles) {
  auto why = path_problem(path, path_role::input_file);
  std::ifstream in;
  if (why.empty())
    in.open(path, std::ios::binary);
  if (!why.empty() || !in)
    throw config_exception({config_error{
      path, 0, 0, "", "cannot open the file" + (why.empty() ? std::string{} : ": " + why)}});
  std::ostringstream text;
  text << in.rdbuf();
  auto base = std::filesystem::path{path}.parent_path().string();
  if (base.empty())
    base = ".";
  return parse_config(text.str(), path, known_roles, base);
}

} // namespace sorl
