// The one rule for time units (horizon.hpp).
#include "horizon.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace baton::detail {

Expected<void> check_budget(Time budget, std::string_view who) {
  if (auto ok = budget.check(); !ok)
    return fail(ErrorCode::invalid_argument, fmt::format("{}: the budget: {}", who, ok.error().message));
  return {};
}

Time resolve(Time t, Time max_duration) {
  if (t.unit != TimeUnit::duration) return t;
  return Time{t.value * max_duration.value, max_duration.unit};
}

Mark Mark::after(Time amount, const Timestamp& from, Time max, std::int64_t n) {
  TimeUnit unit = amount.unit;
  double value = amount.value;
  if (unit == TimeUnit::duration) unit = max.unit, value *= max.value;  // a fraction of the max, in its unit
  switch (unit) {
    case TimeUnit::epoch: return {TimeUnit::epoch, data_position(from, n) + std::llround(value * static_cast<double>(n))};
    case TimeUnit::batch: return {TimeUnit::batch, from.batch + std::llround(value)};
    case TimeUnit::sample: return {TimeUnit::sample, from.sample + std::llround(value)};
    case TimeUnit::duration: break;
  }
  return {TimeUnit::batch, from.batch};
}

std::int64_t Mark::value(const Timestamp& t, std::int64_t n) const {
  switch (unit) {
    case TimeUnit::epoch: return data_position(t, n);
    case TimeUnit::batch: return t.batch;
    case TimeUnit::sample: return t.sample;
    case TimeUnit::duration: break;
  }
  return target;
}

double Mark::progress(const Timestamp& t, const Timestamp& origin, std::int64_t n) const {
  const double done = static_cast<double>(value(t, n) - value(origin, n));
  const double total = static_cast<double>(target - value(origin, n));
  return total > 0 ? std::clamp(done / total, 0.0, 1.0) : 1.0;
}

std::int64_t intervals_done(Time every, const Timestamp& t, const Timestamp& origin, std::int64_t n, Time max) {
  // The length of one interval on its counter: the mark `every` after the start of time.
  const Mark one = Mark::after(every, Timestamp{}, max, n);
  return (one.value(t, n) - one.value(origin, n)) / std::max<std::int64_t>(1, one.target);
}

void advance(Timestamp& t, std::int64_t batch_size) {
  t.batch += 1;
  t.sample += batch_size;
  t.batch_in_epoch += 1;
  t.sample_in_epoch += batch_size;
}

void roll_epoch(Timestamp& t, std::int64_t n, std::int64_t batch_size, bool drop_last) {
  if (t.sample_in_epoch >= n || (drop_last && n - t.sample_in_epoch < batch_size))
    t.epoch += 1, t.batch_in_epoch = 0, t.sample_in_epoch = 0;
}

bool reached_max(const Timestamp& t, Time max) {
  switch (max.unit) {
    case TimeUnit::epoch: return t.epoch >= max.count();
    case TimeUnit::batch: return t.batch >= max.count();
    case TimeUnit::sample: return t.sample >= max.count();
    case TimeUnit::duration: return true;  // rejected by init_state
  }
  return true;
}

Timestamp simulate(Timestamp now, const Mark& end, Time max, std::int64_t n, std::int64_t batch_size, bool drop_last) {
  while (!reached_max(now, max) && !end.reached(now, n)) {
    roll_epoch(now, n, batch_size, drop_last);
    if (reached_max(now, max) || end.reached(now, n)) break;
    advance(now, std::min(batch_size, n - now.sample_in_epoch));
    roll_epoch(now, n, batch_size, drop_last);
  }
  return now;
}

double batches_in(Time t, Time max, std::int64_t n, std::int64_t batch_size, bool drop_last) {
  if (t.unit == TimeUnit::duration) {
    if (max.unit == TimeUnit::duration) return 0.0;
    t = Time{t.value * max.value, max.unit};
  }
  if (batch_size <= 0) return 0.0;
  const double per_epoch = static_cast<double>(drop_last ? n / batch_size : (n + batch_size - 1) / batch_size);
  switch (t.unit) {
    case TimeUnit::epoch: return t.value * per_epoch;
    case TimeUnit::batch: return t.value;
    case TimeUnit::sample: return std::ceil(t.value / static_cast<double>(batch_size));
    case TimeUnit::duration: break;
  }
  return 0.0;
}

}  // namespace baton::detail
