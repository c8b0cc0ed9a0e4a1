#include "tests/support/process.hpp"

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <regex>
#include <csignal>
#include <cstring>
#include <stdexcept>

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace sorl::test {

child_process::child_process(std::vector<std::string> argv) {
  int fds[2];
  if (pipe(fds) != 0)
    throw std::runtime_error(std::string{"pipe: "} + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  std::vector<char*> args;
  for (auto& a : argv)
    args.push_back(a.data());
  args.push_back(nullptr);
  int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  fd_ = fds[0];
  fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

child_process::~child_process() {
  if (!status_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    int st = 0;
    waitpid(pid_, &st, 0);
  }
  if (fd_ >= 0)
    close(fd_);
}

bool child_process::pump(std::chrono::milliseconds budget) {
  if (fd_ < 0)
    return false;
  pollfd p{fd_, POLLIN, 0};
  int ready = poll(&p, 1, static_cast<int>(budget.count()));
  if (ready <= 0)
    return true;
  char buf[4096];
  for (;;) {
    auto n = read(fd_, buf, sizeof(buf));
    if (n > 0) {
      auto now = clock::now();
      partial_.append(buf, static_cast<size_t>(n));
      size_t pos;
      while ((pos = partial_.find('\n')) != std::string::npos) {
        lines_.emplace_back(now, partial_.substr(0, pos));
        partial_.erase(0, pos + 1);
      }
      continue;
    }
    if (n == 0) {
      if (!partial_.empty())
        lines_.emplace_back(clock::now(), partial_);
      partial_.clear();
      close(fd_);
      fd_ = -1;
      return false;
    }
    return true; // EAGAIN
  }
}

std::optional<child_process::clock::time_point>
child_process::wait_for(const std::string& needle, std::chrono::milliseconds timeout) {
  size_t from = 0;
  return wait_for(needle, timeout, from);
}

std::optional<child_process::clock::time_point>
child_process::wait_for(const std::string& needle, std::chrono::milliseconds timeout,
                        size_t& from) {
  auto deadline = clock::now() + timeout;
  size_t& checked = from;
  for (;;) {
    for (; checked < lines_.size(); ++checked)
      if (lines_[checked].second.find(needle) != std::string::npos)
        return lines_[checked++].first;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    if (left.count() <= 0)
      return std::nullopt;
    if (!pump(std::min(left, std::chrono::milliseconds{50})) && checked == lines_.size())
      return std::nullopt;
  }
}

std::optional<int> child_process::wait_exit(std::chrono::milliseconds timeout) {
  auto deadline = clock::now() + timeout;
  while (!status_) {
    pump(std::chrono::milliseconds{10});
    int st = 0;
    auto r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (clock::now() >= deadline)
      return std::nullopt;
  }
  for (int i = 0; i < 200 && pump(std::chrono::milliseconds{10}); ++i) {
  }
  return status_;
}

void child_process::freeze() {
  if (status_ || pid_ <= 0)
    throw std::runtime_error("freeze: the process has exited");
  kill(pid_, SIGSTOP);
  int st = 0;
  if (waitpid(pid_, &st, WUNTRACED) != pid_)
    throw std::runtime_error(std::string{"freeze: waitpid: "} + std::strerror(errno));
  if (!WIFSTOPPED(st)) {
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    throw std::runtime_error("freeze: the process exited before it stopped");
  }
  // Its writes finished before it stopped, so they are all in the pipe: one read to EAGAIN.
  pump(std::chrono::milliseconds{0});
}

void child_process::thaw() {
  if (!status_ && pid_ > 0)
    kill(pid_, SIGCONT);
}

void child_process::signal(int sig) {
  if (!status_ && pid_ > 0)
    kill(pid_, sig);
}

std::string child_process::output() const {
  std::string out;
  for (auto& [t, line] : lines_)
    out += line + '\n';
  return out + partial_;
}

std::string write_test_file(const std::string& dir, const std::string& name,
                            const std::string& text) {
  std::filesystem::create_directories(dir);
  auto path = std::filesystem::path{dir} / name;
  std::ofstream{path} << text;
  return path.string();
}

void make_pki(const std::string& dir) {
  std::filesystem::create_directories(dir);
  auto openssl = [](std::vector<std::string> args) {
    args.insert(args.begin(), "/usr/bin/openssl");
    child_process p{args};
    auto rc = p.wait_exit(std::chrono::seconds{60});
    if (rc != 0)
      throw std::runtime_error("openssl " + args.at(1) + " failed: " + p.output());
  };
  openssl({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", dir + "/ca.key", "-out",
           dir + "/ca.pem", "-days", "2", "-subj", "/CN=sorl-test-ca"});
  openssl({"req", "-newkey", "rsa:2048", "-nodes", "-keyout", dir + "/node.key", "-out",
           dir + "/node.csr", "-subj", "/CN=localhost"});
  openssl({"x509", "-req", "-in", dir + "/node.csr", "-CA", dir + "/ca.pem", "-CAkey",
           dir + "/ca.key", "-CAcreateserial", "-out", dir + "/node.pem", "-days", "2"});
}

std::string listening_port(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex{"listening on 127\\.0\\.0\\.1:([0-9]+)"}))
    return "";
  return m[1];
}

} // namespace sorl::test
