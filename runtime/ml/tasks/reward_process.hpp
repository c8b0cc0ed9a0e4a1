#pragma once

// Reward functions written in another language (Python, usually), run as one long-lived
// child process that scores batches over its stdin / stdout, one JSON document per line.
//
// Protocol (UTF-8, each message one line ending in '\n'):
//
//   request  {"id": 7, "items": [{"prompt": "...", "completion": "...", "answer": "...",
//                                 "entry": <any JSON or null>}, ...]}
//   reply    {"id": 7, "rewards": [1.0, null, ...], "errors": [null, "no <answer> tag", ...]}
//
// - `id` increases by one per request over the life of the reward_process (across
//   restarts), so a reply that belongs to another request is caught.
// - `rewards` has exactly one entry per item; `errors` is optional and, when present, has
//   one string or null per item as well.
// - A reward is a finite JSON number within [min_reward, max_reward] ([0, 1] by default,
//   the range of reward_result). A null reward with a string in `errors` is a failure the
//   scorer reports for that item; the string is its reason. A number with a string in
//   `errors` is a reward with a note.
// - stdout is the protocol channel and nothing else: every byte the scorer writes there
//   that is not its reply line (a debug print, a banner) makes a malformed reply. Logs go
//   to stderr, whose last bytes are kept for the failure reasons.
// - The scorer must flush stdout after each reply (Python: `print(..., flush=True)`), and
//   should exit when its stdin reaches end of file.
//
// What goes wrong, and what it costs:
// - the whole batch (the process is killed with SIGKILL, reaped, and started again for the
//   next batch): the child exits or closes a pipe (a crash), does not answer in time (a
//   timeout), or answers with a line that is not a reply to this request: invalid JSON
//   (NaN and Infinity are not JSON), longer than max_line_bytes, another id, `rewards` or
//   `errors` not an array of the batch's length, output outside a reply line (malformed).
// - one item (the rest of the reply stands, the process keeps running): a null reward with
//   a reason (the scorer's own failure), a null reward without one, a reward that is not a
//   number, not finite, or out of range (an invalid reward).
// A failed item carries its reason, never a reward: a broken scorer does not read as a 0.

#include "runtime/ml/tasks/tasks.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sorl::ml {

/// Options of a reward_process.
struct reward_process_options {
  /// The command and its arguments, e.g. {"python3", "scorer.py"}. Run without a shell;
  /// argv[0] is looked up in PATH when it has no '/'. Required, no empty argv[0], no NUL.
  std::vector<std::string> argv;
  /// The child's working directory; empty = sorl's.
  std::string working_dir;
  /// The most one score() call may take, ms, from its start to its last reply, the
  /// scorer's start-up (its imports) included when the call starts it. A batch still
  /// unanswered then fails as a timeout, and so do the batches not yet sent. > 0.
  std::int64_t timeout_ms = 30000;
  /// Process failures in a row (crashes, timeouts, malformed replies, failed starts; any
  /// complete reply resets the count) after which the process is not started again and
  /// every call fails at once, until reset(). The process is started at most
  /// 1 + max_restarts times in a row. >= 0.
  int max_restarts = 3;
  /// Items per request line; a call with more is sent as several requests, in order. >= 1.
  std::size_t max_batch = 64;
  /// The longest reply line accepted, bytes (the newline excluded). >= 64.
  std::size_t max_line_bytes = std::size_t{16} << 20;
  /// How much of the child's stderr is kept (its last bytes), bytes. >= 256.
  std::size_t stderr_tail_bytes = 8192;
  /// The accepted range of a reward, inclusive; a number outside is an invalid reward.
  /// Widen it (to ±infinity) to accept any finite number; reward_result expects [0, 1].
  double min_reward = 0.0;
  double max_reward = 1.0;
  /// How long the child may take to exit before it is killed, ms: at shutdown, after its
  /// stdin is closed; after a crash shows (a pipe closed), so that its exit status can go
  /// into the reason. >= 0.
  std::int64_t exit_grace_ms = 1000;
};

/// One item to score.
struct reward_request {
  std::string prompt;
  std::string completion; ///< the policy's text; invalid UTF-8 is sent as U+FFFD
  std::string answer;     ///< the reference answer
  /// The item's task-specific record as JSON text (a reasoning-gym entry, say), sent as
  /// the item's "entry" value; empty = null.
  std::string entry_json;
};

/// Why an item has no reward.
enum class reward_failure {
  none,      ///< it has one
  scorer,    ///< the scorer reported this item failed (null reward with a reason)
  invalid,   ///< the reply's value for this item is not an acceptable reward
  timeout,   ///< the batch was not answered in time, or not sent because time ran out
  crash,     ///< the process died, closed a pipe, or could not be started
  malformed, ///< the reply as a whole broke the protocol
  disabled,  ///< not sent: max_restarts failures in a row disabled the process
};

/// "none", "scorer", "invalid", "timeout", "crash", "malformed" or "disabled".
std::string_view to_string(reward_failure failure);

/// The result for one item: a reward, or a failure with its reason.
struct reward_outcome {
  std::optional<double> reward; ///< set exactly when failure == none
  reward_failure failure = reward_failure::none;
  /// Why it failed ("reward process timed out after 300 ms", "scorer: no <answer> tag"),
  /// or the scorer's note on a reward; valid UTF-8, may be empty on success.
  std::string reason;

  /// Whether there is a reward.
  bool ok() const noexcept { return reward.has_value(); }
};

/// Failures so far. timeouts, crashes and malformed count events (one per process killed or
/// failed start, whatever the batch's size); invalid_rewards and scorer_errors count items.
struct reward_process_failures {
  std::uint64_t timeouts = 0;  ///< batches left unanswered at the deadline (process killed)
  std::uint64_t crashes = 0;   ///< exits, closed pipes, failed starts
  std::uint64_t malformed = 0; ///< replies breaking the protocol (process killed)
  std::uint64_t invalid_rewards = 0; ///< items with an unacceptable value (process kept)
  std::uint64_t scorer_errors = 0;   ///< items the scorer reported failed (process kept)
  std::uint64_t starts = 0;          ///< processes started, the first included
};

/// A scorer child process (see the file comment for the protocol).
///
/// The process is started lazily, by the first call that has items to send, and started
/// again by the next batch after a failure killed it (up to max_restarts in a row). One
/// call at a time: calls from several threads are serialized by a mutex, and a call may
/// take up to timeout_ms plus the time to kill and reap the child.
///
/// SIGPIPE: a write to a child that died raises SIGPIPE, which would end sorl. The
/// process-wide disposition is left alone (it belongs to the program, not to a library);
/// instead SIGPIPE is blocked in the calling thread around each write, and one it raised
/// is consumed before the mask is restored, so the write just fails with EPIPE. The child
/// starts with SIGPIPE at its default and an empty signal mask, whatever sorl's are.
///
/// The child runs in its own process group, so a terminal's Ctrl-C reaches sorl only (which
/// shuts down in order), and a kill reaches the scorer's own children too.
class reward_process {
public:
  /// Checks `options`; starts nothing. Throws std::invalid_argument for an empty argv, an
  /// empty argv[0], a NUL in an argument or the working directory, or an option out of its
  /// range (naming it).
  explicit reward_process(reward_process_options options);

  /// Closes the child's stdin, gives it exit_grace_ms to exit, then kills (SIGKILL) its
  /// process group; always reaps it.
  ~reward_process();

  reward_process(const reward_process&) = delete;
  reward_process& operator=(const reward_process&) = delete;

  /// One outcome per item, in order. Never throws because of the scorer: whatever it does
  /// ends in failed outcomes. Throws std::invalid_argument when an item's entry_json is
  /// not valid JSON (naming the item), before anything is sent; std::bad_alloc.
  std::vector<reward_outcome> score(const std::vector<reward_request>& items);

  /// Failure counts since construction.
  reward_process_failures failures() const;

  /// Process failures since the last complete reply (or reset()).
  int consecutive_failures() const;

  /// Whether max_restarts failures in a row have disabled the process (calls fail at once).
  bool disabled() const;

  /// Clears the failures in a row (not the counts of failures()), so that the next call
  /// starts the process again. A running process is kept.
  void reset();

  /// The running child's pid, or nullopt when none runs.
  std::optional<int> pid() const;

  /// The last bytes (at most stderr_tail_bytes) the current or last child wrote to
  /// stderr, as read so far (stderr is read during calls only).
  std::string stderr_tail() const;

private:
  struct state;
  std::unique_ptr<state> state_;
};

/// Thrown by to_reward_result for a failed outcome. The rollout pipeline already treats a
/// scorer that throws as a failed reward (rollout_status::reward_failed, actors/rollout/
/// worker_core.cpp): left out of its group's statistics and masked out of the loss, never
/// a 0 that would teach the policy that a correct answer was wrong.
class reward_failed_error : public std::runtime_error {
public:
  reward_failed_error(reward_failure kind, const std::string& reason);
  reward_failure kind() const noexcept { return kind_; }

private:
  reward_failure kind_;
};

/// The outcome as a reward_result (runtime/ml/tasks/tasks.hpp): the reward with the scorer's note
/// as reason (or "reward process"). Throws reward_failed_error with the outcome's reason
/// when it failed.
reward_result to_reward_result(const reward_outcome& outcome);

} // namespace sorl::ml
