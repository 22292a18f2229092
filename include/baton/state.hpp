#pragma once
/// \file state.hpp
/// TrainState: everything a training run is, as one value.
///
/// Copying a TrainState gives an independent deep copy (new module, cloned tensors), like
/// `std::vector`; moving it is free. `fit(spec, state)` leaves `state` untouched;
/// `fit(spec, std::move(state))` costs no copy.
///
/// ```cpp
/// auto state = baton::init_state(baton::models::small_cnn(), {.seed = 42, .max_duration = "6ep"_t});
/// auto branch = *state;                    // deep copy: train it another way
/// ```

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "baton/error.hpp"
#include "baton/model.hpp"
#include "baton/optim.hpp"
#include "baton/time.hpp"

namespace baton {

/// What a `ModelCarry::transfer` did, parameter by parameter (buffers included), for the caller
/// to print or check.
struct TransferReport {
  std::vector<std::string> copied{};     ///< taken from the source: same name and shape
  std::vector<std::string> skipped{};    ///< in the source but not taken, with the reason
  std::vector<std::string> initialized{};  ///< new in the target: freshly initialized
  [[nodiscard]] std::string to_string() const;
};

/// One stage, as recorded in the state's history (fits that continue a stage extend its record).
struct StageRecord {
  std::string name{};           ///< the spec's name
  Timestamp start{};
  Timestamp end{};
  double last_loss = 0;         ///< training loss of the last batch
  double last_lr = 0;           ///< base learning rate of the last step (after the schedule)
  double last_grad_norm = 0;    ///< global gradient norm before clipping (when clipping by norm)
  std::optional<TransferReport> transfer{};  ///< set when this call began a stage with a transfer
  bool interrupted = false;     ///< the last fit of this stage stopped early on a stop request or signal
  std::string stop_reason{};    ///< why a callback (early stopping, ...) or the non-finite policy ended the stage early
  std::int64_t skipped_batches = 0;  ///< batches consumed without an update (non-finite policy "skip")
  std::string restored_best{};  ///< KeepBest::restore: which evaluation's weights the stage ended with
};

/// Where dynamic loss scaling stands (spec.hpp: LossScaling).
struct LossScaleState {
  double scale = 65536.0;          ///< the loss is multiplied by this before backward
  std::int64_t growth_tracker = 0; ///< updates in a row with finite gradients since the last change
  std::int64_t skipped = 0;        ///< batches consumed without an update because gradients overflowed
  bool operator==(const LossScaleState&) const = default;
};

/// The data order of the current epoch, cached inside a state (opaque: defined in the library).
struct OrderCache;

/// The whole state of a run. Fields are public, as in Flax's TrainState: read them freely;
/// baton's functions return new states rather than changing yours.
struct TrainState {
  ModelFactory factory{};          ///< makes the architecture (used for deep copies)
  Model model{};                   ///< parameters and buffers live in `model.module`
  OptimizerState optimizer{};      ///< moments keyed by parameter name
  Timestamp time{};                ///< where the run is
  torch::Tensor rng{};             ///< CPU generator state used for dropout etc. during fit
  std::uint64_t seed = 0;          ///< the run's seed: data order and RNG derive from it
  Time max_duration{};             ///< the run never trains past this (ep, ba or sp)
  std::vector<StageRecord> history{};  ///< what the run has done, one record per stage
  std::string stage{};             ///< name of the stage in progress ("" before the first fit)
  Timestamp stage_start{};         ///< when the stage in progress began (the stage clock's origin)
  /// What algorithms remember (EMA/SWA weights, ...), by algorithm name then tensor name. One
  /// that keeps nothing (yet) has no entry; so for callbacks.
  std::map<std::string, std::map<std::string, torch::Tensor>> algorithm_state{};
  /// What callbacks remember (early stopping's best value, ...), by callback name then key.
  std::map<std::string, std::map<std::string, double>> callback_state{};
  /// Dynamic loss scaling's scale (set by the first fit whose spec has `loss_scaling`).
  std::optional<LossScaleState> loss_scale{};

  TrainState() = default;
  TrainState(const TrainState& other);             ///< deep copy
  TrainState& operator=(const TrainState& other);  ///< deep copy
  TrainState(TrainState&&) noexcept = default;
  TrainState& operator=(TrainState&&) noexcept = default;
  ~TrainState() = default;

  /// True once `time` has reached `max_duration`: a further `fit` is an error.
  [[nodiscard]] bool finished() const;

  /// Parameters by name (shared with the module: do not modify them).
  [[nodiscard]] std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const;
  /// Buffers (e.g. BatchNorm running statistics) by name.
  [[nodiscard]] std::vector<std::pair<std::string, torch::Tensor>> named_buffers() const;

  /// Cached data order of the current epoch: derived from (seed, epoch), shared between copies
  /// because it is immutable. Not part of the state's value.
  std::shared_ptr<const OrderCache> order_cache{};
};

/// Options of a new run.
struct InitOptions {
  std::uint64_t seed = 0;                      ///< weights, data order and RNG all derive from it
  Time max_duration = Time::epochs(1);         ///< in ep, ba or sp (not dur)
};

/// A fresh run: builds the model with the global CPU generator seeded from `options.seed` (the
/// caller's generator state is restored afterwards), time zero, no optimizer state.
Expected<TrainState> init_state(const ModelFactory& factory, const InitOptions& options);

/// True when two states hold everything a resume must reproduce, bit for bit: parameters,
/// buffers, optimizer steps and moments, the RNG, algorithm and callback state, the timestamp,
/// stage and stage start, seed, max duration, the loss scale and the history (any NaN equals any NaN there: a
/// checkpoint keeps NaN, not its bits). `bitwise_equal(s, load(save(s)))` always holds. Not
/// compared: the model factory and the module's train/eval flag. Used by tests of split and
/// resume invariance.
bool bitwise_equal(const TrainState& a, const TrainState& b);

/// What `bitwise_equal` finds first that differs, for a message: `parameter "1.weight": max
/// |difference| 2.98e-08 (3 of 64 elements differ)`, `time: ... against ...`, `the RNG state: ...`.
/// Parameters and buffers are compared first, in module order. Nothing when the states are equal.
std::optional<std::string> first_difference(const TrainState& a, const TrainState& b);

}  // namespace baton
