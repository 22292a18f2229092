// Values without LibTorch work: Error, Time, TrainingSpec, optimizer options, losses.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <torch/cuda.h>

#include "baton/error.hpp"
#include "baton/loss.hpp"
#include "baton/optim.hpp"
#include "baton/spec.hpp"
#include "baton/time.hpp"
#include "detail.hpp"
#include "io.hpp"
#include "optim_rules.hpp"
#include "params_reader.hpp"

namespace baton {

// ---------------------------------------------------------------- Error
std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::invalid_time: return "invalid_time";
    case ErrorCode::invalid_spec: return "invalid_spec";
    case ErrorCode::io: return "io";
    case ErrorCode::data: return "data";
    case ErrorCode::shape_mismatch: return "shape_mismatch";
    case ErrorCode::non_finite: return "non_finite";
    case ErrorCode::run_finished: return "run_finished";
    case ErrorCode::runtime: return "runtime";
    case ErrorCode::torch: return "torch";
  }
  return "unknown";
}

Error Error::with_context(std::string where) const {
  Error e = *this;
  e.context.insert(e.context.begin(), std::move(where));
  return e;
}

std::string Error::to_string() const {
  std::string out;
  for (std::size_t i = 0; i < context.size(); ++i) {
    out += context[i];
    out += i + 1 < context.size() ? " > " : ": ";
  }
  return out + fmt::format("[{}] {}", baton::to_string(code), message);
}

std::ostream& operator<<(std::ostream& os, const Error& e) { return os << e.to_string(); }

namespace detail {
std::string torch_message(const c10::Error& e) {
  std::string msg = e.what_without_backtrace();
  if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  return msg;
}

std::string shape_string(const torch::Tensor& t) {
  if (!t.defined()) return "(undefined)";
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}
}  // namespace detail

// ---------------------------------------------------------------- Time
std::string_view unit_suffix(TimeUnit unit) noexcept {
  switch (unit) {
    case TimeUnit::epoch: return "ep";
    case TimeUnit::batch: return "ba";
    case TimeUnit::sample: return "sp";
    case TimeUnit::duration: return "dur";
  }
  return "?";
}

std::string duration_text(double seconds) {
  const auto s = static_cast<long>(std::max(0.0, seconds) + 0.5);
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60) : fmt::format("{}:{:02}", s / 60, s % 60);
}

Expected<Time> Time::parse(std::string_view text) {
  if (const auto t = try_parse(text)) return *t;
  // Say precisely what is wrong.
  std::string why;
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string_view num = text.substr(0, i), suffix = text.substr(i);
  if (text.empty()) why = "empty duration";
  else if (text.front() == '-' || text.front() == '+') why = "durations are non-negative and unsigned";
  else if (num.empty()) why = "no number before the unit";
  else if (suffix.empty()) why = "missing unit";
  else if (suffix != "ep" && suffix != "ba" && suffix != "sp" && suffix != "dur")
    why = fmt::format("unknown unit \"{}\"", suffix);
  else if (suffix == "dur") why = "a dur fraction must be a number in [0, 1]";
  else if (num.find('.') != std::string_view::npos && suffix != "ep")
    why = fmt::format("\"{}\" counts whole {}, not fractions (a part of an epoch is \"0.5ep\")", suffix,
                      suffix == "ba" ? "batches" : "samples");
  else if (num.find('.') != std::string_view::npos && num.find('.') == num.rfind('.') && num.size() - num.find('.') > 16)
    why = "at most 15 decimals";
  else why = "malformed number";
  return fail(ErrorCode::invalid_time,
              fmt::format("\"{}\": {}; expected <count>ep (epochs), <count>ba (batches), "
                          "<count>sp (samples) or <fraction>dur (of the max duration), e.g. "
                          "\"3ep\", \"0.5ep\", \"500ba\", \"12000sp\", \"0.25dur\"",
                          text, why));
}

std::string Time::to_string() const {
  if (unit == TimeUnit::duration || (unit == TimeUnit::epoch && std::isfinite(value) && value >= 0 &&
                                     value != std::floor(value) && value < 1e14)) {
    // Fixed notation ("0.00001dur", never "1e-05dur", which parse rejects); parse allows 15 decimals.
    std::string text = fmt::format("{:.15f}", value);
    while (text.back() == '0') text.pop_back();
    if (text.back() == '.') text.pop_back();
    return text + std::string(unit_suffix(unit));
  }
  if (!std::isfinite(value) || value != std::floor(value)) return fmt::format("{}{}", value, unit_suffix(unit));
  return fmt::format("{}{}", count(), unit_suffix(unit));
}

Expected<void> Time::check() const {
  const auto bad = [&](std::string_view why) {
    return fail(ErrorCode::invalid_argument, fmt::format("time \"{}\": {}", to_string(), why));
  };
  if (!std::isfinite(value)) return bad("not a finite number");
  if (value < 0) return bad("negative");
  if (unit == TimeUnit::duration) {
    if (value > 1) return bad("a fraction of the max duration is at most 1 (\"1dur\": all of it)");
    return {};
  }
  if (unit != TimeUnit::epoch && value != std::floor(value))
    return bad(fmt::format("{} are counted in whole numbers", unit == TimeUnit::batch ? "batches" : "samples"));
  if (value > 9.0e15) return bad("more than 9e15 is beyond exact counting");
  return {};
}

std::string Timestamp::to_string() const {
  return fmt::format("epoch {} (batch {} of it, sample {} of its order), batch {}, sample {}", epoch,
                     batch_in_epoch, sample_in_epoch, batch, sample);
}

namespace {
// Out of line on purpose: GCC 12 misreads inlined std::string copies of literals as out of bounds
// (-Warray-bounds false positive, GCC bug 105651).
[[gnu::noinline]] void note(std::vector<std::string>& problems, std::string_view what) { problems.emplace_back(what); }
}  // namespace

// ---------------------------------------------------------------- Optimizer
std::string_view Optimizer::kind() const { return rule.name; }
double Optimizer::lr() const { return rule.lr; }
double Optimizer::weight_decay() const { return rule.weight_decay; }

Optimizer Optimizer::with_lr(double lr) const {
  Optimizer copy = *this;
  copy.rule.lr = lr;
  return copy;
}

Optimizer Optimizer::with_groups(std::vector<ParamGroup> g) const {
  Optimizer copy = *this;
  copy.groups = std::move(g);
  return copy;
}

Expected<void> Optimizer::validate() const {
  std::vector<std::string> problems;
  auto check = [&](bool ok, std::string_view what) { if (!ok) note(problems, what); };
  auto finite_nonneg = [](double v) { return std::isfinite(v) && v >= 0; };
  check(finite_nonneg(lr()), fmt::format("optimizer.lr: must be a finite number >= 0, got {}", lr()));
  check(finite_nonneg(weight_decay()),
        fmt::format("optimizer.weight_decay: must be a finite number >= 0, got {}", weight_decay()));
  for (const auto& problem : optim::rule_problems(rule)) note(problems, problem);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto& g = groups[i];
    check(!g.patterns.empty() || !g.modules.empty(),
          fmt::format("optimizer.groups[{}]: needs at least one parameter-name pattern or module type", i));
    if (g.lr) check(finite_nonneg(*g.lr), fmt::format("optimizer.groups[{}].lr: must be a finite number >= 0, got {}", i, *g.lr));
    if (g.weight_decay)
      check(finite_nonneg(*g.weight_decay),
            fmt::format("optimizer.groups[{}].weight_decay: must be a finite number >= 0, got {}", i, *g.weight_decay));
  }
  for (const auto& problem : optim::transform_problems(transforms)) note(problems, problem);
  if (problems.empty()) return {};
  return fail(ErrorCode::invalid_spec, fmt::format("{}", fmt::join(problems, "; ")));
}

namespace optim {
const std::vector<std::string>& names() {
  static const std::vector<std::string> all = {"sgd", "adam", "adamw", "rmsprop", "adagrad", "lion", "lamb", "adafactor"};
  return all;
}

const std::vector<std::string>& transform_names() {
  static const std::vector<std::string> all = {"clip_by_global_norm", "clip_by_value", "add_decayed_weights"};
  return all;
}

Expected<GradientTransform> transform_from_name(const std::string& name, const Params& params) {
  detail::ParamReader r(params, fmt::format("optimizer.chain.{}", name));
  GradientTransform t;
  if (name == "clip_by_global_norm") t = clip_by_global_norm(r.number("max_norm", 1.0));
  else if (name == "clip_by_value") t = clip_by_value(r.number("limit", 1.0));
  else if (name == "add_decayed_weights") t = add_decayed_weights(r.number("rate", 0.0));
  else
    return fail(ErrorCode::invalid_argument,
                fmt::format("unknown gradient transform \"{}\"{}; valid transforms: {}", name,
                            detail::did_you_mean(name, transform_names()), fmt::join(transform_names(), ", ")));
  if (auto ok = r.finish(); !ok) return tl::unexpected(ok.error());
  if (!t.invalid.empty()) return fail(ErrorCode::invalid_argument, t.invalid);
  return t;
}

Expected<Optimizer> from_name(const std::string& name, const Params& params) {
  detail::ParamReader r(params, "optimizer");
  Optimizer opt;
  if (name == "sgd") {
    SgdOptions o;
    o.lr = r.number("lr", o.lr), o.momentum = r.number("momentum", o.momentum);
    o.dampening = r.number("dampening", o.dampening), o.weight_decay = r.number("weight_decay", o.weight_decay);
    o.nesterov = r.flag("nesterov", o.nesterov);
    opt = sgd(o);
  } else if (name == "adam" || name == "adamw") {
    auto read = [&r](auto o) {
      o.lr = r.number("lr", o.lr), o.beta1 = r.number("beta1", o.beta1), o.beta2 = r.number("beta2", o.beta2);
      o.eps = r.number("eps", o.eps), o.weight_decay = r.number("weight_decay", o.weight_decay);
      o.amsgrad = r.flag("amsgrad", o.amsgrad);
      return o;
    };
    opt = name == "adam" ? adam(read(AdamOptions{})) : adamw(read(AdamWOptions{}));
  } else if (name == "rmsprop") {
    RmspropOptions o;
    o.lr = r.number("lr", o.lr), o.alpha = r.number("alpha", o.alpha), o.eps = r.number("eps", o.eps);
    o.weight_decay = r.number("weight_decay", o.weight_decay), o.momentum = r.number("momentum", o.momentum);
    o.centered = r.flag("centered", o.centered);
    opt = rmsprop(o);
  } else if (name == "adagrad") {
    AdagradOptions o;
    o.lr = r.number("lr", o.lr), o.lr_decay = r.number("lr_decay", o.lr_decay);
    o.weight_decay = r.number("weight_decay", o.weight_decay), o.eps = r.number("eps", o.eps);
    o.initial_accumulator_value = r.number("initial_accumulator_value", o.initial_accumulator_value);
    opt = adagrad(o);
  } else if (name == "lion") {
    LionOptions o;
    o.lr = r.number("lr", o.lr), o.beta1 = r.number("beta1", o.beta1), o.beta2 = r.number("beta2", o.beta2);
    o.weight_decay = r.number("weight_decay", o.weight_decay);
    opt = lion(o);
  } else if (name == "lamb") {
    LambOptions o;
    o.lr = r.number("lr", o.lr), o.beta1 = r.number("beta1", o.beta1), o.beta2 = r.number("beta2", o.beta2);
    o.eps = r.number("eps", o.eps), o.weight_decay = r.number("weight_decay", o.weight_decay);
    opt = lamb(o);
  } else if (name == "adafactor") {
    AdafactorOptions o;
    o.lr = r.number("lr", o.lr), o.decay_rate = r.number("decay_rate", o.decay_rate);
    o.eps1 = r.number("eps1", o.eps1), o.eps2 = r.number("eps2", o.eps2);
    o.clip_threshold = r.number("clip_threshold", o.clip_threshold), o.weight_decay = r.number("weight_decay", o.weight_decay);
    o.relative_step = r.flag("relative_step", o.relative_step), o.scale_parameter = r.flag("scale_parameter", o.scale_parameter);
    opt = adafactor(o);
  } else {
    return fail(ErrorCode::invalid_argument, fmt::format("unknown optimizer \"{}\"{}; valid optimizers: {}", name,
                                                         detail::did_you_mean(name, names()), fmt::join(names(), ", ")));
  }
  if (auto ok = r.finish(); !ok) return tl::unexpected(ok.error());
  if (auto ok = opt.validate(); !ok) return tl::unexpected(ok.error());
  return opt;
}
}  // namespace optim

// ---------------------------------------------------------------- TrainingSpec
#define BATON_WITH(fn, field, type)                        \
  TrainingSpec TrainingSpec::fn(type v) const {            \
    TrainingSpec copy = *this;                             \
    copy.field = std::move(v);                             \
    return copy;                                           \
  }
BATON_WITH(with_name, name, std::string)
BATON_WITH(with_data, data, DataSpec)
BATON_WITH(with_train_data, data.train, Dataset)
BATON_WITH(with_batch_size, data.batch_size, std::int64_t)
BATON_WITH(with_loss, loss, Loss)
BATON_WITH(with_optimizer_carry, optimizer_carry, Carry)
BATON_WITH(with_duration, duration, Time)
BATON_WITH(with_device, device, c10::Device)
BATON_WITH(with_model, model, ModelCarry)
BATON_WITH(with_freeze, freeze, std::vector<std::string>)
BATON_WITH(with_grad_accum, grad_accum, std::int64_t)
BATON_WITH(with_clip_grad_norm, clip_grad_norm, std::optional<double>)
BATON_WITH(with_clip_grad_value, clip_grad_value, std::optional<double>)
BATON_WITH(with_algorithms, algorithms, std::vector<Algorithm>)
BATON_WITH(with_callbacks, callbacks, std::vector<Callback>)
BATON_WITH(with_loggers, loggers, std::vector<std::shared_ptr<Logger>>)
BATON_WITH(with_evaluation, evaluation, std::optional<EvalSchedule>)
BATON_WITH(with_checkpoints, checkpoints, CheckpointPolicy)
BATON_WITH(with_keep_best, keep_best, std::optional<KeepBest>)
BATON_WITH(with_non_finite, on_non_finite, NonFinite)
BATON_WITH(with_precision, precision, Precision)
BATON_WITH(with_memory_format, memory_format, MemoryFormat)
BATON_WITH(with_loss_scaling, loss_scaling, std::optional<LossScaling>)
BATON_WITH(with_deterministic, deterministic, bool)
BATON_WITH(with_distributed, distributed, std::shared_ptr<const Distributed>)
#undef BATON_WITH

TrainingSpec TrainingSpec::with_schedule(Schedule v, Clock clock) const {
  TrainingSpec copy = *this;
  copy.schedule = std::move(v);
  copy.schedule_clock = clock;
  return copy;
}

TrainingSpec TrainingSpec::with_data_seed(std::uint64_t v) const {
  TrainingSpec copy = *this;
  copy.data_seed = v;
  return copy;
}

TrainingSpec TrainingSpec::with_optimizer(Optimizer v, Carry carry) const {
  TrainingSpec copy = *this;
  copy.optimizer = std::move(v);
  copy.optimizer_carry = carry;
  return copy;
}

TrainingSpec TrainingSpec::with_lr(double lr) const {
  TrainingSpec copy = *this;
  copy.optimizer = optimizer.with_lr(lr);
  return copy;
}

Expected<void> TrainingSpec::validate() const {
  std::vector<std::string> problems;
  if (name.empty()) problems.push_back("name: empty; a stage is identified by its name (history, checkpoints, resume)");
  else if (auto bad = detail::name_problem("name", name, detail::kStageNameUse); !bad.empty()) problems.push_back(bad);
  if (auto d = data.train.validate(); !d) problems.push_back("data.train: " + d.error().message);
  if (data.batch_size <= 0)
    problems.push_back(fmt::format("data.batch_size: must be positive, got {}", data.batch_size));
  if (data.workers < 0 || data.workers > 256)
    problems.push_back(fmt::format("data.workers: must be in [0, 256], got {}", data.workers));
  if (data.prefetch < 1 || data.prefetch > 64)
    problems.push_back(fmt::format("data.prefetch: must be in [1, 64], got {}", data.prefetch));
  if (data.drop_last && data.train.size() > 0 && data.batch_size > data.train.size())
    problems.push_back(fmt::format(
        "data.batch_size: {} is larger than the {} samples of \"{}\" and drop_last is set, so no "
        "batch would ever be formed; lower the batch size or unset drop_last",
        data.batch_size, data.train.size(), data.train.name));
  if (!loss.fn) note(problems, "loss: no loss function set (e.g. baton::loss::cross_entropy())");
  if (auto o = optimizer.validate(); !o) problems.push_back(o.error().message);
  if (auto ok = duration.check(); !ok)
    problems.push_back("duration: " + ok.error().message);
  else if (duration.value <= 0)
    problems.push_back(fmt::format("duration: must be more than zero, got \"{}\"", duration.to_string()));
  if (grad_accum < 1 || (data.batch_size > 0 && grad_accum > data.batch_size))
    problems.push_back(fmt::format("grad_accum: must be in [1, batch_size = {}], got {}", data.batch_size, grad_accum));
  if (clip_grad_norm && !(*clip_grad_norm > 0))
    problems.push_back(fmt::format("clip_grad_norm: must be > 0, got {}", *clip_grad_norm));
  if (clip_grad_value && !(*clip_grad_value > 0))
    problems.push_back(fmt::format("clip_grad_value: must be > 0, got {}", *clip_grad_value));
  for (const auto& f : freeze)
    if (f.empty()) note(problems, "freeze: an empty pattern matches nothing; remove it");
  if (model.kind == ModelCarry::Kind::transfer && model.source && !model.source->model.module)
    note(problems, "model: the transfer source state has no model");
  if (schedule.warmup && (!schedule.warmup->check() || schedule.warmup->value <= 0))
    problems.push_back(fmt::format("schedule: warm-up must be a valid time more than zero, got \"{}\"", schedule.warmup->to_string()));
  if (device.is_cuda() && !torch::cuda::is_available())
    note(problems, "device: CUDA requested but this LibTorch has no CUDA device; use CPU");
  if (!device.is_cpu() && !device.is_cuda())
    problems.push_back(fmt::format("device: {} is not supported; use cpu or cuda", device.str()));
  if (precision == Precision::fp16 && !device.is_cuda())
    problems.push_back("precision: fp16 needs a CUDA device (autocast on CPU has bf16 only); use bf16");
  if (deterministic && device.is_cuda()) {
    const char* ws = std::getenv("CUBLAS_WORKSPACE_CONFIG");
    const std::string v = ws ? ws : "";
    if (v != ":4096:8" && v != ":16:8")
      problems.push_back("deterministic: on CUDA, cuBLAS needs CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8) in the "
                         "environment before the process starts; it is " + (ws ? "\"" + v + "\"" : std::string("unset")));
  }
  if (loss_scaling) {
    const LossScaling& ls = *loss_scaling;
    if (!(ls.init > 0) || !std::isfinite(ls.init))
      problems.push_back(fmt::format("loss_scaling.init: must be a finite number > 0, got {}", ls.init));
    if (!(ls.growth > 1) || !std::isfinite(ls.growth))
      problems.push_back(fmt::format("loss_scaling.growth: must be a finite number > 1, got {}", ls.growth));
    if (!(ls.backoff > 0 && ls.backoff < 1))
      problems.push_back(fmt::format("loss_scaling.backoff: must be in (0, 1), got {}", ls.backoff));
    if (ls.interval < 1) problems.push_back(fmt::format("loss_scaling.interval: must be >= 1, got {}", ls.interval));
  }
  for (std::size_t i = 0; i < algorithms.size(); ++i) {
    if (algorithms[i].name.empty()) problems.push_back(fmt::format("algorithms[{}]: has no name", i));
    if (!algorithms[i].invalid.empty()) problems.push_back(fmt::format("algorithms[{}] ({}): {}", i, algorithms[i].name, algorithms[i].invalid));
    for (std::size_t j = 0; j < i; ++j)
      if (!algorithms[i].name.empty() && algorithms[j].name == algorithms[i].name)
        problems.push_back(fmt::format("algorithms[{}]: \"{}\" is listed twice (its memory is kept by name)", i, algorithms[i].name));
    for (std::size_t j = 0; j < i; ++j)
      if (algorithms[i].gradient && algorithms[j].gradient)
        problems.push_back(fmt::format("algorithms[{}] ({}) and algorithms[{}] ({}) both take over the step's gradient "
                                       "(Algorithm::gradient); at most one may", j, algorithms[j].name, i, algorithms[i].name));
  }
  for (std::size_t i = 0; i < callbacks.size(); ++i)
  {
    if (callbacks[i].name.empty() || !callbacks[i].on_event)
      problems.push_back(fmt::format("callbacks[{}]: needs a name and an on_event function", i));
    if (!callbacks[i].invalid.empty()) problems.push_back(fmt::format("callbacks[{}] ({}): {}", i, callbacks[i].name, callbacks[i].invalid));
  }
  for (std::size_t i = 0; i < loggers.size(); ++i)
    if (!loggers[i]) problems.push_back(fmt::format("loggers[{}]: is null", i));
  auto positive = [&](const std::optional<Time>& t, const char* field) {
    if (!t) return;
    if (auto ok = t->check(); !ok) problems.push_back(fmt::format("{}: {}", field, ok.error().message));
    else if (!(t->value > 0))
      problems.push_back(fmt::format("{}: must be more than zero, got \"{}\"", field, t->to_string()));
  };
  if (evaluation) {
    positive(evaluation->every, "evaluation.every");
    if (evaluation->spec.sets.empty()) problems.push_back("evaluation.spec.sets: no dataset to evaluate on");
    if (evaluation->spec.limit && *evaluation->spec.limit <= 0)
      problems.push_back(fmt::format("evaluation.spec.limit: must be positive, got {}", *evaluation->spec.limit));
  }
  if (keep_best) {
    const auto slash = keep_best->metric.find('/');
    if (!evaluation)
      problems.push_back(fmt::format("keep_best: watches \"{}\", but the stage has no evaluation; set evaluation (TOML: "
                                     "eval = {{ sets = [...], interval = \"1ep\" }})", keep_best->metric));
    else if (slash == std::string::npos ||
             std::none_of(evaluation->spec.sets.begin(), evaluation->spec.sets.end(),
                          [&](const auto& set) { return set.first == keep_best->metric.substr(0, slash); }))
      problems.push_back(fmt::format("keep_best.metric: \"{}\" is not <eval set>/<metric> of a set this stage evaluates",
                                     keep_best->metric));
  }
  positive(checkpoints.every, "checkpoints.every");
  if (problems.empty()) return {};
  return fail(ErrorCode::invalid_spec,
              fmt::format("invalid spec \"{}\": {}", detail::printable(name), fmt::join(problems, "; ")));
}

}  // namespace baton
