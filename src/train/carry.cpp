// Stage start and carry-over (carry.hpp).
#include "train/carry.hpp"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <torch/torch.h>

#include "detail.hpp"

namespace baton::detail {

namespace {
std::string some_names(const torch::nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& item : m.named_parameters()) names.push_back(item.key());
  if (names.size() > 8) names.resize(8), names.emplace_back("...");
  return fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

StagePosition stage_position(const TrainingSpec& spec, const TrainState& s) {
  if (s.stage == spec.name) return {false, s.time, s.stage_start};
  Timestamp t = s.time;
  if (t.sample_in_epoch > 0) t.epoch += 1, t.batch_in_epoch = 0, t.sample_in_epoch = 0;
  return {true, t, t};
}

/// Applies the stage-start carry-over policies when `spec` begins a new stage. Returns the
/// transfer report when there was a transfer.
std::optional<TransferReport> begin_stage(const TrainingSpec& spec, TrainState& s) {
  const StagePosition pos = stage_position(spec, s);
  if (!pos.new_stage) return std::nullopt;
  s.time = pos.time;
  s.stage = spec.name;
  s.stage_start = pos.stage_start;
  std::optional<TransferReport> report;
  const bool fresh_moments = spec.optimizer_carry == Carry::fresh;
  switch (spec.model.kind) {
    case ModelCarry::Kind::keep:
      break;
    case ModelCarry::Kind::reinitialize: {
      const ModelFactory& factory = spec.model.factory ? spec.model.factory : s.factory;
      s.model = build_model(factory, s.seed, spec.name);
      s.factory = factory;
      s.optimizer = OptimizerState{};  // moments of the old weights mean nothing for new ones
      break;
    }
    case ModelCarry::Kind::transfer: {
      const ModelFactory& factory = spec.model.factory ? spec.model.factory : s.factory;
      Model fresh = build_model(factory, s.seed, spec.name);
      const torch::nn::Module& source = spec.model.source ? *spec.model.source->model.module : *s.model.module;
      std::vector<std::string> copied_params;
      TransferReport r = transfer_weights(source, *fresh.module, spec.model.fresh, &copied_params);
      if (const auto why = transfer_took_nothing(source, *fresh.module, r); !why.empty())
        raise(ErrorCode::invalid_spec, fmt::format("stage \"{}\": model: {}", spec.name, why));
      fresh.module->train(true);
      // Moments continue (with Carry::keep) only for weights copied from the incoming state.
      OptimizerState kept;
      if (!spec.model.source && !fresh_moments) {
        kept.kind = s.optimizer.kind;
        for (const auto& name : copied_params)
          if (auto it = s.optimizer.params.find(name); it != s.optimizer.params.end()) kept.params.insert(*it);
      }
      s.optimizer = std::move(kept);
      s.model = std::move(fresh);
      s.factory = factory;
      report = std::move(r);
      break;
    }
  }
  if (fresh_moments) s.optimizer = OptimizerState{};
  return report;
}

namespace {
/// A module's type as groups name it: the class name without namespace and "Impl"
/// ("torch::nn::LayerNormImpl" -> "LayerNorm").
std::string type_of(const torch::nn::Module& m) {
  std::string n = m.name();
  if (const auto at = n.rfind("::"); at != std::string::npos) n = n.substr(at + 2);
  if (n.size() > 4 && n.compare(n.size() - 4, 4, "Impl") == 0) n.resize(n.size() - 4);
  return n;
}

/// Each parameter's name -> the type of the module that holds it.
std::map<std::string, std::string> holder_types(const torch::nn::Module& m) {
  std::map<std::string, std::string> out;
  for (const auto& item : m.named_modules("", /*include_self=*/true))
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false))
      out[item.key().empty() ? p.key() : item.key() + "." + p.key()] = type_of(*item.value());
  return out;
}

/// Whether `group` selects the parameter `name` held by a module of type `type`.
bool selects(const ParamGroup& group, const std::string& name, const std::string& type) {
  return std::any_of(group.patterns.begin(), group.patterns.end(), [&](const auto& p) { return matches(p, name); }) ||
         std::find(group.modules.begin(), group.modules.end(), type) != group.modules.end();
}
}  // namespace

/// Lines the state's optimizer state up with the trainable parameters, resolving groups and
/// frozen patterns. Checks that every pattern matches something.
std::vector<Slot> bind_optimizer(const TrainingSpec& spec, TrainState& s, bool began_stage) {
  const std::string kind(spec.optimizer.kind());
  if (!s.optimizer.kind.empty() && s.optimizer.kind != kind) {
    if (began_stage)  // (with Carry::fresh the moments were dropped: only Carry::keep gets here)
      raise(ErrorCode::invalid_spec,
            fmt::format("optimizer: stage \"{}\" begins with Carry::keep, but the state holds {} moments and the "
                        "stage's optimizer is {}; moments of one optimizer kind cannot continue another: use "
                        "with_optimizer(opt, Carry::fresh) (optimizer_carry = \"fresh\")",
                        spec.name, s.optimizer.kind, kind));
    raise(ErrorCode::invalid_spec,
          fmt::format("optimizer: this fit continues stage \"{}\" (begun by an earlier fit), whose moments are {}; "
                      "its optimizer cannot change to {} midway, whatever the carry (optimizer carry applies where a "
                      "stage begins). Give the {} optimizer a stage of its own (another name) with Carry::fresh",
                      spec.name, s.optimizer.kind, kind, kind));
  }
  s.optimizer.kind = kind;
  const auto& opt = spec.optimizer;
  if (auto problem = pattern_problem(spec, *s.model.module)) raise(ErrorCode::invalid_spec, *problem);
  const std::size_t nslots = optim::slot_count(opt);
  std::vector<Slot> slots;
  const auto types = opt.groups.empty() ? std::map<std::string, std::string>{} : holder_types(*s.model.module);
  for (const auto& item : s.model.module->named_parameters()) {
    const std::string& name = item.key();
    if (std::any_of(spec.freeze.begin(), spec.freeze.end(), [&](const auto& p) { return matches(p, name); })) continue;
    double lr = opt.lr(), wd = opt.weight_decay();
    const auto type = types.count(name) ? types.at(name) : std::string();
    for (const auto& group : opt.groups)  // the first group that selects the parameter wins
      if (selects(group, name, type)) {
        lr = group.lr.value_or(lr), wd = group.weight_decay.value_or(wd);
        break;
      }
    ParamState& ps = s.optimizer.params[name];
    ps.slots.resize(nslots);
    for (auto& t : ps.slots)  // moments follow their parameter (a CPU checkpoint resumed on a GPU)
      if (t.defined() && t.device() != item.value().device()) t = t.to(item.value().device());
    slots.push_back(Slot{item.value(), &ps, lr, wd});
  }
  return slots;
}

std::optional<std::string> pattern_problem(const TrainingSpec& spec, const torch::nn::Module& m) {
  const auto& groups = spec.optimizer.groups;
  std::vector<std::size_t> group_hits(groups.size(), 0), freeze_hits(spec.freeze.size(), 0);
  std::size_t trainable = 0;
  const auto types = groups.empty() ? std::map<std::string, std::string>{} : holder_types(m);
  for (const auto& item : m.named_parameters()) {
    const std::string& name = item.key();
    bool frozen = false;
    for (std::size_t f = 0; f < spec.freeze.size(); ++f)
      if (matches(spec.freeze[f], name)) frozen = true, ++freeze_hits[f];
    if (!frozen) ++trainable;
    const auto type = types.count(name) ? types.at(name) : std::string();
    for (std::size_t g = 0; g < groups.size(); ++g)
      if (selects(groups[g], name, type)) {
        ++group_hits[g];
        break;
      }
  }
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (group_hits[g] == 0) {
      std::set<std::string> present;
      for (const auto& [param, type] : types) present.insert(type);
      std::vector<std::string> what;
      if (!groups[g].patterns.empty()) what.push_back(fmt::format("patterns {}", fmt::join(groups[g].patterns, ", ")));
      if (!groups[g].modules.empty()) what.push_back(fmt::format("modules {}", fmt::join(groups[g].modules, ", ")));
      return fmt::format("optimizer.groups[{}]: {} match no parameter (the first group wins; an earlier group may take "
                         "them all); parameters are named like: {}; modules holding parameters: {}",
                         g, fmt::join(what, " and "), some_names(m), fmt::join(present, ", "));
    }
  for (std::size_t f = 0; f < spec.freeze.size(); ++f)
    if (freeze_hits[f] == 0)
      return fmt::format("freeze: pattern \"{}\" matches no parameter; parameters are named like: {}",
                         spec.freeze[f], some_names(m));
  if (trainable == 0 && !spec.freeze.empty())
    return fmt::format("freeze: patterns \"{}\" freeze every parameter, so nothing would train; freeze fewer "
                       "(parameters are named like: {})",
                       fmt::join(spec.freeze, "\", \""), some_names(m));
  return std::nullopt;
}

FreezeScope::FreezeScope(const TrainingSpec& spec, torch::nn::Module& m) {
  if (spec.freeze.empty()) return;
  for (const auto& item : m.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    if (std::any_of(spec.freeze.begin(), spec.freeze.end(), [&](const auto& p) { return matches(p, item.key()); })) {
      item.value().set_requires_grad(false);
      frozen_.push_back(item.value());
    }
  }
}

FreezeScope::~FreezeScope() {
  for (auto& p : frozen_) p.set_requires_grad(true);
}

}  // namespace baton::detail
