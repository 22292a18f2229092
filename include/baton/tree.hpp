#pragma once
/// \file tree.hpp
/// Curricula that branch: one pretraining, a suite of fine-tunes. A stage that says `from =
/// "pretrain"` starts from that stage's final state; stages without it follow the one before. The
/// stages make a tree, one branch per leaf, named by its last stage (docs/curricula.md).
///
/// ```cpp
/// auto result = baton::run_tree("examples/fashion_suite.toml", {});
/// if (result) fmt::print("{}", result->table());
/// ```
///
/// `run_tree` trains each stage once, whichever branches go through it, in its own run directory
/// `<run_dir>/<stage>` (metrics, checkpoints, final.baton, TensorBoard, like any `baton::run`),
/// starting from its parent stage's final state; a branch's scratch baseline (`baseline =
/// "scratch"`) trains in `<run_dir>/scratch/<stage>`. A branch is trained as the chain of its
/// path (`Curriculum::branches()`), so its bits equal an independent run of that chain. Called
/// again, every unfinished stage resumes from its newest checkpoint and finished ones are read
/// back; a stage whose configuration changed since is refused, naming it. The run directory gets
/// `summary.json` (the schema of a sweep's sweep.json) and `report.html` (every stage's curves).
/// It is the sweep's implementation (sweep.hpp) with one point and directories named by stage.

#include <filesystem>
#include <string>
#include <vector>

#include "baton/run.hpp"
#include "baton/sweep.hpp"

namespace baton {

struct TreeOptions {
  std::filesystem::path dir{};      ///< the run directory; empty: the file's `[run] run_dir`
  std::vector<std::string> sets{};  ///< overrides, as `baton run --set`
  bool progress = true;             ///< progress lines on stdout
  bool report = true;               ///< write dir/report.html
  bool fresh = false;               ///< start over: every stage trained again
  int jobs = 1;                     ///< stages trained at once (as SweepOptions::jobs)
  int threads = 0;                  ///< with jobs > 1: intra-op threads of all jobs together (0: available_cores())
  std::filesystem::path executable{};  ///< with jobs > 1: the program that serves `sweep-node` (SweepOptions::executable)
  Registry registry = Registry::builtin();
};

/// One stage of a tree built in C++: its spec and where it starts.
struct TreeStage {
  TrainingSpec spec{};
  std::string from{};             ///< the stage it starts from (its name); empty: the stage before (the first: `initial`)
  bool scratch_baseline = false;  ///< also train this stage (and those after it to each leaf) from `initial`, without the stages before
};

/// The same tree from specs, in one call: `options.dir` is the tree's directory (each stage's
/// run in `<dir>/<stage>`, as for a file), `options.name`, `checkpoint_every`,
/// `keep_checkpoints`, `tensorboard`, `fresh`, `progress` and `report` apply to every stage's run.
/// A stage's fingerprint is `describe` of its path from `initial`, so a resume after a change
/// anywhere on the path is refused, naming the stage. In this process only (no `jobs`), on one
/// rank. Errors: `from` naming itself, a later or an unknown stage, two stages of one name, an
/// undescribed part without `accept_undescribed`, those of `run`.
Expected<SweepResult> run_tree(const RunOptions& options, const std::vector<TreeStage>& stages, const TrainState& initial);

/// Trains every branch of the tree curriculum `file` (a chain is a tree of one branch) and
/// returns one row per branch (SweepPointResult::branch), each baseline after its branch.
/// Errors: those of the curriculum (every branch's, before anything trains) and of `run`, with
/// the branch and stage as context.
Expected<SweepResult> run_tree(const std::filesystem::path& file, const TreeOptions& options);

}  // namespace baton
