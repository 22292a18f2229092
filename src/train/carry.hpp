#pragma once
// What a stage carries over when it begins (weights, optimizer moments, clock), and the binding
// of the optimizer state to the parameters a fit trains. Building models and copying weights by
// name are below the loop, in weights.hpp.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <torch/nn/module.h>

#include "baton/spec.hpp"
#include "baton/state.hpp"
#include "weights.hpp"

namespace baton::detail {

/// Where the next step happens when `spec` runs on `s`: a new stage closes a partial epoch and
/// starts its clock there.
struct StagePosition {
  bool new_stage;
  Timestamp time;
  Timestamp stage_start;
};
StagePosition stage_position(const TrainingSpec& spec, const TrainState& s);

/// Applies the stage-start carry-over policies when `spec` begins a new stage (a no-op when it
/// continues one). Returns the transfer report when the weights were transferred.
std::optional<TransferReport> begin_stage(const TrainingSpec& spec, TrainState& s);

/// One trainable parameter, its optimizer state and its group's hyperparameters, for the
/// duration of a fit (the optimizer-state map's nodes are stable).
struct Slot {
  torch::Tensor param;
  ParamState* state;
  double lr;  // the group's base LR (the schedule multiplies it)
  double weight_decay;
};

/// Lines the state's optimizer state up with the trainable parameters, resolving groups and
/// frozen patterns; every pattern must match something.
std::vector<Slot> bind_optimizer(const TrainingSpec& spec, TrainState& s, bool began_stage);

/// Turns off gradients of frozen parameters for a scope and restores them after.
class FreezeScope {
 public:
  FreezeScope(const TrainingSpec& spec, torch::nn::Module& m);
  FreezeScope(const FreezeScope&) = delete;
  FreezeScope& operator=(const FreezeScope&) = delete;
  ~FreezeScope();

 private:
  std::vector<torch::Tensor> frozen_;
};

/// What is wrong with the spec's `freeze` and `optimizer.groups` patterns against the parameters of
/// `m` (a pattern matching nothing; a freeze leaving nothing to train), or nothing. `fit` raises it;
/// `Curriculum::validate` reports it before anything trains.
std::optional<std::string> pattern_problem(const TrainingSpec& spec, const torch::nn::Module& m);

}  // namespace baton::detail
