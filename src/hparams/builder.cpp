// SpecBuilder: one stage of a curriculum, its keys looked up through layers (set() overrides, the
// stage's own table, earlier stages, [defaults]), built into a TrainingSpec with every problem
// of the stage at once.
#include <algorithm>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <cmath>
#include <sstream>

#include "baton/algorithms.hpp"
#include "baton/callbacks.hpp"
#include "baton/schedule.hpp"
#include "suggest.hpp"
#include "internal.hpp"
#include "named.hpp"

namespace baton {

using detail::Problems;
using detail::Reader;
using detail::kInheritable;
using detail::kStageOnly;
using detail::parse_eval;
using detail::check_watched_metrics;
using detail::read_keep_best;

// ---------------------------------------------------------------- SpecBuilder::Impl
std::vector<const toml::table*> SpecBuilder::Impl::layers(bool inheritable) const {
  std::vector<const toml::table*> out = {overrides.get(), &own()};
  if (!inheritable) return out;
  const auto* stages = doc->root["stages"].as_array();
  for (std::size_t i = index; i-- > 0;) out.push_back(stages->at(i).as_table());
  if (const auto* d = doc->root["defaults"].as_table()) out.push_back(d);
  return out;
}

const toml::node* SpecBuilder::Impl::get(const std::string& key) const {
  for (const auto* t : layers(detail::contains(kInheritable, key)))
    if (const auto* n = t->get(key)) return n;
  return nullptr;
}

std::map<std::string, const toml::node*> SpecBuilder::Impl::merged(const std::string& key, std::optional<std::string>& name,
                                                                   Problems& p) const {
  std::map<std::string, const toml::node*> out;
  for (const auto* layer : layers(true)) {
    const auto* n = layer->get(key);
    if (!n) continue;
    const auto* t = n->as_table();
    if (!t) {
      if (key != "eval" && n->is_string() && !name) {  // shorthand: optimizer = "adam"
        name = *n->value<std::string>();
        continue;
      }
      p.add(n, fmt::format("stage \"{}\": {}: expected a table, got {}", this->name(), key, detail::type_name(*n)));
      break;
    }
    if (const auto* nm = t->get("name")) {
      const auto this_name = nm->value<std::string>().value_or("");
      if (!name) name = this_name;
      else if (*name != this_name) break;
    }
    for (auto&& [k, v] : *t)
      if (k.str() != "name" && !out.count(std::string(k.str()))) out[std::string(k.str())] = &v;
  }
  return out;
}

Expected<Dataset> SpecBuilder::Impl::dataset(const std::string& name) const {
  if (auto it = bound.find(name); it != bound.end()) return it->second;
  return doc->dataset(name);
}

// ---------------------------------------------------------------- changes
SpecBuilder::SpecBuilder(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
const std::string& SpecBuilder::name() const { return impl_->name(); }

SpecBuilder SpecBuilder::set(const std::string& key, ParamValue value) const {
  auto impl = std::make_shared<Impl>(*impl_);
  auto table = std::make_shared<toml::table>(impl->overrides ? *impl->overrides : toml::table{});
  toml::table holder;
  std::visit([&](const auto& v) {
    using V = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<V, std::vector<double>> || std::is_same_v<V, std::vector<std::string>>) {
      toml::array a;
      for (const auto& e : v) a.push_back(e);
      holder.insert("v", a);
    } else if constexpr (std::is_same_v<V, double>) {
      // ParamValue has one number type: whole numbers become TOML integers (batch_size = 8),
      // which every number-valued key accepts too.
      if (std::floor(v) == v && std::abs(v) < 9.0e15) holder.insert("v", static_cast<std::int64_t>(v));
      else holder.insert("v", v);
    } else {
      holder.insert("v", v);
    }
  }, value);
  detail::insert_at(*table, detail::split_path(key), 0, *holder.get("v"));
  impl->overrides = std::move(table);
  return SpecBuilder(std::move(impl));
}

SpecBuilder SpecBuilder::with_dataset(const std::string& name, Dataset dataset) const {
  auto impl = std::make_shared<Impl>(*impl_);
  impl->bound[name] = std::move(dataset);
  return SpecBuilder(std::move(impl));
}

SpecBuilder SpecBuilder::with(std::function<TrainingSpec(TrainingSpec)> change) const {
  auto impl = std::make_shared<Impl>(*impl_);
  impl->changes.push_back(std::move(change));
  return SpecBuilder(std::move(impl));
}

// ---------------------------------------------------------------- build
namespace {
using Impl = SpecBuilder::Impl;

/// The plain keys: duration, data and batching, loss, accumulation, clipping, clock, carry, freeze.
void read_plain_keys(const Impl& b, Reader& r, TrainingSpec& spec) {
  Problems& p = r.p;
  const std::string& stage = b.name();
  if (const auto* n = b.get("duration")) {
    if (auto t = r.time(n, "duration")) spec.duration = *t;
  } else {
    p.add(&b.own(), fmt::format("stage \"{}\": duration: required (e.g. duration = \"2ep\")", stage));
  }
  const std::string data_name = r.string(b.get("data"), "data").value_or("train");
  if (auto ds = b.dataset(data_name)) spec.data.train = *ds;
  else p.add(b.get("data"), fmt::format("stage \"{}\": data: {}", stage, ds.error().to_string()));
  if (auto v = r.integer(b.get("batch_size"), "batch_size", 1)) spec.data.batch_size = *v;
  if (auto v = r.boolean(b.get("shuffle"), "shuffle")) spec.data.shuffle = *v;
  if (auto v = r.boolean(b.get("drop_last"), "drop_last")) spec.data.drop_last = *v;
  if (auto v = r.integer(b.get("workers"), "workers", 0)) spec.data.workers = static_cast<int>(std::min<std::int64_t>(*v, 1 << 20));
  if (auto v = r.integer(b.get("prefetch"), "prefetch", 1)) spec.data.prefetch = static_cast<int>(std::min<std::int64_t>(*v, 1 << 20));
  if (auto v = r.one_of<Loss>(b.get("loss"), "loss", {{"cross_entropy", loss::cross_entropy()}, {"mse", loss::mse()},
                                                                 {"token_cross_entropy", loss::token_cross_entropy()}})) spec.loss = *v;
  if (auto v = r.integer(b.get("grad_accum"), "grad_accum", 1)) spec.grad_accum = *v;
  if (auto v = r.number(b.get("clip_grad_norm"), "clip_grad_norm")) spec.clip_grad_norm = *v;
  if (auto v = r.number(b.get("clip_grad_value"), "clip_grad_value")) spec.clip_grad_value = *v;
  if (auto v = r.one_of<Clock>(b.get("clock"), "clock", {{"run", Clock::run}, {"stage", Clock::stage}})) spec.schedule_clock = *v;
  if (auto v = r.one_of<Carry>(b.get("optimizer_carry"), "optimizer_carry", {{"keep", Carry::keep}, {"fresh", Carry::fresh}}))
    spec.optimizer_carry = *v;
  if (auto v = r.strings(b.get("freeze"), "freeze")) spec.freeze = *v;
  if (auto v = r.one_of<NonFinite>(b.get("on_non_finite"), "on_non_finite",
                                   {{"error", NonFinite::error}, {"skip", NonFinite::skip}, {"stop", NonFinite::stop}}))
    spec.on_non_finite = *v;
}

/// How the stage computes: precision, memory_format, deterministic, loss_scaling (a table, true
/// for the defaults, or false; with precision = "fp16" it defaults to dynamic scaling).
void read_compute_keys(const Impl& b, Reader& r, TrainingSpec& spec) {
  if (auto v = r.one_of<Precision>(b.get("precision"), "precision",
                                   {{"fp32", Precision::fp32}, {"bf16", Precision::bf16}, {"fp16", Precision::fp16}}))
    spec.precision = *v;
  if (auto v = r.one_of<MemoryFormat>(b.get("memory_format"), "memory_format",
                                      {{"auto", MemoryFormat::automatic}, {"contiguous", MemoryFormat::contiguous},
                                       {"channels_last", MemoryFormat::channels_last}}))
    spec.memory_format = *v;
  if (auto v = r.boolean(b.get("deterministic"), "deterministic")) spec.deterministic = *v;
  const toml::node* n = b.get("loss_scaling");
  if (!n) {
    if (spec.precision == Precision::fp16) spec.loss_scaling = LossScaling{};
    return;
  }
  if (n->is_boolean()) {
    spec.loss_scaling = *n->value<bool>() ? std::optional<LossScaling>(LossScaling{}) : std::nullopt;
    return;
  }
  const auto* t = n->as_table();
  if (!t) {
    r.p.add(n, fmt::format("{}loss_scaling: expected true, false or a table such as {{ init = 65536.0, interval = 2000 }}, "
                           "got {}", r.path, detail::type_name(*n)));
    return;
  }
  detail::check_keys(*t, {"init", "growth", "backoff", "interval"}, r.path + "loss_scaling", r.p);
  LossScaling ls;
  if (auto v = r.number(t->get("init"), "loss_scaling.init")) ls.init = *v;
  if (auto v = r.number(t->get("growth"), "loss_scaling.growth")) ls.growth = *v;
  if (auto v = r.number(t->get("backoff"), "loss_scaling.backoff")) ls.backoff = *v;
  if (auto v = r.integer(t->get("interval"), "loss_scaling.interval", 1)) ls.interval = *v;
  spec.loss_scaling = ls;
}

/// algorithms = { mixup = { alpha = 0.2 }, ema = {}, order = ["ema", "mixup"] }: the most
/// specific layer's table replaces the others whole, so a stage can switch algorithms off with
/// `algorithms = {}`.
void read_algorithms(const Impl& b, Reader& r, TrainingSpec& spec) {
  Problems& p = r.p;
  const auto* n = b.get("algorithms");
  if (!n) return;
  const auto* t = n->as_table();
  if (!t) {
    p.add(n, fmt::format("{}algorithms: expected a table such as {{ mixup = {{ alpha = 0.2 }} }}, got {}", r.path,
                         detail::type_name(*n)));
    return;
  }
  std::vector<std::string> order = algorithms::default_order();
  if (const auto* o = t->get("order")) {
    if (auto v = r.strings(o, "algorithms.order")) {
      for (const auto& name : *v)
        if (!t->contains(name))
          p.add(o, fmt::format("{}algorithms.order: \"{}\" is not one of this stage's algorithms", r.path, name));
      order = *v;
      for (const auto& name : algorithms::default_order())  // the rest keep the default order
        if (std::find(order.begin(), order.end(), name) == order.end()) order.push_back(name);
    }
  }
  for (const auto& [key, node] : *t) {
    const std::string name(key.str());
    if (name == "order") continue;
    if (std::find(order.begin(), order.end(), name) == order.end()) order.push_back(name);  // unknown: error below
  }
  for (const auto& name : order) {
    const auto* node = t->get(name);
    if (!node) continue;
    const auto* opts = node->as_table();
    if (!opts) {
      p.add(node, fmt::format("{}algorithms.{}: expected a table of options (e.g. {} = {{}})", r.path, name, name));
      continue;
    }
    auto a = detail::make_named("algorithm", b.doc->registry.algorithms, algorithms::default_order(), name,
                                detail::to_params(*opts, {}, r.path + "algorithms." + name, p), algorithms::from_name);
    if (a) spec.algorithms.push_back(std::move(*a));
    else p.add(node, r.path + a.error().message);
  }
}

/// callbacks = { early_stopping = { metric = "test/accuracy", mode = "max", patience = 2 }, ... }
void read_callbacks(const Impl& b, Reader& r, TrainingSpec& spec) {
  Problems& p = r.p;
  const auto* n = b.get("callbacks");
  if (!n) return;
  const auto* t = n->as_table();
  if (!t) {
    p.add(n, fmt::format("{}callbacks: expected a table such as {{ early_stopping = {{ patience = 3 }} }}, got {}", r.path,
                         detail::type_name(*n)));
    return;
  }
  for (const auto& [key, node] : *t) {
    const std::string name(key.str());
    const auto* opts = node.as_table();
    if (!opts) {
      p.add(&node, fmt::format("{}callbacks.{}: expected a table of options", r.path, name));
      continue;
    }
    auto c = detail::make_named("callback", b.doc->registry.callbacks, callbacks::names(), name,
                                detail::to_params(*opts, {}, r.path + "callbacks." + name, p), callbacks::from_name);
    if (c) spec.callbacks.push_back(std::move(*c));
    else p.add(&node, r.path + c.error().message);
  }
}

/// model carry-over: "keep" | "reinitialize" | "transfer" | {carry = ..., fresh = [...]}, and
/// in the table, a model of the stage's own (`name` and the model's keys; models.cpp).
void read_model_carry(const Impl& b, Reader& r, TrainingSpec& spec) {
  const auto* n = b.get("model");
  if (!n) return;
  const std::vector<std::pair<std::string, ModelCarry::Kind>> kinds = {
      {"keep", ModelCarry::Kind::keep}, {"reinitialize", ModelCarry::Kind::reinitialize}, {"transfer", ModelCarry::Kind::transfer}};
  const auto* t = n->as_table();
  if (!t) {
    if (auto k = r.one_of(n, "model", kinds)) spec.model.kind = *k;
    return;
  }
  if (auto k = r.one_of(t->get("carry"), "model.carry", kinds)) spec.model.kind = *k;
  if (auto f = r.strings(t->get("fresh"), "model.fresh")) spec.model.fresh = *f;
  const auto own = detail::stage_model_table(*b.doc, n, b.name(), r.p);
  if (!own) {
    detail::check_keys(*t, {"carry", "fresh", "name"}, r.path + "model", r.p);
    return;
  }
  if (!t->get("carry") || spec.model.kind == ModelCarry::Kind::keep) {
    r.p.add(t->get("carry") ? t->get("carry") : t,
            fmt::format("{}model: a model of the stage's own (\"{}\") needs carry = \"transfer\" (it takes the weights "
                        "whose names and shapes match, e.g. a trunk under a new head) or carry = \"reinitialize\" (all anew)",
                        r.path, own->name));
    return;
  }
  auto made = detail::make_model(*b.doc, *own);
  if (made) spec.model.factory = std::move(*made);
  else r.p.add(t, fmt::format("{}model \"{}\": {}", r.path, own->name, made.error().message));
}

/// optimizer.groups = [{patterns = [...], lr = ..., weight_decay = ...}, ...]
std::vector<ParamGroup> read_groups(const toml::node* node, Reader& r) {
  Problems& p = r.p;
  std::vector<ParamGroup> groups;
  const auto* arr = node->as_array();
  if (!arr) {
    p.add(node, r.path + "optimizer.groups: expected an array of tables");
    return groups;
  }
  for (const auto& g : *arr) {
    const auto* gt = g.as_table();
    if (!gt) { p.add(&g, r.path + "optimizer.groups: expected tables {patterns = [...], lr = ...}"); continue; }
    detail::check_keys(*gt, {"patterns", "modules", "lr", "weight_decay"}, r.path + "optimizer.groups[]", p);
    ParamGroup group;
    if (auto pats = r.strings(gt->get("patterns"), "optimizer.groups.patterns")) group.patterns = *pats;
    if (auto types = r.strings(gt->get("modules"), "optimizer.groups.modules")) group.modules = *types;
    if (auto lr = r.number(gt->get("lr"), "optimizer.groups.lr")) group.lr = *lr;
    if (auto wd = r.number(gt->get("weight_decay"), "optimizer.groups.weight_decay")) group.weight_decay = *wd;
    groups.push_back(std::move(group));
  }
  return groups;
}

/// optimizer.chain = [{ name = "clip_by_global_norm", max_norm = 1.0 }, ...]: transforms before the update.
std::vector<GradientTransform> read_chain(const toml::node* node, const Registry& registry, Reader& r) {
  Problems& p = r.p;
  std::vector<GradientTransform> chain;
  const auto* arr = node->as_array();
  if (!arr) {
    p.add(node, r.path + "optimizer.chain: expected an array of tables, e.g. [{ name = \"clip_by_global_norm\", max_norm = 1.0 }]");
    return chain;
  }
  for (const auto& entry : *arr) {
    const auto* t = entry.as_table();
    const auto name = t ? (*t)["name"].value<std::string>() : std::nullopt;
    if (!name) {
      p.add(&entry, r.path + "optimizer.chain: each entry is a table with a name, e.g. { name = \"clip_by_value\", limit = 0.5 }");
      continue;
    }
    Params params;
    for (const auto& [k, v] : *t) {
      if (k.str() == "name") continue;
      if (auto value = detail::to_param(v)) params[std::string(k.str())] = *value;
      else p.add(&v, fmt::format("{}optimizer.chain.{}.{}: {} is not allowed here", r.path, *name, k.str(), detail::type_name(v)));
    }
    auto made = detail::make_named("gradient transform", registry.transforms, optim::transform_names(), *name, params,
                                   optim::transform_from_name);
    if (made) chain.push_back(std::move(*made));
    else p.add(&entry, r.path + made.error().message);
  }
  return chain;
}

void read_optimizer(const Impl& b, Reader& r, TrainingSpec& spec) {
  Problems& p = r.p;
  std::optional<std::string> name;
  auto keys = b.merged("optimizer", name, p);
  Params params;
  std::vector<ParamGroup> groups;
  std::vector<GradientTransform> chain;
  for (const auto& [k, node] : keys) {
    if (k == "groups") {
      groups = read_groups(node, r);
      continue;
    }
    if (k == "chain") {
      chain = read_chain(node, b.doc->registry, r);
      continue;
    }
    if (auto v = detail::to_param(*node)) params[k] = *v;
    else p.add(node, fmt::format("{}optimizer.{}: {} is not allowed here", r.path, k, detail::type_name(*node)));
  }
  auto opt = detail::make_named("optimizer", b.doc->registry.optimizers, optim::names(), name.value_or("sgd"), params,
                                optim::from_name)
                 .and_then([&](Optimizer o) -> Expected<Optimizer> {
                   if (auto ok = o.validate(); !ok) return tl::unexpected(ok.error());
                   return optim::chain(std::move(chain), o.with_groups(std::move(groups)));
                 });
  if (opt) spec.optimizer = std::move(*opt);
  else p.add(b.get("optimizer"), r.path + opt.error().message);
}

void read_schedule(const Impl& b, Reader& r, TrainingSpec& spec) {
  Problems& p = r.p;
  std::optional<std::string> name;
  auto keys = b.merged("schedule", name, p);
  Params params;
  for (const auto& [k, node] : keys) {
    if (auto v = detail::to_param(*node)) params[k] = *v;
    else p.add(node, fmt::format("{}schedule.{}: {} is not allowed here", r.path, k, detail::type_name(*node)));
  }
  // A schedule of the registry's takes the keys every schedule takes (warmup, scale) from baton.
  const std::string n = name.value_or("constant");
  const auto& mine = b.doc->registry.schedules;
  Params common;
  if (auto it = mine.find(n); it != mine.end())
    for (const char* k : {"warmup", "warmup_from", "scale"})
      if (params.count(k) && !detail::contains(it->second.keys, k)) common[k] = params.at(k), params.erase(k);
  auto s = detail::make_named("schedule", mine, schedule::names(), n, params, schedule::from_name)
               .and_then([&](Schedule made) { return schedule::with_common_keys(std::move(made), common); });
  if (s) spec.schedule = *s;
  else p.add(b.get("schedule"), r.path + s.error().message);
}

}  // namespace

Expected<TrainingSpec> SpecBuilder::build() const {
  const Impl& b = *impl_;
  Problems p{b.doc->source, {}};
  Reader r{p, fmt::format("stage \"{}\": ", b.name())};
  TrainingSpec spec;
  spec.name = b.name();
  spec.device = b.doc->run.device;
  read_plain_keys(b, r, spec);
  read_compute_keys(b, r, spec);
  read_algorithms(b, r, spec);
  read_callbacks(b, r, spec);
  read_model_carry(b, r, spec);
  read_optimizer(b, r, spec);
  read_schedule(b, r, spec);
  // Evaluation during the fit: at the eval interval and at the stage's end.
  if (EvalPlan plan = parse_eval(b, p); !plan.spec.sets.empty()) {
    plan.spec.loss = spec.loss;
    spec.evaluation = EvalSchedule{plan.spec, plan.interval, true};
  }
  check_watched_metrics(b, spec, p);
  read_keep_best(b, r, spec);
  if (!p.empty()) return tl::unexpected(p.error());
  for (const auto& change : b.changes) spec = change(std::move(spec));
  if (auto ok = spec.validate(); !ok) {
    // Say where: the line of the key the first problem names (it may come from [defaults]),
    // else the stage's own table.
    static const std::pair<const char*, const char*> kFieldKeys[] = {
        {"duration:", "duration"}, {"grad_accum:", "grad_accum"}, {"data.batch_size:", "batch_size"},
        {"clip_grad_norm:", "clip_grad_norm"}, {"clip_grad_value:", "clip_grad_value"}, {"freeze:", "freeze"}, {"precision:", "precision"},
        {"loss_scaling.", "loss_scaling"}, {"deterministic:", "deterministic"},
        {"schedule:", "schedule"}, {"evaluation.", "eval"}, {"optimizer", "optimizer"}, {"keep_best", "keep_best"}};
    const std::string& message = ok.error().message;
    const toml::node* at = &b.own();
    std::size_t first = std::string::npos;
    for (const auto& [field, key] : kFieldKeys)
      if (const auto pos = message.find(field); pos != std::string::npos && pos < first)
        if (const auto* n = b.get(key)) at = n, first = pos;
    Problems where{b.doc->source, {}};
    where.add(at, message);
    return tl::unexpected(where.error());
  }
  return spec;
}

Expected<EvalPlan> SpecBuilder::eval() const {
  Problems p{impl_->doc->source, {}};
  EvalPlan plan = parse_eval(*impl_, p);
  if (!p.empty()) return tl::unexpected(p.error());
  if (auto spec = build()) plan.spec.loss = spec->loss;
  return plan;
}

std::string SpecBuilder::to_toml() const {
  toml::table out;
  out.insert("name", impl_->name());
  for (const auto& key : kStageOnly)
    if (const auto* n = impl_->get(key); n && key != "name") n->visit([&](auto&& v) { out.insert(key, v); });
  Problems ignored{impl_->doc->source, {}};
  for (const auto& key : kInheritable) {
    if (key == "optimizer" || key == "schedule" || key == "eval") {
      std::optional<std::string> name;
      auto keys = impl_->merged(key, name, ignored);
      if (keys.empty() && !name) continue;
      toml::table t;
      if (name) t.insert("name", *name);
      for (const auto& [k, node] : keys) node->visit([&, k = k](auto&& v) { t.insert(k, v); });
      out.insert(key, std::move(t));
    } else if (const auto* n = impl_->get(key)) {
      n->visit([&](auto&& v) { out.insert(key, v); });
    }
  }
  std::ostringstream ss;
  ss << out;
  return ss.str();
}

}  // namespace baton
