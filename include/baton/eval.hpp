#pragma once
/// \file eval.hpp
/// Evaluation: metrics on named datasets. Changes nothing (the model is put in eval mode for the
/// call and restored; no gradients; no buffers updated).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "baton/data.hpp"
#include "baton/error.hpp"
#include "baton/loss.hpp"
#include "baton/metrics.hpp"
#include "baton/state.hpp"

namespace baton {

class Distributed;  // distributed.hpp

/// What to evaluate. Metrics per set: "loss" (the mean over samples of `loss`, weighted by batch
/// size) and each of `metrics` (metrics.hpp).
struct EvalSpec {
  std::vector<std::pair<std::string, Dataset>> sets{};
  Loss loss = baton::loss::cross_entropy();
  std::int64_t batch_size = 256;  ///< activations of a batch stay under glibc's mmap threshold
  /// The metrics besides the loss, in order. Empty: `metric::defaults` for each set's targets
  /// (accuracy and top-5 accuracy for class targets). A listed metric whose targets a set does not
  /// have (accuracy on regression targets) is an error naming both.
  std::vector<Metric> metrics{};
  /// Evaluate on the first `limit` samples of each set only (a quick estimate during training).
  std::optional<std::int64_t> limit{};
  /// Evaluate with weights an algorithm keeps instead of the model's own: "ema" or "swa" (the
  /// name of an entry in `TrainState::algorithm_state` holding parameters and buffers by name).
  std::string weights{};
  /// Evaluate across the ranks of this process group: each rank evaluates a contiguous shard of
  /// every set, and the metrics are reduced from sums and counts, so every rank gets the
  /// metrics of the whole set (equal to one process's, up to float summation order). Every rank
  /// must call eval. Null: this process evaluates everything. A fit with a group passes it on.
  std::shared_ptr<const Distributed> distributed{};
};

/// Metric values by set name, then metric name: `metrics["test"]["accuracy"]`.
using Metrics = std::map<std::string, std::map<std::string, double>>;

/// A value by its full name, "<set>/<metric>" ("val/accuracy", "val/f1/3"); none when absent.
std::optional<double> metric_value(const Metrics& m, const std::string& name);

Expected<Metrics> eval(const EvalSpec& spec, const TrainState& state);

}  // namespace baton
