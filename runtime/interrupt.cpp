#include "runtime/interrupt.hpp"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

namespace sorl {

namespace {

static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free int");

std::atomic<int> first_signal{0};
std::atomic<int> pipe_write_fd{-1};
std::atomic<bool> watch_exists{false};

constexpr int handled[] = {SIGINT, SIGTERM};
struct sigaction previous[2];
bool installed[2] = {false, false};

constexpr char second_message[] =
  "\nsorl: second signal: exiting at once; the step in progress is lost, the last complete "
  "checkpoint is intact\n";

/// Async-signal-safe: atomics, write(2) and _exit(2) only.
void on_signal(int signo) {
  const int saved_errno = errno;
  int expected = 0;
  if (first_signal.compare_exchange_strong(expected, signo)) {
    const char byte = 1;
    ssize_t ignored = write(pipe_write_fd.load(), &byte, 1);
    (void) ignored;
  } else {
    ssize_t ignored = write(STDERR_FILENO, second_message, sizeof second_message - 1);
    (void) ignored;
    _exit(interrupted_exit_code(signo));
  }
  errno = saved_errno;
}

} // namespace

std::string signal_name(int signo) {
  switch (signo) {
  case SIGINT:
    return "SIGINT";
  case SIGTERM:
    return "SIGTERM";
  default:
    return "signal " + std::to_string(signo);
  }
}

int interrupted_exit_code(int signo) {
  return 128 + signo;
}

interrupt_watch::interrupt_watch() {
  if (watch_exists.exchange(true))
    throw std::logic_error("interrupt_watch: one already exists in this process");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    watch_exists = false;
    throw std::system_error(errno, std::generic_category(), "interrupt_watch: pipe");
  }
  read_fd_ = fds[0];
  pipe_write_fd = fds[1];
  first_signal = 0;
  watcher_ = std::thread([this] { watch(); });
  for (size_t i = 0; i < 2; ++i) {
    struct sigaction old {};
    sigaction(handled[i], nullptr, &old);
    if (old.sa_handler == SIG_IGN)
      continue; // nohup and `&` in a non-interactive shell: the caller wants it ignored
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    installed[i] = sigaction(handled[i], &sa, &previous[i]) == 0;
  }
}

interrupt_watch::~interrupt_watch() {
  for (size_t i = 0; i < 2; ++i)
    if (installed[i]) {
      sigaction(handled[i], &previous[i], nullptr);
      installed[i] = false;
    }
  const char stop = 0;
  ssize_t ignored = write(pipe_write_fd.load(), &stop, 1);
  (void) ignored;
  watcher_.join();
  close(pipe_write_fd.exchange(-1));
  close(read_fd_);
  watch_exists = false;
}

void interrupt_watch::watch() {
  for (;;) {
    char byte = 0;
    ssize_t n = read(read_fd_, &byte, 1);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0 || byte == 0)
      return;
    std::lock_guard<std::mutex> guard{mtx_};
    if (callback_ && !delivered_) {
      delivered_ = true;
      callback_(first_signal.load());
    }
  }
}

void interrupt_watch::on_first(std::function<void(int)> fn) {
  std::lock_guard<std::mutex> guard{mtx_};
  callback_ = std::move(fn);
  if (callback_ && !delivered_ && first_signal.load() != 0) {
    delivered_ = true;
    callback_(first_signal.load());
  }
}

int interrupt_watch::received() const {
  return first_signal.load();
}

} // namespace sorl
