#pragma once
/// \file schedule.hpp
/// Learning-rate schedules as pure functions of time (as Optax's schedules and Composer's
/// schedulers): a schedule maps a `ScheduleTime` to a multiplier of the optimizer's base LR.
/// Compose them: `linear_warmup("500ba"_t, cosine())` is a composition, not a class of its own;
/// `join({a, b, c}, {"1ep"_t, "3ep"_t})` switches at boundaries, each schedule seeing the time
/// since its boundary.
///
/// Times inside schedules may use any unit, including `dur`: a fraction of the schedule's
/// horizon, which is the run's max duration on the run clock, or the stage's duration on the
/// stage clock (`Clock` in the spec).

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "baton/error.hpp"
#include "baton/params.hpp"
#include "baton/time.hpp"

namespace baton {

/// Time as a schedule sees it: progress since its clock's origin in every unit, plus the
/// conversions between units of the stage being trained.
struct ScheduleTime {
  double epoch = 0;                ///< fractional epochs since the origin
  double batch = 0;                ///< optimizer steps since the origin
  double sample = 0;               ///< samples since the origin
  double batches_per_epoch = 1;    ///< of the stage's data and batch size
  double samples_per_batch = 1;    ///< the stage's batch size
  Time horizon = Time::batches(1); ///< what `1dur` is (ep, ba or sp)

  /// Progress in `unit` (`dur`: the fraction of the horizon).
  [[nodiscard]] double in(TimeUnit unit) const;
  /// Any time as an amount of `unit`, using this stage's conversions.
  [[nodiscard]] double convert(Time t, TimeUnit unit) const;
  /// The same moment seen from an origin moved forward by `t`; the horizon shrinks by `t`.
  [[nodiscard]] ScheduleTime shifted(Time t) const;
  /// Time slowed down by `ratio` (> 1 stretches a schedule, < 1 shrinks it).
  [[nodiscard]] ScheduleTime scaled(double ratio) const;

  /// A schedule time at `batch` steps for a stage of `batches_per_epoch` batches of
  /// `samples_per_batch`, e.g. for plotting or testing a schedule.
  static ScheduleTime at_batch(double batch, double batches_per_epoch, double samples_per_batch, Time horizon);
};

/// A named LR multiplier function. `warmup` is set by `linear_warmup` so that a spec can check that
/// the warm-up fits in the stage.
struct Schedule {
  std::string name = "constant";
  std::function<double(const ScheduleTime&)> fn{};
  std::optional<Time> warmup{};

  [[nodiscard]] double operator()(const ScheduleTime& t) const { return fn ? fn(t) : 1.0; }
};

/// Which clock a stage's schedule reads.
enum class Clock {
  run,    ///< time since the run began: the schedule continues across stages; dur = run max
  stage,  ///< time since the stage began: it restarts at 0 each stage; dur = stage duration
};

namespace schedule {
/// Always `value`.
Schedule constant(double value = 1.0);
/// `gamma ^ floor(t / step_size)`.
Schedule step(Time step_size, double gamma = 0.1);
/// `gamma ^ (number of milestones passed)`.
Schedule multistep(std::vector<Time> milestones, double gamma = 0.1);
/// `gamma ^ (t / period)`: decays continuously by `gamma` per `period`.
Schedule exponential(double gamma, Time period = Time::epochs(1));
/// From `from` to `to` linearly over `over`, then `to`.
Schedule linear(double from = 1.0, double to = 0.0, Time over = Time::fraction(1.0));
/// `to + (from - to) * (1 - t/over)^power`, then `to`.
Schedule polynomial(double power, double from = 1.0, double to = 0.0, Time over = Time::fraction(1.0));
/// Cosine annealing from 1 to `to` over `over`, then `to`.
Schedule cosine(Time over = Time::fraction(1.0), double to = 0.0);
/// Cosine annealing that restarts after `period`, each period `period_mult` times longer (SGDR).
Schedule cosine_warm_restarts(Time period, double period_mult = 1.0, double to = 0.0);
/// One cycle (as torch's OneCycleLR with cosine annealing, in continuous time): from
/// `peak / div_factor` up to `peak` over the first `pct_start` of `over`, then down to
/// `peak / (div_factor * final_div_factor)`.
Schedule one_cycle(Time over = Time::fraction(1.0), double peak = 1.0, double pct_start = 0.3,
                   double div_factor = 25.0, double final_div_factor = 1e4);
/// Inverse square root: 1 until `warmup`, then `sqrt(warmup / t)`.
Schedule inverse_sqrt(Time warmup);
/// Linear warm-up from `from` times to the full value of `after` over `warmup`, then `after` on
/// time shifted by the warm-up (so `after` starts at its own time zero).
Schedule linear_warmup(Time warmup, Schedule after = constant(), double from = 0.0);
/// `schedules[0]` until `boundaries[0]`, then `schedules[1]` on time since `boundaries[0]`, ...
/// (as Optax's join_schedules). Needs `boundaries.size() == schedules.size() - 1`.
Schedule join(std::vector<Schedule> schedules, std::vector<Time> boundaries);
/// The scale-schedule ratio: `scale(s, 2.0)` runs `s` twice as slowly (durations x2).
Schedule scale(Schedule s, double ratio);

/// Builds a schedule from its name and a key/value table (for hparams files), e.g.
/// `from_name("cosine", {{"to", 0.01}})`, `from_name("step", {{"step_size", "2ep"}, {"gamma", 0.5}})`.
/// A `warmup` key (a time) puts a linear warm-up in front of any schedule. Unknown names and
/// keys, wrong types and bad values are errors listing the valid names or keys.
Expected<Schedule> from_name(const std::string& name, const Params& params);
/// Every name `from_name` accepts.
const std::vector<std::string>& names();
/// The keys every schedule of a file takes, applied to `s` (a schedule of your own, say): `warmup`
/// (a time; with `warmup_from`, default 0) puts a linear warm-up in front, `scale` stretches it.
/// Any other key is an error.
Expected<Schedule> with_common_keys(Schedule s, const Params& params);
}  // namespace schedule

}  // namespace baton
