// The optimizers' update rules (optim.hpp): torch::optim's SGD, Adam, AdamW, RMSprop and Adagrad
// of LibTorch 1.13, op for op, so that results match them bit for bit.
#include <cmath>

#include <torch/torch.h>

#include "optim_rules.hpp"

namespace baton::optim {

std::size_t slot_count(const Optimizer& opt) {
  if (const auto* r = std::get_if<UpdateRule>(&opt.options)) return r->slots.size();
  return std::holds_alternative<SgdOptions>(opt.options) || std::holds_alternative<AdagradOptions>(opt.options) ? 1 : 3;
}

void apply(const Optimizer& opt, torch::Tensor p, torch::Tensor grad, ParamState& st, double lr, double wd) {
  torch::NoGradGuard no_grad;
  auto init = [](torch::Tensor& slot, const torch::Tensor& p, double value = 0.0) {
    if (!slot.defined()) slot = torch::full_like(p, value, torch::MemoryFormat::Preserve);
  };
  if (st.slots.size() < slot_count(opt)) st.slots.resize(slot_count(opt));
  st.step += 1;
  if (const auto* r = std::get_if<UpdateRule>(&opt.options)) return apply_rule(*r, p, grad, st, lr, wd);
  std::visit(
      [&](const auto& o) {
        using O = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<O, SgdOptions>) {
          if (wd != 0) grad = grad.add(p, wd);
          if (o.momentum != 0) {
            auto& buf = st.slots[0];
            if (!buf.defined()) buf = torch::clone(grad).detach();
            else buf.mul_(o.momentum).add_(grad, 1 - o.dampening);
            grad = o.nesterov ? grad.add(buf, o.momentum) : buf;
          }
          p.add_(grad, -lr);
        } else if constexpr (std::is_same_v<O, AdamOptions> || std::is_same_v<O, AdamWOptions>) {
          constexpr bool decoupled = std::is_same_v<O, AdamWOptions>;
          if constexpr (decoupled) {
            if (wd != 0) p.mul_(1 - lr * wd);
          }
          init(st.slots[0], p), init(st.slots[1], p);
          const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(st.step));
          const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(st.step));
          if constexpr (!decoupled) {
            if (wd != 0) grad = grad.add(p, wd);
          }
          st.slots[0].mul_(o.beta1).add_(grad, 1 - o.beta1);
          st.slots[1].mul_(o.beta2).addcmul_(grad, grad, 1 - o.beta2);
          torch::Tensor denom;
          if (o.amsgrad) {
            init(st.slots[2], p);
            torch::max_out(st.slots[2], st.slots[1], st.slots[2]);
            denom = (st.slots[2].sqrt() / std::sqrt(bias_correction2)).add_(o.eps);
          } else {
            denom = (st.slots[1].sqrt() / std::sqrt(bias_correction2)).add_(o.eps);
          }
          p.addcdiv_(st.slots[0], denom, -lr / bias_correction1);
        } else if constexpr (std::is_same_v<O, RmspropOptions>) {
          if (wd != 0) grad = grad.add(p, wd);
          init(st.slots[0], p);
          st.slots[0].mul_(o.alpha).addcmul_(grad, grad, 1 - o.alpha);
          torch::Tensor avg;
          if (o.centered) {
            init(st.slots[2], p);
            st.slots[2].mul_(o.alpha).add_(grad, 1 - o.alpha);
            avg = st.slots[0].addcmul(st.slots[2], st.slots[2], -1).sqrt_().add_(o.eps);
          } else {
            avg = st.slots[0].sqrt().add_(o.eps);
          }
          if (o.momentum > 0) {
            init(st.slots[1], p);
            st.slots[1].mul_(o.momentum).addcdiv_(grad, avg);
            p.add_(st.slots[1], -lr);
          } else {
            p.addcdiv_(grad, avg, -lr);
          }
        } else if constexpr (std::is_same_v<O, AdagradOptions>) {
          init(st.slots[0], p, o.initial_accumulator_value);
          if (wd != 0) grad = grad.add(p, wd);
          const double clr = lr / (1 + static_cast<double>(st.step - 1) * o.lr_decay);
          st.slots[0].addcmul_(grad, grad, 1.0);
          const auto std = st.slots[0].sqrt().add_(o.eps);
          p.addcdiv_(grad, std, -clr);
        }
      },
      opt.options);
}

Updated update(const Optimizer& opt, const torch::Tensor& param, const torch::Tensor& grad, const ParamState& state,
               double lr, double weight_decay) {
  Updated out{param.detach().clone(), ParamState{state.step, {}}};
  for (const auto& t : state.slots) out.state.slots.push_back(t.defined() ? t.clone() : t);
  apply(opt, out.param, grad, out.state, lr, weight_decay);
  return out;
}

}  // namespace baton::optim
