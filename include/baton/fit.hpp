#pragma once
/// \file fit.hpp
/// The training functions: `fit`, `train_step` and `stage`.

#include "baton/data.hpp"
#include "baton/error.hpp"
#include "baton/spec.hpp"
#include "baton/state.hpp"

namespace baton {

/// Trains `state` for `spec.duration` (never past `state.max_duration`) and returns the new
/// state. Pass a copy to keep yours (`fit(spec, s)`), or move it in (`fit(spec, std::move(s))`).
///
/// Duration semantics, counted from the state's time at the call: `Nba` = N optimizer steps,
/// `Nsp` = until N more samples were seen (stops at the first batch boundary at or past it),
/// `Nep` = N epochs' worth of data positions (from mid-epoch, it ends mid-epoch),
/// `f dur` = the fraction f of the run's max duration, in the max duration's unit.
///
/// Errors: an invalid spec; a finished run (`run_finished`, saying what was done and the max);
/// a shape mismatch (naming both shapes); a non-finite loss (`non_finite`, naming the batch; the
/// step is not applied). Every error carries the context `stage "<spec.name>"`.
Expected<TrainState> fit(const TrainingSpec& spec, TrainState state);

/// The same training as `fit(spec, state)`, stopping after at most `max_batches` steps. The spec
/// is unchanged, so a schedule on the stage clock keeps `spec.duration` as its horizon: train a
/// stage in pieces this way (for progress, interval evaluation, checkpoints) rather than with
/// shorter `with_duration` specs, which would shrink a `dur` schedule's horizon to each piece.
Expected<TrainState> fit(const TrainingSpec& spec, TrainState state, std::int64_t max_batches);

/// What one training step produced.
struct StepResult {
  TrainState state;
  double loss = 0;       ///< the batch's loss before the update
  double lr = 0;         ///< the base learning rate used (optimizer lr x schedule)
  double grad_norm = 0;  ///< global gradient norm before clipping (0 unless clipping by norm)
};

/// One pure step on one batch: forward, loss, backward, optimizer update, timestamp advanced by
/// one batch. Useful to unit-test training code.
Expected<StepResult> train_step(const TrainingSpec& spec, TrainState state, const Batch& batch);

/// The base learning rate (the optimizer's lr times the schedule) that the next step of
/// `fit(spec, state)` would use: for checking schedules and clocks step by step.
Expected<double> scheduled_lr(const TrainingSpec& spec, const TrainState& state);

/// Where `fit(spec, state)` would stop, without training (integer arithmetic over the batches it
/// would take): for progress bars, ETA and planning evaluation intervals.
Expected<Timestamp> fit_end(const TrainingSpec& spec, const TrainState& state);

/// Where the stage that `spec` names ends, counted from the stage's start. For a state in the
/// middle of that stage (e.g. resumed from a checkpoint) this is the end of the stage as
/// written, not `spec.duration` more: `fit(spec.with_duration(<batches left>), state)` finishes it.
Expected<Timestamp> stage_end(const TrainingSpec& spec, const TrainState& state);

/// Binds `fit` to a spec: a curriculum is a chain of stages.
///
/// ```cpp
/// auto result = baton::fit(warmup, std::move(state))
///                   .and_then(baton::stage(main))
///                   .and_then(baton::stage(finetune));
/// ```
inline auto stage(TrainingSpec spec) {
  return [spec = std::move(spec)](TrainState state) { return fit(spec, std::move(state)); };
}

}  // namespace baton
