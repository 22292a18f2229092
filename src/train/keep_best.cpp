// KeepBest (spec.hpp): the best evaluation's weights in the state, and their restoring at the
// stage's end. The entry algorithm_state["keep_best"] holds the parameters and buffers by name
// (as EMA's does, so eval's `weights = "keep_best"` reads it too) and three scalars: the value,
// the batch of the evaluation and the start of the stage it belongs to.
#include <cmath>

#include <fmt/format.h>
#include <torch/torch.h>

#include "train/observers.hpp"

namespace baton::detail {
namespace {
constexpr const char* kEntry = "keep_best";
constexpr const char* kValue = "#value";  // '#' is in no parameter name (LibTorch joins names with '.')
constexpr const char* kBatch = "#batch";
constexpr const char* kStage = "#stage_start";

/// The kept entry when it belongs to this scope (the stage's own for Scope::stage).
const std::map<std::string, torch::Tensor>* kept(const KeepBest& keep, const TrainState& s) {
  const auto it = s.algorithm_state.find(kEntry);
  if (it == s.algorithm_state.end() || !it->second.count(kValue)) return nullptr;
  if (keep.scope == KeepBest::Scope::stage && it->second.at(kStage).item<std::int64_t>() != s.stage_start.batch) return nullptr;
  return &it->second;
}
}  // namespace

bool keep_if_best(const KeepBest& keep, const Metrics& m, TrainState& s) {
  const auto value = metric_value(m, keep.metric);
  if (!value)
    throw BatonException(Error{ErrorCode::invalid_spec,
                               fmt::format("keep_best: metric \"{}\" is not among the evaluated ones", keep.metric), {}});
  if (std::isnan(*value)) return false;
  if (const auto* old = kept(keep, s)) {
    const double best = old->at(kValue).item<double>();
    if (!(keep.maximize ? *value > best : *value < best)) return false;  // ties keep the earlier
  }
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> entry;
  for (const auto& [name, t] : s.named_parameters()) entry[name] = t.detach().clone();
  for (const auto& [name, t] : s.named_buffers()) entry[name] = t.detach().clone();
  entry[kValue] = torch::tensor(*value, torch::kDouble);
  entry[kBatch] = torch::tensor(s.time.batch, torch::kLong);
  entry[kStage] = torch::tensor(s.stage_start.batch, torch::kLong);
  s.algorithm_state[kEntry] = std::move(entry);
  return true;
}

std::optional<std::string> restore_kept(const KeepBest& keep, TrainState& s) {
  const auto* entry = kept(keep, s);
  if (entry == nullptr) return std::nullopt;
  const auto batch = entry->at(kBatch).item<std::int64_t>();
  const auto what = fmt::format("{} = {} from the evaluation at batch {}", keep.metric, entry->at(kValue).item<double>(), batch);
  if (batch == s.time.batch) return "kept the last weights, the best: " + what;
  auto named = s.named_parameters();
  const auto buffers = s.named_buffers();
  named.insert(named.end(), buffers.begin(), buffers.end());
  for (const auto& [name, t] : named)  // a run-wide best kept before the model changed shape
    if (const auto it = entry->find(name); it == entry->end() || it->second.sizes() != t.sizes())
      throw BatonException(Error{ErrorCode::shape_mismatch,
                                 fmt::format("restore_best: the kept weights (batch {}) have no tensor \"{}\" of shape {}: "
                                             "the model changed since; use scope = \"stage\"", batch, name,
                                             shape_string(t)), {}});
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : named) t.copy_(entry->at(name));
  return "restored the best weights: " + what;
}

std::optional<std::int64_t> kept_batch(const TrainState& s) {
  const auto it = s.algorithm_state.find(kEntry);
  if (it == s.algorithm_state.end() || !it->second.count(kBatch)) return std::nullopt;
  return it->second.at(kBatch).item<std::int64_t>();
}

}  // namespace baton::detail
