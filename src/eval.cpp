// eval: metrics of a state on evaluation sets, changing nothing.
#include <fmt/format.h>
#include <torch/torch.h>

#include "baton/distributed.hpp"
#include "baton/eval.hpp"
#include "baton/state.hpp"
#include "detail.hpp"

namespace baton {

namespace {
/// Puts a module in eval mode for a scope and restores its previous mode.
class EvalModeScope {
 public:
  explicit EvalModeScope(torch::nn::Module& m) : m_(m), was_training_(m.is_training()) { m_.eval(); }
  EvalModeScope(const EvalModeScope&) = delete;
  EvalModeScope& operator=(const EvalModeScope&) = delete;
  ~EvalModeScope() { m_.train(was_training_); }
 private:
  torch::nn::Module& m_;
  bool was_training_;
};

/// A copy of `s` holding the weights an algorithm keeps (e.g. its EMA) in place of its own.
Expected<TrainState> with_weights(const std::string& which, const TrainState& s) {
  auto it = s.algorithm_state.find(which);
  if (it == s.algorithm_state.end() || it->second.empty())
    return fail(ErrorCode::invalid_argument,
                fmt::format("eval: weights \"{}\" requested, but the state holds none; add the algorithm \"{}\" "
                            "to the training spec and train at least one step with it",
                            which, which));
  TrainState swapped = s;
  auto take = [&](const std::vector<std::pair<std::string, torch::Tensor>>& named) -> Expected<void> {
    for (const auto& [name, t] : named) {
      auto jt = it->second.find(name);
      if (jt == it->second.end() || !jt->second.defined() || jt->second.sizes() != t.sizes())
        return fail(ErrorCode::shape_mismatch,
                    fmt::format("eval: weights \"{}\" have no tensor \"{}\" of shape {} (the model changed since "
                                "they were recorded?)", which, name, detail::shape_string(t)));
      t.copy_(jt->second);
    }
    return {};
  };
  if (auto ok = take(swapped.named_parameters()); !ok) return tl::unexpected(ok.error());
  if (auto ok = take(swapped.named_buffers()); !ok) return tl::unexpected(ok.error());
  return swapped;
}

/// The metrics of one set: sums over this rank's shard, reduced across ranks.
Expected<std::map<std::string, double>> eval_set(const EvalSpec& spec, const TrainState& s, const std::string& name,
                                                 const Dataset& ds) {
  if (auto ok = ds.validate(); !ok) return tl::unexpected(ok.error().with_context(fmt::format("eval set \"{}\"", name)));
  const std::int64_t n = spec.limit ? std::min(ds.size(), *spec.limit) : ds.size();
  if (n <= 0) return fail(ErrorCode::invalid_argument, fmt::format("eval set \"{}\": no samples to evaluate", name));
  const bool classes = ds.targets.scalar_type() == torch::kLong && ds.targets.dim() == 1;
  double loss_sum = 0;
  std::int64_t correct = 0;
  std::vector<std::int64_t> topk_correct(spec.top_k.size(), 0);
  std::int64_t num_classes = 0;
  // Across ranks: this rank's contiguous shard of the set; sums and counts reduced below.
  const auto [lo, count] = spec.distributed ? spec.distributed->shard(n) : std::pair<std::int64_t, std::int64_t>{0, n};
  // The data stays where it is; each batch goes to the model's device (a state trained on a GPU).
  const auto params = s.model.module->parameters();
  const c10::Device device = params.empty() ? c10::Device(c10::kCPU) : params.front().device();
  for (std::int64_t i = lo; i < lo + count; i += spec.batch_size) {
    const std::int64_t take = std::min(spec.batch_size, lo + count - i);
    auto x = ds.inputs.narrow(0, i, take);
    auto y = ds.targets.narrow(0, i, take);
    if (x.device() != device) x = x.to(device), y = y.to(device);
    torch::Tensor out;
    try {
      out = s.model.forward(x);
      // Under a fit's bf16/fp16 autocast: metrics in float32, as the training loss.
      if (out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kHalf) out = out.to(at::kFloat);
    } catch (const c10::Error& e) {
      return fail(ErrorCode::shape_mismatch, fmt::format("eval set \"{}\": the model's forward failed on inputs of shape {}: {}",
                                                         name, detail::shape_string(x), detail::torch_message(e)));
    }
    auto l = spec.loss.fn(out, y);
    loss_sum += l.item<double>() * static_cast<double>(take);
    if (classes && out.dim() == 2) {
      num_classes = out.size(1);
      correct += out.argmax(1).eq(y).sum().item<std::int64_t>();
      for (std::size_t k = 0; k < spec.top_k.size(); ++k) {
        if (spec.top_k[k] >= out.size(1)) {  // the top k of fewer than k classes hold every class
          topk_correct[k] += take;
          continue;
        }
        auto top = std::get<1>(out.topk(spec.top_k[k], 1));
        topk_correct[k] += top.eq(y.unsqueeze(1)).any(1).sum().item<std::int64_t>();
      }
    }
  }
  if (spec.distributed) {
    std::vector<double> sums{loss_sum, static_cast<double>(correct)};
    for (auto c : topk_correct) sums.push_back(static_cast<double>(c));
    auto summed = torch::tensor(sums, torch::kDouble);
    auto most = torch::tensor(std::vector<std::int64_t>{num_classes}, torch::kLong);  // a rank with an empty shard saw none
    const std::string what = fmt::format("the metrics of eval set \"{}\"", name);
    if (auto ok = spec.distributed->all_reduce({summed}, Distributed::Op::sum, what); !ok) return tl::unexpected(ok.error());
    if (auto ok = spec.distributed->all_reduce({most}, Distributed::Op::max, what); !ok) return tl::unexpected(ok.error());
    loss_sum = summed[0].item<double>();
    correct = std::llround(summed[1].item<double>());
    for (std::size_t k = 0; k < topk_correct.size(); ++k) topk_correct[k] = std::llround(summed[2 + static_cast<std::int64_t>(k)].item<double>());
    num_classes = most[0].item<std::int64_t>();
  }
  std::map<std::string, double> m;
  m["loss"] = loss_sum / static_cast<double>(n);
  if (classes && num_classes > 0) {
    m["accuracy"] = static_cast<double>(correct) / static_cast<double>(n);
    for (std::size_t k = 0; k < spec.top_k.size(); ++k)
      m[fmt::format("top{}_accuracy", spec.top_k[k])] = static_cast<double>(topk_correct[k]) / static_cast<double>(n);
  }
  return m;
}

}  // namespace

Expected<Metrics> eval(const EvalSpec& spec, const TrainState& s) {
  return detail::guard([&]() -> Expected<Metrics> {
    if (!s.model.module) return fail(ErrorCode::invalid_argument, "eval: the state has no model");
    if (spec.batch_size <= 0)
      return fail(ErrorCode::invalid_argument, fmt::format("eval: batch_size must be positive, got {}", spec.batch_size));
    if (!spec.loss.fn) return fail(ErrorCode::invalid_argument, "eval: no loss function set");
    for (const auto k : spec.top_k)
      if (k < 1) return fail(ErrorCode::invalid_argument, fmt::format("eval: top_k holds {}; each k must be at least 1", k));
    torch::NoGradGuard no_grad;
    if (!spec.weights.empty()) {
      EvalSpec plain = spec;
      plain.weights.clear();
      return with_weights(spec.weights, s).and_then([&](const TrainState& swapped) { return eval(plain, swapped); });
    }
    // The whole evaluation is one exclusive section (docs/threads.md): the module's eval mode
    // and any draws of its forward are never seen by another thread; the state is left as it was.
    detail::GlobalRngScope rng(s.rng);
    EvalModeScope eval_mode(*s.model.module);
    Metrics metrics;
    for (const auto& [name, ds] : spec.sets) {
      auto m = eval_set(spec, s, name, ds);
      if (!m) return tl::unexpected(m.error());
      metrics[name] = std::move(*m);
    }
    return metrics;
  });
}

}  // namespace baton
