// A stage's evaluation in the file: its eval table (sets, interval, metrics by name) and the keys
// that watch a metric of it (early stopping, thresholds, keep_best), checked before any training.
#include <algorithm>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)

#include "baton/callbacks.hpp"
#include "baton/metrics.hpp"
#include "baton/text.hpp"
#include "suggest.hpp"
#include "internal.hpp"

namespace baton::detail {
namespace {
using Impl = SpecBuilder::Impl;

const std::vector<std::string> kEvalKeys = {"sets", "interval", "batch_size", "metrics", "limit", "weights"};

/// metrics = ["accuracy", "f1", ...]: the registry's own first, then the built-in ones.
void read_metrics(const Impl& b, Reader& r, const toml::node* n, EvalSpec& spec) {
  const auto names = r.strings(n, "metrics");
  if (!names) return;
  std::vector<std::string> known = metric::builtin_names();
  known.push_back("bits_per_byte");
  for (const auto& [name, m] : b.doc->registry.metrics) known.push_back(name);
  const auto* a = n->as_array();
  for (std::size_t i = 0; i < names->size(); ++i) {
    const auto& name = (*names)[i];
    const toml::node* at = a && i < a->size() ? a->get(i) : n;
    if (auto it = b.doc->registry.metrics.find(name); it != b.doc->registry.metrics.end()) {
      spec.metrics.push_back(it->second);
    } else if (name == "bits_per_byte") {
      auto m = text::bits_per_byte(spec.sets);
      if (!m) r.p.add(at, fmt::format("{}metrics: {}", r.path, m.error().message));
      else spec.metrics.push_back(std::move(*m));
    } else if (auto m = metric::builtin(name)) {
      spec.metrics.push_back(std::move(*m));
    } else {
      r.p.add(at, fmt::format("{}metrics: unknown metric \"{}\"{}; known: {} (top<k>_accuracy for any k)", r.path, name,
                              did_you_mean(name, known), fmt::join(known, ", ")));
      continue;
    }
    for (std::size_t j = 0; j < i; ++j)
      if ((*names)[j] == name) r.p.add(at, fmt::format("{}metrics: \"{}\" is listed twice", r.path, name));
  }
}

/// The values this stage's evaluation gives that a key may watch ("<eval set>/<metric>").
std::vector<std::string> evaluated_metrics(const TrainingSpec& spec) {
  std::vector<std::string> known;
  if (!spec.evaluation) return known;
  const auto& es = spec.evaluation->spec;
  for (const auto& [set, ds] : es.sets) {
    known.push_back(set + "/loss");
    const bool classes = ds.class_targets();
    for (const auto& m : es.metrics.empty() ? metric::defaults(classes ? MetricTargets::classes : MetricTargets::values)
                                            : es.metrics)
      if (m.scalar) known.push_back(set + "/" + m.name);
  }
  return known;
}

/// True for a detail value of a listed metric ("val/f1/3", "val/confusion_matrix/2/7").
bool is_listed_detail(const TrainingSpec& spec, const std::string& metric) {
  for (const auto& [set, ds] : spec.evaluation->spec.sets)
    for (const auto& m : spec.evaluation->spec.metrics)
      if (metric.starts_with(set + "/" + m.name + "/")) return true;
  return false;
}

/// A metric a key watches must be one this stage's evaluation gives, or the key could never act:
/// an error at validate, with the choices.
void check_metric(const toml::node* at, const std::string& key, const std::string& metric, const TrainingSpec& spec,
                  Problems& p) {
  if (!spec.evaluation) {
    p.add(at, fmt::format("{}: watches \"{}\", but this stage has no evaluation (eval = {{ sets = [...] }}), so it "
                          "would never act", key, metric));
    return;
  }
  const auto known = evaluated_metrics(spec);
  if (std::find(known.begin(), known.end(), metric) == known.end() && !is_listed_detail(spec, metric))
    p.add(at, fmt::format("{}: metric \"{}\"{} is not one this stage's evaluation gives; it gives {}", key, metric,
                          did_you_mean(metric, known), fmt::join(known, ", ")));
}
}  // namespace

std::string sweep_metric_problem(const std::string& metric, const TrainingSpec& last) {
  if (!last.evaluation)
    return fmt::format("the last stage \"{}\" evaluates nothing, so no point would have a score{}; give it an evaluation "
                       "(eval = {{ sets = [\"val\"] }})", last.name, metric.empty() ? "" : fmt::format(" for \"{}\"", metric));
  const auto known = evaluated_metrics(last);
  const std::string ranked = metric.empty() ? last.evaluation->spec.sets.front().first + "/accuracy" : metric;
  if (std::find(known.begin(), known.end(), ranked) != known.end() || is_listed_detail(last, ranked)) return "";
  if (metric.empty())
    return fmt::format("the default metric \"{}\" (the accuracy of the first set the last stage \"{}\" evaluates) is not "
                       "one that stage gives; name one with --metric or [sweep] metric: it gives {}",
                       ranked, last.name, fmt::join(known, ", "));
  return fmt::format("\"{}\"{} is not a metric the last stage \"{}\" evaluates (the score of a point is its last stage's "
                     "last evaluation); it gives {}",
                     ranked, did_you_mean(ranked, known), last.name, fmt::join(known, ", "));
}

/// The stage's eval table as a plan (the loss is the caller's to set).
EvalPlan parse_eval(const SpecBuilder::Impl& b, Problems& p) {
  Reader r{p, fmt::format("stage \"{}\": eval.", b.name())};
  std::optional<std::string> unused;
  auto keys = b.merged("eval", unused, p);
  auto at = [&](const char* k) { auto it = keys.find(k); return it == keys.end() ? nullptr : it->second; };
  EvalPlan plan;
  for (const auto& name : r.strings(at("sets"), "sets").value_or(std::vector<std::string>{})) {
    if (auto ds = b.dataset(name)) plan.spec.sets.emplace_back(name, *ds);
    else p.add(at("sets"), r.path + "sets: " + ds.error().to_string());
  }
  if (const auto* n = at("interval")) plan.interval = r.time(n, "interval");
  if (auto v = r.integer(at("batch_size"), "batch_size", 1)) plan.spec.batch_size = *v;
  if (auto v = r.integer(at("limit"), "limit", 1)) plan.spec.limit = *v;
  if (auto v = r.string(at("weights"), "weights")) plan.spec.weights = *v;
  read_metrics(b, r, at("metrics"), plan.spec);
  if (const auto* n = at("top_k"))  // the key before metrics as values
    p.add(n, r.path + "top_k: replaced by metrics, e.g. metrics = [\"accuracy\", \"top5_accuracy\"]");
  for (const auto& [k, node] : keys)
    if (!contains(kEvalKeys, k) && k != "top_k")
      p.add(node, fmt::format("{}{}: unknown key{}; valid keys: {}", r.path, k, did_you_mean(k, kEvalKeys),
                              fmt::join(kEvalKeys, ", ")));
  if (plan.interval && plan.interval->value <= 0) p.add(at("interval"), r.path + "interval: must be more than zero");
  return plan;
}

/// The metric a stopping callback watches must be one this stage's evaluation produces.
void check_watched_metrics(const SpecBuilder::Impl& b, const TrainingSpec& spec, Problems& p) {
  const auto* n = b.get("callbacks");
  const auto* t = n ? n->as_table() : nullptr;
  if (!t) return;
  // The metrics they watch when the file names none: the options' own defaults.
  const std::pair<const char*, std::string> watchers[] = {{"early_stopping", callbacks::EarlyStoppingOptions{}.metric},
                                                         {"threshold_stop", callbacks::ThresholdOptions{}.metric}};
  for (const auto& [cb, default_metric] : watchers) {
    const auto* opts = (*t)[cb].as_table();
    if (!opts) continue;
    const std::string metric = (*opts)["metric"].value<std::string>().value_or(default_metric);
    const toml::node* at = opts->get("metric") ? opts->get("metric") : static_cast<const toml::node*>(opts);
    check_metric(at, fmt::format("callbacks.{}", cb), metric, spec, p);
  }
}

/// keep_best = { metric = "val/accuracy", mode = "max", scope = "stage" } and restore_best = true.
void read_keep_best(const SpecBuilder::Impl& b, Reader& r, TrainingSpec& spec) {
  const auto* n = b.get("keep_best");
  const auto* restore = b.get("restore_best");
  const auto restore_value = r.boolean(restore, "restore_best");
  if (!n) {
    if (restore_value.value_or(false))
      r.p.add(restore, r.path + "restore_best: needs keep_best = { metric = \"val/accuracy\", mode = \"max\" } (which "
                                "evaluation's weights to restore)");
    return;
  }
  const auto* t = n->as_table();
  if (!t) {
    r.p.add(n, r.path + "keep_best: expected a table, e.g. keep_best = { metric = \"val/accuracy\", mode = \"max\" }");
    return;
  }
  check_keys(*t, {"metric", "mode", "scope"}, r.path + "keep_best", r.p);
  KeepBest keep;
  keep.restore = restore_value.value_or(false);
  if (auto m = r.string(t->get("metric"), "keep_best.metric")) keep.metric = *m;
  else if (!t->get("metric")) r.p.add(n, r.path + "keep_best.metric: required, e.g. \"val/accuracy\"");
  // No default mode: keeping the "best" loss by the largest value would be a silent mistake.
  if (auto mode = r.one_of<bool>(t->get("mode"), "keep_best.mode", {{"max", true}, {"min", false}})) keep.maximize = *mode;
  else if (!t->get("mode")) r.p.add(n, r.path + "keep_best.mode: required, \"max\" (accuracy) or \"min\" (a loss)");
  if (auto scope = r.one_of<KeepBest::Scope>(t->get("scope"), "keep_best.scope",
                                              {{"stage", KeepBest::Scope::stage}, {"run", KeepBest::Scope::run}}))
    keep.scope = *scope;
  check_metric(t->get("metric") ? t->get("metric") : n, r.path + "keep_best", keep.metric, spec, r.p);
  spec.keep_best = keep;
}

}  // namespace baton::detail
