#pragma once
// Update rules and gradient transforms (optim_rules.cpp), for the optimizer's own code: what is
// wrong with them, and one update through them.
#include <cmath>
#include <string>
#include <vector>

#include "baton/optim.hpp"

namespace baton::optim {
/// The factories' range checks: v in [0, 1); v finite and > 0.
inline bool unit(double v) { return std::isfinite(v) && v >= 0 && v < 1; }
inline bool positive(double v) { return std::isfinite(v) && v > 0; }
/// Appends `what` to a factory's `invalid` text when the check failed.
inline void note(std::string& invalid, bool ok, const std::string& what) {
  if (!ok) invalid += (invalid.empty() ? "" : "; ") + what;
}
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
