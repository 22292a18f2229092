// Autocast, memory format, deterministic algorithms and loss scaling (precision.hpp).
#include "train/precision.hpp"

#include <cmath>
#include <mutex>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/nn/module.h>
#include <torch/version.h>

#include "train/carry.hpp"

// LibTorch 2.4 replaced the per-device autocast functions (set_cpu_enabled, ...) by ones that
// take the device type; 1.13 (Debian's) has only the old ones.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define BATON_AUTOCAST_BY_DEVICE 1
#endif

namespace baton::detail {

namespace {
bool autocast_enabled(c10::DeviceType t) {
#ifdef BATON_AUTOCAST_BY_DEVICE
  return at::autocast::is_autocast_enabled(t);
#else
  return t == c10::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}
void set_autocast_enabled(c10::DeviceType t, bool on) {
#ifdef BATON_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_enabled(t, on);
#else
  if (t == c10::kCUDA) at::autocast::set_enabled(on);
  else at::autocast::set_cpu_enabled(on);
#endif
}
at::ScalarType autocast_dtype(c10::DeviceType t) {
#ifdef BATON_AUTOCAST_BY_DEVICE
  return at::autocast::get_autocast_dtype(t);
#else
  return t == c10::kCUDA ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
#endif
}
void set_autocast_dtype(c10::DeviceType t, at::ScalarType dtype) {
#ifdef BATON_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_dtype(t, dtype);
#else
  if (t == c10::kCUDA) at::autocast::set_autocast_gpu_dtype(dtype);
  else at::autocast::set_autocast_cpu_dtype(dtype);
#endif
}

void relayout(torch::nn::Module& m, at::MemoryFormat format) {
  torch::NoGradGuard no_grad;
  auto move = [&](torch::Tensor t) {
    if (t.defined() && t.dim() == 4 && !(t.suggest_memory_format() == format && t.is_contiguous(format)))
      t.set_data(in_format(t.data(), format));
  };
  for (auto& p : m.parameters()) move(p);
  for (auto& b : m.buffers()) move(b);
}
}  // namespace

AutocastScope::AutocastScope(Precision precision, const c10::Device& device) {
  if (precision == Precision::fp32) return;
  type_ = device.type();
  was_enabled_ = autocast_enabled(type_);
  was_dtype_ = autocast_dtype(type_);
  set_autocast_dtype(type_, precision == Precision::bf16 ? at::kBFloat16 : at::kHalf);
  set_autocast_enabled(type_, true);
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  // Casts of the weights are cached for one scope (one microbatch): the next sees new weights.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast_enabled(type_, was_enabled_);
  set_autocast_dtype(type_, was_dtype_);
}

bool use_channels_last(MemoryFormat format, std::int64_t batch_dims, const c10::Device& device) {
  switch (format) {
    // automatic is baton's measured choice: channels_last for image batches on the CPU, where
    // oneDNN's NHWC kernels train small_cnn 1.5x as fast as NCHW in fp32 (benchmarks/README.md);
    // the default layout on CUDA, where it was not measured since that figure.
    case MemoryFormat::automatic: return batch_dims == 4 && device.is_cpu();
    case MemoryFormat::contiguous: return false;
    case MemoryFormat::channels_last: return batch_dims == 4;
  }
  return false;
}

torch::Tensor in_format(const torch::Tensor& t, at::MemoryFormat format) {
  // Not contiguous(format): a tensor with one channel (an [N, 1, H, W] batch, the weight of a
  // conv over one channel) is contiguous in both layouts, so contiguous() keeps whichever strides
  // it has, and the strides are what LibTorch reads the layout from (suggest_memory_format). A
  // first conv whose weight kept NCHW strides ran in NCHW and handed NCHW activations to an NHWC
  // second conv: the backward then mixed layouts in every elementwise kernel (small_cnn: 0.95x of
  // NCHW, against 1.5x with NHWC strides).
  if (t.suggest_memory_format() == format && t.is_contiguous(format)) return t;
  return t.to(t.options(), /*non_blocking=*/false, /*copy=*/true, format);
}

torch::Tensor in_layout(const torch::Tensor& inputs, MemoryFormat format, const c10::Device& device) {
  if (!inputs.defined() || !use_channels_last(format, inputs.dim(), device)) return inputs;
  return in_format(inputs, at::MemoryFormat::ChannelsLast);
}

LayoutScope::LayoutScope(torch::nn::Module& module, bool channels_last) {
  if (!channels_last) return;
  relayout(module, at::MemoryFormat::ChannelsLast);
  module_ = &module;
}

void LayoutScope::restore() {
  if (!module_) return;
  relayout(*module_, at::MemoryFormat::Contiguous);
  module_ = nullptr;
}

LayoutScope::~LayoutScope() {
  try {
    restore();
  } catch (...) {  // unwinding from another error: the state is not returned then
  }
}

namespace {
struct DeterministicSettings {
  std::mutex m;
  int users = 0;
  bool algorithms = false, warn_only = false, cudnn_deterministic = false, cudnn_benchmark = false;
  static DeterministicSettings& get() {
    static DeterministicSettings s;
    return s;
  }
};
}  // namespace

DeterministicScope::DeterministicScope(bool on) : on_(on) {
  if (!on_) return;
  auto& d = DeterministicSettings::get();
  std::lock_guard lock(d.m);
  if (d.users++ > 0) return;
  auto& ctx = at::globalContext();
  d.algorithms = ctx.deterministicAlgorithms();
  d.warn_only = ctx.deterministicAlgorithmsWarnOnly();
  d.cudnn_deterministic = ctx.deterministicCuDNN();
  d.cudnn_benchmark = ctx.benchmarkCuDNN();
  ctx.setDeterministicAlgorithms(true, false);
  ctx.setDeterministicCuDNN(true);
  ctx.setBenchmarkCuDNN(false);
}

DeterministicScope::~DeterministicScope() {
  if (!on_) return;
  auto& d = DeterministicSettings::get();
  std::lock_guard lock(d.m);
  if (--d.users > 0) return;
  auto& ctx = at::globalContext();
  ctx.setDeterministicAlgorithms(d.algorithms, d.warn_only);
  ctx.setDeterministicCuDNN(d.cudnn_deterministic);
  ctx.setBenchmarkCuDNN(d.cudnn_benchmark);
}

std::optional<std::string> nondeterministic_op_message(const std::string& torch_message) {
  const auto at = torch_message.find(" does not have a deterministic implementation");
  if (at == std::string::npos) return std::nullopt;
  const auto start = torch_message.rfind('\n', at);
  const std::string op = torch_message.substr(start == std::string::npos ? 0 : start + 1, at - (start == std::string::npos ? 0 : start + 1));
  return fmt::format("deterministic = true, but {} has no deterministic implementation in LibTorch; set "
                     "deterministic = false for this stage, or use another op",
                     op);
}

double begin_loss_scale(const TrainingSpec& spec, TrainState& s) {
  if (!spec.loss_scaling) return 1.0;
  if (!s.loss_scale) s.loss_scale = LossScaleState{spec.loss_scaling->init, 0, 0};
  return s.loss_scale->scale;
}

bool unscale_gradients(std::vector<Slot>& slots, double scale) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> finite;
  const double inverse = 1.0 / scale;
  for (auto& sl : slots) {
    auto& g = sl.param.mutable_grad();
    if (!g.defined()) continue;
    g.mul_(inverse);
    finite.push_back(g.isfinite().all());
  }
  return finite.empty() || torch::stack(finite).all().item<bool>();
}

void update_loss_scale(const LossScaling& policy, LossScaleState& state, bool finite) {
  if (!finite) {
    state.scale *= policy.backoff;
    state.growth_tracker = 0;
    ++state.skipped;
    return;
  }
  if (++state.growth_tracker >= policy.interval) {
    state.scale *= policy.growth;
    state.growth_tracker = 0;
  }
}

}  // namespace baton::detail
