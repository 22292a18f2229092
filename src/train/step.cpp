// One optimizer step (step.hpp).
#include "train/step.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>
#include <torch/torch.h>

#include "detail.hpp"
#include "optim_rules.hpp"
#include "train/precision.hpp"

namespace baton::detail {

namespace {
void drop_grads(std::vector<Slot>& slots) {
  for (auto& sl : slots) sl.param.mutable_grad().reset();  // set_to_none: no memset per step
}

/// The model's output and the loss of one microbatch; shape problems become clear errors.
torch::Tensor microbatch_loss(const TrainingSpec& spec, TrainState& s, const torch::Tensor& inputs,
                              torch::Tensor targets, Hooks* hooks, const AlgorithmContext& actx) {
  if (hooks) hooks->fire(Event::before_forward);
  torch::Tensor output;
  try {
    AutocastScope autocast(spec.precision, spec.device);
    output = s.model.forward(in_layout(inputs, spec.memory_format, spec.device));
  } catch (const c10::Error& e) {
    if (auto m = nondeterministic_op_message(torch_message(e))) raise(ErrorCode::invalid_spec, *m);
    raise(ErrorCode::shape_mismatch, fmt::format("the model's forward failed on inputs of shape {}: {}",
                                                 shape_string(inputs), torch_message(e)));
  }
  // The loss in float32 whatever the forward's precision (as the optimizer's arithmetic).
  if (output.defined() && (output.scalar_type() == at::kBFloat16 || output.scalar_type() == at::kHalf))
    output = output.to(at::kFloat);
  if (hooks) {
    if (hooks->any_before_loss)
      for (const auto& a : spec.algorithms)
        if (a.before_loss) targets = a.before_loss(actx, output, std::move(targets));
    hooks->fire(Event::after_forward);
  }
  torch::Tensor loss;
  try {
    loss = spec.loss.fn(output, targets);
  } catch (const c10::Error& e) {
    raise(ErrorCode::shape_mismatch,
          fmt::format("loss \"{}\" failed on the model's output {} and targets {}: {}", spec.loss.name,
                      shape_string(output), shape_string(targets), torch_message(e)));
  }
  if (!loss.defined() || loss.dim() != 0)
    raise(ErrorCode::shape_mismatch,
          fmt::format("loss \"{}\" must return a scalar, returned {}", spec.loss.name, shape_string(loss)));
  return loss;
}

/// backward(), with an op that has no deterministic implementation named as such.
void backward(const torch::Tensor& loss) {
  try {
    loss.backward();
  } catch (const c10::Error& e) {
    if (auto m = nondeterministic_op_message(torch_message(e))) raise(ErrorCode::invalid_spec, *m + " (in backward)");
    throw;
  }
}

/// Forward and backward over the microbatches; gradients accumulate in the parameters.
/// Returns the batch's loss (this rank's weighted share under data parallel); a non-finite
/// loss returns at once with the gradients dropped.
StepOutput forward_backward(const TrainingSpec& spec, TrainState& s, std::vector<Slot>& slots, const Batch& batch,
                            Hooks* hooks, const AlgorithmContext& actx, DataParallel& dp) {
  const std::int64_t total = batch.inputs.size(0);  // data parallel: this rank's shard, maybe empty
  const std::int64_t k = std::min<std::int64_t>(std::max<std::int64_t>(spec.grad_accum, 1), std::max<std::int64_t>(total, 1));
  const std::int64_t micro = (total + k - 1) / k;
  double batch_loss = 0.0;
  const double loss_scale = begin_loss_scale(spec, s);  // 1 without loss scaling
  // A loss that counts its terms (tokens) weights each microbatch by its share of the global
  // batch's terms: the step's loss is then their mean, however the batch was cut.
  // Each microbatch's units are counted once; their sum (over ranks) is the step's.
  std::vector<double> micro_units;
  double all_units = 0.0;
  if (spec.loss.units) {
    for (std::int64_t start = 0; start < total; start += micro)
      micro_units.push_back(spec.loss.units(batch.targets.narrow(0, start, std::min(micro, total - start))));
    double here = 0.0;
    for (double u : micro_units) here += u;
    all_units = dp.sum(here);
  }
  for (std::int64_t start = 0, index = 0; start < total; start += micro, ++index) {
    const std::int64_t size = std::min(micro, total - start);
    const bool whole = size == total;
    const auto inputs = whole ? batch.inputs : batch.inputs.narrow(0, start, size);
    auto targets = whole ? batch.targets : batch.targets.narrow(0, start, size);
    const double units = spec.loss.units ? micro_units[static_cast<std::size_t>(index)] : 0.0;
    const torch::Tensor loss = microbatch_loss(spec, s, inputs, std::move(targets), hooks, actx);
    // CPU sync point (cheap on CPU): a non-finite loss must stop us before the step is applied.
    const double value = loss.item<double>();
    if (!std::isfinite(value)) {
      drop_grads(slots);
      return {value, 0.0, true, fmt::format("loss \"{}\" is {}", spec.loss.name, value)};
    }
    if (hooks) hooks->fire(Event::after_loss);
    if (whole && !dp.active() && !spec.loss.units) {
      batch_loss = value;
      backward(loss_scale == 1.0 ? loss : loss * loss_scale);
    } else {
      // A mean over the batch is the size-weighted mean of the microbatch means (data parallel:
      // of the ranks' shards, so that the summed gradients are those of the global batch's mean).
      const double weight = !spec.loss.units ? static_cast<double>(size) / static_cast<double>(total) * dp.weight()
                            : all_units > 0 ? units / all_units : 0.0;
      batch_loss += value * weight;
      // The last backward: the loss goes out now, the gradients all-reduced as they come.
      if (start + size >= total) dp.arm(slots, batch_loss);
      backward(loss * (weight * loss_scale));
    }
  }
  return {batch_loss, 0.0};
}

/// The global gradient norm when the policy asks to survive non-finite gradients, or when
/// clipping by norm computed it anyway; 0 (unchecked) otherwise.
double checked_norm(const TrainingSpec& spec, const std::vector<Slot>& slots, double clip_norm) {
  if (spec.on_non_finite == NonFinite::error && !spec.clip_grad_norm) return 0.0;
  if (spec.clip_grad_norm) return clip_norm;
  std::vector<torch::Tensor> grads;
  for (const auto& sl : slots)
    if (sl.param.grad().defined()) grads.push_back(sl.param.grad());
  return global_norm(grads);
}

/// One gradient at the current weights (GradientFn): forward and backward, the data-parallel
/// reduction, unscaling, the after_backward algorithms. Gradients of an unusable pass are dropped.
StepOutput gradient_pass(const TrainingSpec& spec, TrainState& s, std::vector<Slot>& slots, const Batch& batch,
                         Hooks* hooks, const AlgorithmContext& actx, DataParallel& dp) {
  drop_grads(slots);
  StepOutput out = forward_backward(spec, s, slots, batch, hooks, actx, dp);
  if (out.non_finite && !dp.active()) return out;
  if (dp.active()) {
    // The gradient all-reduce of the pass (none per microbatch); every rank learns whether
    // some rank's loss was not finite, and then every rank skips the step.
    const auto [global_loss, any_non_finite] = dp.reduce(slots, out.non_finite ? 0.0 : out.loss, out.non_finite);
    if (any_non_finite) {
      drop_grads(slots);
      return {out.non_finite ? out.loss : global_loss, 0.0, true,
              fmt::format("loss \"{}\" is not finite on {}", spec.loss.name,
                          out.non_finite ? fmt::format("rank {}", dp.rank()) : std::string("another rank"))};
    }
    out.loss = global_loss;
  }
  if (spec.loss_scaling && !unscale_gradients(slots, s.loss_scale->scale)) {
    drop_grads(slots);
    out.overflow = true;
    return out;
  }
  if (hooks && hooks->any_after_backward) {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& item : s.model.module->named_parameters()) named.emplace_back(item.key(), item.value());
    for (const auto& a : spec.algorithms)
      if (a.after_backward) a.after_backward(actx, named);
  }
  return out;
}

/// The optimizer's chain of gradient transforms over the parameters that have a gradient.
void transform_gradients(const Optimizer& opt, std::vector<Slot>& slots) {
  std::vector<torch::Tensor> params, grads;
  for (auto& sl : slots)
    if (sl.param.grad().defined()) params.push_back(sl.param), grads.push_back(sl.param.mutable_grad());
  optim::apply_transforms(opt.transforms, params, grads);
  for (std::size_t i = 0; i < params.size(); ++i)  // a transform that made a new tensor rather than change it in place
    if (!grads[i].is_same(params[i].grad())) params[i].mutable_grad() = grads[i];
}

/// The step's gradient: one pass, or what the algorithm that takes over the gradient makes of
/// passes (Algorithm::gradient). The step's output is the first pass's, with the algorithm's
/// loss; an unusable pass makes the step's output that pass's (nothing is applied).
StepOutput compute_gradient(const TrainingSpec& spec, TrainState& s, std::vector<Slot>& slots, const Batch& batch,
                            Hooks* hooks, const AlgorithmContext& actx, DataParallel& dp) {
  const auto taker = std::find_if(spec.algorithms.begin(), spec.algorithms.end(), [](const Algorithm& a) { return bool(a.gradient); });
  if (taker == spec.algorithms.end()) return gradient_pass(spec, s, slots, batch, hooks, actx, dp);
  std::optional<StepOutput> first, failed;
  const GradientFn gradient = [&]() -> GradientResult {
    StepOutput o = gradient_pass(spec, s, slots, batch, hooks, actx, dp);
    const bool usable = !o.non_finite && !o.overflow;
    if (!first) first = o;
    if (!usable && !failed) failed = o;
    return {o.loss, usable};
  };
  std::vector<torch::Tensor> params;
  for (const auto& sl : slots)
    if (sl.param.requires_grad()) params.push_back(sl.param);
  const GradientResult result = taker->gradient(actx, params, gradient);
  if (failed) {
    drop_grads(slots);
    return *failed;
  }
  if (!first)
    raise(ErrorCode::invalid_spec, fmt::format("algorithm \"{}\" took over the gradient but never computed one "
                                               "(Algorithm::gradient must call `gradient`)", taker->name));
  first->loss = result.loss;
  return *first;
}
}  // namespace

StepOutput step_in_place(const TrainingSpec& spec, TrainState& s, std::vector<Slot>& slots, const Batch& batch,
                         double lr_scale, Hooks* hooks, const AlgorithmContext& actx, DataParallel& dp) {
  StepOutput out = compute_gradient(spec, s, slots, batch, hooks, actx, dp);
  // Once per step, however many gradients it took: every rank holds the same reduced gradients,
  // so every rank decides alike.
  if (spec.loss_scaling && !out.non_finite) update_loss_scale(*spec.loss_scaling, *s.loss_scale, !out.overflow);
  if (out.non_finite || out.overflow) return out;
  if (hooks) hooks->fire(Event::after_backward);
  out.grad_norm = clip_gradients(spec, slots);
  if (const double norm = checked_norm(spec, slots, out.grad_norm); !std::isfinite(norm)) {
    drop_grads(slots);
    return {out.loss, norm, true, fmt::format("the gradient norm is {}", norm)};
  }
  torch::NoGradGuard no_grad;
  if (!spec.optimizer.transforms.empty()) transform_gradients(spec.optimizer, slots);
  if (hooks) hooks->fire(Event::before_optimizer_step);
  for (auto& sl : slots)
    if (sl.param.grad().defined())
      optim::apply(spec.optimizer, sl.param, sl.param.grad(), *sl.state, sl.lr * lr_scale, sl.weight_decay);
  drop_grads(slots);
  return out;
}

/// Clips gradients (by global norm, then by value); returns the global norm before clipping,
/// or 0 when not clipping by norm (computing it costs a pass over every gradient).
double clip_gradients(const TrainingSpec& spec, std::vector<Slot>& slots) {
  if (!spec.clip_grad_norm && !spec.clip_grad_value) return 0.0;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (auto& sl : slots)
    if (sl.param.grad().defined()) grads.push_back(sl.param.grad());
  const double total = spec.clip_grad_norm && !grads.empty() ? clip_by_norm(grads, *spec.clip_grad_norm) : 0.0;
  if (spec.clip_grad_value)
    for (auto& g : grads) g.clamp_(-*spec.clip_grad_value, *spec.clip_grad_value);
  return total;
}

double clip_by_norm(std::vector<torch::Tensor>& grads, double max_norm) {
  torch::NoGradGuard no_grad;
  const double total = global_norm(grads);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0)
    for (auto& g : grads) g.mul_(coef);
  return total;
}

double global_norm(const std::vector<torch::Tensor>& grads) {
  if (grads.empty()) return 0.0;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> norms;
  norms.reserve(grads.size());
  for (const auto& g : grads) norms.push_back(g.norm(2));
  return torch::stack(norms).norm(2).item<double>();
}

}  // namespace baton::detail
