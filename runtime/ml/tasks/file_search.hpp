#pragma once

// The "file_search" multi-turn environment: find a key hidden in a small generated file tree.

#include "runtime/ml/tasks/environments.hpp"
#include "runtime/ml/tasks/tasks.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sorl::ml {

/// One directory of a file_search tree. Index 0 is the root "/".
struct fs_directory {
  std::string name;                ///< "" for the root
  int parent = -1;                 ///< index of the parent; -1 for the root
  int level = 0;                   ///< 0 for the root
  std::vector<int> subdirs;        ///< indices, in listing order
  std::vector<std::string> files;  ///< names, in listing order (after the subdirs)
  std::vector<std::string> contents; ///< what `cat` prints, one per file
};

/// The family of the episode with this seed, in [0, options.preamble_families): which
/// preamble opens its first observation.
std::int64_t file_search_family(const file_search_options& options, std::uint64_t seed);

/// Preamble `family` of these options: exactly `options.preamble_bytes` bytes of lowercase
/// words and spaces (the file names, directory names and decoy texts of the trees, in an order
/// drawn from the family), the same on every machine. Empty when preamble_bytes is 0. Throws
/// std::invalid_argument for a family outside [0, preamble_families).
std::string file_search_preamble(const file_search_options& options, std::int64_t family);

/// Find a key stored in one file of a small directory tree by moving around it.
///
/// The tree (from the episode seed): every directory above level `depth` has 1..max_dirs
/// subdirectories and every directory 1..max_files files, named from fixed vocabularies
/// (so listings recur across episodes). The key, a 4-digit number, is in one file of one
/// directory at level `depth`; every other file holds a fixed decoy text.
///
/// Commands (the action, trimmed of ASCII whitespace) and observations:
///   reset        → "find the key. in /", after the episode's preamble and a newline when
///                  `preamble_bytes` > 0 (file_search_preamble)
///   ls           → the current directory: subdirectories as "name/", then files,
///                  space-separated, e.g. "src/ docs/ notes.txt"
///   cd NAME      → "in /src/lib"; "no such directory" when NAME is not a subdirectory
///   cd ..        → "in /src"; at the root "already at /"
///   cat NAME     → the file's content ("key: 4821", "nothing here", ...); "no such file"
///   answer TEXT  → ends the episode: reward 1 when TEXT is the key, else 0
///   anything else → "unknown command"
/// Each action costs a turn. The episode also ends, reward 0, when `max_turns` actions are
/// taken ("turn budget of N exhausted") or its transcript reaches `max_episode_tokens`
/// ("token budget of N tokens exhausted"). Transcript tokens are counted as the byte-level
/// tokenizer lays out the chat (encode_chat): <|bos|>, then per turn its marker, one token
/// per byte and <|end_turn|>, with the <|assistant|> marker that opens the next action
/// counted with the observation before it; an action's end-of-turn token is counted too.
/// That equals the rollout's context length (prompt + response) with the byte tokenizer.
class file_search_environment final : public environment {
public:
  /// Throws std::invalid_argument naming the bad option.
  explicit file_search_environment(const file_search_options& options);

  std::string reset(std::uint64_t seed) override;
  env_step step(std::string_view action) override;
  int turns() const override;

  /// The tree of the current episode (index 0 = "/").
  const std::vector<fs_directory>& tree() const noexcept { return tree_; }
  /// Index of the current directory in `tree()`.
  int cwd() const noexcept { return cwd_; }
  /// The key of the current episode, 4 decimal digits.
  const std::string& key() const noexcept { return key_; }
  /// Transcript tokens so far (see the class comment).
  std::int64_t tokens() const noexcept { return tokens_; }
  /// Whether an episode is running (reset called, not yet done).
  bool running() const noexcept { return running_; }
  /// "/" or "/src/lib" for directory `dir`.
  std::string path_of(int dir) const;

private:
  std::string observe(std::string_view action, std::string& reason);

  file_search_options options_;
  std::vector<fs_directory> tree_;
  std::string key_;
  int cwd_ = 0;
  int turns_ = 0;
  std::int64_t tokens_ = 0;
  bool running_ = false;
};

/// The "file_search" multi-turn task. Held out: eval episode seeds are a stream disjoint
/// from train's (trees may coincide, the vocabularies being small).
///
/// Demonstrations. The expert searches depth-first: `ls`, then, where the listing has
/// subdirectories, `cd` into each in turn (and `cd ..` back), else `cat` each file until
/// the key shows, then `answer KEY`. Before each of its actions it takes, with probability
/// `detour_rate`, a detour that ends where it started (`ls` again, a `cat` of a file of
/// the directory, or `cd` into a subdirectory, `ls`, `cd ..`), which spreads the expert's
/// lengths. The wrong demonstrations follow `wrong_episodes`. "wander": each turn, with
/// probability 1/40 it answers a random 4-digit number (right only by chance), else it takes
/// `ls`, `cd ..`, `cd` or `cat` uniformly, names drawn from the current directory or, one
/// time in four, from the vocabularies; most of its episodes run into the turn or token
/// budget, which gives the long tail of episode lengths. "give_up": the expert, except that
/// where it would leave the first deepest directory it searched in vain it answers
/// "answer not found" (reward 0); when the key is in that directory the demonstration is the
/// expert's. A policy taught a share of such episodes still samples the persistence the rest
/// show, which is what RL can then reinforce. With "give_up", `wander_share` of the wrong
/// demonstrations wander instead, answering "not found" where the wanderer answers. (A
/// guessed number instead of "not found" kept a 1000-step warm start from learning to copy
/// the key it read: 1 of 20 solved greedily.)
class file_search_task final
  : public seeded_environment_task<file_search_environment, file_search_options> {
public:
  /// Throws std::invalid_argument naming the bad option.
  file_search_task(const file_search_options& options, std::uint64_t seed);

  std::string_view name() const override;
  std::vector<chat_message> demonstrate(std::uint64_t seed, bool correct) const override;
};

} // namespace sorl::ml
