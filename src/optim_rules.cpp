// Update rules as values (optim.hpp): the shape anyone's optimizer takes, and the three built on
// it from their papers' update equations, Lion, LAMB and Adafactor; the gradient transforms of
// optim::chain.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "detail.hpp"
#include "optim_rules.hpp"

namespace baton::optim {
Optimizer rule(UpdateRule r) { return Optimizer{std::move(r), {}}; }

Optimizer lion(LionOptions o) {
  UpdateRule r{.name = "lion",
               .identity = fmt::format("lion(beta1={}, beta2={})", o.beta1, o.beta2),
               .lr = o.lr,
               .weight_decay = o.weight_decay,
               .slots = {"exp_avg"}};
  note(r.invalid, unit(o.beta1), fmt::format("optimizer.beta1: must be in [0, 1), got {}", o.beta1));
  note(r.invalid, unit(o.beta2), fmt::format("optimizer.beta2: must be in [0, 1), got {}", o.beta2));
  r.update = [b1 = o.beta1, b2 = o.beta2](torch::Tensor& p, const torch::Tensor& g, std::vector<torch::Tensor>& slots,
                                          std::int64_t, double lr, double wd) {
    auto& m = slots[0];
    if (wd != 0) p.mul_(1 - lr * wd);                        // decoupled weight decay
    p.add_(m.mul(b1).add_(g, 1 - b1).sign_(), -lr);          // sign(b1 m + (1 - b1) g)
    m.mul_(b2).add_(g, 1 - b2);                              // then the momentum, with b2
  };
  return rule(std::move(r));
}

Optimizer lamb(LambOptions o) {
  UpdateRule r{.name = "lamb",
               .identity = fmt::format("lamb(beta1={}, beta2={}, eps={})", o.beta1, o.beta2, o.eps),
               .lr = o.lr,
               .weight_decay = o.weight_decay,
               .slots = {"exp_avg", "exp_avg_sq"}};
  note(r.invalid, unit(o.beta1), fmt::format("optimizer.beta1: must be in [0, 1), got {}", o.beta1));
  note(r.invalid, unit(o.beta2), fmt::format("optimizer.beta2: must be in [0, 1), got {}", o.beta2));
  note(r.invalid, std::isfinite(o.eps) && o.eps > 0, fmt::format("optimizer.eps: must be > 0, got {}", o.eps));
  r.update = [b1 = o.beta1, b2 = o.beta2, eps = o.eps](torch::Tensor& p, const torch::Tensor& g,
                                                       std::vector<torch::Tensor>& slots, std::int64_t step, double lr,
                                                       double wd) {
    auto &m = slots[0], &v = slots[1];
    m.mul_(b1).add_(g, 1 - b1);
    v.mul_(b2).addcmul_(g, g, 1 - b2);
    const double c1 = 1 - std::pow(b1, static_cast<double>(step)), c2 = 1 - std::pow(b2, static_cast<double>(step));
    auto direction = (m / c1).div_((v / c2).sqrt_().add_(eps));
    if (wd != 0) direction.add_(p, wd);
    const double w = p.norm().item<double>(), d = direction.norm().item<double>();
    const double trust = w > 0 && d > 0 ? w / d : 1.0;
    p.add_(direction, -lr * trust);
  };
  return rule(std::move(r));
}

namespace {
torch::Tensor rms(const torch::Tensor& t) { return t.square().mean().sqrt(); }
}  // namespace

Optimizer adafactor(AdafactorOptions o) {
  UpdateRule r{.name = "adafactor",
               .identity = fmt::format("adafactor(decay_rate={}, eps1={}, eps2={}, clip_threshold={}, relative_step={}, "
                                       "scale_parameter={})", o.decay_rate, o.eps1, o.eps2, o.clip_threshold,
                                       o.relative_step, o.scale_parameter),
               .lr = o.lr,
               .weight_decay = o.weight_decay,
               .slots = {"exp_avg_sq_row", "exp_avg_sq_col"}};
  note(r.invalid, std::isfinite(o.decay_rate) && o.decay_rate < 0,
       fmt::format("optimizer.decay_rate: must be < 0 (beta2 = 1 - t^decay_rate), got {}", o.decay_rate));
  note(r.invalid, std::isfinite(o.eps1) && o.eps1 >= 0, fmt::format("optimizer.eps1: must be >= 0, got {}", o.eps1));
  note(r.invalid, std::isfinite(o.eps2) && o.eps2 >= 0, fmt::format("optimizer.eps2: must be >= 0, got {}", o.eps2));
  note(r.invalid, positive(o.clip_threshold), fmt::format("optimizer.clip_threshold: must be > 0, got {}", o.clip_threshold));
  // A matrix (or the last two dimensions of a larger tensor) keeps its rows' and columns' means.
  r.init = [](const torch::Tensor& p) -> std::vector<torch::Tensor> {
    const auto opts = p.options().memory_format(torch::MemoryFormat::Contiguous);
    if (p.dim() < 2) return {torch::zeros_like(p, torch::MemoryFormat::Contiguous), torch::zeros({}, opts)};
    auto row = p.sizes().vec(), col = p.sizes().vec();
    row.pop_back();
    col.erase(col.end() - 2);
    return {torch::zeros(row, opts), torch::zeros(col, opts)};
  };
  r.update = [o](torch::Tensor& p, const torch::Tensor& g, std::vector<torch::Tensor>& slots, std::int64_t step, double lr,
                 double wd) {
    const double t = static_cast<double>(step), beta2 = 1 - std::pow(t, o.decay_rate);
    const double rho = o.relative_step ? std::min(lr, 1 / std::sqrt(t)) : lr;
    const double alpha = o.scale_parameter ? std::max(o.eps2, rms(p).item<double>()) * rho : rho;
    const auto sq = g.square().add_(o.eps1);
    torch::Tensor update;
    if (p.dim() < 2) {
      slots[0].mul_(beta2).add_(sq, 1 - beta2);
      update = g / slots[0].sqrt();
    } else {
      auto &row = slots[0], &col = slots[1];
      row.mul_(beta2).add_(sq.mean(-1), 1 - beta2);
      col.mul_(beta2).add_(sq.mean(-2), 1 - beta2);
      const auto row_factor = (row / row.mean(-1, /*keepdim=*/true)).rsqrt_().unsqueeze(-1);
      update = g * row_factor * col.rsqrt().unsqueeze(-2);
    }
    update.div_(std::max(1.0, rms(update).item<double>() / o.clip_threshold));
    if (wd != 0) p.mul_(1 - lr * wd);
    p.add_(update, -alpha);
  };
  return rule(std::move(r));
}

Optimizer chain(std::vector<GradientTransform> transforms, Optimizer opt) {
  transforms.insert(transforms.end(), opt.transforms.begin(), opt.transforms.end());
  opt.transforms = std::move(transforms);
  return opt;
}

GradientTransform clip_by_global_norm(double max_norm) {
  GradientTransform t{.name = "clip_by_global_norm", .identity = fmt::format("clip_by_global_norm({})", max_norm)};
  if (!(std::isfinite(max_norm) && max_norm > 0))
    t.invalid = fmt::format("clip_by_global_norm: max_norm must be a finite number > 0, got {}", max_norm);
  t.apply = [max_norm](const std::vector<torch::Tensor>&, std::vector<torch::Tensor>& grads) {
    detail::clip_by_norm(grads, max_norm);
  };
  return t;
}

GradientTransform clip_by_value(double limit) {
  GradientTransform t{.name = "clip_by_value", .identity = fmt::format("clip_by_value({})", limit)};
  if (!(std::isfinite(limit) && limit > 0))
    t.invalid = fmt::format("clip_by_value: limit must be a finite number > 0, got {}", limit);
  t.apply = [limit](const std::vector<torch::Tensor>&, std::vector<torch::Tensor>& grads) {
    for (auto& g : grads) g.clamp_(-limit, limit);
  };
  return t;
}

GradientTransform add_decayed_weights(double rate) {
  GradientTransform t{.name = "add_decayed_weights", .identity = fmt::format("add_decayed_weights({})", rate)};
  if (!(std::isfinite(rate) && rate >= 0))
    t.invalid = fmt::format("add_decayed_weights: rate must be a finite number >= 0, got {}", rate);
  t.apply = [rate](const std::vector<torch::Tensor>& params, std::vector<torch::Tensor>& grads) {
    for (std::size_t i = 0; i < grads.size(); ++i) grads[i].add_(params[i], rate);
  };
  return t;
}

std::vector<std::string> transform_problems(const std::vector<GradientTransform>& transforms) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < transforms.size(); ++i) {
    const auto& t = transforms[i];
    if (!t.invalid.empty()) out.push_back(fmt::format("optimizer.transforms[{}]: {}", i, t.invalid));
    if (t.name.empty() || !t.apply)
      out.push_back(fmt::format("optimizer.transforms[{}]: a gradient transform needs a name and an apply function", i));
    if (t.identity.empty())
      out.push_back(fmt::format("optimizer.transforms[{}] (\"{}\"): needs an identity naming every option that can "
                                "change the bits; run fingerprints hold it", i, t.name));
  }
  return out;
}

void apply_transforms(const std::vector<GradientTransform>& transforms, const std::vector<torch::Tensor>& params,
                      std::vector<torch::Tensor>& grads) {
  for (const auto& t : transforms) t.apply(params, grads);
}

std::vector<std::string> rule_problems(const UpdateRule& r) {
  std::vector<std::string> out;
  if (!r.invalid.empty()) out.push_back(r.invalid);
  if (r.name.empty()) out.emplace_back("optimizer: an update rule needs a name (its kind in states and checkpoints)");
  if (r.identity.empty())
    out.push_back(fmt::format("optimizer \"{}\": an update rule needs an identity naming every option that can change "
                              "the bits (e.g. \"{}(beta=0.9)\"); run fingerprints hold it",
                              r.name, r.name.empty() ? "mine" : r.name));
  if (!r.update) out.push_back(fmt::format("optimizer \"{}\": an update rule needs an update function", r.name));
  for (std::size_t i = 0; i < r.slots.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (r.slots[i] == r.slots[j]) out.push_back(fmt::format("optimizer \"{}\": slot \"{}\" is named twice", r.name, r.slots[i]));
  if (r.slots.size() > 16) out.push_back(fmt::format("optimizer \"{}\": {} slots; at most 16", r.name, r.slots.size()));
  return out;
}

void apply_rule(const UpdateRule& r, torch::Tensor& p, const torch::Tensor& grad, ParamState& st, double lr, double wd) {
  const bool fresh = std::none_of(st.slots.begin(), st.slots.end(), [](const auto& t) { return t.defined(); });
  if (fresh) {
    if (r.init) {
      st.slots = r.init(p);
      if (st.slots.size() != r.slots.size())
        throw std::invalid_argument(fmt::format("optimizer \"{}\": init made {} slots for {} names ({})", r.name,
                                                st.slots.size(), r.slots.size(), fmt::join(r.slots, ", ")));
    } else {
      st.slots.clear();
      for (std::size_t i = 0; i < r.slots.size(); ++i) st.slots.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    }
  }
  r.update(p, grad, st.slots, st.step, lr, wd);
}

}  // namespace baton::optim
