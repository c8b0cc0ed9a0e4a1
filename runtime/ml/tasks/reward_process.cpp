#include "runtime/ml/tasks/reward_process.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <utility>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char** environ;

namespace sorl::ml {

namespace {

using clock_type = std::chrono::steady_clock;
using json = nlohmann::json;

// glibc's posix_spawn extensions: closefrom keeps sorl's other descriptors (sockets, other
// children's pipes) out of the scorer, where a stray write end would keep a pipe from ever
// reaching end of file; addchdir sets the working directory without a shell.
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
constexpr bool have_closefrom = true;
#else
constexpr bool have_closefrom = false;
#endif
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 29))
constexpr bool have_addchdir = true;
#else
constexpr bool have_addchdir = false;
#endif

constexpr std::size_t read_chunk = 64 * 1024;
// A reason quotes at most this much of the child's stderr, and of a malformed line.
constexpr std::size_t reason_stderr_bytes = 1000;
constexpr std::size_t reason_stderr_lines = 5;
constexpr std::size_t reason_line_bytes = 80;

std::string errno_text(int e) { return std::strerror(e); }

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

bool set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

// A pipe whose ends are close-on-exec and not 0, 1 or 2: posix_spawn's dup2 onto the same
// descriptor would leave close-on-exec set, and the child would start without it.
bool make_pipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  for (int i = 0; i < 2; ++i) {
    if (fds[i] > 2) continue;
    const int moved = ::fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
    if (moved < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      return false;
    }
    ::close(fds[i]);
    fds[i] = moved;
  }
  return true;
}

// write(2) that cannot raise SIGPIPE: the signal is blocked in this thread for the write,
// and one the write raised is taken off the pending set before the mask is restored. A
// SIGPIPE that was already pending belongs to someone else and is left alone.
ssize_t write_no_sigpipe(int fd, const char* data, std::size_t size) {
  sigset_t pipe_only;
  sigset_t old_mask;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &old_mask);
  sigset_t pending;
  sigemptyset(&pending);
  sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  const ssize_t n = ::write(fd, data, size);
  const int saved = errno;
  if (n < 0 && saved == EPIPE && !was_pending) {
    const timespec zero{};
    while (sigtimedwait(&pipe_only, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  errno = saved;
  return n;
}

std::int64_t ms_until(clock_type::time_point deadline) {
  const auto left = deadline - clock_type::now();
  if (left <= clock_type::duration::zero()) return 0;
  // Round up, so that a poll does not wake just before the deadline and spin.
  return std::chrono::ceil<std::chrono::milliseconds>(left).count();
}

const char* signal_name(int sig) {
  switch (sig) {
  case SIGSEGV: return "SIGSEGV";
  case SIGABRT: return "SIGABRT";
  case SIGKILL: return "SIGKILL";
  case SIGTERM: return "SIGTERM";
  case SIGINT: return "SIGINT";
  case SIGBUS: return "SIGBUS";
  case SIGFPE: return "SIGFPE";
  case SIGILL: return "SIGILL";
  case SIGPIPE: return "SIGPIPE";
  case SIGHUP: return "SIGHUP";
  default: return nullptr;
  }
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    std::string out = "was killed by signal " + std::to_string(sig);
    if (const char* name = signal_name(sig)) out += std::string(" (") + name + ")";
    return out;
  }
  return "ended with wait status " + std::to_string(status);
}

// "a number", "an array", ...: the JSON type of `value` for a reason.
std::string json_type_name(const json& value) {
  const std::string name = value.type_name();
  return (value.is_object() || value.is_array() ? "an " : "a ") + name;
}

// A scorer's own text for a reason: quote_for_reason's escaping and length cap, without
// the quotes (the text is the reason, not a quoted value within it).
std::string scorer_text(std::string_view text) {
  std::string q = quote_for_reason(text, 300);
  const bool cut = q.size() >= 5 && q.compare(q.size() - 4, 4, "\"...") == 0;
  q = q.substr(1, q.size() - (cut ? 5 : 2));
  return cut ? q + "..." : q;
}

} // namespace

std::string_view to_string(reward_failure failure) {
  switch (failure) {
  case reward_failure::none: return "none";
  case reward_failure::scorer: return "scorer";
  case reward_failure::invalid: return "invalid";
  case reward_failure::timeout: return "timeout";
  case reward_failure::crash: return "crash";
  case reward_failure::malformed: return "malformed";
  case reward_failure::disabled: return "disabled";
  }
  return "unknown";
}

struct reward_process::state {
  reward_process_options opts;
  mutable std::mutex mu;

  pid_t pid = -1;
  int in_fd = -1;  // the child's stdin, our write end
  int out_fd = -1; // the child's stdout, our read end
  int err_fd = -1; // the child's stderr, our read end
  std::string out_buf;
  std::string err_tail;

  std::int64_t next_id = 1;
  int consecutive = 0;
  std::string last_failure;
  reward_process_failures counts;

  // The outcome of one request line: the reply line, or why there is none.
  struct exchange_result {
    reward_failure failure = reward_failure::none;
    std::string reason;
    std::string line;
  };

  explicit state(reward_process_options o) : opts(std::move(o)) {}

  bool is_disabled() const { return consecutive > opts.max_restarts; }

  std::string disabled_reason() const {
    return "reward process disabled after " + std::to_string(consecutive)
           + " failures in a row (max_restarts = " + std::to_string(opts.max_restarts)
           + "); last: " + last_failure;
  }

  void record(reward_failure kind, const std::string& reason) {
    switch (kind) {
    case reward_failure::timeout: ++counts.timeouts; break;
    case reward_failure::crash: ++counts.crashes; break;
    case reward_failure::malformed: ++counts.malformed; break;
    default: break;
    }
    ++consecutive;
    last_failure = reason;
  }

  void keep_stderr(const char* data, std::size_t size) {
    err_tail.append(data, size);
    // Trim in large steps so that a flood costs amortized O(1) per byte.
    if (err_tail.size() > 2 * opts.stderr_tail_bytes)
      err_tail.erase(0, err_tail.size() - opts.stderr_tail_bytes);
  }

  // Reads what stderr holds now, without blocking; closes it at end of file.
  void drain_stderr() {
    char buf[read_chunk];
    while (err_fd >= 0) {
      const ssize_t n = ::read(err_fd, buf, sizeof buf);
      if (n > 0) {
        keep_stderr(buf, static_cast<std::size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) close_fd(err_fd);
        return;
      }
    }
  }

  std::string tail() const {
    if (err_tail.size() <= opts.stderr_tail_bytes) return err_tail;
    return err_tail.substr(err_tail.size() - opts.stderr_tail_bytes);
  }

  // "; stderr: "<its last lines>"" for a crash reason, or "" when it wrote nothing.
  std::string stderr_suffix() const {
    std::string_view s = err_tail;
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t'))
      s.remove_suffix(1);
    if (s.empty()) return "";
    std::size_t start = s.size();
    for (std::size_t lines = 0; start > 0; --start) {
      if (s[start - 1] == '\n' && ++lines == reason_stderr_lines) break;
    }
    s.remove_prefix(std::max(start, s.size() > reason_stderr_bytes ? s.size() - reason_stderr_bytes : 0));
    // Do not start inside a UTF-8 sequence.
    while (!s.empty() && (static_cast<unsigned char>(s.front()) & 0xC0) == 0x80)
      s.remove_prefix(1);
    return "; stderr: " + quote_for_reason(s, reason_stderr_bytes);
  }

  // Starts the child; on failure returns why (and leaves no descriptor open).
  std::optional<std::string> spawn() {
    int in[2] = {-1, -1};
    int out[2] = {-1, -1};
    int err[2] = {-1, -1};
    const auto close_all = [&] {
      for (int* p : {in, out, err}) {
        close_fd(p[0]);
        close_fd(p[1]);
      }
    };
    if (!make_pipe(in) || !make_pipe(out) || !make_pipe(err)) {
      const int e = errno;
      close_all();
      return "cannot create pipes for the reward process: " + errno_text(e);
    }

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    if constexpr (have_closefrom) posix_spawn_file_actions_addclosefrom_np(&actions, 3);
    if (!opts.working_dir.empty()) {
      if constexpr (have_addchdir)
        posix_spawn_file_actions_addchdir_np(&actions, opts.working_dir.c_str());
    }

    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Its own process group (see the class comment); the signals sorl may ignore or block
    // back to their defaults, since ignored dispositions and the mask survive exec.
    sigset_t none;
    sigemptyset(&none);
    sigset_t defaults;
    sigemptyset(&defaults);
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD})
      sigaddset(&defaults, sig);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, static_cast<short>(POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK
                                                       | POSIX_SPAWN_SETSIGDEF));

    std::vector<char*> args;
    args.reserve(opts.argv.size() + 1);
    for (std::string& a : opts.argv)
      args.push_back(a.data());
    args.push_back(nullptr);

    pid_t child = -1;
    const int rc = ::posix_spawnp(&child, args[0], &actions, &attr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
      close_all();
      std::string why = "cannot start reward process " + quote_for_reason(opts.argv[0], 200);
      if (!opts.working_dir.empty()) why += " in " + quote_for_reason(opts.working_dir, 200);
      return why + ": " + errno_text(rc);
    }
    close_fd(in[0]);
    close_fd(out[1]);
    close_fd(err[1]);
    pid = child;
    in_fd = in[1];
    out_fd = out[0];
    err_fd = err[0];
    set_nonblocking(in_fd);
    set_nonblocking(out_fd);
    set_nonblocking(err_fd);
    out_buf.clear();
    err_tail.clear();
    ++counts.starts;
    return std::nullopt;
  }

  // Waits up to `ms` for the child to exit, reading its stderr meanwhile (a child blocked
  // on a full stderr pipe would never exit). Leaves it unreaped (waitid's WNOWAIT): its pid
  // stays reserved, so that kill_and_reap can still reach the rest of its process group.
  bool wait_exit(std::int64_t ms) {
    const auto until = clock_type::now() + std::chrono::milliseconds(ms);
    for (;;) {
      siginfo_t info;
      std::memset(&info, 0, sizeof info);
      const int r = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
      if (r == 0 && info.si_pid == pid) return true;
      if (r < 0 && errno != EINTR) return true; // not waitable (reaped elsewhere): gone
      const std::int64_t left = ms_until(until);
      if (left <= 0) return false;
      // Output nobody reads must not block the exit either.
      if (out_fd >= 0) {
        char buf[read_chunk];
        while (::read(out_fd, buf, sizeof buf) > 0) {
        }
      }
      if (err_fd >= 0) {
        pollfd p{err_fd, POLLIN, 0};
        if (::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left, 5))) > 0) drain_stderr();
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min<std::int64_t>(left, 5)));
      }
    }
  }

  void close_pipes() {
    close_fd(in_fd);
    close_fd(out_fd);
    close_fd(err_fd);
    out_buf.clear();
  }

  // SIGKILLs the child's process group (the scorer's own children too) and reaps the
  // child. Its wait status, or nullopt when it had been reaped elsewhere (a SIGCHLD set to
  // SIG_IGN by the program reaps children automatically).
  std::optional<int> kill_and_reap() {
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
    int status = 0;
    pid_t r = -1;
    while ((r = ::waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
    }
    pid = -1;
    drain_stderr(); // what it wrote before dying, still in the pipe
    close_pipes();
    if (r < 0) return std::nullopt;
    return status;
  }

  // The child closed a pipe or its stdout ended: give it a moment to exit so that its
  // status is known, then make sure it is gone. Returns the crash reason.
  std::string reap_crashed(std::string_view what) {
    const bool exited = wait_exit(opts.exit_grace_ms);
    const std::optional<int> status = kill_and_reap();
    std::string reason = "reward process ";
    if (!exited)
      reason += std::string(what) + " but did not exit; killed";
    else if (status)
      reason += describe_status(*status);
    else
      reason += "exited (status unknown)";
    return reason + stderr_suffix();
  }

  void shut_down() {
    if (pid < 0) return;
    close_fd(in_fd);
    wait_exit(opts.exit_grace_ms);
    kill_and_reap();
  }

  exchange_result fail(reward_failure kind, std::string reason) {
    record(kind, reason);
    return {kind, std::move(reason), {}};
  }

  // A child that is running, with nothing on its stdout since its last reply; started if
  // needed. Failures found on the way (it died while idle, it printed outside a reply)
  // count, and it is started again while max_restarts allows.
  std::optional<exchange_result> ensure_ready() {
    for (;;) {
      if (is_disabled()) return exchange_result{reward_failure::disabled, disabled_reason(), {}};
      if (pid < 0) {
        if (std::optional<std::string> why = spawn()) return fail(reward_failure::crash, *why);
        return std::nullopt;
      }
      drain_stderr();
      bool ended = false;
      char buf[read_chunk];
      for (;;) {
        const ssize_t n = ::read(out_fd, buf, sizeof buf);
        if (n > 0 && out_buf.size() < opts.max_line_bytes) {
          out_buf.append(buf, static_cast<std::size_t>(n));
        } else if (n > 0) {
          continue;
        } else if (n < 0 && errno == EINTR) {
          continue;
        } else {
          ended = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
          break;
        }
      }
      if (!out_buf.empty()) {
        const std::string stray = out_buf;
        kill_and_reap();
        record(reward_failure::malformed,
               "malformed reply: output outside a reply line: " + quote_for_reason(stray, reason_line_bytes));
        continue;
      }
      if (ended) {
        record(reward_failure::crash, reap_crashed("closed its stdout between calls"));
        continue;
      }
      return std::nullopt;
    }
  }

  // Sends one request line and reads the reply line, within `deadline`.
  exchange_result exchange(const std::string& request, clock_type::time_point deadline) {
    if (std::optional<exchange_result> bad = ensure_ready()) return std::move(*bad);

    std::size_t sent = 0;
    std::size_t scanned = 0; // bytes of out_buf known to hold no newline
    char buf[read_chunk];
    for (;;) {
      const std::int64_t left = ms_until(deadline);
      if (left <= 0) {
        kill_and_reap();
        return fail(reward_failure::timeout,
                    "reward process timed out after " + std::to_string(opts.timeout_ms) + " ms");
      }
      pollfd fds[3];
      nfds_t count = 0;
      const bool writing = sent < request.size();
      if (writing) fds[count++] = {in_fd, POLLOUT, 0};
      const nfds_t out_at = count;
      fds[count++] = {out_fd, POLLIN, 0};
      const nfds_t err_at = count;
      if (err_fd >= 0) fds[count++] = {err_fd, POLLIN, 0};
      const int ready = ::poll(fds, count, static_cast<int>(std::min<std::int64_t>(left, 1 << 30)));
      if (ready < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        kill_and_reap();
        return fail(reward_failure::crash, "poll on the reward process failed: " + errno_text(e));
      }
      if (ready == 0) continue;

      if (err_fd >= 0 && fds[err_at].revents != 0) drain_stderr();

      if (writing && fds[0].revents != 0) {
        const ssize_t n = write_no_sigpipe(in_fd, request.data() + sent, request.size() - sent);
        if (n > 0) {
          sent += static_cast<std::size_t>(n);
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          return fail(reward_failure::crash, reap_crashed("closed its stdin"));
        }
      }

      if (fds[out_at].revents != 0) {
        const ssize_t n = ::read(out_fd, buf, sizeof buf);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
          return fail(reward_failure::crash, reap_crashed("closed its stdout"));
        if (n > 0) out_buf.append(buf, static_cast<std::size_t>(n));
        const std::size_t newline = out_buf.find('\n', scanned);
        if (newline == std::string::npos) {
          scanned = out_buf.size();
          if (out_buf.size() > opts.max_line_bytes) {
            kill_and_reap();
            return fail(reward_failure::malformed, "malformed reply: line longer than "
                                                       + std::to_string(opts.max_line_bytes) + " bytes");
          }
          continue;
        }
        if (newline > opts.max_line_bytes) {
          kill_and_reap();
          return fail(reward_failure::malformed, "malformed reply: line longer than "
                                                     + std::to_string(opts.max_line_bytes) + " bytes");
        }
        std::string line = out_buf.substr(0, newline);
        // What follows the line stays: ensure_ready reports it before the next request.
        out_buf.erase(0, newline + 1);
        if (sent < request.size()) {
          kill_and_reap();
          return fail(reward_failure::malformed,
                      "malformed reply: a line before the request was complete: "
                          + quote_for_reason(line, reason_line_bytes));
        }
        return {reward_failure::none, {}, std::move(line)};
      }
    }
  }

  // Turns a reply line into outcomes[first, first + n), or returns why the reply as a whole
  // is malformed.
  std::optional<std::string> read_reply(const std::string& line, std::int64_t id, std::size_t first,
                                        std::size_t n, std::vector<reward_outcome>& outcomes) {
    const json reply = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (reply.is_discarded()) {
      std::string why = "malformed reply: not JSON: " + quote_for_reason(line, reason_line_bytes);
      if (line.find("NaN") != std::string::npos || line.find("Infinity") != std::string::npos)
        why += " (NaN and Infinity are not JSON: send null with a reason in errors)";
      return why;
    }
    if (!reply.is_object())
      return "malformed reply: " + json_type_name(reply) + ", not an object: "
             + quote_for_reason(line, reason_line_bytes);
    const auto id_it = reply.find("id");
    if (id_it == reply.end() || !id_it->is_number_integer())
      return "malformed reply: no integer id: " + quote_for_reason(line, reason_line_bytes);
    if (id_it->get<std::int64_t>() != id)
      return "malformed reply: id " + std::to_string(id_it->get<std::int64_t>()) + ", expected "
             + std::to_string(id);
    const auto rewards = reply.find("rewards");
    if (rewards == reply.end() || !rewards->is_array())
      return "malformed reply: no rewards array";
    if (rewards->size() != n)
      return "malformed reply: rewards has " + std::to_string(rewards->size()) + " entries for "
             + std::to_string(n) + " items";
    const auto errors = reply.find("errors");
    const bool has_errors = errors != reply.end() && !errors->is_null();
    if (has_errors) {
      if (!errors->is_array()) return "malformed reply: errors is not an array";
      if (errors->size() != n)
        return "malformed reply: errors has " + std::to_string(errors->size()) + " entries for "
               + std::to_string(n) + " items";
      for (const json& e : *errors)
        if (!e.is_null() && !e.is_string()) return "malformed reply: errors holds a non-string";
    }

    for (std::size_t i = 0; i < n; ++i) {
      const json& r = (*rewards)[i];
      const json* note = has_errors && (*errors)[i].is_string() ? &(*errors)[i] : nullptr;
      reward_outcome& out = outcomes[first + i];
      const auto invalid = [&](std::string why) {
        out.failure = reward_failure::invalid;
        out.reason = "malformed reply: rewards[" + std::to_string(i) + "] " + std::move(why);
        ++counts.invalid_rewards;
      };
      if (r.is_number()) {
        const double v = r.get<double>();
        if (!std::isfinite(v)) {
          invalid("is not finite");
        } else if (v < opts.min_reward || v > opts.max_reward) {
          invalid("= " + json(v).dump() + " is outside [" + json(opts.min_reward).dump() + ", "
                  + json(opts.max_reward).dump() + "]");
        } else {
          out.reward = v;
          if (note) out.reason = scorer_text(note->get_ref<const std::string&>());
        }
      } else if (r.is_null() && note) {
        out.failure = reward_failure::scorer;
        out.reason = "scorer: " + scorer_text(note->get_ref<const std::string&>());
        ++counts.scorer_errors;
      } else if (r.is_null()) {
        invalid("is null without a reason in errors");
      } else {
        invalid("is " + json_type_name(r) + ", not a number");
      }
    }
    return std::nullopt;
  }
};

reward_process::reward_process(reward_process_options options) {
  const auto bad = [](const std::string& what) {
    throw std::invalid_argument("reward_process: " + what);
  };
  if (options.argv.empty()) bad("argv is empty (it names the scorer command)");
  if (options.argv[0].empty()) bad("argv[0] is empty");
  for (std::size_t i = 0; i < options.argv.size(); ++i)
    if (options.argv[i].find('\0') != std::string::npos)
      bad("argv[" + std::to_string(i) + "] contains a NUL byte");
  if (options.working_dir.find('\0') != std::string::npos) bad("working_dir contains a NUL byte");
  if (!have_addchdir && !options.working_dir.empty())
    bad("working_dir needs glibc 2.29 or newer (posix_spawn_file_actions_addchdir_np)");
  if (options.timeout_ms <= 0) bad("timeout_ms must be > 0, got " + std::to_string(options.timeout_ms));
  if (options.max_restarts < 0)
    bad("max_restarts must be >= 0, got " + std::to_string(options.max_restarts));
  if (options.max_batch < 1) bad("max_batch must be >= 1");
  if (options.max_line_bytes < 64)
    bad("max_line_bytes must be >= 64, got " + std::to_string(options.max_line_bytes));
  if (options.stderr_tail_bytes < 256)
    bad("stderr_tail_bytes must be >= 256, got " + std::to_string(options.stderr_tail_bytes));
  if (std::isnan(options.min_reward) || std::isnan(options.max_reward)
      || options.min_reward > options.max_reward)
    bad("min_reward must be <= max_reward, neither NaN");
  if (options.exit_grace_ms < 0)
    bad("exit_grace_ms must be >= 0, got " + std::to_string(options.exit_grace_ms));
  state_ = std::make_unique<state>(std::move(options));
}

reward_process::~reward_process() {
  if (!state_) return;
  const std::lock_guard<std::mutex> lock(state_->mu);
  state_->shut_down();
}

std::vector<reward_outcome> reward_process::score(const std::vector<reward_request>& items) {
  // The request items first: a caller's bad entry_json throws before anything is sent.
  std::vector<json> encoded;
  encoded.reserve(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    const reward_request& item = items[i];
    json entry = nullptr;
    if (!item.entry_json.empty()) {
      entry = json::parse(item.entry_json, nullptr, /*allow_exceptions=*/false);
      if (entry.is_discarded())
        throw std::invalid_argument("reward_process::score: item " + std::to_string(i)
                                    + ": entry_json is not valid JSON: "
                                    + quote_for_reason(item.entry_json));
    }
    encoded.push_back(json{{"prompt", item.prompt},
                           {"completion", item.completion},
                           {"answer", item.answer},
                           {"entry", std::move(entry)}});
  }

  state& s = *state_;
  const std::lock_guard<std::mutex> lock(s.mu);
  std::vector<reward_outcome> outcomes(items.size());
  const auto deadline = clock_type::now() + std::chrono::milliseconds(s.opts.timeout_ms);
  for (std::size_t first = 0; first < items.size(); first += s.opts.max_batch) {
    const std::size_t n = std::min(s.opts.max_batch, items.size() - first);
    const auto fail_batch = [&](reward_failure kind, const std::string& reason) {
      for (std::size_t i = first; i < first + n; ++i) {
        outcomes[i].failure = kind;
        outcomes[i].reason = reason;
      }
    };
    if (s.is_disabled()) {
      fail_batch(reward_failure::disabled, s.disabled_reason());
      continue;
    }
    if (ms_until(deadline) <= 0) {
      fail_batch(reward_failure::timeout, "reward process timed out after "
                                              + std::to_string(s.opts.timeout_ms)
                                              + " ms, before this batch was sent");
      continue;
    }
    const std::int64_t id = s.next_id++;
    json request{{"id", id}, {"items", json::array()}};
    json& list = request["items"];
    for (std::size_t i = first; i < first + n; ++i)
      list.push_back(std::move(encoded[i]));
    // Completions are untrusted bytes: invalid UTF-8 goes out as U+FFFD rather than failing.
    std::string line = request.dump(-1, ' ', false, json::error_handler_t::replace);
    line += '\n';

    state::exchange_result result = s.exchange(line, deadline);
    if (result.failure != reward_failure::none) {
      fail_batch(result.failure, result.reason);
      continue;
    }
    if (std::optional<std::string> why = s.read_reply(result.line, id, first, n, outcomes)) {
      s.kill_and_reap();
      s.record(reward_failure::malformed, *why);
      fail_batch(reward_failure::malformed, *why);
      continue;
    }
    s.consecutive = 0;
  }
  return outcomes;
}

reward_process_failures reward_process::failures() const {
  const std::lock_guard<std::mutex> lock(state_->mu);
  return state_->counts;
}

int reward_process::consecutive_failures() const {
  const std::lock_guard<std::mutex> lock(state_->mu);
  return state_->consecutive;
}

bool reward_process::disabled() const {
  const std::lock_guard<std::mutex> lock(state_->mu);
  return state_->is_disabled();
}

void reward_process::reset() {
  const std::lock_guard<std::mutex> lock(state_->mu);
  state_->consecutive = 0;
}

std::optional<int> reward_process::pid() const {
  const std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->pid < 0) return std::nullopt;
  return static_cast<int>(state_->pid);
}

std::string reward_process::stderr_tail() const {
  const std::lock_guard<std::mutex> lock(state_->mu);
  return state_->tail();
}

reward_failed_error::reward_failed_error(reward_failure kind, const std::string& reason)
    : std::runtime_error(reason), kind_(kind) {}

reward_result to_reward_result(const reward_outcome& outcome) {
  if (!outcome.ok())
    throw reward_failed_error(outcome.failure, outcome.reason);
  reward_result out;
  out.reward = *outcome.reward;
  out.reason = outcome.reason.empty() ? "reward process" : outcome.reason;
  return out;
}

} // namespace sorl::ml
