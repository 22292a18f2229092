// The built-in callbacks by name, with options from a TOML table (callbacks::from_name).
#include <cmath>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)

#include "baton/callbacks.hpp"
#include "params_reader.hpp"

namespace baton::callbacks {

const std::vector<std::string>& names() {
  static const std::vector<std::string> all = {"train_monitor", "lr_monitor", "throughput", "memory_monitor",
                                               "grad_norm_monitor", "nan_monitor", "early_stopping", "threshold_stop"};
  return all;
}

Expected<Callback> from_name(const std::string& name, const Params& params) {
  detail::ParamReader r(params, "callbacks." + name);
  const std::vector<std::string>& known = names();
  auto mode = [&](Mode fallback) {
    const auto s = r.text("mode");  // a value that is not a string is a problem already
    if (s == "max") return Mode::max;
    if (s == "min") return Mode::min;
    if (!s.empty() || (params.count("mode") && std::holds_alternative<std::string>(params.at("mode"))))
      r.problem(fmt::format("callbacks.{}.mode: expected \"max\" or \"min\"", name));
    return fallback;
  };
  auto text = [&](const std::string& key, std::string fallback) { return r.text(key, std::move(fallback)); };
  // A whole number of batches, or a time ("0.5ep", "1000sp", "0.1dur") more than zero.
  auto every = [&]() -> MonitorOptions {
    auto it = params.find("every");
    if (it != params.end())
      if (const auto* s = std::get_if<std::string>(&it->second)) {
        r.seen("every");
        auto t = Time::parse(*s);
        if (t && t->value > 0) return {*t};
        r.problem(fmt::format("callbacks.{}.every: {}", name, t ? fmt::format("must be more than zero, got \"{}\"", *s) : t.error().message));
        return {};
      }
    const double v = r.number("every", 1);
    if (!(v >= 1 && v <= 9.0e15) || v != std::floor(v)) {
      r.problem(fmt::format("callbacks.{}.every: expected a whole number of batches >= 1 or a time such as \"0.5ep\", got {}", name, v));
      return {};
    }
    return {static_cast<std::int64_t>(v)};
  };
  std::optional<Callback> out;
  if (name == "train_monitor") out = train_monitor(every());
  else if (name == "lr_monitor") out = lr_monitor(every());
  else if (name == "throughput") out = throughput(every());
  else if (name == "memory_monitor") out = memory_monitor(every());
  else if (name == "grad_norm_monitor") out = grad_norm_monitor(every());
  else if (name == "nan_monitor") out = nan_monitor(every());
  else if (name == "early_stopping") {
    EarlyStoppingOptions o;
    o.metric = text("metric", o.metric);
    o.mode = mode(o.mode);
    const double patience = r.number("patience", 3);
    if (patience < 1 || patience != std::floor(patience))
      r.problem(fmt::format("callbacks.early_stopping.patience: expected a whole number >= 1, got {}", patience));
    o.patience = patience >= 1 && patience <= 9.0e15 ? static_cast<std::int64_t>(patience) : 1;
    o.min_delta = r.number("min_delta", 0);
    if (o.min_delta < 0) r.problem(fmt::format("callbacks.early_stopping.min_delta: must be >= 0, got {}", o.min_delta));
    const std::string scope = text("scope", "stage");
    if (scope == "run") o.scope = Scope::run;
    else if (scope != "stage") r.problem(fmt::format("callbacks.early_stopping.scope: \"{}\" is not one of stage, run", scope));
    out = early_stopping(o);
  } else if (name == "threshold_stop") {
    ThresholdOptions o;
    o.metric = text("metric", o.metric);
    o.mode = mode(o.mode);
    if (!params.count("threshold")) r.problem("callbacks.threshold_stop.threshold: required (a number)");
    o.threshold = r.number("threshold", 0);
    out = threshold_stop(o);
  } else {
    return fail(ErrorCode::invalid_argument, fmt::format("callbacks: unknown callback \"{}\"{}; known: {}", name,
                                                         detail::did_you_mean(name, known), fmt::join(known, ", ")));
  }
  if (auto ok = r.finish(); !ok) return tl::unexpected(ok.error());
  return std::move(*out);
}

}  // namespace baton::callbacks
