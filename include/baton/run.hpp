#pragma once
/// \file run.hpp
/// A run directory for any chain of stages: what `baton run` gives a TOML curriculum, one call
/// gives a C++ one. `baton::run` trains the stages in order and keeps, in `options.dir`:
///
/// | file                         | what                                                          |
/// | ---------------------------- | ------------------------------------------------------------- |
/// | `config.toml`                | the configuration (a curriculum's resolved TOML, or a summary of the specs) |
/// | `tools.toml`                 | a C++ run's model and datasets, for `baton eval/export/predict` (docs/run-directory.md) |
/// | `metrics.jsonl`, `metrics.csv` | training and evaluation metrics, one schema (docs/report.md) |
/// | `checkpoints/ckpt-*.baton`   | at intervals (keep-last-N), at each stage's end, on Ctrl-C     |
/// | `final.baton`                | the final state                                               |
/// | `tensorboard/`               | TensorBoard event files, when asked                           |
/// | `report.html`                | `baton report` of the directory                               |
///
/// Called again on the same directory, it resumes from the newest valid checkpoint (a run of
/// another configuration is refused, naming what changed), so a crash or Ctrl-C loses at most
/// the batches since the last checkpoint and the result has the bits of an uninterrupted run.
///
/// ```cpp
/// auto state = baton::init_state(make_net, {.seed = 42, .max_duration = "6ep"_t});
/// auto result = baton::run({.dir = "runs/fashion", .checkpoint_every = "1ep"_t},
///                          {warmup, main_stage, finetune}, std::move(*state));
/// if (!result) { fmt::print(stderr, "{}\n", result.error()); return 1; }
/// if (result->interrupted) return 3;              // Ctrl-C: run it again to resume
/// fmt::print("{}", result->summary());
/// ```

#include <atomic>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "baton/error.hpp"
#include "baton/eval.hpp"
#include "baton/spec.hpp"
#include "baton/state.hpp"

namespace baton {

class Distributed;

/// Where and how a run keeps its directory.
struct RunOptions {
  std::filesystem::path dir{};             ///< the run directory (created if missing)
  std::string name = "run";                ///< names the run in checkpoints and the report
  /// Written to config.toml and hashed into the fingerprint that guards resumes. Empty:
  /// `describe(stages, &initial)`, every setting of the stages that can change the bits, so a
  /// resume with any of them changed is refused with a diff.
  std::string config{};
  std::string fingerprint{};               ///< empty: SHA-256 of `config`
  std::optional<Time> checkpoint_every{};  ///< also checkpoint every this much (from each stage's start)
  int keep_checkpoints = 3;                ///< interval checkpoints kept (stage ends are always kept)
  bool tensorboard = false;                ///< also write TensorBoard event files to dir/tensorboard
  bool report = true;                      ///< write dir/report.html at the end
  bool fresh = false;                      ///< start over: remove the files a run writes (only those)
  /// Resume even where the machine's numerics differ from the checkpoint's (threads, LibTorch,
  /// CPU kernels, BLAS: numerics_environment() in runtime.hpp). Without it such a resume is an
  /// error naming the difference; with it the run goes on and records that its bits are no longer
  /// those of an uninterrupted run (RunResult::not_bit_exact, and in every later checkpoint).
  bool accept_runtime_change = false;
  /// Resume even though part of the run cannot be described, so baton cannot tell whether it
  /// changed since the checkpoint: an algorithm or a stopping callback without an identity, a
  /// lazy dataset whose Source gives none, an unnamed loss or schedule (`describe` lists them).
  /// Without it such a resume is refused, naming each; better to give each an identity. (A
  /// `fingerprint` of your own is your word for everything, and is not questioned.)
  bool accept_undescribed = false;
  /// Pause when the run's clock reaches this point: epochs, batches or samples of the whole run
  /// (Timestamp's counters; "0.5dur" is half the max duration). The run writes a checkpoint there
  /// and returns with RunResult::paused; called again (with a later pause point or none) it goes
  /// on from the checkpoint, to the bits of a run never paused. The CLI's `baton run --until`.
  std::optional<Time> pause_at{};
  /// Pause after training this much in this call, counted from where it starts or resumes (the
  /// CLI's `baton run --for 1ep`): "train one more epoch, look, decide". Epochs count as `fit`'s
  /// budget does, from the position in the epoch's order ("0.5ep": half an epoch more, on the
  /// batch grid). At most one of the two.
  std::optional<Time> pause_after{};
  bool handle_signals = true;              ///< Ctrl-C/SIGTERM: finish the batch, checkpoint, return interrupted
  bool progress = true;                    ///< a progress bar (a terminal) or lines (a pipe) on stdout
  std::shared_ptr<const std::atomic<bool>> stop{};  ///< set it to stop as a signal would
  /// Data parallel (distributed.hpp): every rank calls `run` with the same arguments; rank 0
  /// writes the directory, the others only train.
  std::shared_ptr<const Distributed> distributed{};
};

/// What one stage did in this call of `run`.
struct StageSummary {
  std::string name{};
  Timestamp start{}, end{};
  double loss = 0;               ///< the mean training loss of the stage's last logged interval
  Metrics metrics{};             ///< the last evaluation of the stage
  double seconds = 0;            ///< wall time of training (evaluation excluded)
  std::vector<double> losses{};  ///< the logged training losses, for a sparkline
};

/// What `run` returns.
struct RunResult {
  TrainState state{};
  bool interrupted = false;                 ///< stopped by a signal or `stop`: run again to resume
  bool paused = false;                      ///< stopped at RunOptions::pause_at / pause_after: run again to go on
  std::filesystem::path checkpoint{};       ///< the newest checkpoint written (the interrupt's or the pause's, when stopped)
  std::optional<std::filesystem::path> resumed_from{};
  /// Empty while the run's bits are those of an uninterrupted run; else why not (a resume with
  /// another runtime, accepted with RunOptions::accept_runtime_change). Kept across resumes.
  std::string not_bit_exact{};
  std::vector<StageSummary> stages{};       ///< the stages this call trained (resumed ones included)
  Metrics final_metrics{};                  ///< the last evaluation of the run
  /// The summary table: per stage, epochs, batches, loss, a loss sparkline, time and metrics.
  [[nodiscard]] std::string summary() const;
};

/// Trains `stages` in order from `initial` (or from the run directory's newest valid checkpoint,
/// rebuilt with `initial.factory`), keeping the run directory described above. Every stage gets
/// the directory's checkpoint policy and metrics loggers added to its own callbacks and loggers.
/// Errors: those of `fit`, an unusable directory (io), a checkpoint of another configuration
/// (invalid_spec, with the changes and how to start over), another process holding the directory.
Expected<RunResult> run(const RunOptions& options, const std::vector<TrainingSpec>& stages, TrainState initial);

/// Every setting of `stages` (and of the run's `initial` state: seed, max duration, model, initial
/// weights) that can change the bits, as TOML-like text, derived from the values: the data's
/// identity (a content hash in memory, the Source's identity when lazy), the loss, every option
/// of the optimizer and its groups, the schedule, the algorithms' and stopping callbacks'
/// identities, precision, layout, clipping, carries, keep_best, ... and nothing bit-neutral
/// (workers, prefetch, loggers, observers, checkpoints). The default `RunOptions::config`: its
/// SHA-256 is the fingerprint that guards resumes. What cannot be described (an algorithm
/// without `identity`, a Source without one) is written as such and appended to `undescribed`.
std::string describe(const std::vector<TrainingSpec>& stages, const TrainState* initial,
                     std::vector<std::string>* undescribed = nullptr);
/// `describe(stages, nullptr)`: the stages only.
std::string describe(const std::vector<TrainingSpec>& stages);

}  // namespace baton
