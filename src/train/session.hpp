#pragma once
// What fit (loop.cpp) and train_step (plan.cpp) share, so that the two cannot drift apart (they
// did twice): the set-up before the first step, in one order and undone when they return, and one
// batch through the step with its events in one order.
#include <cstdint>
#include <optional>
#include <vector>

#include "baton/fit.hpp"
#include "train/carry.hpp"
#include "train/hooks.hpp"
#include "train/precision.hpp"

namespace baton::detail {

class DataParallel;
class Observers;

/// Sets up, in this order: the stage's carry-over (begin_stage), the device, the memory layout,
/// deterministic mode, the optimizer binding (groups), the frozen parameters, training mode. The
/// scopes end with it (weights back in the default layout, frozen parameters' gradients back on).
class Session {
 public:
  /// `input_rank`: the rank of a batch of inputs (whether channels_last applies).
  Session(const TrainingSpec& spec, TrainState& s, std::int64_t input_rank);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// What begin_stage reported when it transferred weights (for the history record); once.
  [[nodiscard]] std::optional<TransferReport> take_transfer() { return std::move(begun_.transfer); }
  [[nodiscard]] std::vector<Slot>& slots() { return slots_; }
  /// The weights back in the default layout now (the fit's end, before the state is returned).
  void restore_layout() { layout_.restore(); }

 private:
  struct Begun {
    Begun(const TrainingSpec& spec, TrainState& s);
    bool new_stage;
    std::optional<TransferReport> transfer;
  };
  Begun begun_;  // first: the carry-over and the device, before anything binds to the parameters
  LayoutScope layout_;
  DeterministicScope deterministic_;
  std::vector<Slot> slots_;
  FreezeScope frozen_;
};

/// What one batch did.
struct BatchResult {
  StepOutput out;
  double lr;      // the base learning rate times the schedule's factor
  bool go_on;     // false: the non-finite policy stopped the fit (nothing was applied)
};

/// One batch, as fit and train_step both train it: the algorithms' after_data, the schedule's
/// learning rate, the step (forward, loss, backward, reduction, clipping, update), the non-finite
/// policy, the clock advanced by `take` samples (the global batch; `batch` is this rank's shard),
/// then batch_end (algorithms, callbacks, the history record). `n`: the samples of an epoch.
BatchResult train_batch(const TrainingSpec& spec, TrainState& s, Session& session, Observers& obs, DataParallel& dp,
                        Batch batch, std::int64_t take, std::int64_t n);

}  // namespace baton::detail
