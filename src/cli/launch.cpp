// The local launcher: N ranks of one process group, as torchrun's standalone mode does.
#include "launch.hpp"

#include "baton/cli.hpp"
#include "io.hpp"
#include "train/signals.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)

namespace baton::cli {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::atomic<int> g_forward_signal{0};

// A hang-up (the terminal closed, an ssh session lost) stops the ranks as SIGTERM does: with a
// checkpoint (baton run handles SIGINT and SIGTERM, not SIGHUP).
extern "C" void baton_launch_on_signal(int sig) { g_forward_signal = sig == SIGHUP ? SIGTERM : sig; }

/// A port nobody listens on now: bind port 0 on loopback and read what the kernel chose. (Rank
/// 0's TCPStore binds it a moment later; another program could take it in between, in which
/// case the ranks fail to rendezvous with an error saying so.)
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

}  // namespace

std::string self_executable() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("baton");
}

/// Collects every rank that has ended since the last look; returns one that failed on its own
/// (of several at once, one killed by a signal, the cause, before one that failed because of
/// it). After a forwarded signal, a rank that stopped with exit 3 did as asked.
std::optional<int> collect_ended(const std::vector<pid_t>& pids, std::vector<std::optional<int>>& statuses, bool forwarded) {
  std::optional<int> pick;
  for (std::size_t r = 0; r < pids.size(); ++r) {
    if (statuses[r]) continue;
    int st = 0;
    if (::waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;
    statuses[r] = st;
    if (!failed(st) || (forwarded && WIFEXITED(st) && WEXITSTATUS(st) == exit_interrupted)) continue;
    if (!pick || (WIFSIGNALED(st) && !WIFSIGNALED(*statuses[static_cast<std::size_t>(*pick)]))) pick = static_cast<int>(r);
  }
  return pick;
}

/// The launcher's exit status: when a rank failed on its own (named, with the others), its exit
/// code (2: invalid input, such as a run directory in use; 1: training failed), or 1 if a signal
/// ended it; else the ranks' common one: 0 when all succeeded, 3 when all stopped after a
/// forwarded signal.
int exit_status(const std::vector<std::optional<int>>& statuses, std::optional<int> first_failed) {
  if (first_failed) {
    std::vector<std::string> others;
    for (std::size_t r = 0; r < statuses.size(); ++r)
      if (static_cast<int>(r) != *first_failed) others.push_back(fmt::format("rank {}: {}", r, detail::exit_status_text(*statuses[r])));
    fmt::print(stderr, "baton launch: rank {} failed ({}){}{}\n", *first_failed,
               detail::exit_status_text(*statuses[static_cast<std::size_t>(*first_failed)]), others.empty() ? "" : "; ",
               fmt::join(others, ", "));
    const int st = *statuses[static_cast<std::size_t>(*first_failed)];
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
  }
  // No rank failed on its own: all succeeded (0), or all stopped after a forwarded signal (3, the
  // code `baton run` gives an interrupted run, when every rank wrote or joined its checkpoint).
  int code = 0;
  for (const auto& st : statuses)
    if (failed(*st)) code = WIFEXITED(*st) ? WEXITSTATUS(*st) : 128 + WTERMSIG(*st);
  return code;
}

/// Forks and execs the ranks with torchrun's variables; false (the started ones stopped) if a
/// fork fails.
bool start_ranks(const LaunchOptions& o, int port, const struct sigaction& old_int, const struct sigaction& old_term,
                 const struct sigaction& old_hup, std::vector<pid_t>& pids) {
  const pid_t launcher = ::getpid();
  std::vector<std::string> argv_storage = o.command;
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (int r = 0; r < o.nproc; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      fmt::print(stderr, "baton launch: cannot start rank {}: {}\n", r, std::strerror(errno));
      for (int k = 0; k < r; ++k) ::kill(pids[static_cast<std::size_t>(k)], SIGTERM);
      for (int k = 0; k < r; ++k) ::waitpid(pids[static_cast<std::size_t>(k)], nullptr, 0);
      return false;
    }
    if (pid == 0) {
      // Its own process group: a Ctrl-C at the terminal reaches the launcher only, which
      // forwards it once (a rank that got it twice would leave at once, without a checkpoint).
      ::setpgid(0, 0);
      sigaction(SIGINT, &old_int, nullptr);
      sigaction(SIGTERM, &old_term, nullptr);
      sigaction(SIGHUP, &old_hup, nullptr);
      // The launcher's death (SIGKILL, a crash) stops the rank as a SIGTERM does: no rank trains
      // unsupervised, and rank 0's lock on the run directory goes with it. If the launcher died
      // before this line, the parent is already another process.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(1);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      if (o.rank_logs) ::setenv("BATON_RANK_LOGS", "1", 1);
      ::execvp(argv[0], argv.data());
      fmt::print(stderr, "baton launch: rank {}: cannot run {}: {}\n", r, argv[0], std::strerror(errno));
      ::_exit(127);
    }
    pids[static_cast<std::size_t>(r)] = pid;
  }
  return true;
}

int launch(const LaunchOptions& o) {
  if (o.nproc < 1) {
    fmt::print(stderr, "baton launch: -n must be at least 1, got {}\n", o.nproc);
    return 2;
  }
  if (o.command.empty()) {
    fmt::print(stderr, "baton launch: no command to run; write it after --, e.g. baton launch -n 2 -- baton run f.toml\n");
    return 2;
  }
  const int port = free_port();
  if (port <= 0) {
    fmt::print(stderr, "baton launch: cannot find a free TCP port on 127.0.0.1: {}\n", std::strerror(errno));
    return 1;
  }
  fmt::print(stderr, "baton launch: {} ranks, rendezvous at 127.0.0.1:{}\n", o.nproc, port);
  std::fflush(stderr);
  std::fflush(stdout);

  struct sigaction sa {}, old_int{}, old_term{}, old_hup{};
  sa.sa_handler = baton_launch_on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);
  g_forward_signal = 0;
  detail::release_stop_signals();  // one held since the start is forwarded like any later one

  std::vector<pid_t> pids(static_cast<std::size_t>(o.nproc), -1);
  std::vector<std::optional<int>> statuses(pids.size());
  if (!start_ranks(o, port, old_int, old_term, old_hup, pids)) return 1;

  std::optional<int> first_failed;  // rank
  std::optional<SteadyClock::time_point> term_at, kill_at;
  bool termed = false, killed = false;
  bool forwarded = false;  // a Ctrl-C/SIGTERM was passed on: ranks that stop with exit 3 did as asked
  auto alive = [&] {
    int count = 0;
    for (std::size_t r = 0; r < pids.size(); ++r) count += statuses[r] ? 0 : 1;
    return count;
  };
  auto signal_alive = [&](int sig) {
    for (std::size_t r = 0; r < pids.size(); ++r)
      if (!statuses[r]) ::kill(pids[r], sig);
  };
  while (alive() > 0) {
    const std::optional<int> pick = collect_ended(pids, statuses, forwarded);
    if (!first_failed) {
      if (pick && !termed) {
        first_failed = pick;
        fmt::print(stderr, "baton launch: rank {} failed ({}); the other ranks get {:g} s to stop\n", *pick,
                   detail::exit_status_text(*statuses[static_cast<std::size_t>(*pick)]),
                   static_cast<double>(o.grace.count()) / 1000.0);
        std::fflush(stderr);
        term_at = SteadyClock::now() + o.grace;
      }
    }
    if (const int sig = g_forward_signal.exchange(0); sig != 0) {
      forwarded = true;
      signal_alive(sig);
      if (!term_at) term_at = SteadyClock::now() + o.grace;  // a second Ctrl-C is forwarded too
    }
    const auto now = SteadyClock::now();
    if (term_at && !termed && now >= *term_at && alive() > 0) {
      fmt::print(stderr, "baton launch: stopping the {} remaining rank(s) (SIGTERM)\n", alive());
      signal_alive(SIGTERM);
      termed = true;
      kill_at = now + std::chrono::seconds(10);
    }
    if (kill_at && !killed && now >= *kill_at && alive() > 0) {
      signal_alive(SIGKILL);
      killed = true;
    }
    if (alive() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);

  return exit_status(statuses, first_failed);
}

}  // namespace baton::cli
