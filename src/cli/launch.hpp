#pragma once
// `baton launch` and `baton run --nproc`: N local processes of one data-parallel group.
#include <chrono>
#include <string>
#include <vector>

namespace baton::cli {

struct LaunchOptions {
  int nproc = 1;                       ///< ranks to start on this machine
  std::vector<std::string> command{};  ///< what each rank runs (argv; searched in PATH)
  /// After the first rank fails, how long the others get to stop by themselves (their
  /// collectives fail when a peer is gone) before they are sent SIGTERM, then SIGKILL.
  std::chrono::milliseconds grace{std::chrono::seconds(30)};
  bool rank_logs = false;              ///< sets BATON_RANK_LOGS=1: ranks > 0 keep their output in rank-<k>.log
};

/// Starts `nproc` processes with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
/// MASTER_ADDR=127.0.0.1 and a free MASTER_PORT set, each in its own process group; forwards
/// SIGINT and SIGTERM to them; waits. Returns 0 when every rank succeeded; otherwise prints
/// "rank K failed (...)" for the first rank that failed and returns 1 (or the ranks' common
/// exit code when all stopped alike, e.g. 3 after Ctrl-C).
int launch(const LaunchOptions& options);

/// The path of the running executable (/proc/self/exe), to start more of itself.
std::string self_executable();

}  // namespace baton::cli
