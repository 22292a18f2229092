#pragma once
// Processes in tests: commands run to completion (shell, python), children that are signalled or
// killed at a chosen moment, and scratch directories. No LibTorch, no baton headers.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

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

struct Output {
  int rc;           ///< the exit status (-1: killed by a signal)
  std::string out;  ///< standard output and standard error, interleaved
};

/// Runs `cmd` with /bin/sh, collecting its output and standard error.
inline Output shell(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

/// A fresh directory of this process: `<tmp>/baton-<name>-<pid>`, emptied if it exists.
inline std::filesystem::path temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / fmt::format("baton-{}-{}", name, ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// What a Python script imports, and the Debian package that gives it to /usr/bin/python3.
struct PythonModule {
  std::string name, package;
};
inline const PythonModule kTorch{"torch", "python3-torch"};
inline const PythonModule kSklearn{"sklearn", "python3-sklearn"};

/// Runs a Python script (written to dir/script.py) with Debian's Python; fails (never skips)
/// when /usr/bin/python3 cannot import `needs` (PyTorch unless told otherwise).
inline Output python(const std::filesystem::path& dir, const std::string& script, const std::string& args = "",
                     const PythonModule& needs = kTorch) {
  const auto probe = shell(fmt::format("/usr/bin/python3 -c 'import {}'", needs.name));
  if (probe.rc != 0)
    FAIL("this test needs " << needs.name << " for /usr/bin/python3 (Debian package " << needs.package
                            << "; scripts/common.sh installs it): " << probe.out);
  std::ofstream(dir / "script.py") << script;
  return shell(fmt::format("cd {} && /usr/bin/python3 script.py {}", dir.string(), args));
}

/// A row of `baton predict`'s CSV: the predicted class, its name and its probability.
struct Prediction {
  std::int64_t cls;
  std::string name;
  double probability;
};

/// The rows of a predictions CSV (header checked), as input id -> prediction, in file order.
inline std::vector<std::pair<std::string, Prediction>> read_predictions(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);
  REQUIRE(line == "input,class,name,probability");
  std::vector<std::pair<std::string, Prediction>> rows;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
    REQUIRE(cells.size() == 4);
    rows.emplace_back(cells[0], Prediction{std::stoll(cells[1]), cells[2], std::stod(cells[3])});
  }
  return rows;
}

#ifdef BATON_EXE
/// The `baton` command of this build with `args`, through the shell.
inline Output baton_cli(const std::string& args) { return shell(std::string(BATON_EXE) + " " + args); }
#endif

}  // namespace test
