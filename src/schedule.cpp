// Learning-rate schedules: pure functions of ScheduleTime.
#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)

#include "baton/schedule.hpp"
#include "params_reader.hpp"

namespace baton {

// ---------------------------------------------------------------- ScheduleTime
namespace {
double batches_of(const ScheduleTime& st, Time t);

double horizon_batches(const ScheduleTime& st) { return batches_of(st, st.horizon); }

double batches_of(const ScheduleTime& st, Time t) {
  switch (t.unit) {
    case TimeUnit::epoch: return t.value * st.batches_per_epoch;
    case TimeUnit::batch: return t.value;
    case TimeUnit::sample: return t.value / st.samples_per_batch;
    case TimeUnit::duration: return st.horizon.unit == TimeUnit::duration ? t.value : t.value * horizon_batches(st);
  }
  return t.value;
}
}  // namespace

double ScheduleTime::in(TimeUnit unit) const {
  switch (unit) {
    case TimeUnit::epoch: return epoch;
    case TimeUnit::batch: return batch;
    case TimeUnit::sample: return sample;
    case TimeUnit::duration: return horizon.value > 0 ? in(horizon.unit) / horizon.value : 1.0;
  }
  return batch;
}

double ScheduleTime::convert(Time t, TimeUnit unit) const {
  if (t.unit == unit) return t.value;
  if (t.unit == TimeUnit::duration && horizon.unit == unit) return t.value * horizon.value;
  const double b = batches_of(*this, t);
  switch (unit) {
    case TimeUnit::epoch: return b / batches_per_epoch;
    case TimeUnit::batch: return b;
    case TimeUnit::sample: return b * samples_per_batch;
    case TimeUnit::duration: return b / horizon_batches(*this);
  }
  return b;
}

ScheduleTime ScheduleTime::shifted(Time t) const {
  ScheduleTime s = *this;
  s.epoch -= convert(t, TimeUnit::epoch);
  s.batch -= convert(t, TimeUnit::batch);
  s.sample -= convert(t, TimeUnit::sample);
  s.horizon.value = std::max(horizon.value - convert(t, horizon.unit), 1e-12);
  return s;
}

ScheduleTime ScheduleTime::scaled(double ratio) const {
  ScheduleTime s = *this;
  s.epoch /= ratio;
  s.batch /= ratio;
  s.sample /= ratio;
  return s;
}

ScheduleTime ScheduleTime::at_batch(double batch, double batches_per_epoch, double samples_per_batch, Time horizon) {
  return ScheduleTime{batch / batches_per_epoch, batch, batch * samples_per_batch, batches_per_epoch,
                      samples_per_batch, horizon};
}

namespace schedule {
namespace {
constexpr double pi = std::numbers::pi;

/// How many whole `period`s fit in `x`, robust to rounding: 0.6 / 0.2 is 2.9999999999999996 in
/// doubles, and a boundary must switch exactly at its time.
double whole_periods(double x, double period) { return std::floor(x / period + 1e-9); }

/// Has time reached `t` (with the same tolerance)?
bool reached(const ScheduleTime& now, Time t) { return now.in(t.unit) >= t.value - 1e-9 * std::max(1.0, std::abs(t.value)); }

/// Fraction of `over` elapsed, clamped to [0, 1].
double progress(const ScheduleTime& t, Time over) {
  return std::clamp(t.in(over.unit) / over.value, 0.0, 1.0);
}

double cos_anneal(double from, double to, double p) { return to + (from - to) * 0.5 * (1.0 + std::cos(pi * p)); }
}  // namespace

Schedule constant(double value) {
  return {fmt::format("constant({})", value), [value](const ScheduleTime&) { return value; }, std::nullopt};
}

Schedule step(Time step_size, double gamma) {
  return {fmt::format("step({}, {})", step_size.to_string(), gamma),
          [=](const ScheduleTime& t) {
            return std::pow(gamma, whole_periods(t.in(step_size.unit), step_size.value));
          },
          std::nullopt};
}

Schedule multistep(std::vector<Time> milestones, double gamma) {
  std::vector<std::string> at;
  for (const auto& m : milestones) at.push_back(m.to_string());
  return {fmt::format("multistep(at {}, {})", fmt::join(at, " "), gamma),
          [=](const ScheduleTime& t) {
            int passed = 0;
            for (const auto& m : milestones) passed += reached(t, m) ? 1 : 0;
            return std::pow(gamma, passed);
          },
          std::nullopt};
}

Schedule exponential(double gamma, Time period) {
  return {fmt::format("exponential({}, {})", gamma, period.to_string()),
          [=](const ScheduleTime& t) { return std::pow(gamma, t.in(period.unit) / period.value); }, std::nullopt};
}

Schedule linear(double from, double to, Time over) {
  return {fmt::format("linear({} -> {} over {})", from, to, over.to_string()),
          [=](const ScheduleTime& t) { return from + (to - from) * progress(t, over); }, std::nullopt};
}

Schedule polynomial(double power, double from, double to, Time over) {
  return {fmt::format("polynomial(power {}, {} -> {} over {})", power, from, to, over.to_string()),
          [=](const ScheduleTime& t) { return to + (from - to) * std::pow(1.0 - progress(t, over), power); },
          std::nullopt};
}

Schedule cosine(Time over, double to) {
  return {fmt::format("cosine(over {}, to {})", over.to_string(), to),
          [=](const ScheduleTime& t) { return cos_anneal(1.0, to, progress(t, over)); }, std::nullopt};
}

Schedule cosine_warm_restarts(Time period, double period_mult, double to) {
  return {fmt::format("cosine_warm_restarts({}, x{}, to {})", period.to_string(), period_mult, to),
          [=](const ScheduleTime& t) {
            const double x = std::max(0.0, t.in(period.unit)), t0 = period.value;
            double start = 0, length = t0;
            if (period_mult == 1.0) {
              start = whole_periods(x, t0) * t0;
            } else {
              // Cycle n starts at t0 (m^n - 1) / (m - 1) and lasts t0 m^n.
              const double n = std::floor(std::log(x / t0 * (period_mult - 1.0) + 1.0) / std::log(period_mult));
              start = t0 * (std::pow(period_mult, n) - 1.0) / (period_mult - 1.0);
              length = t0 * std::pow(period_mult, n);
              if (x - start >= length) start += length, length *= period_mult;  // rounding at a boundary
            }
            return cos_anneal(1.0, to, (x - start) / length);
          },
          std::nullopt};
}

Schedule one_cycle(Time over, double peak, double pct_start, double div_factor, double final_div_factor) {
  return {fmt::format("one_cycle(over {}, peak {}, pct_start {}, div_factor {}, final_div_factor {})", over.to_string(), peak,
                      pct_start, div_factor, final_div_factor),
          [=](const ScheduleTime& t) {
            const double f = progress(t, over);
            const double initial = peak / div_factor, lowest = initial / final_div_factor;
            if (f < pct_start) return cos_anneal(initial, peak, f / pct_start);
            return cos_anneal(peak, lowest, (f - pct_start) / (1.0 - pct_start));
          },
          std::nullopt};
}

Schedule inverse_sqrt(Time warmup) {
  return {fmt::format("inverse_sqrt({})", warmup.to_string()),
          [=](const ScheduleTime& t) {
            const double x = t.in(warmup.unit);
            return x <= warmup.value ? 1.0 : std::sqrt(warmup.value / x);
          },
          std::nullopt};
}

Schedule linear_warmup(Time warmup, Schedule after, double from) {
  auto name = fmt::format("linear_warmup({}) then {}", warmup.to_string(), after.name);
  return {std::move(name),
          [=](const ScheduleTime& t) {
            const ScheduleTime rest = t.shifted(warmup);
            const double x = t.in(warmup.unit);
            if (reached(t, warmup)) return after(rest);
            ScheduleTime zero = rest;  // `after` at its own time zero: the level the warm-up reaches
            zero.epoch = zero.batch = zero.sample = 0;
            return (from + (1.0 - from) * std::max(0.0, x) / warmup.value) * after(zero);
          },
          warmup};
}

Schedule join(std::vector<Schedule> schedules, std::vector<Time> boundaries) {
  std::string name = "join(";
  for (std::size_t i = 0; i < schedules.size(); ++i)
    name += (i ? ", " : "") + schedules[i].name + (i < boundaries.size() ? " until " + boundaries[i].to_string() : "");
  name += ")";
  auto warm = schedules.empty() ? std::nullopt : schedules.front().warmup;
  return {std::move(name),
          [schedules = std::move(schedules), boundaries = std::move(boundaries)](const ScheduleTime& t) {
            std::size_t i = 0;
            while (i < boundaries.size() && reached(t, boundaries[i])) ++i;
            if (i >= schedules.size()) return 1.0;
            return i == 0 ? schedules[0](t) : schedules[i](t.shifted(boundaries[i - 1]));
          },
          warm};
}

Schedule scale(Schedule s, double ratio) {
  auto warm = s.warmup;
  if (warm) warm->value *= ratio;
  auto name = fmt::format("{} scaled x{}", s.name, ratio);
  return {std::move(name), [s = std::move(s), ratio](const ScheduleTime& t) { return s(t.scaled(ratio)); }, warm};
}

const std::vector<std::string>& names() {
  static const std::vector<std::string> all = {"constant", "step", "multistep", "exponential", "linear",
                                               "polynomial", "cosine", "cosine_warm_restarts", "one_cycle",
                                               "inverse_sqrt"};
  return all;
}

namespace {
/// The keys every schedule of a file takes: `warmup` (and `warmup_from`) where `warmup_keys`, and `scale`.
Schedule common_keys(Schedule s, detail::ParamReader& r, bool warmup_keys) {
  if (warmup_keys) {
    if (auto w = r.optional_time("warmup")) {
      const double from = r.number("warmup_from", 0.0);
      if (!(w->value > 0)) r.problem(fmt::format("schedule.warmup: must be more than zero, got \"{}\"", w->to_string()));
      else s = linear_warmup(*w, std::move(s), from);
    } else {
      r.number("warmup_from", 0.0);
    }
  }
  const double ratio = r.number("scale", 1.0);
  if (!(ratio > 0) || !std::isfinite(ratio)) r.problem(fmt::format("schedule.scale: must be > 0, got {}", ratio));
  else if (ratio != 1.0) s = scale(std::move(s), ratio);
  return s;
}
}  // namespace

Expected<Schedule> from_name(const std::string& name, const Params& params) {
  detail::ParamReader r(params, "schedule");
  auto positive = [&r](const char* key, double v) {
    if (!(v > 0) || !std::isfinite(v)) r.problem(fmt::format("schedule.{}: must be > 0, got {}", key, v));
    return v;
  };
  auto positive_time = [&r](const char* key, Time t) {
    if (!(t.value > 0)) r.problem(fmt::format("schedule.{}: must be more than zero, got \"{}\"", key, t.to_string()));
    return t;
  };
  Schedule s;
  if (name == "constant") {
    s = constant(r.number("value", 1.0));
  } else if (name == "step") {
    const Time size = positive_time("step_size", r.required_time("step_size"));
    s = step(size, positive("gamma", r.number("gamma", 0.1)));
  } else if (name == "multistep") {
    auto ms = r.times("milestones");
    s = multistep(std::move(ms), positive("gamma", r.number("gamma", 0.1)));
  } else if (name == "exponential") {
    const double gamma = positive("gamma", r.number("gamma", 0.95));
    s = exponential(gamma, positive_time("period", r.time("period", Time::epochs(1))));
  } else if (name == "linear") {
    const double from = r.number("from", 1.0), to = r.number("to", 0.0);
    s = linear(from, to, positive_time("over", r.time("over", Time::fraction(1.0))));
  } else if (name == "polynomial") {
    const double power = positive("power", r.number("power", 1.0));
    const double from = r.number("from", 1.0), to = r.number("to", 0.0);
    s = polynomial(power, from, to, positive_time("over", r.time("over", Time::fraction(1.0))));
  } else if (name == "cosine") {
    const Time over = positive_time("over", r.time("over", Time::fraction(1.0)));
    s = cosine(over, r.number("to", 0.0));
  } else if (name == "cosine_warm_restarts") {
    const Time period = positive_time("period", r.required_time("period"));
    const double mult = positive("period_mult", r.number("period_mult", 1.0));
    s = cosine_warm_restarts(period, mult, r.number("to", 0.0));
  } else if (name == "one_cycle") {
    const Time over = positive_time("over", r.time("over", Time::fraction(1.0)));
    const double peak = positive("peak", r.number("peak", 1.0));
    const double pct = r.number("pct_start", 0.3);
    if (!(pct > 0 && pct < 1)) r.problem(fmt::format("schedule.pct_start: must be in (0, 1), got {}", pct));
    const double div = positive("div_factor", r.number("div_factor", 25.0));
    s = one_cycle(over, peak, pct, div, positive("final_div_factor", r.number("final_div_factor", 1e4)));
  } else if (name == "inverse_sqrt") {
    s = inverse_sqrt(positive_time("warmup", r.required_time("warmup")));
  } else {
    return fail(ErrorCode::invalid_argument, fmt::format("unknown schedule \"{}\"{}; valid schedules: {}", name,
                                                         detail::did_you_mean(name, names()), fmt::join(names(), ", ")));
  }
  s = common_keys(std::move(s), r, name != "inverse_sqrt");
  if (auto ok = r.finish(); !ok) return tl::unexpected(ok.error());
  return s;
}

Expected<Schedule> with_common_keys(Schedule s, const Params& params) {
  detail::ParamReader r(params, "schedule");
  s = common_keys(std::move(s), r, true);
  if (auto ok = r.finish(); !ok) return tl::unexpected(ok.error());
  return s;
}
}  // namespace schedule

}  // namespace baton
