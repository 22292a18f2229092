#pragma once
/// \file loss.hpp
/// Loss functions: a name and a function of (model output, targets) returning a scalar tensor.

#include <functional>
#include <string>

#include <torch/types.h>

namespace baton {

/// A named loss. The function must return a scalar (0-dim) tensor averaged over the batch.
struct Loss {
  std::string name{};
  std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)> fn{};
};

namespace loss {
/// Cross-entropy on logits [B, C] and int64 class targets [B]. Checks shapes and class range,
/// naming both shapes when they disagree.
Loss cross_entropy();
/// Mean squared error; output and target must have the same shape.
Loss mse();
/// A user loss: `baton::loss::custom("l1", [](auto& y, auto& t) { return (y - t).abs().mean(); })`.
Loss custom(std::string name, std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> fn);
}  // namespace loss

}  // namespace baton
