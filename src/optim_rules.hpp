#pragma once
// Update rules and gradient transforms (optim_rules.cpp), for the optimizer's own code: what is
// wrong with them, and one update through them.
#include <string>
#include <vector>

#include "baton/optim.hpp"

namespace baton::optim {
/// What is wrong with `r` (no name, identity or update; slots named twice), or nothing.
std::vector<std::string> rule_problems(const UpdateRule& r);
/// One update of `p` through `r`: the slots start as `r.init` makes them, then `r.update` runs
/// (`st.step` already counts this update).
void apply_rule(const UpdateRule& r, torch::Tensor& p, const torch::Tensor& grad, ParamState& st, double lr, double wd);
/// What is wrong with the optimizer's gradient transforms, or nothing.
std::vector<std::string> transform_problems(const std::vector<GradientTransform>& transforms);
/// The transforms, in order, on `grads` (`params[i]` is the parameter of `grads[i]`).
void apply_transforms(const std::vector<GradientTransform>& transforms, const std::vector<torch::Tensor>& params,
                      std::vector<torch::Tensor>& grads);
}  // namespace baton::optim
