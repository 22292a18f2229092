// The torch::optim built-ins as update rules (optim.hpp): SGD, Adam, AdamW, RMSprop and Adagrad of
// LibTorch 1.13, op for op, so that results match them bit for bit; and how any rule is applied.
#include <cmath>

#include <fmt/format.h>
#include <torch/torch.h>

#include "optim_rules.hpp"

namespace baton::optim {
namespace {
// Every option of the built-ins' structs is in their identities (and so in fingerprints).
struct AnyOption {
  template <class U>
  operator U() const;
};
template <class T, class... A>
constexpr std::size_t option_count() {
  if constexpr (requires { T{A{}..., AnyOption{}}; }) return option_count<T, A..., AnyOption>();
  else return sizeof...(A);
}
static_assert(option_count<SgdOptions>() == 5 && option_count<AdamOptions>() == 6 && option_count<AdamWOptions>() == 6 &&
                  option_count<RmspropOptions>() == 6 && option_count<AdagradOptions>() == 5,
              "a built-in optimizer has a new option: put it in its identity");

/// A built-in: its slots start undefined and `update` makes each when first used, as
/// torch::optim does (SGD's momentum buffer is the first gradient, AMSGrad's maximum exists only
/// with amsgrad). The identity is the description fingerprints held before the built-ins were
/// rules, with {lr} and {weight_decay} filled in when described.
UpdateRule builtin(std::string name, std::string identity, double lr, double weight_decay, std::vector<std::string> slots) {
  UpdateRule r{.name = std::move(name), .identity = std::move(identity), .lr = lr, .weight_decay = weight_decay,
               .slots = std::move(slots)};
  r.init = [n = r.slots.size()](const torch::Tensor&) { return std::vector<torch::Tensor>(n); };
  return r;
}

void lazily(torch::Tensor& slot, const torch::Tensor& p, double value = 0.0) {
  if (!slot.defined()) slot = torch::full_like(p, value, torch::MemoryFormat::Preserve);
}

template <bool Decoupled, class O>
UpdateRule adam_rule(const O& o) {
  auto r = builtin(Decoupled ? "adamw" : "adam",
                   fmt::format("{}(lr={{lr}}, betas=({}, {}), eps={}, weight_decay={{weight_decay}}, amsgrad={})",
                               Decoupled ? "adamw" : "adam", o.beta1, o.beta2, o.eps, o.amsgrad),
                   o.lr, o.weight_decay, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"});
  note(r.invalid, unit(o.beta1), fmt::format("optimizer.beta1: must be in [0, 1), got {}", o.beta1));
  note(r.invalid, unit(o.beta2), fmt::format("optimizer.beta2: must be in [0, 1), got {}", o.beta2));
  note(r.invalid, positive(o.eps), fmt::format("optimizer.eps: must be > 0, got {}", o.eps));
  r.update = [o](torch::Tensor& p, const torch::Tensor& g, std::vector<torch::Tensor>& s, std::int64_t step, double lr,
                 double wd) {
    auto grad = g;
    if constexpr (Decoupled) {
      if (wd != 0) p.mul_(1 - lr * wd);
    }
    lazily(s[0], p), lazily(s[1], p);
    const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(step));
    const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(step));
    if constexpr (!Decoupled) {
      if (wd != 0) grad = grad.add(p, wd);
    }
    s[0].mul_(o.beta1).add_(grad, 1 - o.beta1);
    s[1].mul_(o.beta2).addcmul_(grad, grad, 1 - o.beta2);
    torch::Tensor denom;
    if (o.amsgrad) {
      lazily(s[2], p);
      torch::max_out(s[2], s[1], s[2]);
      denom = (s[2].sqrt() / std::sqrt(bias_correction2)).add_(o.eps);
    } else {
      denom = (s[1].sqrt() / std::sqrt(bias_correction2)).add_(o.eps);
    }
    p.addcdiv_(s[0], denom, -lr / bias_correction1);
  };
  return r;
}
}  // namespace

Optimizer sgd(SgdOptions o) {
  auto r = builtin("sgd",
                   fmt::format("sgd(lr={{lr}}, momentum={}, dampening={}, weight_decay={{weight_decay}}, nesterov={})",
                               o.momentum, o.dampening, o.nesterov),
                   o.lr, o.weight_decay, {"momentum_buffer"});
  note(r.invalid, unit(o.momentum), fmt::format("optimizer.momentum: must be in [0, 1), got {}", o.momentum));
  note(r.invalid, std::isfinite(o.dampening) && o.dampening >= 0 && o.dampening <= 1,
       fmt::format("optimizer.dampening: must be in [0, 1], got {}", o.dampening));
  note(r.invalid, !o.nesterov || (o.momentum > 0 && o.dampening == 0),
       "optimizer.nesterov: needs momentum > 0 and dampening = 0 (set momentum, e.g. 0.9)");
  r.update = [o](torch::Tensor& p, const torch::Tensor& g, std::vector<torch::Tensor>& s, std::int64_t, double lr,
                 double wd) {
    auto grad = g;
    if (wd != 0) grad = grad.add(p, wd);
    if (o.momentum != 0) {
      auto& buf = s[0];
      if (!buf.defined()) buf = torch::clone(grad).detach();
      else buf.mul_(o.momentum).add_(grad, 1 - o.dampening);
      grad = o.nesterov ? grad.add(buf, o.momentum) : buf;
    }
    p.add_(grad, -lr);
  };
  return rule(std::move(r));
}

Optimizer adam(AdamOptions o) { return rule(adam_rule<false>(o)); }
Optimizer adamw(AdamWOptions o) { return rule(adam_rule<true>(o)); }

Optimizer rmsprop(RmspropOptions o) {
  auto r = builtin("rmsprop",
                   fmt::format("rmsprop(lr={{lr}}, alpha={}, eps={}, weight_decay={{weight_decay}}, momentum={}, centered={})",
                               o.alpha, o.eps, o.momentum, o.centered),
                   o.lr, o.weight_decay, {"square_avg", "momentum_buffer", "grad_avg"});
  note(r.invalid, unit(o.alpha), fmt::format("optimizer.alpha: must be in [0, 1), got {}", o.alpha));
  note(r.invalid, unit(o.momentum), fmt::format("optimizer.momentum: must be in [0, 1), got {}", o.momentum));
  note(r.invalid, positive(o.eps), fmt::format("optimizer.eps: must be > 0, got {}", o.eps));
  r.update = [o](torch::Tensor& p, const torch::Tensor& g, std::vector<torch::Tensor>& s, std::int64_t, double lr,
                 double wd) {
    auto grad = g;
    if (wd != 0) grad = grad.add(p, wd);
    lazily(s[0], p);
    s[0].mul_(o.alpha).addcmul_(grad, grad, 1 - o.alpha);
    torch::Tensor avg;
    if (o.centered) {
      lazily(s[2], p);
      s[2].mul_(o.alpha).add_(grad, 1 - o.alpha);
      avg = s[0].addcmul(s[2], s[2], -1).sqrt_().add_(o.eps);
    } else {
      avg = s[0].sqrt().add_(o.eps);
    }
    if (o.momentum > 0) {
      lazily(s[1], p);
      s[1].mul_(o.momentum).addcdiv_(grad, avg);
      p.add_(s[1], -lr);
    } else {
      p.addcdiv_(grad, avg, -lr);
    }
  };
  return rule(std::move(r));
}

Optimizer adagrad(AdagradOptions o) {
  auto r = builtin("adagrad",
                   fmt::format("adagrad(lr={{lr}}, lr_decay={}, weight_decay={{weight_decay}}, initial_accumulator_value={}, "
                               "eps={})", o.lr_decay, o.initial_accumulator_value, o.eps),
                   o.lr, o.weight_decay, {"sum"});
  note(r.invalid, std::isfinite(o.lr_decay) && o.lr_decay >= 0, fmt::format("optimizer.lr_decay: must be >= 0, got {}", o.lr_decay));
  note(r.invalid, std::isfinite(o.initial_accumulator_value) && o.initial_accumulator_value >= 0,
       fmt::format("optimizer.initial_accumulator_value: must be >= 0, got {}", o.initial_accumulator_value));
  note(r.invalid, positive(o.eps), fmt::format("optimizer.eps: must be > 0, got {}", o.eps));
  r.update = [o](torch::Tensor& p, const torch::Tensor& g, std::vector<torch::Tensor>& s, std::int64_t step, double lr,
                 double wd) {
    auto grad = g;
    lazily(s[0], p, o.initial_accumulator_value);
    if (wd != 0) grad = grad.add(p, wd);
    const double clr = lr / (1 + static_cast<double>(step - 1) * o.lr_decay);
    s[0].addcmul_(grad, grad, 1.0);
    const auto std = s[0].sqrt().add_(o.eps);
    p.addcdiv_(grad, std, -clr);
  };
  return rule(std::move(r));
}

std::size_t slot_count(const Optimizer& opt) { return opt.rule.slots.size(); }

void apply(const Optimizer& opt, torch::Tensor p, torch::Tensor grad, ParamState& st, double lr, double wd) {
  torch::NoGradGuard no_grad;
  if (st.slots.size() < slot_count(opt)) st.slots.resize(slot_count(opt));
  st.step += 1;
  apply_rule(opt.rule, p, grad, st, lr, wd);
}

Updated update(const Optimizer& opt, const torch::Tensor& param, const torch::Tensor& grad, const ParamState& state,
               double lr, double weight_decay) {
  Updated out{param.detach().clone(), ParamState{state.step, {}}};
  for (const auto& t : state.slots) out.state.slots.push_back(t.defined() ? t.clone() : t);
  apply(opt, out.param, grad, out.state, lr, weight_decay);
  return out;
}

}  // namespace baton::optim
