// A sweep's nodes in parallel processes (sweep.hpp, SweepOptions::jobs): each node is
// `executable sweep-node FILE --dir DIR --stage LEVEL --threads N --set ...`, started when its
// parent has finished, at most `jobs` at once. Every node gets the same threads, so its bits do
// not depend on what ran beside it.
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "baton/exit_codes.hpp"  // what a node's exit status means
#include "baton/runtime.hpp"
#include "baton/sweep.hpp"
#include "internal.hpp"
#include "run/run_lock.hpp"
#include "io.hpp"
#include "train/signals.hpp"

namespace baton::detail {
namespace {
namespace fs = std::filesystem;

/// A node directory whose run another process still holds (a child of a sweep that was killed,
/// still writing its checkpoint after its SIGTERM) is waited for, up to a minute; then the node's
/// process says who holds it.
void wait_for_lock(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir / ".lock", ec)) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool said = false;
  while (std::chrono::steady_clock::now() < until) {
    if (auto lock = RunLock::acquire(dir)) return;  // free (released again at once)
    if (!said) fmt::print(stderr, "baton: waiting for the process that still holds {}\n", dir.string());
    said = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

/// Forks and execs one node; -1 (with errno) when fork fails.
pid_t start(const std::vector<std::string>& args) {
  std::vector<std::string> storage = args;
  std::vector<char*> argv;
  for (auto& a : storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t sweeper = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  // Its own process group: a Ctrl-C at the terminal reaches the sweep only, which passes on one
  // SIGTERM (a node that got two signals would leave at once, without its checkpoint). The
  // sweep's death (kill -9) stops it as a SIGTERM does: no node trains unsupervised.
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != sweeper) ::_exit(1);
  ::execv(argv[0], argv.data());
  const char* msg = "baton: sweep: cannot run the node program (SweepOptions::executable)\n";
  (void)!::write(2, msg, std::strlen(msg));
  ::_exit(127);
}
}  // namespace

Expected<bool> train_in_processes(const fs::path& file, const std::vector<SweepTask>& tasks, std::vector<bool> finished,
                                  const SweepOptions& o) {
  if (o.executable.empty())
    return fail(ErrorCode::invalid_argument, fmt::format("sweep: jobs = {} trains nodes in child processes; set "
                                                         "SweepOptions::executable to the baton program (baton sweep "
                                                         "passes itself)", o.jobs));
  const int threads = std::max(1, (o.threads > 0 ? o.threads : available_cores()) / o.jobs);
  SignalScope signals(true);
  std::map<pid_t, std::size_t> running;  // pid -> task
  std::vector<bool> started = finished;
  std::optional<Error> failure;
  bool stopping = false;  // a signal or a failure: start nothing more, let the running ones checkpoint
  bool interrupted = false;
  bool signalled = false;  // a Ctrl-C or SIGTERM of ours, passed on
  auto stop_all = [&] {
    if (stopping) return;
    stopping = true;
    for (const auto& [pid, t] : running) ::kill(pid, SIGTERM);
  };
  for (;;) {
    if (signals.raised() && !signalled) {
      signalled = true;
      stop_all();
    }
    for (std::size_t t = 0; t < tasks.size() && !stopping && static_cast<int>(running.size()) < o.jobs; ++t) {
      const auto& task = tasks[t];
      if (started[t] || (task.parent && !finished[*task.parent])) continue;
      wait_for_lock(task.dir);
      std::vector<std::string> args = {o.executable.string(), "sweep-node", file.string(), "--dir", o.dir.string(),
                                       "--stage", std::to_string(task.level), "--threads", std::to_string(threads)};
      for (const auto& s : task.sets) args.insert(args.end(), {"--set", s});
      if (!task.branch.empty()) args.insert(args.end(), {"--branch", task.branch});
      if (o.by_stage) args.push_back("--by-stage");
      if (o.fresh) args.push_back("--fresh");
      const pid_t pid = start(args);
      if (pid < 0) {
        failure = Error{ErrorCode::io, fmt::format("sweep node {}: cannot start a process: {}", task.dir.string(), std::strerror(errno)), {}};
        stop_all();
        break;
      }
      started[t] = true;
      running.emplace(pid, t);
      if (o.progress)
        fmt::print("{}: stage \"{}\" for {} {}{} -> {} (process {}, {} thread{})\n", o.by_stage ? "tree" : "sweep", task.stage,
                   task.users, o.by_stage ? "branch" : "point", task.users == 1 ? "" : (o.by_stage ? "es" : "s"), task.dir.string(), pid, threads, threads == 1 ? "" : "s");
    }
    if (running.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (auto it = running.begin(); it != running.end();) {
      int status = 0;
      if (::waitpid(it->first, &status, WNOHANG) != it->first) {
        ++it;
        continue;
      }
      const auto& task = tasks[it->second];
      if (WIFEXITED(status) && WEXITSTATUS(status) == cli::exit_ok) {
        finished[it->second] = true;
        if (o.progress) fmt::print("sweep: finished {}\n", task.dir.string());
      } else if ((WIFEXITED(status) && WEXITSTATUS(status) == cli::exit_interrupted) ||
                 (signalled && WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM)) {
        // Stopped by the SIGTERM we passed on (before its handlers were up, it ends by it; its
        // files are written atomically), or by a signal of its own: go on later.
        interrupted = true;
        stop_all();
      } else if (!failure) {
        failure = Error{ErrorCode::runtime,
                        fmt::format("sweep node {}: its process ended with {} (its messages are above); the other "
                                    "nodes were stopped with a checkpoint, run the sweep again to go on",
                                    task.dir.string(), exit_status_text(status)), {}};
        stop_all();
      }
      it = running.erase(it);
    }
    std::fflush(stdout);
  }
  if (failure) return tl::unexpected(*failure);
  if (interrupted || stopping) return false;
  return true;
}

}  // namespace baton::detail
