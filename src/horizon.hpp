#pragma once
// The one rule for time units: where a stage, a budget or an interval ends, how far a stage has
// come, and how the timestamp moves. Integer arithmetic on the run's counters only, so that any
// cut of a stage into fits, and any resume, reaches the same batches. Used by the loop, the
// planning functions (stage_end, fit_end), hparams validation and the run directory.

#include <cstdint>
#include <string_view>

#include "baton/error.hpp"
#include "baton/time.hpp"

namespace baton::detail {

/// A budget as `fit(spec, state, budget)` and `fit_end` take it (Time::check: a whole,
/// non-negative count): an invalid_argument error naming `who` ("fit") otherwise.
Expected<void> check_budget(Time budget, std::string_view who);

/// A Time with `dur` resolved against the run's max duration (a fraction of it, in its unit).
/// (Counters round the product to the nearest whole count where they compare with it: `Mark`.)
Time resolve(Time t, Time max_duration);

/// Position in the data of an epoch-counting clock: epochs * n + samples of the epoch's order.
constexpr std::int64_t data_position(const Timestamp& t, std::int64_t n) { return t.epoch * n + t.sample_in_epoch; }

/// A point in training time, on one counter: data positions (ep), batches (ba) or samples (sp).
/// `reached` is true at the first batch boundary at or past it.
struct Mark {
  TimeUnit unit = TimeUnit::batch;  // epoch: data positions; batch, sample: the counters
  std::int64_t target = 0;

  /// `amount` after `from` (`dur`: a fraction of `max`), for data of `n` samples.
  static Mark after(Time amount, const Timestamp& from, Time max, std::int64_t n);
  [[nodiscard]] std::int64_t value(const Timestamp& t, std::int64_t n) const;
  [[nodiscard]] bool reached(const Timestamp& t, std::int64_t n) const { return value(t, n) >= target; }
  /// Fraction of the way from `origin` to the mark at `t`, in [0, 1].
  [[nodiscard]] double progress(const Timestamp& t, const Timestamp& origin, std::int64_t n) const;
};

/// How many whole `every` intervals lie between `origin` and `t`; interval events fire when it grows.
std::int64_t intervals_done(Time every, const Timestamp& t, const Timestamp& origin, std::int64_t n, Time max);

/// One batch of `batch_size` samples more.
void advance(Timestamp& t, std::int64_t batch_size);

/// Rolls the epoch over when its order is used up (or too short for a batch with drop_last).
void roll_epoch(Timestamp& t, std::int64_t n, std::int64_t batch_size, bool drop_last);

/// Has `t` reached the max duration `max` (in ep, ba or sp)?
bool reached_max(const Timestamp& t, Time max);

/// The loop's timestamp arithmetic without training: from `now` until `end` (or `max`) is reached.
Timestamp simulate(Timestamp now, const Mark& end, Time max, std::int64_t n, std::int64_t batch_size, bool drop_last);

/// The number of batches in `t` for data of `n` samples and batches of `batch_size` (for
/// checking durations against each other before training; `dur` needs `max`).
double batches_in(Time t, Time max, std::int64_t n, std::int64_t batch_size, bool drop_last);

}  // namespace baton::detail
