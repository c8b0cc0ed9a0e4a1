#pragma once

// SIGINT and SIGTERM for `sorl train` and `sorl node` (docs/run-directory.md, "Stopping a run").
//
// The first signal asks the job to stop cleanly: the trainer finishes the step in progress,
// writes a checkpoint and ends the job; the process exits with 128 + the signal number. A
// second signal exits at once with the same status, losing the step in progress (the last
// complete checkpoint stays intact: checkpoints are written to a temporary directory and
// renamed into place, runtime/ml/formats/checkpoint.hpp).
//
// Async-signal safety: the handler only stores the signal number in a lock-free atomic and
// writes one byte to a self-pipe (first signal), or writes a fixed message to stderr and
// calls _exit (second signal). A watcher thread reads the pipe and runs the callback outside
// the handler, where sending an actor message is allowed.

#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace sorl {

/// "SIGINT", "SIGTERM", or "signal N".
std::string signal_name(int signo);

/// The exit status of a process stopped by `signo`: 128 + signo (130 for SIGINT, 143 for
/// SIGTERM), what a shell reports for a process the signal killed.
int interrupted_exit_code(int signo);

/// Installs the SIGINT / SIGTERM handlers for its lifetime; one per process at a time.
class interrupt_watch {
public:
  /// Installs the handlers (a signal the process inherited as ignored stays ignored, as
  /// under nohup) and starts the watcher thread. Raises std::logic_error when another
  /// interrupt_watch exists, std::system_error when the pipe cannot be made.
  interrupt_watch();
  /// Restores the previous handlers and stops the watcher thread.
  ~interrupt_watch();
  interrupt_watch(const interrupt_watch&) = delete;
  interrupt_watch& operator=(const interrupt_watch&) = delete;

  /// Runs `fn(signo)` once, on the watcher thread, for the first signal: when it comes, or
  /// now when it already came and no callback has run for it. Replaces the previous callback;
  /// an empty one removes it. Returns after any running call of the previous one ended, so
  /// what that captured may be destroyed afterwards.
  void on_first(std::function<void(int)> fn);

  /// The first signal received, or 0 while none came.
  int received() const;

private:
  void watch();

  int read_fd_ = -1;
  std::mutex mtx_;
  std::function<void(int)> callback_;
  bool delivered_ = false;
  std::thread watcher_;
};

} // namespace sorl
