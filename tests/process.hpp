#pragma once
// Child processes for tests that signal or kill a run at a chosen moment.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace test {

/// A program in a child process whose output (stdout and stderr) we read line by line, to
/// signal it at a chosen moment.
struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
};

inline Child spawn(const std::string& exe, const std::vector<std::string>& args) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    std::vector<char*> argv;
    std::string path = exe;
    argv.push_back(path.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(path.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  return {pid, ::fdopen(fds[0], "r")};
}

/// Reads the child's output until a line contains `marker` (true) or the output ends (false).
inline bool read_until(Child& c, const std::string& marker, std::string& log) {
  std::array<char, 4096> line{};
  while (std::fgets(line.data(), line.size(), c.out)) {
    log += line.data();
    if (std::string(line.data()).find(marker) != std::string::npos) return true;
  }
  return false;
}

inline int finish(Child& c, std::string& log) {
  read_until(c, "\x01never", log);
  std::fclose(c.out);
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace test
