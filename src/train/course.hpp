#pragma once
// What one fit knows of its stage, fixed when it starts: the data and its order, where the stage
// ends as written (from the stage's start), where this fit's budget ends, and the schedule's
// view of time. Everything that reads progress reads it against the stage as written, so any
// cut of a stage into fits, and any resume, trains the same bits.

#include <cstdint>
#include <optional>

#include "baton/data.hpp"
#include "baton/schedule.hpp"
#include "baton/spec.hpp"
#include "baton/state.hpp"
#include "horizon.hpp"

namespace baton::detail {

struct Course {
  const Dataset& data;
  std::int64_t n;             // training samples
  std::int64_t batch_size;
  bool drop_last;
  std::uint64_t data_seed;    // the order is a function of (data_seed, epoch, n) only
  Timestamp stage_start;
  Mark stage_end;             // the stage as written
  Mark limit;                 // this fit's budget (the stage end without one)
  std::int64_t num_classes;   // for algorithms: max label + 1 of the training data, 0 if not classes

  /// For `spec` on `s` after `begin_stage`.
  static Course make(const TrainingSpec& spec, const TrainState& s, std::optional<Time> budget);
  /// For one train_step of `batch` on `s` after `begin_stage`. Without training data in the spec,
  /// an epoch is this one batch (for the schedule's units); the classes are those of the data or
  /// of the batch, whichever is more.
  static Course for_step(const TrainingSpec& spec, const TrainState& s, const Batch& batch);

  /// The fit is over: the stage or the budget is done, or the run's max duration is reached.
  [[nodiscard]] bool done(const TrainState& s) const {
    return s.finished() || stage_end.reached(s.time, n) || limit.reached(s.time, n);
  }
  /// The stage is over (not merely this fit's budget).
  [[nodiscard]] bool stage_done(const TrainState& s) const { return s.finished() || stage_end.reached(s.time, n); }
  /// Fraction of the stage done at `t` (for algorithms that follow the stage's course).
  [[nodiscard]] double progress(const Timestamp& t) const { return stage_end.progress(t, stage_start, n); }

  /// The data indices of the next batch at `t`, `offset` and `size` into it (a rank's shard);
  /// the epoch's order is cached in the state.
  torch::Tensor indices(TrainState& s, bool shuffle, std::int64_t offset, std::int64_t size) const;
};

/// The schedule's view of time for the step at `now`.
ScheduleTime schedule_time(const TrainingSpec& spec, const TrainState& s, const Timestamp& now,
                           const Timestamp& stage_start, std::int64_t n);

/// The `run_finished` error of a fit on a finished run.
Error finished_error(const TrainState& s);

/// Classes of a dataset: max label + 1 for int64 class labels, else 0.
std::int64_t data_classes(const Dataset& d);

}  // namespace baton::detail
