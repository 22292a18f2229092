// How a fit computes: autocast (precision), the layout of 4-D tensors (memory format), LibTorch's
// deterministic algorithms, and dynamic loss scaling. Each is a setting of the stage's spec;
// docs/precision.md says what they mean for users.
#pragma once

#include <vector>

#include <torch/types.h>

#include "baton/spec.hpp"
#include "baton/state.hpp"

namespace torch::nn { class Module; }

namespace baton::detail {

struct Slot;

/// Autocast for the forward pass and the loss at the stage's precision; nothing for fp32.
/// LibTorch keeps autocast per thread: fits in other threads are not affected. Restores the
/// thread's previous settings when it ends.
class AutocastScope {
 public:
  AutocastScope(Precision precision, const c10::Device& device);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
  c10::DeviceType type_ = c10::kCPU;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kFloat;
};

/// True when a fit on these training inputs, on this device, runs in channels_last.
bool use_channels_last(MemoryFormat format, std::int64_t batch_dims, const c10::Device& device);
/// `t` with the strides of `format` (`t` itself when it has them): strides LibTorch reads as
/// that layout, also for one channel, where both layouts are contiguous.
torch::Tensor in_format(const torch::Tensor& t, at::MemoryFormat format);
/// A batch's inputs in the layout of a fit on `device` (4-D inputs only; others as they are).
torch::Tensor in_layout(const torch::Tensor& inputs, MemoryFormat format, const c10::Device& device);

/// The module's 4-D parameters and buffers in channels_last while the scope lives (when asked),
/// back in the default layout after: a fit returns weights in the layout it was given them in.
class LayoutScope {
 public:
  LayoutScope(torch::nn::Module& module, bool channels_last);
  ~LayoutScope();
  void restore();  ///< back to the default layout now (the fit's end)
  LayoutScope(const LayoutScope&) = delete;
  LayoutScope& operator=(const LayoutScope&) = delete;

 private:
  torch::nn::Module* module_ = nullptr;
};

/// LibTorch's deterministic algorithms (and on CUDA cuDNN's deterministic, non-benchmarked
/// kernels) while at least one fit that asks for them runs; the process's own settings come back
/// when the last one ends. A process-wide setting: documented as such.
class DeterministicScope {
 public:
  explicit DeterministicScope(bool on);
  ~DeterministicScope();
  DeterministicScope(const DeterministicScope&) = delete;
  DeterministicScope& operator=(const DeterministicScope&) = delete;

 private:
  bool on_ = false;
};

/// A LibTorch error that says an op has no deterministic implementation, rewritten for the user;
/// nothing for other errors.
std::optional<std::string> nondeterministic_op_message(const std::string& torch_message);

/// The loss multiplier of this step: the state's scale under loss scaling, else 1. Starts the
/// state's scale from `spec.loss_scaling->init` when it has none.
double begin_loss_scale(const TrainingSpec& spec, TrainState& s);
/// Divides the gradients by `scale`; true when every one is finite after.
bool unscale_gradients(std::vector<Slot>& slots, double scale);
/// After a step: backs off on overflow (the batch is then skipped), grows after `interval` good steps.
void update_loss_scale(const LossScaling& policy, LossScaleState& state, bool finite);

}  // namespace baton::detail
