// Models and their weights: building one from a factory with the run's seed, and copying weights
// by name and shape between two (weights.hpp).
#include "weights.hpp"

#include <fnmatch.h>

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "detail.hpp"

namespace baton::detail {

bool matches(const std::string& pattern, const std::string& name) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

namespace {
constexpr std::string_view kByRequest = "(initialized anew by request)";

/// FNV-1a: a stable hash of the stage name for seeds (the same on every platform).
std::uint64_t stable_hash(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

std::uint64_t stage_seed(std::uint64_t run_seed, std::string_view stage, std::uint64_t stream) {
  std::uint64_t x = run_seed ^ stable_hash(stage) ^ (stream * 0xD1B54A32D192ED03ULL);
  return splitmix64(x);
}
}  // namespace

Model build_model(const ModelFactory& factory, std::uint64_t seed, std::string_view stage) {
  GlobalRngScope scope(seeded_rng_state(stage_seed(seed, stage, 3)));
  Model m = factory();
  if (!m.module || !m.forward) raise(ErrorCode::invalid_argument, "the model factory returned no module or no forward");
  return m;
}

namespace {
/// Copies tensors whose name and shape match from `from` into `to`; reports what it did.
void transfer_tensors(const torch::OrderedDict<std::string, torch::Tensor>& from,
                      const torch::OrderedDict<std::string, torch::Tensor>& to, const std::vector<std::string>& fresh,
                      TransferReport& report, std::vector<std::string>* copied_params) {
  torch::NoGradGuard no_grad;
  for (const auto& item : to) {
    const auto* src = from.find(item.key());
    if (src != nullptr && std::any_of(fresh.begin(), fresh.end(), [&](const auto& p) { return matches(p, item.key()); })) {
      report.skipped.push_back(fmt::format("{} {}", item.key(), kByRequest));
      report.initialized.push_back(item.key());
    } else if (src == nullptr) {
      report.initialized.push_back(item.key());
    } else if (src->sizes() != item.value().sizes()) {
      report.skipped.push_back(fmt::format("{} (shape {} in the source, {} here)", item.key(),
                                           shape_string(*src), shape_string(item.value())));
      report.initialized.push_back(item.key());
    } else {
      item.value().set_data(src->detach().clone());
      report.copied.push_back(item.key());
      if (copied_params) copied_params->push_back(item.key());
    }
  }
  for (const auto& item : from)
    if (to.find(item.key()) == nullptr) report.skipped.push_back(fmt::format("{} (not in the new model)", item.key()));
}

}  // namespace

TransferReport transfer_weights(const torch::nn::Module& from, torch::nn::Module& to, const std::vector<std::string>& fresh,
                                std::vector<std::string>* copied_params) {
  TransferReport r;
  transfer_tensors(from.named_parameters(), to.named_parameters(), fresh, r, copied_params);
  transfer_tensors(from.named_buffers(), to.named_buffers(), fresh, r, nullptr);
  return r;
}

namespace {
std::string brief_parameter_list(const torch::nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& p : m.named_parameters()) names.push_back(fmt::format("{} {}", p.key(), shape_string(p.value())));
  constexpr std::size_t kShown = 4;
  std::string out = fmt::format("{}", fmt::join(names.begin(), names.begin() + std::min(names.size(), kShown), ", "));
  if (names.size() > kShown) out += fmt::format(", ... ({} in all)", names.size());
  return names.empty() ? std::string("no parameters") : out;
}
}  // namespace

std::string transfer_took_nothing(const torch::nn::Module& from, const torch::nn::Module& to, const TransferReport& r) {
  if (!r.copied.empty() || r.initialized.empty()) return {};
  for (const auto& s : r.skipped)
    if (s.find(kByRequest) != std::string::npos) return {};
  return fmt::format("the transfer takes nothing: no parameter or buffer of the new model has a name and shape of the "
                     "model before it (before: {}; new: {}). A transfer keeps the weights whose names and shapes "
                     "match: name the new model's trunk as the old one does, or build it all anew (carry = "
                     "\"reinitialize\"; in C++, ModelCarry::reinitialize)",
                     brief_parameter_list(from), brief_parameter_list(to));
}

const ModelFactory& factory_after(const std::vector<TrainingSpec>& stages, std::size_t index, const ModelFactory& initial) {
  for (std::size_t i = std::min(index + 1, stages.size()); i-- > 0;)
    if (stages[i].model.kind != ModelCarry::Kind::keep && stages[i].model.factory) return stages[i].model.factory;
  return initial;
}

}  // namespace baton::detail
