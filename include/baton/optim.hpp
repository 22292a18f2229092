#pragma once
/// \file optim.hpp
/// Optimizers as pure update rules over plain state (as Optax): the hyperparameters live in the
/// spec, the moments live in the TrainState keyed by parameter name, so they survive copies and
/// checkpoints. Update rules match torch::optim bit for bit.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <torch/types.h>

#include "baton/error.hpp"

namespace baton {

/// SGD, as torch::optim::SGD: momentum buffer starts as the first gradient.
struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

/// Adam, as torch::optim::Adam (L2 weight decay added to the gradient).
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
};

/// An optimizer's hyperparameters; which kind it is follows from the options held.
struct Optimizer {
  std::variant<SgdOptions, AdamOptions> options;

  [[nodiscard]] std::string_view kind() const;  ///< "sgd" or "adam"
  [[nodiscard]] double lr() const;
  [[nodiscard]] Optimizer with_lr(double lr) const;
  /// Checks ranges (lr >= 0, momentum in [0,1), nesterov needs momentum and no dampening, ...).
  [[nodiscard]] Expected<void> validate() const;
};

namespace optim {
Optimizer sgd(SgdOptions options = {});
Optimizer adam(AdamOptions options = {});
}  // namespace optim

/// What a stage does with the optimizer state it finds in the TrainState.
enum class Carry {
  keep,   ///< continue the moments (an error if the state's optimizer is of another kind)
  fresh,  ///< start from empty moments
};

/// Per-parameter optimizer state: the step count and the slot tensors (SGD: momentum buffer;
/// Adam: exp_avg, exp_avg_sq[, max_exp_avg_sq]). A slot is undefined until first used.
struct ParamState {
  std::int64_t step = 0;
  std::vector<torch::Tensor> slots;
};

/// The optimizer state of a TrainState: empty `kind` means no step has been taken.
struct OptimizerState {
  std::string kind;
  std::map<std::string, ParamState> params;  ///< keyed by parameter name, e.g. "0.weight"
};

}  // namespace baton
