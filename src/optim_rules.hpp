#pragma once
// Update rules (optim_rules.cpp), for the optimizer's own code: what is wrong with a rule, and one
// update through it.
#include <string>
#include <vector>

#include "baton/optim.hpp"

namespace baton::optim {
/// What is wrong with `r` (no name, identity or update; slots named twice), or nothing.
std::vector<std::string> rule_problems(const UpdateRule& r);
/// One update of `p` through `r`: the slots start as `r.init` makes them, then `r.update` runs
/// (`st.step` already counts this update).
void apply_rule(const UpdateRule& r, torch::Tensor& p, const torch::Tensor& grad, ParamState& st, double lr, double wd);
}  // namespace baton::optim
