// eval: metrics of a state on evaluation sets, changing nothing.
#include <fmt/format.h>
#include <torch/torch.h>

#include "baton/distributed.hpp"
#include "baton/eval.hpp"
#include "baton/state.hpp"
#include "detail.hpp"
#include "weights.hpp"

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

}  // namespace

Expected<TrainState> detail::with_weights(const std::string& which, const TrainState& s) {
  auto it = s.algorithm_state.find(which);
  if (it == s.algorithm_state.end() || it->second.empty())
    return fail(ErrorCode::invalid_argument,
                fmt::format("weights \"{}\" requested, but the state holds none; add the algorithm \"{}\" "
                            "to the training spec and train at least one step with it",
                            which, which));
  TrainState swapped = s;
  auto take = [&](const std::vector<std::pair<std::string, torch::Tensor>>& named) -> Expected<void> {
    for (const auto& [name, t] : named) {
      auto jt = it->second.find(name);
      if (jt == it->second.end() || !jt->second.defined() || jt->second.sizes() != t.sizes())
        return fail(ErrorCode::shape_mismatch,
                    fmt::format("weights \"{}\" have no tensor \"{}\" of shape {} (the model changed since "
                                "they were recorded?)", which, name, detail::shape_string(t)));
      t.copy_(jt->second);
    }
    return {};
  };
  if (auto ok = take(swapped.named_parameters()); !ok) return tl::unexpected(ok.error());
  if (auto ok = take(swapped.named_buffers()); !ok) return tl::unexpected(ok.error());
  return swapped;
}

namespace {

/// A metric's statistics over batches: integral ones summed as they come, floating ones folded
/// row by row in sample order (float64; added, or joined with the metric's `merge`), so the
/// result does not depend on the batch size.
struct Sums {
  const Metric::Merge* merge = nullptr;  // the metric's join of floating rows; null or empty: add
  torch::Tensor counts{};      // integral statistics, summed
  std::vector<double> rows{};  // floating statistics: the rows so far, folded
  bool floating = false, seen = false;

  /// Takes in floating statistics of later samples (one sample's row, or a rank's result).
  void join(std::span<const double> later) {
    if (!seen) rows.assign(later.begin(), later.end());
    else if (merge && *merge) (*merge)(rows, later);
    else
      for (std::size_t j = 0; j < rows.size(); ++j) rows[j] += later[j];
    seen = floating = true;
  }

  Expected<void> add(torch::Tensor stats, std::int64_t take) {
    const bool f = stats.is_floating_point();
    if (seen && f != floating) return fail(ErrorCode::invalid_argument, "gave integral and floating statistics");
    floating = f;
    if (f) {
      if (stats.dim() != 2 || stats.size(0) != take)
        return fail(ErrorCode::shape_mismatch,
                    fmt::format("gave floating statistics of shape {} for a batch of {}; floating statistics are one "
                                "row per sample, [batch, k]", detail::shape_string(stats), take));
      stats = stats.to(torch::kCPU, torch::kDouble).contiguous();
      const auto k = static_cast<std::size_t>(stats.size(1));
      if (seen && k != rows.size())
        return fail(ErrorCode::shape_mismatch, fmt::format("gave rows of {} values after rows of {}", k, rows.size()));
      const double* data = stats.data_ptr<double>();
      for (std::int64_t i = 0; i < stats.size(0); ++i) join({data + static_cast<std::size_t>(i) * k, k});
    } else {
      stats = stats.to(torch::kCPU, torch::kLong);
      if (stats.dim() > 3) return fail(ErrorCode::shape_mismatch, fmt::format("gave counts of {} dimensions; at most 3", stats.dim()));
      if (seen && stats.sizes() != counts.sizes())
        return fail(ErrorCode::shape_mismatch, fmt::format("gave counts of shape {} after {}", detail::shape_string(stats),
                                                           detail::shape_string(counts)));
      counts = seen ? counts + stats : stats.clone();
      seen = true;
    }
    return {};
  }
  /// The result as float64 ({} when nothing was seen).
  [[nodiscard]] torch::Tensor total() const {
    if (!seen) return {};
    return floating ? torch::tensor(rows, torch::kDouble) : counts.to(torch::kDouble);
  }
};

/// What the metric needs of the targets, checked against a batch; empty when it fits.
std::string misfit(const Metric& m, const torch::Tensor& out, const torch::Tensor& y) {
  if (m.targets == MetricTargets::classes && !(y.scalar_type() == torch::kLong && y.dim() == 1 && out.dim() == 2))
    return fmt::format("needs int64 class targets [batch] and logits [batch, classes]; got targets {} ({}) and output {}",
                       detail::shape_string(y), c10::toString(y.scalar_type()), detail::shape_string(out));
  if (m.targets == MetricTargets::values && !(y.is_floating_point() && out.numel() == y.numel()))
    return fmt::format("needs floating targets with the output's elements; got targets {} ({}) and output {}",
                       detail::shape_string(y), c10::toString(y.scalar_type()), detail::shape_string(out));
  return "";
}

/// Every rank's statistics joined, shapes agreed first (a rank with an empty shard saw no batch):
/// counts summed; floating results gathered and joined in rank order, the order of the shards.
Expected<std::vector<torch::Tensor>> reduce(const Distributed& d, const std::vector<Sums>& sums, const std::string& what) {
  constexpr std::int64_t kSlots = 5;  // seen, floating, d0..d2 (+1 each; 0: no such dimension)
  auto shapes = torch::zeros({static_cast<std::int64_t>(sums.size()), kSlots}, torch::kLong);
  for (std::size_t i = 0; i < sums.size(); ++i) {
    const auto t = sums[i].total();
    if (!t.defined()) continue;
    const auto row = static_cast<std::int64_t>(i);
    shapes[row][0] = 1, shapes[row][1] = sums[i].floating ? 1 : 0;
    for (std::int64_t k = 0; k < t.dim(); ++k) shapes[row][2 + k] = t.size(k) + 1;
  }
  if (auto ok = d.all_reduce({shapes}, Distributed::Op::max, what); !ok) return tl::unexpected(ok.error());
  const auto agreed = [&](std::size_t i, std::int64_t slot) { return shapes[static_cast<std::int64_t>(i)][slot].item<std::int64_t>(); };
  // Counts: each rank's (zeros where it saw none), summed. Floating: a rank fills its own block of
  // [world, 1 + k] (a seen flag, its row) and the sum of the blocks, each value added to zeros
  // only, is a gather.
  const auto world = d.world_size(), rank = d.rank();
  std::vector<torch::Tensor> totals(sums.size());
  std::vector<torch::Tensor> counts, gathered;
  for (std::size_t i = 0; i < sums.size(); ++i) {
    if (!agreed(i, 0)) continue;
    std::vector<std::int64_t> dims;
    for (std::int64_t k = 2; k < kSlots && agreed(i, k) > 0; ++k) dims.push_back(agreed(i, k) - 1);
    const auto mine = sums[i].total();
    if (!agreed(i, 1)) {
      totals[i] = mine.defined() ? mine : torch::zeros(dims, torch::kDouble);
      counts.push_back(totals[i].reshape({-1}));
      continue;
    }
    auto block = torch::zeros({world, 1 + dims.at(0)}, torch::kDouble);
    if (mine.defined()) {
      block[rank][0] = 1.0;
      block[rank].narrow(0, 1, dims[0]).copy_(mine);
    }
    gathered.push_back(block.reshape({-1}));
  }
  auto all_counts = counts.empty() ? torch::Tensor() : torch::cat(counts);
  auto all_gathered = gathered.empty() ? torch::Tensor() : torch::cat(gathered);
  for (auto* t : {&all_counts, &all_gathered})
    if (t->defined())
      if (auto ok = d.all_reduce({*t}, Distributed::Op::sum, what); !ok) return tl::unexpected(ok.error());
  std::int64_t at_counts = 0, at_gathered = 0;
  for (std::size_t i = 0; i < sums.size(); ++i) {
    if (!agreed(i, 0)) continue;
    if (!agreed(i, 1)) {
      auto& t = totals[i];
      t = all_counts.narrow(0, at_counts, t.numel()).view(t.sizes()).clone(), at_counts += t.numel();
      continue;
    }
    const std::int64_t k = agreed(i, 2) - 1;
    const auto block = all_gathered.narrow(0, at_gathered, world * (1 + k)).view({world, 1 + k}).contiguous();
    at_gathered += world * (1 + k);
    Sums joined{sums[i].merge};
    const double* data = block.data_ptr<double>();
    for (std::int64_t r = 0; r < world; ++r, data += 1 + k)
      if (data[0] != 0) joined.join({data + 1, static_cast<std::size_t>(k)});
    totals[i] = joined.total();
  }
  return totals;
}

/// The metrics of one set: sums over this rank's shard, reduced across ranks.
Expected<std::map<std::string, double>> eval_set(const EvalSpec& spec, const TrainState& s, const std::string& name,
                                                 const Dataset& ds) {
  auto where = [&](const Error& e) { return tl::unexpected(e.with_context(fmt::format("eval set \"{}\"", name))); };
  if (auto ok = ds.validate(); !ok) return where(ok.error());
  const std::int64_t n = spec.limit ? std::min(ds.size(), *spec.limit) : ds.size();
  if (n <= 0) return fail(ErrorCode::invalid_argument, fmt::format("eval set \"{}\": no samples to evaluate", name));
  const bool classes = ds.class_targets();
  const auto metrics = spec.metrics.empty() ? metric::defaults(classes ? MetricTargets::classes : MetricTargets::values)
                                            : spec.metrics;
  double loss_sum = 0, units = 0;  // units: samples, or the loss's own terms (Loss::units)
  std::vector<Sums> sums;
  for (const auto& m : metrics) sums.push_back({&m.merge});
  // Across ranks: this rank's contiguous shard of the set; sums and counts reduced below.
  const auto [lo, count] = spec.distributed ? spec.distributed->shard(n) : std::pair<std::int64_t, std::int64_t>{0, n};
  // The data stays where it is; each batch goes to the model's device (a state trained on a GPU).
  const auto params = s.model.module->parameters();
  const c10::Device device = params.empty() ? c10::Device(c10::kCPU) : params.front().device();
  for (std::int64_t i = lo; i < lo + count; i += spec.batch_size) {
    const std::int64_t take = std::min(spec.batch_size, lo + count - i);
    auto b = ds.range(i, take);
    if (!b) return where(b.error());
    auto x = std::move(b->inputs), y = std::move(b->targets);
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
    const double u = spec.loss.units ? spec.loss.units(y) : static_cast<double>(take);
    loss_sum += l.item<double>() * u;
    units += u;
    for (std::size_t k = 0; k < metrics.size(); ++k) {
      const auto& m = metrics[k];
      if (const auto why = misfit(m, out, y); !why.empty())
        return fail(ErrorCode::shape_mismatch, fmt::format("eval set \"{}\": metric \"{}\" {}", name, m.name, why));
      if (auto ok = sums[k].add(m.batch(out, y), take); !ok)
        return where(ok.error().with_context(fmt::format("metric \"{}\"", m.name)));
    }
  }
  std::vector<torch::Tensor> totals;
  if (spec.distributed) {
    const std::string what = fmt::format("the metrics of eval set \"{}\"", name);
    auto loss = torch::tensor(std::vector<double>{loss_sum, units}, torch::kDouble);
    if (auto ok = spec.distributed->all_reduce({loss}, Distributed::Op::sum, what); !ok) return tl::unexpected(ok.error());
    loss_sum = loss[0].item<double>(), units = loss[1].item<double>();
    auto reduced = reduce(*spec.distributed, sums, what);
    if (!reduced) return tl::unexpected(reduced.error());
    totals = std::move(*reduced);
  } else {
    for (const auto& x : sums) totals.push_back(x.total());
  }
  std::map<std::string, double> values;
  values["loss"] = units > 0 ? loss_sum / units : 0.0;
  for (std::size_t k = 0; k < metrics.size(); ++k) {
    if (!totals[k].defined()) continue;
    for (const auto& [key, v] : metrics[k].finish(totals[k], n)) values[key.empty() ? metrics[k].name : metrics[k].name + "/" + key] = v;
  }
  return values;
}

}  // namespace

Expected<Metrics> eval(const EvalSpec& spec, const TrainState& s) {
  return detail::guard([&]() -> Expected<Metrics> {
    if (!s.model.module) return fail(ErrorCode::invalid_argument, "eval: the state has no model");
    if (spec.batch_size <= 0)
      return fail(ErrorCode::invalid_argument, fmt::format("eval: batch_size must be positive, got {}", spec.batch_size));
    if (!spec.loss.fn) return fail(ErrorCode::invalid_argument, "eval: no loss function set");
    for (const auto& m : spec.metrics)
      if (m.name.empty() || is_detail(m.name) || m.name == "loss" || !m.batch || !m.finish)
        return fail(ErrorCode::invalid_argument,
                    fmt::format("eval: metric \"{}\" needs a name without '/' other than \"loss\", and both "
                                "functions (batch, finish)", m.name));
    torch::NoGradGuard no_grad;
    if (!spec.weights.empty()) {
      EvalSpec plain = spec;
      plain.weights.clear();
      return detail::with_weights(spec.weights, s).and_then([&](const TrainState& swapped) { return eval(plain, swapped); });
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

std::optional<double> metric_value(const Metrics& m, const std::string& name) {
  const auto slash = name.find('/');
  if (slash == std::string::npos) return std::nullopt;
  const auto set = m.find(name.substr(0, slash));
  if (set == m.end()) return std::nullopt;
  const auto v = set->second.find(name.substr(slash + 1));
  return v == set->second.end() ? std::nullopt : std::optional(v->second);
}

}  // namespace baton
