// The description of a C++ run that its fingerprint is taken from (run.hpp: describe): every
// setting that can change the bits, written from the values themselves, and nothing else.
#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <torch/torch.h>

#include "baton/checkpoint.hpp"
#include "baton/run.hpp"
#include "detail.hpp"
#include "io.hpp"
#include "run/internal.hpp"
#include "train/carry.hpp"

namespace baton {
namespace {

// A guard against a new field slipping past the fingerprint: each aggregate's field count is
// checked here, so adding one fails to compile until it is described below or named bit-neutral.
struct AnyField {
  template <class T>
  operator T() const;  // NOLINT: converts to any field's type, only in unevaluated contexts
};
template <class T, class... A>
constexpr std::size_t field_count() {
  if constexpr (requires { T{A{}..., AnyField{}}; }) return field_count<T, A..., AnyField>();
  else return sizeof...(A);
}
static_assert(field_count<TrainingSpec>() == 29,
              "TrainingSpec has a new field: describe it in stage_lines() (if it can change the bits) or list it as "
              "bit-neutral there");
static_assert(field_count<DataSpec>() == 6, "DataSpec has a new field: describe it in stage_lines()");
static_assert(field_count<ModelCarry>() == 4, "ModelCarry has a new field: describe it in weights_line()");
static_assert(field_count<KeepBest>() == 4 && field_count<LossScaling>() == 4 && field_count<EvalSchedule>() == 3,
              "KeepBest, LossScaling or EvalSchedule has a new field: describe it in stage_lines()");
static_assert(field_count<ParamGroup>() == 4 && field_count<UpdateRule>() == 8 && field_count<Optimizer>() == 3 &&
                  field_count<GradientTransform>() == 4,
              "an optimizer has a new field: describe it in optimizer_text() (a built-in's options go in its identity, optim.cpp)");

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) out += c == '"' ? std::string("\\\"") : c == '\\' ? std::string("\\\\") : std::string(1, c);
  return out + "\"";
}

std::string toml_strings(const std::vector<std::string>& items) {
  std::vector<std::string> q;
  for (const auto& i : items) q.push_back(toml_string(i));
  return fmt::format("[{}]", fmt::join(q, ", "));
}

/// A rule as fingerprints hold it. The built-ins' identities name {lr} and {weight_decay} and are
/// the whole text (the text they had before they were rules, so older run directories resume).
std::string rule_text(const UpdateRule& r) {
  const std::string_view lr_mark = "{lr}", wd_mark = "{weight_decay}";
  const auto at_lr = r.identity.find(lr_mark), at_wd = r.identity.find(wd_mark);
  if (at_lr == std::string::npos || at_wd == std::string::npos)
    return fmt::format("{} as {}(lr={}, weight_decay={}, slots [{}])", r.identity, r.name, r.lr, r.weight_decay,
                       fmt::join(r.slots, " "));
  std::string text = r.identity;
  text.replace(text.find(lr_mark), lr_mark.size(), fmt::format("{}", r.lr));
  text.replace(text.find(wd_mark), wd_mark.size(), fmt::format("{}", r.weight_decay));
  return text;
}

std::string optimizer_text(const Optimizer& o) {
  auto text = rule_text(o.rule);
  // Only when there are some, so that the fingerprints of runs from before chains stay as they were.
  if (!o.transforms.empty()) {
    std::vector<std::string> links;
    for (const auto& t : o.transforms) links.push_back(t.identity);
    text = fmt::format("chain [{}] then {}", fmt::join(links, ", "), text);
  }
  for (const auto& g : o.groups)
    text += fmt::format(" + group [{}]{} lr={} weight_decay={}", fmt::join(g.patterns, " "),
                        g.modules.empty() ? "" : fmt::format(" modules [{}]", fmt::join(g.modules, " ")),
                        g.lr ? fmt::format("{}", *g.lr) : "base", g.weight_decay ? fmt::format("{}", *g.weight_decay) : "base");
  return text;
}

std::string module_digest(const torch::nn::Module& m) {
  std::ostringstream os;
  os << m;  // the modules and their options (Dropout(p=0.5), Conv2d(1, 32, kernel_size=[3, 3], ...))
  for (const auto& p : m.named_parameters()) os << '\n' << p.key() << ' ' << p.value().sizes() << ' ' << p.value().dtype();
  for (const auto& b : m.named_buffers()) os << '\n' << b.key() << ' ' << b.value().sizes() << ' ' << b.value().dtype();
  return detail::sha256_hex(os.str()).substr(0, 16);
}

/// One description per Dataset, however many stages share it (hashing a dataset reads it all).
class DataIdentities {
 public:
  std::string operator()(const Dataset& d) {
    const auto key = std::make_tuple(d.inputs.defined() ? d.inputs.data_ptr() : nullptr, d.size(),
                                     d.targets.defined() ? d.targets.data_ptr() : nullptr, d.source.get(), d.name);
    auto [it, fresh] = cache_.try_emplace(key);
    if (fresh) it->second = d.identity();
    return it->second;
  }

 private:
  std::map<std::tuple<const void*, std::int64_t, const void*, const Source*, std::string>, std::string> cache_;
};

struct Writer {
  std::string out;
  std::vector<std::string>* undescribed;
  std::string where;
  void line(std::string_view key, const std::string& value) { out += fmt::format("{} = {}\n", key, value); }
  /// A value baton cannot describe: written as such, and listed for the resume check.
  std::string unknown(const std::string& what) {
    if (undescribed) undescribed->push_back(fmt::format("{}: {}", where, what));
    return toml_string("(not described: " + what + ")");
  }
};

std::string weights_line(const ModelCarry& m) {
  if (m.kind == ModelCarry::Kind::keep) return toml_string("keep");
  std::string text = m.kind == ModelCarry::Kind::reinitialize ? "reinitialize" : "transfer";
  if (m.factory) {
    try {
      const auto model = detail::build_model(m.factory, 0, "describe");
      text += fmt::format(", model {}", module_digest(*model.module));
    } catch (const std::exception& e) {
      text += fmt::format(", model factory failed: {}", e.what());
    }
  }
  if (m.kind == ModelCarry::Kind::transfer) {
    if (m.source) text += fmt::format(", from weights {}", params_sha256(*m.source).substr(0, 16));
    if (!m.fresh.empty()) text += fmt::format(", fresh {}", fmt::join(m.fresh, " "));
  }
  return toml_string(text);
}

std::string eval_line(const EvalSchedule& e, DataIdentities& data, Writer& w) {
  std::vector<std::string> sets, metrics;
  for (const auto& [name, set] : e.spec.sets) {
    const auto id = data(set);
    sets.push_back(fmt::format("{}={}", name, id.empty() ? w.unknown(fmt::format("eval set \"{}\" (its Source has no identity)", name)) : id));
  }
  for (const auto& m : e.spec.metrics) metrics.push_back(m.name);
  return toml_string(fmt::format("every {}, at stage end {}, loss {}, batch {}, limit {}, weights {}, metrics [{}], sets [{}]",
                            e.every ? e.every->to_string() : "-", e.at_stage_end, e.spec.loss.name, e.spec.batch_size,
                            e.spec.limit ? std::to_string(*e.spec.limit) : "-", e.spec.weights.empty() ? "model" : e.spec.weights,
                            fmt::join(metrics, " "), fmt::join(sets, "; ")));
}

void stage_lines(const TrainingSpec& s, DataIdentities& data, Writer& w) {
  // Bit-neutral, so not here: callbacks that only observe, loggers, checkpoints, the stop flag,
  // handle_signals, data.workers and data.prefetch (any number gives the same bits), distributed
  // (the world size is in the numerics record of every checkpoint).
  w.line("name", toml_string(s.name));
  w.line("duration", toml_string(s.duration.to_string()));
  const auto id = data(s.data.train);
  w.line("train_data", id.empty() ? w.unknown("the training data (its Source has no identity)") : toml_string(id));
  w.line("batch_size", std::to_string(s.data.batch_size));
  w.line("shuffle", fmt::format("{}", s.data.shuffle));
  w.line("drop_last", fmt::format("{}", s.data.drop_last));
  w.line("data_seed", s.data_seed ? std::to_string(*s.data_seed) : toml_string("run"));
  w.line("loss", s.loss.name.empty() ? w.unknown("the loss (Loss::name is empty)") : toml_string(s.loss.name));
  w.line("optimizer", toml_string(optimizer_text(s.optimizer)));
  w.line("optimizer_carry", toml_string(s.optimizer_carry == Carry::keep ? "keep" : "fresh"));
  // A Schedule built without a name keeps the default "constant" (the factories say "constant(1)").
  const bool unnamed_schedule = s.schedule.fn && s.schedule.name == "constant";
  w.line("schedule", unnamed_schedule ? w.unknown("the schedule (Schedule::name is not set)") : toml_string(s.schedule.name));
  w.line("schedule_clock", toml_string(s.schedule_clock == Clock::run ? "run" : "stage"));
  w.line("weights", weights_line(s.model));
  w.line("freeze", toml_strings(s.freeze));
  w.line("grad_accum", std::to_string(s.grad_accum));
  w.line("clip_grad_norm", s.clip_grad_norm ? fmt::format("{}", *s.clip_grad_norm) : toml_string("none"));
  w.line("clip_grad_value", s.clip_grad_value ? fmt::format("{}", *s.clip_grad_value) : toml_string("none"));
  std::vector<std::string> algos;
  for (const auto& a : s.algorithms)
    algos.push_back(a.identity.empty() ? w.unknown(fmt::format("algorithm \"{}\" (Algorithm::identity is empty)", a.name))
                                       : toml_string(a.identity));
  w.line("algorithms", fmt::format("[{}]", fmt::join(algos, ", ")));
  std::vector<std::string> steering;
  for (const auto& c : s.callbacks)
    if (!c.observer)
      steering.push_back(c.identity.empty() ? w.unknown(fmt::format("callback \"{}\" (Callback::identity is empty)", c.name))
                                            : toml_string(c.identity));
  w.line("callbacks", fmt::format("[{}]", fmt::join(steering, ", ")));
  // Evaluation changes the bits only through what reads it: keep_best and stopping callbacks.
  if (s.evaluation && (s.keep_best || !steering.empty())) w.line("evaluation", eval_line(*s.evaluation, data, w));
  if (s.keep_best)
    w.line("keep_best", toml_string(fmt::format("{} {}, scope {}, restore {}", s.keep_best->metric, s.keep_best->maximize ? "max" : "min",
                                           s.keep_best->scope == KeepBest::Scope::stage ? "stage" : "run", s.keep_best->restore)));
  w.line("on_non_finite", toml_string(s.on_non_finite == NonFinite::error ? "error" : s.on_non_finite == NonFinite::skip ? "skip" : "stop"));
  w.line("device", toml_string(s.device.str()));
  w.line("precision", toml_string(s.precision == Precision::fp32 ? "fp32" : s.precision == Precision::bf16 ? "bf16" : "fp16"));
  w.line("memory_format", toml_string(s.memory_format == MemoryFormat::automatic ? "automatic"
                                 : s.memory_format == MemoryFormat::contiguous ? "contiguous" : "channels_last"));
  if (const auto& ls = s.loss_scaling)
    w.line("loss_scaling", toml_string(fmt::format("init {}, growth {}, backoff {}, interval {}", ls->init, ls->growth, ls->backoff, ls->interval)));
  w.line("deterministic", fmt::format("{}", s.deterministic));
}
}  // namespace

std::string describe(const std::vector<TrainingSpec>& stages, const TrainState* initial, std::vector<std::string>* undescribed) {
  Writer w{"# the stages of a C++ run (baton::describe): every setting that can change the bits\n", undescribed, "run"};
  if (initial) {
    w.out += "\n[run]\n";
    w.line("seed", std::to_string(initial->seed));
    w.line("max_duration", toml_string(initial->max_duration.to_string()));
    if (initial->model.module) {
      w.line("model", toml_string(module_digest(*initial->model.module)));
      w.line("initial_weights", toml_string(params_sha256(*initial).substr(0, 16)));
    }
  }
  DataIdentities data;
  for (const auto& s : stages) {
    w.out += "\n[[stages]]\n";
    w.where = fmt::format("stage \"{}\"", s.name);
    stage_lines(s, data, w);
  }
  return w.out;
}

std::string describe(const std::vector<TrainingSpec>& stages) { return describe(stages, nullptr, nullptr); }

// ---------------------------------------------------------------- tools.toml
namespace {
std::string toml_value(const ParamValue& v) {
  auto number = [](double d) {
    // Whole numbers as TOML integers: the registry's integer keys (widths, samples) take only those.
    return d == std::floor(d) && std::abs(d) < 9.0e15 ? fmt::format("{}", static_cast<std::int64_t>(d)) : fmt::format("{}", d);
  };
  return std::visit(
      [&](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, double>) return number(x);
        else if constexpr (std::is_same_v<T, bool>) return x ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>) return toml_string(x);
        else if constexpr (std::is_same_v<T, std::vector<std::string>>) return toml_strings(x);
        else {
          std::vector<std::string> items;
          for (double d : x) items.push_back(number(d));
          return fmt::format("[{}]", fmt::join(items, ", "));
        }
      },
      v);
}

std::string keys_text(const Params& params) {
  std::string out;
  for (const auto& [k, v] : params) out += fmt::format("{} = {}\n", k, toml_value(v));
  return out;
}

/// The model the run ends with: the last stage's that builds a new one, else the initial state's.
const ModelFactory& final_factory(const std::vector<TrainingSpec>& stages, const TrainState& initial) {
  return stages.empty() ? initial.factory : detail::factory_after(stages, stages.size() - 1, initial.factory);
}

/// The run's datasets by the names the tools take (a stage's training data by its Dataset::name,
/// an evaluation set by its set's name), with what cannot be rebuilt said as comments.
struct ToolData {
  std::map<std::string, DataOrigin> known;
  std::vector<std::string> unknown;  // "name" (why)
  void add(const std::string& name, const Dataset& d) {
    if (known.count(name)) return;
    if (d.origin.kind.empty()) {
      const auto why = fmt::format("\"{}\" ({}: no baton loader made it)", name, d.name);
      if (std::find(unknown.begin(), unknown.end(), why) == unknown.end()) unknown.push_back(why);
      return;
    }
    known[name] = d.origin;
  }
};

std::string data_key(const Dataset& d) { return d.name.empty() ? std::string("train") : d.name; }
}  // namespace

std::string detail::tools_record(const std::vector<TrainingSpec>& stages, const TrainState& initial, const std::string& run_name,
                                 const std::filesystem::path& dir) {
  std::string out =
      "# The model and datasets of a C++ run (baton::run), as a curriculum's tables: what `baton eval`,\n"
      "# `baton export` and `baton predict` rebuild them from (docs/run-directory.md). Not the run's\n"
      "# settings (config.toml has those): its one stage names the last stage's data and evaluation.\n";
  out += fmt::format("\n[run]\nname = {}\nrun_dir = {}\nseed = {}\nmax_duration = {}\n", toml_string(run_name),
                     toml_string(dir.string()), initial.seed, toml_string(initial.max_duration.to_string()));
  const auto* model = final_factory(stages, initial).target<models::Named>();
  if (model) out += fmt::format("\n[model]\nname = {}\n{}", toml_string(model->name), keys_text(model->params));
  else out += "\n# [model]: not named (a factory of your own: name it with baton::models::named)\n";
  ToolData data;
  for (const auto& s : stages) {
    data.add(data_key(s.data.train), s.data.train);
    if (s.evaluation)
      for (const auto& [name, set] : s.evaluation->spec.sets) data.add(name, set);
  }
  for (const auto& [name, o] : data.known) {
    out += fmt::format("\n[datasets.{}]\nkind = {}\n{}", toml_string(name), toml_string(o.kind), keys_text(o.keys));
    if (o.holdout_fraction > 0)
      out += fmt::format("holdout = {{ fraction = {}, seed = {}, part = \"{}\" }}\n", o.holdout_fraction, o.holdout_seed,
                         o.holdout_val ? "val" : "train");
  }
  for (const auto& u : data.unknown) out += fmt::format("# dataset {}: cannot be rebuilt by name\n", u);
  if (stages.empty() || data.known.empty()) return out;  // no stage can name data: the tools say so
  const auto& last = stages.back();
  const auto train = data_key(last.data.train);
  const bool rebuilt = data.known.count(train) > 0;
  out += fmt::format("\n[[stages]]\nname = {}\nduration = {}\ndata = {}{}\n", toml_string(last.name),
                     toml_string(last.duration.to_string()), toml_string(rebuilt ? train : data.known.begin()->first),
                     rebuilt ? "" : fmt::format("  # the last stage's \"{}\" cannot be rebuilt", train));
  if (!last.evaluation) return out;
  std::vector<std::string> sets, metrics;
  for (const auto& [name, set] : last.evaluation->spec.sets)
    if (data.known.count(name)) sets.push_back(name);
  for (const auto& m : last.evaluation->spec.metrics)
    if (metric::builtin(m.name)) metrics.push_back(m.name);
  if (!sets.empty())
    out += fmt::format("eval = {{ sets = {}{} }}\n", toml_strings(sets),
                       metrics.empty() ? "" : fmt::format(", metrics = {}", toml_strings(metrics)));
  return out;
}

}  // namespace baton
