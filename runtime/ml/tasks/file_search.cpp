#include "runtime/ml/tasks/file_search.hpp"

#include "runtime/ml/tasks/tasks_random.hpp"

#include <array>
#include <stdexcept>
#include <string>

namespace sorl::ml {

namespace {

// Small fixed vocabularies: the same names and texts recur within and across episodes.
constexpr std::array<std::string_view, 8> dir_names{"src", "docs", "lib", "bin",
                                                    "etc", "tmp", "data", "logs"};
constexpr std::array<std::string_view, 8> file_names{"notes.txt", "readme.md", "todo.txt",
                                                     "log.txt",   "config.ini", "data.csv",
                                                     "main.py",   "index.html"};
constexpr std::array<std::string_view, 4> decoys{"nothing here", "todo: tidy up",
                                                 "see readme", "empty"};

constexpr std::string_view reset_text = "find the key. in /";

// Tokens an observation adds to the transcript: <|user|> bytes <|end_turn|> <|assistant|>.
std::int64_t observation_tokens(std::string_view text) {
  return static_cast<std::int64_t>(text.size()) + 3;
}

void validate(const file_search_options& o) {
  auto in = [](const char* key, std::int64_t v, std::int64_t lo, std::int64_t hi) {
    if (v < lo || v > hi)
      throw std::invalid_argument("file_search: " + std::string{key} + " must be in ["
                                  + std::to_string(lo) + ", " + std::to_string(hi) + "], got "
                                  + std::to_string(v));
  };
  in("depth", o.depth, 1, 4);
  in("max_dirs", o.max_dirs, 1, static_cast<std::int64_t>(dir_names.size()));
  in("max_files", o.max_files, 1, static_cast<std::int64_t>(file_names.size()));
  in("max_turns", o.max_turns, 1, 1 << 16);
  in("max_episode_tokens", o.max_episode_tokens, 64, std::int64_t{1} << 30);
  if (!(o.detour_rate >= 0.0 && o.detour_rate <= 1.0))
    throw std::invalid_argument("file_search: detour_rate must be in [0, 1], got "
                                + std::to_string(o.detour_rate));
  in("preamble_bytes", o.preamble_bytes, 0, 1 << 16);
  in("preamble_families", o.preamble_families, 1, 1 << 16);
  if (o.preamble_bytes > 0) {
    // <|bos|> and the first observation (preamble, '\n', reset text), as reset() counts it;
    // then room for a few turns.
    const std::int64_t first =
      1 + observation_tokens(reset_text) + o.preamble_bytes + 1;
    if (o.max_episode_tokens < first + 64)
      throw std::invalid_argument("file_search: max_episode_tokens = "
                                  + std::to_string(o.max_episode_tokens)
                                  + " leaves less than 64 tokens past the first observation ("
                                  + std::to_string(first) + " tokens with preamble_bytes = "
                                  + std::to_string(o.preamble_bytes) + "); raise it to at least "
                                  + std::to_string(first + 64));
  }
  if (o.wrong_episodes != "wander" && o.wrong_episodes != "give_up")
    throw std::invalid_argument("file_search: wrong_episodes must be \"wander\" or \"give_up\", got \""
                                + o.wrong_episodes + "\"");
  if (!(o.wander_share >= 0.0 && o.wander_share <= 1.0))
    throw std::invalid_argument("file_search: wander_share must be in [0, 1], got "
                                + std::to_string(o.wander_share));
  if (o.wander_share > 0.0 && o.wrong_episodes != "give_up")
    throw std::invalid_argument("file_search: wander_share applies to wrong_episodes = \"give_up\" "
                                "(with \"wander\" every wrong demonstration wanders)");
}

// `k` distinct indices of [0, n), in a random order (a partial Fisher-Yates shuffle).
std::vector<std::size_t> pick(detail::split_mix& rng, std::size_t n, std::size_t k) {
  std::vector<std::size_t> all(n);
  for (std::size_t i = 0; i < n; ++i)
    all[i] = i;
  for (std::size_t i = 0; i < k; ++i)
    std::swap(all[i], all[i + rng.below(n - i)]);
  all.resize(k);
  return all;
}


} // namespace

std::int64_t file_search_family(const file_search_options& options, std::uint64_t seed) {
  // A stream of its own: the tree and the policies' draws stay what they are with or
  // without a preamble.
  detail::split_mix rng(detail::mix64(seed ^ 0x9E3779B97F4A7C15ULL));
  return static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(options.preamble_families)));
}

std::string file_search_preamble(const file_search_options& options, std::int64_t family) {
  if (family < 0 || family >= options.preamble_families)
    throw std::invalid_argument("file_search_preamble: family " + std::to_string(family)
                                + " is not in [0, " + std::to_string(options.preamble_families)
                                + ")");
  std::string text;
  const auto bytes = static_cast<std::size_t>(options.preamble_bytes);
  text.reserve(bytes + 16);
  detail::split_mix rng(detail::mix64(static_cast<std::uint64_t>(family) ^ 0xD1B54A32D192ED03ULL));
  while (text.size() < bytes) {
    if (!text.empty())
      text += ' ';
    switch (rng.below(3)) {
    case 0: text += dir_names[rng.below(dir_names.size())]; break;
    case 1: text += file_names[rng.below(file_names.size())]; break;
    default: text += decoys[rng.below(decoys.size())]; break;
    }
  }
  text.resize(bytes);
  return text;
}

file_search_environment::file_search_environment(const file_search_options& options)
  : options_(options) {
  validate(options);
}

std::string file_search_environment::path_of(int dir) const {
  if (dir == 0)
    return "/";
  std::string path;
  for (int d = dir; d > 0; d = tree_[static_cast<std::size_t>(d)].parent)
    path = "/" + tree_[static_cast<std::size_t>(d)].name + path;
  return path;
}

std::string file_search_environment::reset(std::uint64_t seed) {
  detail::split_mix rng(seed);
  tree_.assign(1, fs_directory{});
  std::vector<int> deepest;
  for (std::size_t i = 0; i < tree_.size(); ++i) { // breadth first; tree_ grows
    const int level = tree_[i].level;
    if (level < options_.depth) {
      const auto n = static_cast<std::size_t>(rng.between(1, options_.max_dirs));
      for (std::size_t name : pick(rng, dir_names.size(), n)) {
        fs_directory d;
        d.name = std::string{dir_names[name]};
        d.parent = static_cast<int>(i);
        d.level = level + 1;
        tree_[i].subdirs.push_back(static_cast<int>(tree_.size()));
        tree_.push_back(std::move(d));
      }
    } else {
      deepest.push_back(static_cast<int>(i));
    }
    const auto n = static_cast<std::size_t>(rng.between(1, options_.max_files));
    for (std::size_t name : pick(rng, file_names.size(), n)) {
      tree_[i].files.emplace_back(file_names[name]);
      tree_[i].contents.emplace_back(decoys[rng.below(decoys.size())]);
    }
  }
  key_ = std::to_string(rng.between(1000, 9999));
  auto& holder = tree_[static_cast<std::size_t>(deepest[rng.below(deepest.size())])];
  holder.contents[rng.below(holder.files.size())] = "key: " + key_;
  cwd_ = 0;
  turns_ = 0;
  running_ = true;
  std::string first{reset_text};
  if (options_.preamble_bytes > 0)
    first = file_search_preamble(options_, file_search_family(options_, seed)) + "\n" + first;
  tokens_ = 1 + observation_tokens(first); // <|bos|> first
  return first;
}

std::string file_search_environment::observe(std::string_view action, std::string& reason) {
  const std::string_view cmd = trim_ascii_whitespace(action);
  const auto space = cmd.find(' ');
  const std::string_view verb = cmd.substr(0, space);
  const std::string_view arg =
    space == std::string_view::npos ? std::string_view{} : trim_ascii_whitespace(cmd.substr(space));
  const fs_directory& here = tree_[static_cast<std::size_t>(cwd_)];
  if (verb == "ls" && arg.empty()) {
    std::string out;
    for (int s : here.subdirs)
      out += (out.empty() ? "" : " ") + tree_[static_cast<std::size_t>(s)].name + "/";
    for (const auto& f : here.files)
      out += (out.empty() ? "" : " ") + f;
    reason = "listed " + path_of(cwd_);
    return out;
  }
  if (verb == "cd" && arg == "..") {
    if (cwd_ == 0) {
      reason = "cd .. at the root";
      return "already at /";
    }
    cwd_ = here.parent;
    reason = "moved up";
    return "in " + path_of(cwd_);
  }
  if (verb == "cd" && !arg.empty()) {
    for (int s : here.subdirs)
      if (tree_[static_cast<std::size_t>(s)].name == arg) {
        cwd_ = s;
        reason = "moved down";
        return "in " + path_of(cwd_);
      }
    reason = "cd to a missing directory";
    return "no such directory";
  }
  if (verb == "cat" && !arg.empty()) {
    for (std::size_t f = 0; f < here.files.size(); ++f)
      if (here.files[f] == arg) {
        reason = "read " + here.files[f];
        return here.contents[f];
      }
    reason = "cat of a missing file";
    return "no such file";
  }
  reason = "unknown command " + quote_for_reason(cmd);
  return "unknown command";
}

env_step file_search_environment::step(std::string_view action) {
  if (!running_)
    throw std::logic_error("file_search: step() without a running episode (call reset first; "
                           "the last episode is done)");
  ++turns_;
  tokens_ += static_cast<std::int64_t>(action.size()) + 1; // the action's <|end_turn|>
  env_step out;
  const std::string_view cmd = trim_ascii_whitespace(action);
  if (cmd.substr(0, 7) == "answer " || cmd == "answer") {
    running_ = false;
    out.done = true;
    const std::string_view given = trim_ascii_whitespace(cmd.substr(6));
    out.reward = given == key_ ? 1.0 : 0.0;
    out.reason = given == key_ ? "right answer in " + std::to_string(turns_) + " turns"
                               : "wrong answer " + quote_for_reason(given) + " in "
                                   + std::to_string(turns_) + " turns";
    return out;
  }
  out.observation = observe(action, out.reason);
  tokens_ += observation_tokens(out.observation);
  if (turns_ >= options_.max_turns) {
    out.reason = "turn budget of " + std::to_string(options_.max_turns) + " exhausted";
  } else if (tokens_ >= options_.max_episode_tokens) {
    out.reason = "token budget of " + std::to_string(options_.max_episode_tokens)
                 + " tokens exhausted after " + std::to_string(turns_) + " turns";
  } else {
    return out;
  }
  running_ = false;
  out.done = true;
  out.observation.clear();
  return out;
}

int file_search_environment::turns() const {
  return turns_;
}

file_search_task::file_search_task(const file_search_options& options, std::uint64_t seed)
  : seeded_environment_task(options, seed) {
  validate(options);
}

std::string_view file_search_task::name() const {
  return "file_search";
}

namespace {

// The expert's actions for the whole search, detours included (they end where they start,
// so the plan does not depend on the observations). With `give_up`, the search ends with
// "answer not found" where the expert would leave the first deepest directory it searched in
// vain.
class expert_plan {
public:
  expert_plan(const file_search_environment& env, double detour_rate, bool give_up,
              detail::split_mix& rng)
    : env_(env), detour_rate_(detour_rate), give_up_(give_up), rng_(rng) {}

  std::vector<std::string> make() {
    visit(0);
    return std::move(actions_);
  }

private:
  const fs_directory& dir(int d) const { return env_.tree()[static_cast<std::size_t>(d)]; }

  void emit(int at, std::string action) {
    if (rng_.uniform() < detour_rate_) {
      const fs_directory& here = dir(at);
      switch (rng_.below(3)) {
      case 0:
        actions_.emplace_back("ls");
        break;
      case 1:
        actions_.push_back("cat " + here.files[rng_.below(here.files.size())]);
        break;
      default:
        if (here.subdirs.empty()) {
          actions_.emplace_back("ls");
        } else {
          actions_.push_back("cd " + dir(here.subdirs[rng_.below(here.subdirs.size())]).name);
          actions_.emplace_back("ls");
          actions_.emplace_back("cd ..");
        }
      }
    }
    actions_.push_back(std::move(action));
  }

  // True once the key has been read (the answer is then the last action).
  bool visit(int d) {
    emit(d, "ls");
    const fs_directory& here = dir(d);
    for (int s : here.subdirs) {
      emit(d, "cd " + dir(s).name);
      if (visit(s))
        return true;
      emit(s, "cd ..");
    }
    if (!here.subdirs.empty())
      return false;
    for (std::size_t f = 0; f < here.files.size(); ++f) {
      emit(d, "cat " + here.files[f]);
      if (here.contents[f] == "key: " + env_.key()) {
        emit(d, "answer " + env_.key());
        return true;
      }
    }
    if (give_up_) {
      // A fixed text, not a guessed number: the answer's digits are then always copied from
      // a key the episode has read, which the policy must still learn to do.
      actions_.push_back("answer not found"); // no detour: it replaces the way on
      return true;
    }
    return false;
  }

  const file_search_environment& env_;
  double detour_rate_;
  bool give_up_;
  detail::split_mix& rng_;
  std::vector<std::string> actions_;
};

// One action of the wandering policy in the current state. Its answers are a random number,
// or "not found" for the wanderers mixed into give_up demonstrations (their only wrong
// answer, so that no demonstration answers digits it has not read).
std::string wander(const file_search_environment& env, detail::split_mix& rng, bool gives_up) {
  if (rng.below(40) == 0)
    return gives_up ? std::string{"answer not found"}
                    : "answer " + std::to_string(rng.between(1000, 9999));
  const fs_directory& here = env.tree()[static_cast<std::size_t>(env.cwd())];
  const bool from_vocabulary = rng.below(4) == 0;
  switch (rng.below(4)) {
  case 0:
    return "ls";
  case 1:
    return "cd ..";
  case 2:
    if (from_vocabulary || here.subdirs.empty())
      return "cd " + std::string{dir_names[rng.below(dir_names.size())]};
    return "cd " + env.tree()[static_cast<std::size_t>(here.subdirs[rng.below(here.subdirs.size())])].name;
  default:
    if (from_vocabulary)
      return "cat " + std::string{file_names[rng.below(file_names.size())]};
    return "cat " + here.files[rng.below(here.files.size())];
  }
}

} // namespace

std::vector<chat_message> file_search_task::demonstrate(std::uint64_t seed, bool correct) const {
  file_search_environment env(options_);
  std::vector<chat_message> chat;
  chat.push_back({chat_role::user, env.reset(seed)});
  // The policies' own randomness is a separate stream from the tree's.
  detail::split_mix rng(detail::mix64(seed ^ 0xA0761D6478BD642FULL));
  std::vector<std::string> plan;
  const bool gives_up = options_.wrong_episodes == "give_up";
  // The wanderers among give_up's wrong episodes come from a third stream, so that the other
  // demonstrations stay what they are without wander_share.
  detail::split_mix share_rng(detail::mix64(seed ^ 0x5DEECE66DULL));
  const bool wanders = !correct && (!gives_up || share_rng.uniform() < options_.wander_share);
  if (!wanders)
    plan = expert_plan(env, options_.detour_rate, !correct, rng).make();
  for (std::size_t i = 0;; ++i) {
    chat.push_back({chat_role::assistant, wanders ? wander(env, rng, gives_up) : plan.at(i)});
    const env_step s = env.step(chat.back().content);
    if (s.done)
      break;
    chat.push_back({chat_role::user, s.observation});
  }
  return chat;
}

} // namespace sorl::ml
