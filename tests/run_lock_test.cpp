// One run directory, one writer: a second `baton run` on a directory in use refuses, and a run
// that was killed does not leave the directory locked.
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <signal.h>
#include <unistd.h>

#include <fmt/format.h>

#include "helpers.hpp"
#include "process.hpp"

namespace fs = std::filesystem;

namespace {
const char* kLongRun = R"(
[run]
name = "lock"
max_duration = "400ep"
[model]
name = "mlp"
widths = [8, 64, 4]
[datasets.train]
kind = "synthetic"
samples = 2000
[[stages]]
name = "long"
duration = "400ep"
data = "train"
batch_size = 8
optimizer = { name = "sgd", lr = 0.01 }
)";

struct LockOutcome {
  int code;
  std::string out;
};

LockOutcome lock_run(const std::string& args) {
  auto r = test::shell(fmt::format("timeout -s KILL 120 {} {}", BATON_EXE, args));
  return {r.rc, std::move(r.out)};
}

/// Starts `baton run` in the background and returns its pid once it holds the lock.
pid_t start_run(const fs::path& cfg, const fs::path& dir) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const std::string log = (dir.parent_path() / "first.log").string();
    std::freopen(log.c_str(), "w", stdout);
    std::freopen(log.c_str(), "a", stderr);
    ::execl(BATON_EXE, BATON_EXE, "run", cfg.c_str(), "--run-dir", dir.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // The lock file names its holder once the lock is taken.
  for (int i = 0; i < 600; ++i) {
    std::ifstream in(dir / ".lock");
    std::string holder;
    if (in >> holder && holder == std::to_string(pid)) return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  FAIL("the first run did not take the lock within 60 s");
  return pid;
}
}  // namespace

TEST_CASE("a second baton run on a run directory in use refuses -- a killed run leaves no stale lock", "[cli][lock]") {
  const auto root = fs::temp_directory_path() / fmt::format("baton-lock-{}", ::getpid());
  fs::remove_all(root);
  fs::create_directories(root);
  const auto cfg = root / "long.toml", dir = root / "run";
  std::ofstream(cfg) << kLongRun;

  const pid_t first = start_run(cfg, dir);
  const auto second = lock_run(fmt::format("run {} --run-dir {}", cfg.string(), dir.string()));
  CHECK(second.code == 2);
  CHECK(second.out.find("in use by another baton run (pid " + std::to_string(first) + ")") != std::string::npos);
  // The refused run wrote nothing: no config, no checkpoints, no metrics of its own.
  CHECK_FALSE(fs::exists(dir / "metrics.jsonl.tmp"));

  // A crash (SIGKILL: no handler, no cleanup) releases the lock with the process.
  REQUIRE(::kill(first, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(first, &status, 0) == first);
  CHECK(WIFSIGNALED(status));
  const auto after = lock_run(fmt::format("validate {}", cfg.string()));
  REQUIRE(after.code == 0);
  // The directory is usable again: a short run with the same directory goes through.
  const auto third = lock_run(fmt::format("run {} --run-dir {} --fresh --set run.max_duration=1ep --set stage.long.duration=1ep",
                                     cfg.string(), dir.string()));
  INFO(third.out);
  CHECK(third.code == 0);
  fs::remove_all(root);
}
