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

std::string toml_quoted(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\')
      out += {'\\', ch};
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\u{:04X}", c);
    else
      out += ch;
  }
  return out + "\"";
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
  /// When set, every reader call records the key it reads, as it reads and checks it, under
  /// its table's kind (see table_kind): how config_keys() learns the keys from the parser.
  std::vector<config_key>* schema = nullptr;

  void add(const toml::source_region& where, std::string key, std::string message) {
    // A value a `--set` override put in carries the override as its source path: the error
    // names the override, whose line and column in its one-line document mean nothing.
    if (where.path && where.path->rfind(override_prefix, 0) == 0) {
      errors.push_back(config_error{*where.path, 0, 0, std::move(key), std::move(message)});
      return;
    }
    errors.push_back(config_error{file, static_cast<int>(where.begin.line),
                                  static_cast<int>(where.begin.column), std::move(key),
                                  std::move(message)});
  }

  /// How an override is named in errors and source regions: "--set TABLE.KEY=VALUE".
  static constexpr std::string_view override_prefix = "--set ";
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

/// The reference text of a key, written as the last argument of the reader call that parses
/// it, so that the key's meaning sits beside the code that reads and checks it. A key with no
/// default (its absence means something, or the file must set it) gives an example value.
struct key_doc {
  key_doc(const char* meaning) : meaning(meaning) {
  }
  key_doc(const char* meaning, const char* example, bool required)
    : meaning(meaning), example(example), required(required) {
  }
  std::string_view meaning;
  std::string_view example; ///< TOML text; "" = the key has a default
  bool required = false;
};

/// Records a top-level entry (a section or `node`) in the reference probe.
void describe_top(error_sink& sink, std::string_view name, config_type type, const key_doc& doc) {
  if (!sink.schema)
    return;
  config_key k;
  k.key = std::string{name};
  k.type = type;
  k.meaning = std::string{doc.meaning};
  sink.schema->push_back(std::move(k));
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

  /// A key read by hand (an array of tables, a list of mixed entries): its caller says what
  /// it holds, for the reference.
  const toml::node* find(std::string_view key, config_type type, const key_doc& doc,
                         config_value default_value = {}) {
    describe(key, type, doc, [&](config_key& k) { k.default_value = std::move(default_value); });
    return lookup(key);
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
  void integer(std::string_view key, Int& out, int64_t lo, int64_t hi, const key_doc& doc) {
    describe(key, config_type::integer, doc, [&](config_key& k) {
      k.default_value = static_cast<int64_t>(out);
      k.lo = lo;
      k.hi = hi;
    });
    auto* n = lookup(key);
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

  void number(std::string_view key, double& out, double lo, double hi, const key_doc& doc) {
    number(key, out, lo, hi, false, doc);
  }

  void number(std::string_view key, double& out, double lo, double hi, bool lo_open,
              const key_doc& doc) {
    describe(key, config_type::number, doc, [&](config_key& k) {
      k.default_value = out;
      k.lo = lo;
      k.hi = hi;
      k.lo_open = lo_open;
    });
    auto* n = lookup(key);
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

  void boolean(std::string_view key, bool& out, const key_doc& doc) {
    describe(key, config_type::boolean, doc, [&](config_key& k) { k.default_value = out; });
    auto* n = lookup(key);
    if (!n)
      return;
    if (auto* b = n->as_boolean())
      out = b->get();
    else
      wrong_type(key, *n, "a boolean (true or false)");
  }

  /// Returns the node too, so callers can validate the string's content at its location.
  const toml::node* string(std::string_view key, std::string& out, const key_doc& doc) {
    describe(key, config_type::string, doc, [&](config_key& k) { k.default_value = out; });
    return read_string(key, out);
  }

  const toml::node* read_string(std::string_view key, std::string& out) {
    auto* n = lookup(key);
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
  const toml::node* string_list(std::string_view key, std::vector<std::string>& out, bool non_empty,
                                const key_doc& doc) {
    describe(key, config_type::string_list, doc, [&](config_key& k) { k.default_value = out; });
    auto* n = lookup(key);
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
              std::initializer_list<std::string_view> allowed, const key_doc& doc) {
    describe(key, config_type::choice, doc, [&](config_key& k) {
      k.default_value = out;
      k.choices.assign(allowed.begin(), allowed.end());
    });
    std::string value;
    auto* n = read_string(key, value);
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
  void choice(std::string_view key, E& out, const key_doc& doc) {
    describe(key, config_type::choice, doc, [&](config_key& k) {
      k.default_value = std::string{to_string(out)};
      for (const auto& item : config_names<E>::values)
        k.choices.emplace_back(item.second);
    });
    std::string value;
    auto* n = read_string(key, value);
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
  const toml::node* lookup(std::string_view key) {
    seen_.emplace(key);
    return tbl_.get(key);
  }

  /// In the reference probe, records `key` as its reader call describes it; `fill` adds what
  /// only that reader knows (default, bounds, choices). Nothing otherwise.
  template <class Fill>
  void describe(std::string_view key, config_type type, const key_doc& doc, Fill&& fill) {
    if (!sink_.schema)
      return;
    config_key k;
    k.table = table_kind(prefix_);
    k.key = std::string{key};
    k.type = type;
    k.meaning = std::string{doc.meaning};
    k.example = std::string{doc.example};
    k.required = doc.required;
    fill(k);
    if (!k.example.empty())
      k.default_value = std::monostate{};
    sink_.schema->push_back(std::move(k));
  }

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
  r.string("name", c.name,
           "run name: the run writes to output_dir/name (metrics.jsonl, checkpoints/, plots/)");
  r.integer("seed", c.seed, 0, max_i64,
            "seed of the run's random streams: initial weights, prompt draws, each group's "
            "sampler");
  r.integer("steps", c.steps, 0, 100'000'000, "synchronous RL steps to run");
  r.string("output_dir", c.output_dir,
           "directory of run directories, relative to the working directory");
  r.integer("checkpoint_every", c.checkpoint_every, 0, 100'000'000,
            "steps between checkpoints; 0 = only at the end");
  r.integer("eval_every", c.eval_every, 0, 100'000'000,
            "steps between greedy held-out evaluations on task.eval_prompts prompts; 0 = only "
            "before the first step and after the last");
  r.number("stop_at_accuracy", c.stop_at_accuracy, 0.0, 1.0,
           "end the run early after the first held-out evaluation (every eval_every steps) whose "
           "greedy accuracy is >= this: it checkpoints and stops as if run.steps ended there; "
           "0 = never");
  r.integer("threads", c.threads, 0, 1024,
            "libtorch intra-op threads per process; 0 = libtorch's default (one per core)");
  r.choice("kernels", c.kernels,
           "CPU kernels: \"native\" = each library's fastest for this CPU; \"portable\" = AVX2 "
           "kernels, the same bits on any x86-64 CPU with AVX2 and FMA");
  r.string("device", c.device,
           "libtorch device of the learner, and of the rollout workers unless rollout.device "
           "names one: \"cpu\", \"cuda\" or \"cuda:N\"");
  if (auto why = device_problem(c.device); !why.empty())
    r.conflict("device", why);
  // The run directory is made when the run starts; refuse now what could never be made.
  if (auto why = path_problem(c.output_dir, path_role::directory_to_make); !why.empty())
    r.conflict("output_dir", why);
  else if (auto why = path_problem(c.run_dir(), path_role::directory_to_make); !why.empty())
    r.conflict("name", why);
}

void parse_model(table_reader& r, model_config& c, const std::string& base) {
  r.choice("preset", c.preset, {"tiny", "tiny-2k", "50m"},
           "built-in model shape: tiny-2k is tiny with a 2048-token context; not with hf_dir");
  r.string("checkpoint", c.checkpoint,
           "checkpoint root (a directory of step-N checkpoints) to start from, relative to the "
           "config file; \"\" = random init from the preset");
  c.checkpoint = resolve(base, c.checkpoint);
  if (!c.checkpoint.empty())
    if (auto why = path_problem(c.checkpoint, path_role::directory_to_make); !why.empty())
      r.conflict("checkpoint", why);
  r.boolean("warm_start", c.warm_start,
            "when checkpoint holds no checkpoint yet, make it with the supervised warm start "
            "([sft]) first");
  r.choice("rollout_dtype", c.rollout_dtype, {"bf16", "fp32"},
           "dtype of the rollout workers' weights; \"fp32\" is refused as not implemented yet");
  not_yet(r, "rollout_dtype", c.rollout_dtype != "bf16", "rollout_dtype \"fp32\"");
  if (c.warm_start && c.checkpoint.empty())
    r.missing("checkpoint", "warm_start = true needs a checkpoint directory to create");
  r.string("hf_dir", c.hf_dir,
           "Hugging Face model directory to start from instead of a preset (shape, weights, "
           "tokenizer, chat template), relative to the config file; single-turn tasks only");
  c.hf_dir = resolve(base, c.hf_dir);
  r.integer("max_seq", c.max_seq, 0, int64_t{1} << 20,
            "with hf_dir: longest prompt + response, tokens; 0 = the model's "
            "max_position_embeddings, at most 32768");
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
  r.choice("name", c.name, {"arithmetic", "number_guess", "file_search", "jsonl"},
           "the task: arithmetic, number_guess (multi-turn), file_search (a multi-turn agent) or "
           "jsonl (prompts from path)");
  r.string("path", c.path,
           "jsonl: the prompts file, one {\"prompt\", \"answer\"} object per line, relative to "
           "the config file; required by name = \"jsonl\"");
  r.string("eval_path", c.eval_path,
           "jsonl: a held-out prompts file, relative to the config file; \"\" = hold out "
           "eval_fraction of path's prompts");
  r.choice("match", c.match,
           "jsonl: how a completion is scored against answer (reasoning-gym's rules, on the last "
           "<answer> tag when there is one; last_number reads the answer's last number, for "
           "responses that reason before they answer)");
  r.integer("min_digits", c.min_digits, 1, 9, "arithmetic: fewest digits of an operand");
  r.integer("max_digits", c.max_digits, 1, 9, "arithmetic: most digits of an operand");
  if (auto* n = r.string("operators", c.operators,
                         "arithmetic: the operators drawn, a non-empty subset of \"+-*/\"")) {
    bool ok = !c.operators.empty();
    for (char ch : c.operators)
      ok = ok && std::string_view{"+-*/"}.find(ch) != std::string_view::npos;
    if (!ok)
      r.error("operators", *n, fmt::format("\"{}\" must be a non-empty subset of \"+-*/\"",
                                           c.operators));
  }
  r.boolean("allow_negative", c.allow_negative,
            "arithmetic: whether a - b may be negative (false orders the operands)");
  r.choice("wrong_answers", c.wrong_answers, {"near", "dropped_carry"},
           "arithmetic: the warm start's wrong demonstrations: near = the result off by 1..10, "
           "dropped_carry = carries dropped");
  r.integer("lo", c.lo, std::numeric_limits<int64_t>::min() / 4, max_i64 / 4,
            "number_guess: smallest hidden number");
  r.integer("hi", c.hi, std::numeric_limits<int64_t>::min() / 4, max_i64 / 4,
            "number_guess: largest hidden number");
  r.integer("max_turns", c.max_turns, 1, 1 << 16, "number_guess, file_search: actions per episode");
  r.integer("depth", c.depth, 1, 4,
            "file_search: directory levels below \"/\", the key at the deepest");
  r.integer("max_dirs", c.max_dirs, 1, 8, "file_search: most subdirectories per directory");
  r.integer("max_files", c.max_files, 1, 8, "file_search: most files per directory");
  r.integer("max_episode_tokens", c.max_episode_tokens, 64, 1 << 30,
            "file_search: transcript budget per episode, tokens; keep it at most model.max_seq "
            "minus max_new_tokens");
  r.number("detour_rate", c.detour_rate, 0.0, 1.0,
           "file_search: the warm-start expert's probability of a detour per action");
  r.choice("wrong_episodes", c.wrong_episodes, {"wander", "give_up"},
           "file_search: the warm start's wrong demonstrations: wander = ignore the tree, "
           "give_up = answer \"not found\" after the first deepest directory searched in vain");
  r.number("wander_share", c.wander_share, 0.0, 1.0,
           "file_search with wrong_episodes = \"give_up\": share of the wrong demonstrations "
           "that wander instead; 0 with \"wander\"");
  r.integer("preamble_bytes", c.preamble_bytes, 0, 1 << 16,
            "file_search: bytes of documentation opening each episode's first observation; 0 = "
            "none");
  r.integer("preamble_families", c.preamble_families, 1, 1 << 16,
            "file_search: distinct preamble texts; each episode's seed picks one");
  r.number("eval_fraction", c.eval_fraction, 0.0, 0.99,
           "share of the problem space (of path's prompts for jsonl) held out for evaluation");
  r.integer("max_new_tokens", c.max_new_tokens, 1, 1 << 20, "generation budget per turn, tokens");
  r.integer("eval_prompts", c.eval_prompts, 0, 1 << 24,
            "held-out prompts in each greedy evaluation");
  r.string_list("reward_command", c.reward_command, true,
                "jsonl: argv of a scorer process that rewards completions instead of match, run "
                "from sorl's working directory (runtime/ml/tasks/reward_process.hpp); [] = off");
  r.integer("reward_timeout_ms", c.reward_timeout_ms, 1, 3'600'000,
            "budget of one reward_command scoring call, ms");
  r.string("system_prompt", c.system_prompt,
           "with model.hf_dir: a system message before every prompt; \"\" = none");
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
  r.integer("steps", c.steps, 1, 100'000'000, "optimizer steps of the warm start");
  r.integer("batch_size", c.batch_size, 1, 1 << 20, "demonstrations per step");
  r.number("lr", c.lr, 0.0, 1.0, true,
           "AdamW learning rate after the warmup (cosine decay follows)");
  r.integer("warmup_steps", c.warmup_steps, 0, 100'000'000, "steps of linear learning-rate warmup");
  r.number("wrong_fraction", c.wrong_fraction, 0.0, 1.0,
           "share of deliberately wrong demonstrations");
  r.integer("eval_count", c.eval_count, 0, 1 << 24,
            "held-out prompts evaluated greedily before and after");
  r.integer("group_by_length", c.group_by_length, 0, 1 << 16,
            "batches of similar lengths from sorted windows of this many batches; 0 = off");
  r.string("init_checkpoint", c.init_checkpoint,
           "checkpoint root whose latest weights the warm start starts from (the optimizer "
           "starts fresh), relative to the config file; \"\" = fresh weights");
  c.init_checkpoint = resolve(base, c.init_checkpoint);
  // It may be written later (another config's warm start): only what could never be one is
  // refused now; run_sft names it if it is still missing then.
  if (!c.init_checkpoint.empty())
    if (auto why = path_problem(c.init_checkpoint, path_role::directory_to_make); !why.empty())
      r.conflict("init_checkpoint", why);
}

void parse_algorithm(table_reader& r, algorithm_config& c) {
  r.choice("name", c.name,
           "the algorithm; dapo changes the defaults of clip_eps_high (0.28), dynamic_sampling "
           "(true), overlong (shape) and loss_norm (token) for keys the file does not set");
  r.integer("prompts_per_step", c.prompts_per_step, 1, 1 << 20,
            "prompts per step (B), each sampled as a group of sagc.group_size rollouts");
  r.boolean("dynamic_sampling", c.dynamic_sampling,
            "DAPO: drop groups whose rewards are all equal (no signal) and refill the batch");
  r.integer("max_refill_rounds", c.max_refill_rounds, 0, 1000,
            "dynamic sampling: most refill rounds per step");
  r.choice("overlong", c.overlong,
           "truncated responses: none = trained as they are, filter = masked from the loss, "
           "shape = DAPO's soft overlong punishment");
  r.integer("overlong_cache", c.overlong_cache, 1, 1 << 20,
            "soft overlong punishment interval before max_new_tokens, tokens (per turn)");
  r.choice("on_reward_failure", c.on_reward_failure,
           "a rollout whose reward failed (the scorer threw, NaN or inf): mask = left out of its "
           "group and the loss, fail = stop the job");
  r.integer("epochs", c.epochs, 1, 1000, "passes over the batch per step");
  r.integer("minibatches", c.minibatches, 1, 1 << 16, "optimizer steps per pass");
  r.boolean("group_minibatches", c.group_minibatches,
            "minibatches hold whole groups (shuffled and split by group, veRL's split by "
            "prompt), so a group's advantages sum to 0 in its minibatch; false = single "
            "rollouts are shuffled and split");
  r.integer("micro_batch_tokens", c.micro_batch_tokens, 0, int64_t{1} << 40,
            "bound on one learner forward, padded tokens (rows x longest row); 0 = none");
  r.number("lr", c.lr, 0.0, 1.0,
           "AdamW learning rate; 0 = a frozen policy (a baseline on the same prompts and seeds)");
  r.number("clip_eps_low", c.clip_eps_low, 0.0, 1.0,
           "PPO clip: the importance ratio's floor is 1 - clip_eps_low; below 1");
  if (c.clip_eps_low >= 1.0) // the ratio floor 1 − ε_low must stay above 0
    r.conflict("clip_eps_low", fmt::format("{} is out of range [0, 1)", c.clip_eps_low));
  r.number("clip_eps_high", c.clip_eps_high, 0.0, 10.0,
           "PPO clip: the importance ratio's ceiling is 1 + clip_eps_high (DAPO's clip-higher: "
           "0.28)");
  r.number("kl_coef", c.kl_coef, 0.0, 1e6,
           "weight of the KL penalty against the reference model; 0 = no reference model");
  r.choice("loss_norm", c.loss_norm,
           "loss normalisation: token = mean over the batch's tokens, sequence = mean per "
           "sequence, then over sequences");
  r.boolean("scale_advantages", c.scale_advantages,
            "divide advantages by the group's standard deviation (false = Dr. GRPO)");
  r.number("max_grad_norm", c.max_grad_norm, 0.0, inf,
           "clip the global L2 gradient norm to this; 0 = no clipping");
  r.number("weight_decay", c.weight_decay, 0.0, 1.0,
           "AdamW decoupled weight decay; lr x weight_decay must stay below 1");
  if (c.lr * c.weight_decay >= 1.0) // decoupled decay multiplies weights by 1 − lr·λ
    r.conflict("weight_decay", fmt::format("lr × weight_decay = {} must be < 1 (it would zero "
                                           "the weights every update)",
                                           c.lr * c.weight_decay));
  r.number("temperature", c.temperature, 0.0, 100.0,
           "sampling temperature; 0 = greedy, else at least 0.01");
  // Below the floor the learner's fp32 log-probs of logits / T overflow
  // (runtime/ml/policy/sampler.hpp).
  if (c.temperature > 0.0 && c.temperature < ml::min_temperature)
    r.conflict("temperature", fmt::format("{} is out of range: 0 (greedy) or [{}, 100]; smaller "
                                          "temperatures overflow the learner's fp32 log-probs",
                                          c.temperature, ml::min_temperature));
  r.number("top_p", c.top_p, 0.0, 1.0, "nucleus sampling mass; 1 = off");
  r.integer("top_k", c.top_k, 0, 1 << 30, "sample among the k most likely tokens; 0 = off");
  r.choice("learner_weights", c.learner_weights,
           "weights the learner's forward sees: bf16 = the rollouts' image of the fp32 master "
           "(exactly on-policy), fp32 = the master, to measure the drift");
  r.choice("old_logprobs", c.old_logprobs,
           "pi_old of the importance ratio: recompute = a no-grad learner forward "
           "(bit-reproducible), rollout = the workers' sampling log-probs");
  r.number("tis_cap", c.tis_cap, 0.0, 1e6,
           "truncated importance sampling: cap on pi_old / pi_rollout per token; 0 = off, else "
           "at least 1; needs old_logprobs = \"recompute\"");
  if (c.tis_cap > 0.0 && c.tis_cap < 1.0)
    r.conflict("tis_cap", fmt::format("{} is out of range: 0 (off) or [1, 1e6]", c.tis_cap));
  if (c.tis_cap > 0.0 && c.old_logprobs == old_logprobs_kind::rollout)
    r.conflict("tis_cap", "truncated IS needs old_logprobs = \"recompute\" (with the rollout's "
                          "log-probs as pi_old every weight is 1)");
  r.number("mismatch_warn", c.mismatch_warn, 0.0, inf, true,
           "warn when a step's mean |learner - rollout log-prob| exceeds this, nats");
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
  r.choice("policy", c.policy,
           "group-size policy: static = group_size always, sagc = straggler-aware "
           "drift-plus-penalty, deadline = a rollout time budget");
  // A group of one has advantage 0 whatever its reward (GRPO compares siblings): no signal.
  r.integer("group_size", c.group_size, 2, 1 << 16,
            "rollouts per prompt (G) of the static policy and of the first step");
  r.integer("g_min", c.g_min, 2, 1 << 16,
            "smallest group size the sagc and deadline policies choose");
  r.integer("g_max", c.g_max, 2, 1 << 16,
            "largest group size the sagc and deadline policies choose");
  r.choice("straggler_rule", c.straggler_rule,
           "what makes a rollout a straggler: wall_clock = its duration exceeds kappa x the "
           "median of the last `window` durations, across steps; group_tokens = its response "
           "tokens exceed kappa x its own group's median, and events are counted per group "
           "(independent of load and of the prompts per step)");
  r.number("kappa", c.kappa, 1.0, 1e6,
           "a rollout is a straggler when it exceeds kappa x the median that straggler_rule "
           "names");
  r.number("target_rate", c.target_rate, 0.0, 1.0,
           "epsilon: the long-run share of groups (group_tokens) or of steps (wall_clock) with "
           "a straggler event that sagc holds");
  r.integer("window", c.window, 1, 1 << 24, "rollouts in the running duration statistic");
  r.number("v", c.v, 1e-9, 1e12, "sagc: penalty weight V of drift-plus-penalty");
  r.number("deadline_kappa", c.deadline_kappa, 1e-3, 1e6,
           "deadline: rollout budget = deadline_kappa x the window's median duration");
  if (c.g_min > c.g_max)
    r.conflict("g_min", fmt::format("g_min = {} exceeds g_max = {}", c.g_min, c.g_max));
  else if (c.policy != group_policy_kind::fixed &&
           (c.group_size < c.g_min || c.group_size > c.g_max))
    r.conflict("group_size", fmt::format("group_size = {} is outside [g_min, g_max] = [{}, {}]",
                                        c.group_size, c.g_min, c.g_max));
}

void parse_salt(table_reader& r, salt_config& c) {
  r.boolean("enabled", c.enabled,
            "reweight each minibatch's advantages from its rollouts' gradient geometry (off = "
            "plain GRPO / DAPO)");
  r.number("eta", c.eta, 0.0, 1.0, /*lo_open=*/true,
           "energy share of the dominant (shared) subspace");
  r.number("beta", c.beta, 0.0, 1e6, "amplification slope of the residual channel");
  r.number("c0", c.c0, 0.0, 1e6, /*lo_open=*/true,
           "cancellation below which the residual channel is amplified");
  r.number("gamma_max", c.gamma_max, 1.0, 1e6, "bound on the amplification gamma");
  r.integer("layers", c.layers, -1, 1 << 16,
            "last decoder layers whose linear layers enter the Gram matrix besides the LM head; "
            "0 = the LM head only, -1 = all");
  r.choice("gram", c.gram,
           "how the gradient Gram matrix is computed: ghost = from activations and output "
           "gradients, materialized = per-rollout gradients, auto = the cheaper per layer");
}

void parse_sync(table_reader& r, sync_config& c) {
  r.choice("mode", c.mode,
           "sparse = bit-exact bf16 deltas against the last acknowledged version, full = all "
           "weights every version");
  r.integer("bucket_bytes", c.bucket_bytes, 4096, 1ll << 29,
            "bytes per sync bucket (an envelope holds at most 1 GiB)");
  r.integer("full_every", c.full_every, 0, 1 << 30,
            "a full anchor every N versions; 0 = only when a worker needs one");
}

void parse_rollout(table_reader& r, rollout_config& c) {
  r.integer("max_batch", c.max_batch, 1, 1 << 20, "sequences decoded together per worker");
  r.integer("chunk_tokens", c.chunk_tokens, 0, 1 << 20,
            "a timing chunk message every N generated tokens; 0 = off");
  r.integer("prefix_cache_bytes", c.prefix_cache_bytes, 0, 1ll << 40,
            "prefix KV cache per worker, bytes of fp32 KV (16-token blocks, least recently used "
            "evicted first); 0 = off");
  r.choice("speculative", c.speculative, {"off", "on", "auto"},
           "suffix speculative decoding: on = drafts of up to draft_max_tokens, auto = per batch "
           "size whichever measures fastest; the same tokens either way");
  r.integer("draft_max_tokens", c.draft_max_tokens, 1, 256,
            "longest draft per sample and step, tokens");
  r.number("draft_min_token_prob", c.draft_min_token_prob, 0.0, 1.0,
           "a draft stops where the product of its tokens' suffix-tree frequencies falls below "
           "this");
  r.number("draft_spec_factor", c.draft_spec_factor, 0.0, 64.0,
           "a suffix match of m tokens allows drafts of floor(m x draft_spec_factor) tokens");
  r.integer("suffix_max_depth", c.suffix_max_depth, 2, 256,
            "longest indexed substring of the suffix trees, tokens");
  r.integer("suffix_global_bytes", c.suffix_global_bytes, 0, 1ll << 40,
            "bound on the global suffix tree of finished responses, bytes; 0 = group trees only");
  r.number("watchdog_s", c.watchdog_s, 0.0, 1e9, true,
           "longest the trainer waits for the next finished rollout before it fails the job "
           "naming what is missing, s");
  r.string("device", c.device,
           "the rollout workers' device, spelled as run.device; \"\" = run.device");
  if (!c.device.empty())
    if (auto why = device_problem(c.device); !why.empty())
      r.conflict("device", why);
}

void parse_scheduler(table_reader& r, scheduler_config& c) {
  r.choice("policy", c.policy,
           "placement of rollout requests on workers (sglang_cache_aware: SGLang router's rule, "
           "a baseline)");
  r.number("imbalance_threshold", c.imbalance_threshold, 1.0, 1e6,
           "load difference, requests, past which group affinity yields to the least loaded "
           "worker");
  r.number("cache_threshold", c.cache_threshold, 0.0, 1.0,
           "cache_aware: least share of a prompt its estimated cached prefix on a worker must "
           "cover to decide the placement");
  r.number("cache_imbalance_threshold", c.cache_imbalance_threshold, 0.0, 1e6,
           "cache_aware: load difference, requests, past which the cached prefix yields to the "
           "least loaded worker");
}

void parse_network(table_reader& r, network_config& c, const std::string& base) {
  r.integer("heartbeat_ms", c.heartbeat_ms, 0, 3'600'000,
            "heartbeat period between nodes, ms; 0 = none");
  r.integer("connection_timeout_ms", c.connection_timeout_ms, 0, 3'600'000,
            "a node silent this long is declared down, ms (more than heartbeat_ms); 0 = never");
  r.integer("connect_timeout_ms", c.connect_timeout_ms, 0, 3'600'000,
            "how long a connecting node retries reaching the hub, ms");
  r.integer("join_timeout_ms", c.join_timeout_ms, 1, 86'400'000,
            "how long the hub waits for every node to join, ms");
  r.integer("stop_grace_ms", c.stop_grace_ms, 1, 3'600'000,
            "once the job has ended, how long the hub waits for every actor to stop, ms");
  r.boolean("insecure", c.insecure,
            "allow listening on and connecting to non-loopback addresses without TLS");
  auto* cert = r.string("tls_certificate", c.tls_certificate,
                        "PEM certificate of this node, relative to the config file; \"\" = no TLS");
  auto* key = r.string("tls_key", c.tls_key,
                       "PEM private key of tls_certificate, relative to the config file");
  auto* ca = r.string("tls_ca_file", c.tls_ca_file,
                      "PEM CA certificate the peers' certificates must chain to, relative to the "
                      "config file");
  r.string("tls_passphrase", c.tls_passphrase,
           "passphrase of tls_key; \"\" = none (never copied into config.resolved.toml)");
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
  r.integer("rounds", c.rounds, 1, 1 << 30, "ping-pong round trips");
  r.integer("interval_ms", c.interval_ms, 0, 3'600'000, "pause between rounds, ms");
  r.integer("payload_bytes", c.payload_bytes, 0, 64 << 20, "filler carried by each ping, bytes");
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
    name_node = r.string("role", spec.role,
                         {"role name (`sorl roles` lists them)", "\"rollout_worker\"", true});
    if (!r.table().contains("role"))
      r.missing("role", "an actor entry needs a role");
    r.integer("count", spec.count, 0, 4096, "actors of this role on the node");
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
    auto* name_node = r.string("name", node.name,
                               {"node name, unique in the file: letters, digits, '-', '_', '.'",
                                "\"main\"", true});
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
    if (auto* ln = r.string("listen", listen,
                            {"host:port the hub listens on (port 0 = any free port); exactly one "
                             "node listens when there are several", "\"127.0.0.1:4242\"", false})) {
      std::string why;
      if (auto ep = endpoint::parse(listen, &why))
        node.listen = *ep;
      else
        r.error("listen", *ln, fmt::format("\"{}\": {}", listen, why));
    }
    r.string("connect", node.connect,
             "name of the node to connect to; \"\" = the only node with listen");
    if (auto* an = r.find("actors", config_type::role_list,
                          "roles this node runs: role names or { role = \"...\", count = N } "
                          "entries (`sorl roles` lists the roles)",
                          std::vector<std::string>{})) {
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

bool is_bare_key(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

/// The one-key document `head` + `key = value` parsed with `label` as its source path, so
/// every node in it names the override. A value that is not TOML is read again as a string
/// when it is a bare word (it does not start as a string, array or inline table would).
/// Throws std::invalid_argument saying why when it is neither, or when more TOML follows it.
toml::table override_document(const std::string& head, const std::string& key,
                              const std::string& value, const std::string& label) {
  auto parse = [&](const std::string& v) {
    auto doc = parse_toml(head + key + " = " + v + "\n", label);
    const toml::table* inner = &doc;
    if (!head.empty())
      inner = doc.size() == 1 ? doc.begin()->second.as_table() : nullptr;
    if (doc.size() != 1 || !inner || inner->size() != 1)
      throw std::invalid_argument("more TOML follows the value; give one value");
    return doc;
  };
  try {
    return parse(value);
  } catch (const toml::parse_error& e) {
    const auto first = value.find_first_not_of(" \t");
    if (first != std::string::npos
        && std::string_view{"\"'[{"}.find(value[first]) != std::string_view::npos)
      throw std::invalid_argument(
        fmt::format("{} is not a TOML value: {}", value, e.description()));
    return parse(toml_quoted(value));
  }
}

/// The names of the [[node]] tables of `root`, for an override's error message.
std::vector<std::string> node_names(const toml::array* nodes) {
  std::vector<std::string> names;
  if (nodes)
    for (const auto& n : *nodes)
      if (auto* t = n.as_table())
        if (auto* name = t->get_as<std::string>("name"))
          names.push_back(name->get());
  return names;
}

/// Puts each `--set` override into `root` (parse_config): a malformed one is an error naming
/// it, and the others still apply. A value's node carries the override as its source path
/// (error_sink::add), and so does the key it adds.
void apply_overrides(toml::table& root, const std::vector<std::string>& overrides,
                     error_sink& sink, const std::string& file) {
  for (const auto& text : overrides) {
    const std::string label = std::string{error_sink::override_prefix} + text;
    const toml::source_region where{{1, 1}, {1, 1}, std::make_shared<const std::string>(label)};
    const auto eq = text.find('=');
    const std::string path = text.substr(0, eq);
    auto fail = [&](std::string message) { sink.add(where, path, std::move(message)); };
    std::vector<std::string> parts;
    for (size_t from = 0;;) {
      const auto dot = path.find('.', from);
      parts.push_back(path.substr(from, dot - from));
      if (dot == std::string::npos)
        break;
      from = dot + 1;
    }
    const bool node = parts.front() == "node";
    if (eq == std::string::npos || parts.size() < 2 || (!node && parts.size() != 2)
        || !is_bare_key(parts.front()) || !is_bare_key(parts.back())) {
      fail("expected TABLE.KEY=VALUE (or node.NAME.KEY=VALUE), e.g. --set run.steps=20");
      continue;
    }
    const std::string& key = parts.back();
    const std::string value = text.substr(eq + 1);
    toml::table* target = nullptr;
    std::string head;
    if (node) {
      // A node is named by its `name`, which may hold dots: all between "node." and ".KEY".
      if (parts.size() < 3) {
        fail("[[node]] is an array of tables: set a key of one node as node.NAME.KEY=VALUE");
        continue;
      }
      const std::string name = path.substr(5, path.size() - 5 - key.size() - 1);
      auto* nodes = root.get_as<toml::array>("node");
      if (nodes)
        for (auto& n : *nodes)
          if (auto* t = n.as_table())
            if (auto* s = t->get_as<std::string>("name"); s && s->get() == name)
              target = t;
      if (!target) {
        const auto names = node_names(nodes);
        std::string list;
        for (const auto& n : names)
          list += fmt::format("{}\"{}\"", list.empty() ? "" : ", ", n);
        fail(fmt::format("{} has no [[node]] named \"{}\" (its nodes: {}){}", file, name,
                         list.empty() ? "none" : list, value_hint(name, names)));
        continue;
      }
    } else if (auto* existing = root.get(parts.front())) {
      target = existing->as_table();
      if (!target) {
        fail(fmt::format("`{}` in {} is {}, not a table", parts.front(), file, type_name(*existing)));
        continue;
      }
    } else {
      head = "[" + parts.front() + "]\n"; // the file has no such table: the override makes it
    }
    toml::table doc;
    try {
      doc = override_document(head, key, value, label);
    } catch (const std::invalid_argument& e) {
      fail(e.what());
      continue;
    }
    if (!target) {
      root.insert_or_assign(toml::key{parts.front(), where}, std::move(*doc.begin()->second.as_table()));
      continue;
    }
    doc.begin()->second.visit(
      [&](auto& v) { target->insert_or_assign(toml::key{key, where}, std::move(v)); });
  }
}

/// Everything after the TOML syntax: fills the structs from `root`, adding every problem to
/// `sink` (the caller throws).
experiment_config parse_root(const toml::table& root, error_sink& sink,
                             const std::set<std::string>& known_roles,
                             const std::string& base_dir) {
  experiment_config cfg;
  std::set<std::string> seen;
  // The reference probe (sink.schema) reads every section, present or not, as empty.
  static const toml::table absent;
  auto section = [&](std::string_view name, const char* doc, auto&& fn) {
    seen.emplace(name);
    describe_top(sink, name, config_type::table, doc);
    auto* n = root.get(name);
    if (!n && !sink.schema)
      return;
    auto* t = n ? n->as_table() : &absent;
    if (!t) {
      sink.add(n->source(), std::string{name},
               fmt::format("expected a table [{}], got {}", name, type_name(*n)));
      return;
    }
    table_reader r{*t, std::string{name}, sink};
    fn(r);
    r.finish();
  };
  section("run", "identity and length of the experiment, where it writes, what it runs on",
          [&](table_reader& r) { parse_run(r, cfg.run); });
  section("model", "which policy to build or load",
          [&](table_reader& r) { parse_model(r, cfg.model, base_dir); });
  section("task", "the verifiable-reward task or multi-turn environment (runtime/ml/tasks/tasks.hpp)",
          [&](table_reader& r) { parse_task(r, cfg.task, base_dir); });
  section("sft", "the supervised warm start (`sorl sft`, runtime/ml/train/sft.hpp)",
          [&](table_reader& r) { parse_sft(r, cfg.sft, base_dir); });
  section("algorithm", "GRPO / DAPO hyper-parameters (ARCHITECTURE.md §6)",
          [&](table_reader& r) { parse_algorithm(r, cfg.algorithm); });
  section("sagc", "group-size control (ARCHITECTURE.md §6, SAGC)",
          [&](table_reader& r) { parse_sagc(r, cfg.sagc); });
  section("salt", "subspace-adaptive advantage coefficients (ARCHITECTURE.md §6, SALT)",
          [&](table_reader& r) { parse_salt(r, cfg.salt); });
  section("sync", "learner to rollout weight synchronisation (ARCHITECTURE.md §6, SparseRL-Sync)",
          [&](table_reader& r) { parse_sync(r, cfg.sync); });
  section("rollout", "the rollout workers: batching, prefix KV cache, speculative decoding",
          [&](table_reader& r) { parse_rollout(r, cfg.rollout); });
  section("scheduler", "placement of rollout requests on the workers",
          [&](table_reader& r) { parse_scheduler(r, cfg.scheduler); });
  section("network", "how nodes connect, how failures are detected, TLS",
          [&](table_reader& r) { parse_network(r, cfg.network, base_dir); });
  section("smoke", "the ping / pong roles of configs/smoke.toml (a topology smoke run)",
          [&](table_reader& r) { parse_smoke(r, cfg.smoke); });
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
  if (cfg.run.stop_at_accuracy > 0 && (cfg.run.eval_every == 0 || cfg.task.eval_prompts == 0))
    sink.add(source_of("run", "stop_at_accuracy"), "run.stop_at_accuracy",
             cfg.run.eval_every == 0
               ? "stopping at a held-out accuracy needs evaluations during the run: set "
                 "run.eval_every > 0"
               : "stopping at a held-out accuracy needs held-out prompts: task.eval_prompts is 0");
  if (cfg.model.hf_dir.empty() && !cfg.task.system_prompt.empty())
    sink.add(source_of("task", "system_prompt"), "task.system_prompt",
             "a system message needs a chat template: set model.hf_dir (sorl's byte presets "
             "have no system turn)");
  seen.emplace("node");
  describe_top(sink, "node", config_type::table_array,
               "one process (or, under `sorl train`, a part of the one process); a file needs "
               "at least one, and one that listens when it has several");
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

std::string_view to_string(config_type type) {
  // In the order of config_type's values.
  static constexpr std::string_view names[] = {"integer", "number",          "boolean",
                                               "string",  "string list",     "choice",
                                               "table",   "array of tables", "roles"};
  return names[static_cast<size_t>(type)];
}

const std::vector<config_key>& config_keys() {
  // Read off the parser: every section is read as empty (parse_root does so for the probe)
  // and one [[node]] with one table entry in actors, so each reader call runs once, with the
  // struct's defaults in its fields. No path is set, so no file is read.
  static const auto keys = [] {
    std::vector<config_key> out;
    error_sink sink{"<reference>", {}, &out};
    toml::table node;
    node.insert("actors", toml::array{toml::table{}});
    toml::table probe;
    probe.insert("node", toml::array{std::move(node)});
    parse_root(probe, sink, {}, ".");
    return out;
  }();
  return keys;
}

const std::map<std::string, std::set<std::string>>& known_config_keys() {
  static const auto keys = [] {
    std::map<std::string, std::set<std::string>> known;
    for (const auto& k : config_keys())
      known[k.table].insert(k.key);
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
                               const std::string& base_dir,
                               const std::vector<std::string>& overrides) {
  error_sink sink{file, {}};
  toml::table root;
  try {
    root = parse_toml(text, file);
  } catch (const toml::parse_error& e) {
    sink.add(e.source(), "", fmt::format("TOML syntax error: {}", e.description()));
    throw config_exception(std::move(sink.errors));
  }
  apply_overrides(root, overrides, sink, file);
  auto cfg = parse_root(root, sink, known_roles, base_dir);
  cfg.file = file;
  cfg.overrides = overrides;
  if (!sink.errors.empty())
    throw config_exception(std::move(sink.errors));
  return cfg;
}

experiment_config load_config(const std::string& path,
                              const std::set<std::string>& known_roles,
                              const std::vector<std::string>& overrides) {
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
  return parse_config(text.str(), path, known_roles, base, overrides);
}

} // namespace sorl
