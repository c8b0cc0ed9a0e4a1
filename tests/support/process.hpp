#pragma once

// A child process for multi-process tests: started with posix_spawn, stdout and stderr
// captured through one pipe, every wait bounded. Killed on destruction if still running.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace sorl::test {

class child_process {
public:
  using clock = std::chrono::steady_clock;

  /// Starts `argv[0]` with `argv`; raises std::runtime_error if it cannot be started.
  explicit child_process(std::vector<std::string> argv);
  ~child_process();
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  /// Waits until a line containing `needle` appears in the output; returns when it was read,
  /// or std::nullopt after `timeout`. Lines seen earlier count too.
  std::optional<clock::time_point> wait_for(const std::string& needle,
                                            std::chrono::milliseconds timeout);
  /// The same, counting only lines from index `from` on; on success `from` is moved past
  /// the matching line, so that a loop sees each line once.
  std::optional<clock::time_point> wait_for(const std::string& needle,
                                            std::chrono::milliseconds timeout, size_t& from);

  /// Complete lines read so far, and line `i` of them (0-based).
  size_t line_count() const {
    return lines_.size();
  }
  const std::string& line(size_t i) const {
    return lines_.at(i).second;
  }

  /// SIGSTOP, then waits until the kernel reports the process stopped, and reads every
  /// line it wrote before: what it did up to the stop is all in `output()`. Raises
  /// std::runtime_error if it exited instead.
  void freeze();
  /// SIGCONT after freeze().
  void thaw();

  /// Waits for exit; returns the exit status (128 + signal if killed), or nullopt on timeout.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);

  void signal(int sig);
  pid_t pid() const {
    return pid_;
  }
  /// Everything read so far.
  std::string output() const;

private:
  /// Reads what is available within `budget`; returns false at end of output.
  bool pump(std::chrono::milliseconds budget);

  pid_t pid_ = -1;
  int fd_ = -1;
  std::optional<int> status_;
  std::string partial_;
  std::vector<std::pair<clock::time_point, std::string>> lines_;
};

/// Writes `text` to SORL_TEST_DATA_DIR-style directory `dir` / `name` (created as needed)
/// and returns the path.
std::string write_test_file(const std::string& dir, const std::string& name,
                            const std::string& text);

/// Makes a CA and a certificate signed by it under `dir` with /usr/bin/openssl (ca.pem,
/// node.pem, node.key; CN=localhost, valid 2 days). Raises std::runtime_error with openssl's
/// output when a command fails.
void make_pki(const std::string& dir);

/// The port in a hub's "listening on 127.0.0.1:PORT" line of `output`, or "" if none.
std::string listening_port(const std::string& output);

} // namespace sorl::test
