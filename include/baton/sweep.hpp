#pragma once
/// \file sweep.hpp
/// Sweeps that share their prefix. Because a `TrainState` is a value, points of a sweep that
/// agree on their first stages (the same resolved configuration up to a stage) train those stages
/// once; each point goes on from a copy of the shared state. `baton sweep` is this call.
///
/// ```cpp
/// auto points = baton::sweep_grid({"stage.finetune.optimizer.lr=[1e-4, 3e-4, 1e-3]"});
/// auto result = baton::sweep("fashion.toml", {.dir = "sweeps/lr", .points = *points});
/// if (result) fmt::print("{}", result->table());
/// ```
///
/// The sweep directory holds one run directory per node of the tree (`<stage index>-<stage
/// name>-<12 hex digits of the configuration up to it>`), each a `baton::run` of one stage that
/// starts from its parent's `final.baton`, and writes `sweep-node.json` (its parent, its
/// `params_sha256`, its last metrics) when it has finished. Called again, every unfinished node
/// resumes like any run and a finished one is read back, so a sweep stopped by Ctrl-C or kill -9
/// goes on where it was.
///
/// A curriculum that branches (tree.hpp) is swept the same way, every branch of every point; a
/// node's key holds the datasets its stages up to it name, not all of the file's. `run_tree` is
/// this function with one point and directories named by stage.
///
/// With `jobs` > 1, nodes whose parent has finished train in parallel processes (`executable
/// sweep-node ...`, at most `jobs` at once, each on `threads / jobs` intra-op threads, the shared
/// stages too: the bits depend on the threads, so every node gets the same number).

#include <filesystem>
#include <string>
#include <vector>

#include "baton/error.hpp"
#include "baton/eval.hpp"
#include "baton/hparams.hpp"

namespace baton {

/// One point of a sweep: overrides with the curriculum's paths (as `baton run --set`).
using SweepPoint = std::vector<std::string>;

/// The points of a grid: each axis "path=[v1, v2, ...]" (the values a TOML array); the product
/// of the axes, the last varying fastest. Errors name the axis and what is wrong with it.
Expected<std::vector<SweepPoint>> sweep_grid(const std::vector<std::string>& axes);

struct SweepOptions {
  std::filesystem::path dir{};         ///< the sweep directory (created if missing)
  std::vector<std::string> sets{};     ///< overrides for every point, before the point's own
  std::vector<SweepPoint> points{};    ///< at least one
  std::string metric{};                ///< "set/metric" that ranks the points; empty: the accuracy of the first set the last stage evaluates (its first listed metric when it lists metrics without accuracy)
  bool maximize = true;                ///< the best point has the largest metric (false: the smallest)
  bool progress = true;                ///< progress lines on stdout
  bool report = true;                  ///< write dir/report.html: every node's metrics overlaid
  int jobs = 1;                        ///< nodes trained at once: 1 in this process, more in child processes
  int threads = 0;                     ///< with jobs > 1: intra-op threads of all jobs together (0: available_cores())
  /// With jobs > 1: the program that trains a node, called as `executable sweep-node FILE --dir DIR
  /// --stage LEVEL --threads N --set ...`. `baton sweep` passes itself; a program of your own with
  /// its own models serves the command with `baton::cli::main(argc, argv, registry)` (cli.hpp).
  std::filesystem::path executable{};
  Registry registry = Registry::builtin();
  bool fresh = false;                  ///< start over: every node's run is trained again (RunOptions::fresh)
  /// Node directories `<dir>/<stage>` (a scratch baseline's `<dir>/scratch/<stage>`) instead of
  /// `<level>-<stage>-<hash>`: a tree's layout (run_tree, tree.hpp), where each stage has one
  /// configuration and a changed one is refused on resume rather than trained beside the old.
  bool by_stage = false;
  /// sweep_node only: the branch of a tree the node belongs to ("name", or "name@scratch" for a
  /// scratch baseline); empty for a curriculum that does not branch.
  std::string branch{};
};

/// The `[sweep]` table of a curriculum file as options (docs/sweep.md): `grid` (a table of
/// path = [values], their product, in the order written), `points` (a list of tables of path =
/// value, after the grid's), `metric`, `mode` ("max" or "min"), `jobs` and `dir` (default: the
/// run directory + "-sweep"); `threads` from `[run] threads`. A file without the table gives no
/// points. Errors: those of `load_curriculum`, the table's with file:line.
Expected<SweepOptions> sweep_options(const std::filesystem::path& file, const std::vector<std::string>& sets = {},
                                     const Registry& registry = Registry::builtin());

/// What one point of a sweep (or one branch of a tree) gave.
struct SweepPointResult {
  SweepPoint overrides{};
  std::size_t shared_stages = 0;        ///< stages trained once for this point and at least one other
  std::filesystem::path final_state{};  ///< the run directory's final.baton of its last stage
  std::string params_sha256{};
  Metrics final_metrics{};              ///< the last evaluation of its last stage
  double score = 0;                     ///< the ranking metric (NaN when the point has none)
  std::string branch{};                 ///< a tree's branch (its last stage's name); "" for a chain
  bool baseline = false;                ///< the branch's scratch baseline
  std::filesystem::path dir{};          ///< the run directory of its last stage
  double seconds = 0;                   ///< training time of its own stages (those no other point or branch shares)
  std::filesystem::path best_state{};   ///< its last stage's keep_best state, when it keeps one
  std::string metric{};                 ///< what `score` is: SweepOptions::metric, else its last stage's first set's accuracy
};

struct SweepResult {
  std::vector<SweepPointResult> points{};  ///< in the order of SweepOptions::points
  std::size_t best = 0;                  ///< index of the best point
  std::size_t stages_trained = 0;        ///< tree nodes (stage runs); a sweep without sharing trains points x stages
  std::size_t stages_total = 0;          ///< points x stages
  std::string metric{};                  ///< the ranking metric's name
  bool maximize = true;                  ///< as SweepOptions::maximize
  bool interrupted = false;              ///< Ctrl-C or SIGTERM: a checkpoint was written; call again to go on
  std::filesystem::path summary_file{};  ///< dir/sweep.json when written (empty if not: the reason went to stderr)
  std::filesystem::path report_file{};   ///< dir/report.html when written (empty if not, or not asked for)
  /// One row per point, best first, the best marked with '*'. A tree's: one row per branch in
  /// the file's order, its metrics on each set it evaluates, its scratch baseline under it with
  /// the difference in the branch's metric.
  [[nodiscard]] std::string table() const;
};

/// Trains every point of `options.points` on the curriculum `file`, sharing the stages points
/// agree on. Errors: those of the curriculum (for any point, all found before training) and of
/// `run`, with the point's overrides as context.
Expected<SweepResult> sweep(const std::filesystem::path& file, const SweepOptions& options);

/// Trains one node of a sweep in this process: stage `level` of the one point `options.sets`
/// make (`options.points` is not read), from its parent's final state in `options.dir`; true
/// when it finished, false when a signal stopped it (a checkpoint was written). This is what
/// `sweep` runs in each child process when `jobs` > 1 (`baton sweep-node`).
Expected<bool> sweep_node(const std::filesystem::path& file, const SweepOptions& options, std::size_t level);

}  // namespace baton
