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
  /// Optional: how many terms `fn` averages over in these targets (token_cross_entropy: the real
  /// tokens, padding not counted). Set, a step's loss is the mean over every term of the global
  /// batch: microbatches and data-parallel ranks are weighted by their terms, not their samples
  /// (one more all-reduce of a number per step across ranks), and evaluation's loss likewise.
  /// Empty: every sample is one term.
  std::function<double(const torch::Tensor& target)> units{};
};

namespace loss {
/// Cross-entropy on logits [B, C] and int64 class targets [B]. Checks shapes and class range,
/// naming both shapes when they disagree.
Loss cross_entropy();
/// Cross-entropy of every position of a sequence: logits [B, T, V] and int64 targets [B, T],
/// averaged over the targets that are not `ignore_index` (padding). Batches, microbatches and
/// ranks are weighted by their real tokens (`Loss::units`); a batch with none gives 0.
Loss token_cross_entropy(std::int64_t ignore_index = -100);
/// Mean squared error; output and target must have the same shape.
Loss mse();
/// A user loss: `baton::loss::custom("l1", [](auto& y, auto& t) { return (y - t).abs().mean(); })`.
Loss custom(std::string name, std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> fn);
}  // namespace loss

}  // namespace baton
