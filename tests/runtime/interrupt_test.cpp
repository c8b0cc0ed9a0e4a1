// SIGINT / SIGTERM handling (runtime/interrupt.hpp). Each case runs in a forked child, so
// that raising signals and exiting never touch the test runner; raise() delivers the signal
// to the calling thread before it returns, so the order of events is fixed.

#include "runtime/interrupt.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <functional>
#include <string>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

namespace {

struct child_result {
  int status = -1; ///< exit status, or -1 when the child did not exit normally
  std::string stderr_text;
};

/// Runs `body` in a forked child with stderr captured; `body` ends with _exit.
child_result in_child(const std::function<void()>& body) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], STDERR_FILENO);
    body();
    _exit(99); // body must exit itself
  }
  close(fds[1]);
  child_result r;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;)
    r.stderr_text.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  if (WIFEXITED(status))
    r.status = WEXITSTATUS(status);
  return r;
}

/// Waits (bounded) until `flag` is set; false after 10 s.
bool wait_set(const std::atomic<int>& flag) {
  for (int i = 0; i < 10000 && flag.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds{1});
  return flag.load() != 0;
}

} // namespace

TEST_CASE("the first signal reaches the callback and a second one exits at once with 128 + it") {
  auto r = in_child([] {
    std::atomic<int> got{0};
    sorl::interrupt_watch watch;
    watch.on_first([&](int signo) { got = signo; });
    raise(SIGTERM);
    if (!wait_set(got))
      _exit(10);
    if (got != SIGTERM || watch.received() != SIGTERM)
      _exit(11);
    raise(SIGINT); // the second signal: the handler exits, raise never returns
    _exit(12);
  });
  CHECK(r.status == 128 + SIGINT);
  CHECK_THAT(r.stderr_text, Catch::Contains("second signal: exiting at once"));
}

TEST_CASE("a signal that came before the callback was set reaches it when it is set") {
  auto r = in_child([] {
    std::atomic<int> got{0};
    sorl::interrupt_watch watch;
    raise(SIGINT);
    watch.on_first([&](int signo) { got = signo; });
    if (!wait_set(got))
      _exit(10);
    // Only once: a new callback does not hear the same signal again.
    std::atomic<int> again{0};
    watch.on_first([&](int signo) { again = signo; });
    _exit(got == SIGINT && again == 0 ? 0 : 11);
  });
  CHECK(r.status == 0);
}

TEST_CASE("a signal the process inherited as ignored stays ignored") {
  auto r = in_child([] {
    std::signal(SIGINT, SIG_IGN); // as under nohup
    struct sigaction before {};
    sigaction(SIGTERM, nullptr, &before);
    {
      sorl::interrupt_watch watch;
      raise(SIGINT);
      raise(SIGINT);
      if (watch.received() != 0)
        _exit(10);
    }
    // The watch is gone: the previous handlers are back.
    struct sigaction now {};
    sigaction(SIGTERM, nullptr, &now);
    _exit(now.sa_handler == before.sa_handler ? 0 : 11);
  });
  CHECK(r.status == 0);
}

TEST_CASE("signal names and exit codes follow the shell's convention") {
  CHECK(sorl::signal_name(SIGINT) == "SIGINT");
  CHECK(sorl::signal_name(SIGTERM) == "SIGTERM");
  CHECK(sorl::signal_name(SIGHUP) == "signal 1");
  CHECK(sorl::interrupted_exit_code(SIGINT) == 130);
  CHECK(sorl::interrupted_exit_code(SIGTERM) == 143);
}
