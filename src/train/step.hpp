#pragma once
// One optimizer step: forward, loss and backward over the microbatches, the data-parallel
// gradient reduction, clipping, the update.

#include <vector>

#include "baton/data.hpp"
#include "baton/events.hpp"
#include "baton/spec.hpp"
#include "train/carry.hpp"
#include "train/data_parallel.hpp"
#include "train/hooks.hpp"

namespace baton::detail {

/// forward -> loss -> (finite check) -> backward over `grad_accum` microbatches; then reduce,
/// clip and update. Changes `s` in place. With a non-finite loss (or gradient, when checked)
/// nothing is applied and the output says so. `hooks` null: no event fires.
StepOutput step_in_place(const TrainingSpec& spec, TrainState& s, std::vector<Slot>& slots, const Batch& batch,
                         double lr_scale, Hooks* hooks, const AlgorithmContext& actx, DataParallel& dp);

/// Clips gradients (by global norm, then by value); returns the global norm before clipping,
/// or 0 when not clipping by norm (computing it costs a pass over every gradient).
double clip_gradients(const TrainingSpec& spec, std::vector<Slot>& slots);

}  // namespace baton::detail
