#pragma once
// Pieces of run directories (run.hpp): resuming, the run's own observers, the stage summary.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "baton/callbacks.hpp"
#include "baton/run.hpp"

namespace baton::detail {

/// Where a run directory's newest valid checkpoint puts the chain.
struct Resume {
  TrainState state;
  std::int64_t stage_index = 0;  ///< the stage it was written in
  bool stage_done = false;       ///< written at that stage's end
  std::filesystem::path from;
  std::string not_bit_exact{};  ///< the checkpoint's record, plus a runtime change accepted now
};

/// What a checkpoint must match to be resumed from.
struct ResumeCheck {
  std::string fingerprint;  ///< the configuration's
  std::string config;       ///< its text, for the diff when it changed
  std::string numerics;     ///< numerics_environment() (+ "; ranks=N") of this process
  bool accept_runtime_change = false;
  const std::vector<TrainingSpec>* stages = nullptr;  ///< the run's, for the checkpoint's place in them
};

/// The newest valid checkpoint of `dir`/checkpoints, skipping (and saying so on stderr) bad ones.
/// A checkpoint of another fingerprint is an error that shows the configuration's changes; one
/// written with other numerics, an error naming them unless `accept_runtime_change`.
Expected<std::optional<Resume>> find_resume(const std::filesystem::path& dir, const ResumeCheck& check,
                                            const ModelFactory& factory);

/// The "key=value; ..." pairs that differ between two numerics records, as "threads 4 -> 2, ...".
std::string numerics_changes(const std::string& before, const std::string& now);

/// Temporary files of checkpoint writes that a killed run left in `dir`/checkpoints
/// (`.<name>.tmp-<pid>`): never valid checkpoints, removed (saying so) so they do not pile up.
void remove_unfinished_writes(const std::filesystem::path& dir);

/// Creates `dir` and dir/checkpoints, or says what stands in the way (a file, a dangling link).
Expected<void> make_run_directory(const std::filesystem::path& dir);

/// Names baton writes in `dir` held by what its writes cannot replace (a directory where a
/// checkpoint, the final state, config or report goes; anything but a regular file where metrics
/// are appended: a FIFO would block): an error naming it, before anything trains.
Expected<void> check_run_files(const std::filesystem::path& dir);

/// `--fresh`: removes the files a run writes in `dir` (checkpoints, metrics, final state,
/// report, config, TensorBoard files, unfinished temporary files), and nothing else.
void remove_run_files(const std::filesystem::path& dir);

/// A C++ run's tools.toml: the model (when its factory is `models::Named`) and the datasets that
/// a baton loader made (their DataOrigin), as a curriculum's [run], [model], [datasets.<name>]
/// and one stage (the last one's name, data and evaluation), so that `baton eval`, `baton
/// export` and `baton predict` rebuild them by name. What cannot be rebuilt is said in comments.
std::string tools_record(const std::vector<TrainingSpec>& stages, const TrainState& initial, const std::string& run_name,
                         const std::filesystem::path& dir);

/// What the run's observers saw in a stage, for its summary and messages.
struct StageTrace {
  Metrics last_metrics{};
  std::vector<double> losses{};
  double last_loss = 0;
  std::filesystem::path checkpoint{};  ///< the newest checkpoint written
  double eval_seconds = 0;
};

/// Logs "train/loss" (the mean since the last line), "train/lr" and "train/samples_per_s" at
/// fixed batches of the stage (every ~1% of it, at most 50 batches apart, and at its end: the
/// same batches however the stage is cut or resumed; the running sum lives in the state), and
/// records checkpoints and evaluation time in `trace`.
Callback train_log(std::shared_ptr<StageTrace> trace);

/// A logger that prints evaluation metrics through `progress` (when given) and keeps the last
/// ones in `trace`.
std::shared_ptr<Logger> eval_echo(std::shared_ptr<StageTrace> trace, std::shared_ptr<Progress> progress);

/// KeepBest in a run directory: the state at each evaluation that is a new best, saved to `path`
/// (atomically, as every checkpoint).
Callback best_file(std::filesystem::path path, CheckpointMeta meta);

}  // namespace baton::detail
