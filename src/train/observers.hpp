#pragma once
// Everything in a fit that watches the loop rather than trains: callbacks and loggers, the
// history record, interval and stage-end evaluation, checkpoints, stop requests (flag, signal,
// callback) and the non-finite policy. The loop calls it at its event points.

#include <cstdint>
#include <optional>
#include <string>

#include "baton/spec.hpp"
#include "baton/state.hpp"
#include "detail.hpp"
#include "train/course.hpp"
#include "train/data_parallel.hpp"
#include "train/hooks.hpp"
#include "train/signals.hpp"

namespace baton::detail {

/// The history record this fit writes to: the stage's own when the fit continues it (so a stage
/// split into several fits, or steps, leaves the same history as one fit), else a new one.
std::size_t open_record(TrainState& s, const std::string& stage, std::optional<TransferReport> transfer);

/// KeepBest (keep_best.cpp): records the state's weights when `m` beats the kept value of this
/// scope (true: it did); an error when `m` lacks the metric.
bool keep_if_best(const KeepBest& keep, const Metrics& m, TrainState& s);
/// At the stage's end: the kept weights of this scope into the model (unless they are the
/// current ones); what happened, for StageRecord::restored_best, or nullopt when none is kept.
std::optional<std::string> restore_kept(const KeepBest& keep, TrainState& s);
/// The batch of the kept best's evaluation, if any (the run writes its best file when it is now).
std::optional<std::int64_t> kept_batch(const TrainState& s);

class Observers {
 public:
  /// Opens (or extends) the stage's history record; `transfer` is what begin_stage reported.
  Observers(const TrainingSpec& spec, TrainState& s, const Course& course, RngStream& rng, DataParallel& dp,
            std::optional<TransferReport> transfer);

  /// The hooks the step fires; null when nothing is attached (nothing to pay for).
  [[nodiscard]] Hooks* hooks() { return attached_ ? &hooks_ : nullptr; }
  void fire(Event e) {
    if (attached_) hooks_.fire(e);
  }
  /// The batch of `take` samples that begins at `t`: its events carry its span (EventView::due)
  /// until after_batch.
  void begin_batch(const Timestamp& t, std::int64_t take);
  /// Between batches: a stop flag or signal (agreed across ranks), or a callback's reason.
  [[nodiscard]] bool stop_requested();
  /// This rank was asked to stop (for the data-parallel agreement in the next step).
  [[nodiscard]] bool local_stop() const;
  /// The algorithms' view of the step that begins at `t`.
  [[nodiscard]] AlgorithmContext context(const Timestamp& t) const;
  /// after_data: the algorithms transform the batch.
  Batch after_data(const AlgorithmContext& actx, Batch batch);
  /// A step with a non-finite loss or gradient: an error, a stop (false) or a skipped batch (true).
  bool on_non_finite(const StepOutput& out);
  /// batch_end: the step is counted; algorithms and callbacks see it; the record follows.
  void batch_end(const AlgorithmContext& actx, const StepOutput& out, std::int64_t samples, double lr);
  /// After the epoch roll-over: epoch_end, interval evaluation and checkpoints (from the stage's start).
  void after_batch(const Timestamp& before, bool epoch_ended);
  /// The fit returns: stage-end algorithms, evaluation and checkpoint, or the interrupt
  /// checkpoint; fit_end; loggers flushed.
  void finish();

 private:
  /// Evaluates; keeps the best (KeepBest); the loggers get the metrics, and the callbacks too
  /// unless `callbacks` is false (the evaluation of restored weights is not a new one for them).
  void evaluate(bool callbacks = true);
  void write_checkpoint(bool stage_done);

  const TrainingSpec& spec_;
  TrainState& s_;
  const Course& course_;
  RngStream& rng_;
  DataParallel& dp_;
  Hooks hooks_;
  bool attached_;
  std::size_t record_;
  SignalScope signals_;
  BatchSpan span_{};
  bool interrupted_ = false, any_step_ = false;
  std::optional<std::int64_t> evaluated_at_;  // the batch count of this fit's last evaluation
};

}  // namespace baton::detail
