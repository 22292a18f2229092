#pragma once
/// \file fit.hpp
/// The training functions: `fit`, `train_step` and `stage`.

#include "baton/data.hpp"
#include "baton/error.hpp"
#include "baton/spec.hpp"
#include "baton/state.hpp"

namespace baton {

/// Finishes the stage that `spec` names, from wherever `state` is in it, and returns the new
/// state: a fresh state (or one in another stage) begins the stage; a state in the middle of it
/// (an earlier fit with a budget, a resumed checkpoint) continues it; a state whose stage is done
/// comes back unchanged. Never trains past `state.max_duration`. Pass a copy to keep yours
/// (`fit(spec, s)`), or move it in (`fit(spec, std::move(s))`).
///
/// The stage's length is `spec.duration`, counted from the stage's start: `Nba` = N optimizer
/// steps, `Nsp` = until N samples were seen (at the first batch boundary at or past it), `Nep` =
/// N epochs' worth of data positions, `f dur` = the fraction f of the run's max duration, in
/// the max duration's unit.
///
/// Errors: an invalid spec; a finished run (`run_finished`, saying what was done and the max);
/// a shape mismatch (naming both shapes); a non-finite loss (`non_finite`, naming the batch; the
/// step is not applied). Every error carries the context `stage "<spec.name>"`.
Expected<TrainState> fit(const TrainingSpec& spec, TrainState state);

/// The same training as `fit(spec, state)`, stopping once `budget` more is trained (or the
/// stage ends first): the way to train interactively ("one more epoch, then evaluate") and in
/// pieces. The stage is unchanged (its length, schedules and algorithms still read it as
/// written), so any cut into budgets gives the bits of one `fit(spec, state)`.
///
/// A budget counts from the state's time at the call (after a new stage closed a partial epoch)
/// and ends at a batch boundary: `Nba` = N steps; `Nsp` = the first boundary at or past N more
/// samples, so with batch 64 `fit(spec, s, "150sp"_t)` trains 3 batches (192 samples) and a
/// second such call 3 more; `Nep` = N epochs' worth of data positions (from mid-epoch it ends
/// mid-epoch); `f dur` = that fraction of the run's max duration. A zero budget returns the
/// state unchanged (it does not even begin the stage).
///
/// ```cpp
/// auto s1 = baton::fit(spec, std::move(s0), "1ep"_t);       // one epoch of the stage
/// auto m = baton::eval(eval_spec, *s1);                       // look
/// auto s2 = baton::fit(spec, std::move(*s1));                 // the rest of the stage
/// ```
Expected<TrainState> fit(const TrainingSpec& spec, TrainState state, Time budget);

/// What one training step produced.
struct StepResult {
  TrainState state{};
  double loss = 0;       ///< the batch's loss before the update
  double lr = 0;         ///< the base learning rate used (optimizer lr x schedule)
  double grad_norm = 0;  ///< global gradient norm before clipping (0 unless clipping by norm)
};

/// One pure step on one batch: forward, loss, backward, optimizer update, timestamp advanced by
/// one batch. Useful to unit-test training code. It sets up and trains the batch as `fit` does
/// (the same code: carry-over at a stage's start, groups, freezing, the spec's algorithms at every
/// event point, their stage_end when the step ends the stage), so a fit of N batches equals N
/// steps given the batches fit would draw; callbacks, loggers, evaluation and checkpoints are
/// fit's alone. A non-finite loss is an error unless `on_non_finite` is skip.
Expected<StepResult> train_step(const TrainingSpec& spec, TrainState state, const Batch& batch);

/// The base learning rate (the optimizer's lr times the schedule) that the next step of
/// `fit(spec, state)` would use: for checking schedules and clocks step by step.
Expected<double> scheduled_lr(const TrainingSpec& spec, const TrainState& state);

/// Where `fit(spec, state, budget)` (no budget: `fit(spec, state)`) would stop, without training
/// (integer arithmetic over the batches it would take): for progress bars, ETA and planning. A
/// budget that `fit` refuses (not a whole count, negative) is refused the same way.
Expected<Timestamp> fit_end(const TrainingSpec& spec, const TrainState& state, std::optional<Time> budget = {});

/// Where the stage that `spec` names ends, counted from the stage's start (the same for a state
/// at the stage's start, in its middle or resumed from a checkpoint): `fit_end(spec, state)`.
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
