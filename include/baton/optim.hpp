#pragma once
/// \file optim.hpp
/// Optimizers as pure update rules over plain state (as Optax): the hyperparameters live in the
/// spec, the moments live in the TrainState keyed by parameter name, so they survive copies and
/// checkpoints. Update rules match torch::optim bit for bit.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <torch/types.h>

#include "baton/error.hpp"
#include "baton/params.hpp"

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

/// AdamW, as torch::optim::AdamW (decoupled weight decay: p *= 1 - lr * weight_decay).
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
};

/// RMSprop, as torch::optim::RMSprop.
struct RmspropOptions {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool centered = false;
};

/// Adagrad, as torch::optim::Adagrad.
struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
};

/// An update rule, as Optax's (init, update) pair (docs/optimizers.md): the slots it keeps per
/// parameter, how they start, and one update. Every optimizer is one: the five torch::optim
/// built-ins (optim::sgd ... optim::adagrad), Lion and LAMB, and yours (optim::rule). baton binds
/// it to the parameters, applies groups, freezing, clipping and the schedule, all-reduces
/// gradients across ranks before it runs, and keeps its slots in the TrainState (copied, carried
/// over, checkpointed and resumed).
///
/// `update` changes `param` and `slots` in place (under no_grad): the state is copied before a
/// fit changes it, so purity holds at the state level, and in-place arithmetic is what keeps the
/// built-ins bit-equal to torch::optim and spares a delta tensor per parameter per step.
/// `optim::update` is the pure form, for tests.
///
/// ```cpp
/// baton::UpdateRule sign_sgd{.name = "signsgd", .identity = "signsgd(v1)", .lr = 0.01};
/// sign_sgd.update = [](torch::Tensor& p, const torch::Tensor& g, std::vector<torch::Tensor>&, std::int64_t,
///                      double lr, double wd) { p.mul_(1 - lr * wd).add_(g.sign(), -lr); };
/// auto opt = baton::optim::rule(sign_sgd);
/// ```
struct UpdateRule {
  /// Its kind in the state and in checkpoints: moments continue (Carry::keep) only under the same name.
  std::string name{};
  /// Every option that can change the bits, e.g. "lion(beta1=0.9, beta2=0.99)": run directories'
  /// fingerprints hold it, so a resume with other options is refused. Required: change the text
  /// when the behaviour changes. Fingerprints add the name, base rates and slots, unless it names
  /// `{lr}` and `{weight_decay}` itself (the built-ins' do): then those are filled in and it is
  /// the whole description.
  std::string identity{};
  double lr = 1e-3;            ///< the base learning rate (groups and the schedule scale it)
  double weight_decay = 0.0;   ///< the base weight decay (groups may change it); the rule decides how it applies
  /// The names of the tensors it keeps per parameter, in order (checkpoints keep them by position).
  std::vector<std::string> slots{};
  /// The slots of a parameter before its first update; any shapes (factored moments, scalars), or
  /// undefined tensors that `update` makes when first needed (the built-ins do, as torch::optim).
  /// Unset: zeros shaped like the parameter, one per name.
  std::function<std::vector<torch::Tensor>(const torch::Tensor& param)> init{};
  /// One update of one parameter: `step` counts it from 1; `lr` and `weight_decay` are the
  /// parameter's own (its group's; the learning rate times the schedule).
  std::function<void(torch::Tensor& param, const torch::Tensor& grad, std::vector<torch::Tensor>& slots,
                     std::int64_t step, double lr, double weight_decay)>
      update{};
  std::string invalid{};  ///< set by a factory given bad options; Optimizer::validate reports it
};

/// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): the sign of an
/// interpolation of momentum and gradient, decoupled weight decay. One slot, `exp_avg`.
struct LionOptions {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double weight_decay = 0.0;
};

/// LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning"): Adam's bias-corrected
/// direction plus decoupled weight decay, scaled per parameter by the trust ratio
/// ||param|| / ||direction|| (1 where either norm is 0). Slots `exp_avg`, `exp_avg_sq`.
struct LambOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;
};

/// Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory
/// Cost"), without momentum: the second moment of a matrix (or of the last two dimensions of a
/// larger tensor) kept as its row and column means, V = row * col / mean(row), so a [n, m]
/// weight keeps n + m numbers instead of n * m; vectors keep a full moment. With
/// decay_rate d, beta2 at step t is 1 - t^d; the update G / sqrt(V) is clipped to RMS
/// `clip_threshold`, then scaled by rho = min(lr, 1 / sqrt(t)) (`relative_step`; else lr) times
/// max(eps2, RMS(param)) (`scale_parameter`). Weight decay is decoupled: p *= 1 - lr * wd.
/// Slots `exp_avg_sq_row` (a vector's whole moment) and `exp_avg_sq_col` (a vector: a scalar 0).
struct AdafactorOptions {
  double lr = 1e-2;
  double decay_rate = -0.8;
  double eps1 = 1e-30;   ///< added to the squared gradient
  double eps2 = 1e-3;    ///< the least parameter scale
  double clip_threshold = 1.0;
  double weight_decay = 0.0;
  bool relative_step = true;
  bool scale_parameter = true;
};

/// Parameters selected by name patterns (globs: `*` matches any text including dots, `?` one
/// character; e.g. "backbone.*", "*.bias") or by the type of the module that holds them, with
/// their own learning rate and weight decay. The first group that selects a parameter takes it;
/// the others use the base options. A group that selects no parameter is an error (it is almost
/// always a typo).
///
/// AdamW without weight decay on biases, norms and embeddings (GPT-2's recipe):
/// `{.patterns = {"*.bias"}, .modules = {"LayerNorm", "Embedding"}, .weight_decay = 0.0}`.
struct ParamGroup {
  std::vector<std::string> patterns{};
  /// Module types, by LibTorch's class name without namespace and `Impl` ("LayerNorm",
  /// "Embedding", "BatchNorm2d", "Linear", "Conv2d"; a module of yours by its class name): the
  /// parameters such a module holds itself (not those of modules inside it).
  std::vector<std::string> modules{};
  std::optional<double> lr{};            ///< default: the optimizer's
  std::optional<double> weight_decay{};  ///< default: the optimizer's
};

/// A transform of the step's gradients over all parameters at once, before the update: a link of
/// `optim::chain` (Optax's gradient transformations, without state of their own: what must be
/// remembered between steps belongs in an update rule's slots, which carry over and checkpoint).
///
/// ```cpp
/// baton::GradientTransform centre{.name = "centralize", .identity = "centralize v1"};
/// centre.apply = [](const std::vector<torch::Tensor>& params, std::vector<torch::Tensor>& grads) {
///   for (auto& g : grads) if (g.dim() > 1) g.sub_(g.mean(/*dim=*/{1}, /*keepdim=*/true));
/// };
/// auto opt = baton::optim::chain({baton::optim::clip_by_global_norm(1.0), centre}, baton::optim::adamw({}));
/// ```
struct GradientTransform {
  std::string name{};
  /// Every option that can change the bits (run directories' fingerprints hold it). Required.
  std::string identity{};
  /// Changes `grads` (in place, or by assigning new tensors of the same shapes); `params[i]` is
  /// the parameter of `grads[i]` (each trainable parameter that has a gradient this step, once).
  std::function<void(const std::vector<torch::Tensor>& params, std::vector<torch::Tensor>& grads)> apply{};
  std::string invalid{};  ///< set by a factory given bad options; Optimizer::validate reports it
};

/// An optimizer: its update rule, parameter groups and gradient transforms.
///
/// ```cpp
/// auto opt = baton::optim::adamw({.lr = 1e-3})
///                .with_groups({{.patterns = {"backbone.*"}, .lr = 1e-4},
///                              {.patterns = {"*.bias", "*bn*"}, .weight_decay = 0.0}});
/// ```
struct Optimizer {
  /// The update: a built-in's (optim::sgd, adam, adamw, rmsprop, adagrad, lion, lamb) or yours.
  UpdateRule rule{};
  std::vector<ParamGroup> groups{};
  /// Applied in order to the step's gradients before the update (after the spec's clipping);
  /// `optim::chain` sets them.
  std::vector<GradientTransform> transforms{};

  /// The rule's name: "sgd", "adam", "adamw", "rmsprop", "adagrad", "lion", "lamb", or yours.
  [[nodiscard]] std::string_view kind() const;
  [[nodiscard]] double lr() const;              ///< the base learning rate
  [[nodiscard]] double weight_decay() const;    ///< the base weight decay
  [[nodiscard]] Optimizer with_lr(double lr) const;
  [[nodiscard]] Optimizer with_groups(std::vector<ParamGroup> groups) const;
  /// Checks ranges (lr >= 0, momentum in [0,1), nesterov needs momentum and no dampening, ...),
  /// naming each field, e.g. `optimizer.lr: must be a finite number >= 0, got -1`.
  [[nodiscard]] Expected<void> validate() const;
};

namespace optim {
Optimizer sgd(SgdOptions options = {});
Optimizer adam(AdamOptions options = {});
Optimizer adamw(AdamWOptions options = {});
Optimizer rmsprop(RmspropOptions options = {});
Optimizer adagrad(AdagradOptions options = {});
/// An optimizer of your own update rule.
Optimizer rule(UpdateRule rule);
Optimizer lion(LionOptions options = {});
Optimizer lamb(LambOptions options = {});
Optimizer adafactor(AdafactorOptions options = {});

/// `transforms` in order (before any the optimizer already has), then `opt`'s update: Optax's
/// `chain(transform..., rule)`. Stateless links, so carry-over and checkpoints are the rule's.
Optimizer chain(std::vector<GradientTransform> transforms, Optimizer opt);
/// Scales all the gradients by max_norm / (norm + 1e-6) when their global L2 norm exceeds
/// `max_norm` (what `TrainingSpec::clip_grad_norm` does, and the same arithmetic).
GradientTransform clip_by_global_norm(double max_norm);
/// Clamps every gradient element to [-limit, limit] (as `TrainingSpec::clip_grad_value`).
GradientTransform clip_by_value(double limit);
/// g += rate * param: L2 regularization coupled to the gradient (torch::optim::SGD's
/// weight_decay; unlike AdamW's decoupled decay, a following Adam scales it).
GradientTransform add_decayed_weights(double rate);

/// Builds an optimizer from its name and a key/value table (for hparams files), e.g.
/// `from_name("sgd", {{"lr", 0.1}, {"momentum", 0.9}})`. Keys are the option names above
/// (Adam's betas as `beta1`, `beta2`). Unknown names or keys, wrong types and invalid values are
/// errors listing the valid names or keys.
Expected<Optimizer> from_name(const std::string& name, const Params& params);
/// Every name `from_name` accepts (the built-ins, Lion, LAMB and Adafactor).
const std::vector<std::string>& names();
/// A gradient transform from its name and keys (an `optimizer.chain` entry of an hparams file):
/// `clip_by_global_norm` (max_norm), `clip_by_value` (limit), `add_decayed_weights` (rate).
Expected<GradientTransform> transform_from_name(const std::string& name, const Params& params);
/// Every name `transform_from_name` accepts.
const std::vector<std::string>& transform_names();
}  // namespace optim

/// What a stage does with the optimizer state it finds in the TrainState.
enum class Carry {
  keep,   ///< continue the moments (an error if the state's optimizer is of another kind)
  fresh,  ///< start from empty moments
};

/// Per-parameter optimizer state: the step count and the slot tensors, in the order of the rule's
/// `slots` (SGD: momentum_buffer; Adam/AdamW: exp_avg, exp_avg_sq, max_exp_avg_sq; RMSprop:
/// square_avg, momentum_buffer, grad_avg; Adagrad: sum). A built-in's slot is undefined until first used.
struct ParamState {
  std::int64_t step = 0;
  std::vector<torch::Tensor> slots{};
};

/// The optimizer state of a TrainState: empty `kind` means no step has been taken.
struct OptimizerState {
  std::string kind{};
  std::map<std::string, ParamState> params{};  ///< keyed by parameter name, e.g. "0.weight"
};

namespace optim {
/// How many slot tensors `opt`'s rule keeps per parameter (SGD, Adagrad: 1; Adam, AdamW, RMSprop: 3).
std::size_t slot_count(const Optimizer& opt);

/// One update of one parameter, in place, as `fit` applies it: `param` and `state` change as
/// torch::optim's step would (`state.step` counts it). `lr` and `weight_decay` are this
/// parameter's: its group's, with the learning rate already multiplied by the schedule.
void apply(const Optimizer& opt, torch::Tensor param, torch::Tensor grad, ParamState& state, double lr,
           double weight_decay);

/// The new parameter and optimizer state of one update.
struct Updated {
  torch::Tensor param{};
  ParamState state{};
};

/// The pure form of `apply`, as Optax's `update`: returns the updated parameter and state and
/// leaves its arguments untouched (it costs a copy of each; `fit` uses `apply`).
///
/// ```cpp
/// auto [p1, s1] = baton::optim::update(baton::optim::adam({.lr = 1e-3}), p, grad, {}, 1e-3, 0.0);
/// ```
Updated update(const Optimizer& opt, const torch::Tensor& param, const torch::Tensor& grad, const ParamState& state,
               double lr, double weight_decay);
}  // namespace optim


}  // namespace baton
