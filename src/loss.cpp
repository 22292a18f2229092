// The built-in losses (loss.hpp): shapes checked, LibTorch's errors turned into messages that
// name both shapes.
#include <fmt/format.h>
#include <torch/nn/functional/loss.h>
#include <torch/torch.h>

#include "baton/error.hpp"
#include "baton/loss.hpp"
#include "detail.hpp"

namespace baton {
namespace loss {
Loss cross_entropy() {
  return Loss{"cross_entropy", [](const torch::Tensor& out, const torch::Tensor& target) {
                if (target.is_floating_point() && target.sizes() == out.sizes() && out.dim() == 2) {
                  // Class probabilities (soft targets from label smoothing, MixUp, CutMix):
                  // the mean over the batch of -sum_c p_c log softmax(out)_c.
                  return -(target * torch::log_softmax(out, 1)).sum(1).mean();
                }
                if (out.dim() != 2 || target.dim() != 1 || out.size(0) != target.size(0)) {
                  detail::raise(ErrorCode::shape_mismatch,
                                fmt::format("cross_entropy needs model output [batch, classes] and "
                                            "targets [batch] (class indices) or [batch, classes] (probabilities); "
                                            "got output {} and targets {}",
                                            detail::shape_string(out), detail::shape_string(target)));
                }
                if (target.scalar_type() != torch::kLong) {
                  detail::raise(ErrorCode::shape_mismatch,
                                fmt::format("cross_entropy needs int64 class targets, got {}",
                                            c10::toString(target.scalar_type())));
                }
                try {
                  return torch::nn::functional::cross_entropy(out, target);
                } catch (const c10::Error& e) {
                  detail::raise(ErrorCode::shape_mismatch,
                                fmt::format("cross_entropy on output {} ({} classes): {}; are the "
                                            "labels in [0, {})?",
                                            detail::shape_string(out), out.size(1),
                                            detail::torch_message(e), out.size(1)));
                }
              }};
}

Loss token_cross_entropy(std::int64_t ignore_index) {
  Loss l;
  l.name = "token_cross_entropy";
  l.fn = [ignore_index](const torch::Tensor& out, const torch::Tensor& target) {
    if (out.dim() != 3 || target.dim() != 2 || out.size(0) != target.size(0) || out.size(1) != target.size(1))
      detail::raise(ErrorCode::shape_mismatch,
                    fmt::format("token_cross_entropy needs model output [batch, positions, vocab] and targets [batch, "
                                "positions]; got output {} and targets {}",
                                detail::shape_string(out), detail::shape_string(target)));
    if (target.scalar_type() != torch::kLong)
      detail::raise(ErrorCode::shape_mismatch, fmt::format("token_cross_entropy needs int64 token targets, got {}",
                                                           c10::toString(target.scalar_type())));
    const auto flat = target.reshape({-1});
    const auto real = flat.ne(ignore_index);
    // A target outside the vocabulary: on the CPU cross_entropy finds it itself (its error is
    // translated below, no extra pass); on an accelerator it would be a device-side assert, so
    // the targets are checked first there.
    auto out_of_range = [&] {
      const auto bad = real.logical_and(flat.lt(0).logical_or(flat.ge(out.size(2))));
      if (bad.any().item<bool>())
        detail::raise(ErrorCode::shape_mismatch,
                      fmt::format("token_cross_entropy: target token {} is outside the vocabulary [0, {}) of the output {}",
                                  flat.masked_select(bad)[0].item<std::int64_t>(), out.size(2), detail::shape_string(out)));
    };
    if (!flat.is_cpu()) out_of_range();
    const auto n = real.sum();
    // Summed, then divided by the real tokens: a batch of padding only is 0, not 0/0.
    torch::Tensor sum;
    try {
      sum = torch::nn::functional::cross_entropy(
          out.reshape({-1, out.size(2)}), flat,
          torch::nn::functional::CrossEntropyFuncOptions().ignore_index(ignore_index).reduction(torch::kSum));
    } catch (const c10::Error&) {
      out_of_range();  // raises when a target was the cause
      throw;
    }
    return sum / n.clamp_min(1).to(sum.scalar_type());
  };
  l.units = [ignore_index](const torch::Tensor& target) { return static_cast<double>(target.ne(ignore_index).sum().item<std::int64_t>()); };
  return l;
}

Loss mse() {
  return Loss{"mse", [](const torch::Tensor& out, const torch::Tensor& target) {
                if (out.sizes() != target.sizes()) {
                  detail::raise(ErrorCode::shape_mismatch,
                                fmt::format("mse needs output and targets of the same shape; got "
                                            "output {} and targets {}",
                                            detail::shape_string(out), detail::shape_string(target)));
                }
                return torch::mse_loss(out, target);
              }};
}

Loss custom(std::string name, std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> fn) {
  return Loss{std::move(name), std::move(fn)};
}
}  // namespace loss

}  // namespace baton
