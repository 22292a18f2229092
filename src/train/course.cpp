// The course of one fit through its stage (course.hpp).
#include "train/course.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <torch/torch.h>

#include "detail.hpp"

namespace baton::detail {

/// The schedule's view of time for the next step.
ScheduleTime schedule_time(const TrainingSpec& spec, const TrainState& s, const Timestamp& now,
                           const Timestamp& stage_start, std::int64_t n) {
  const std::int64_t bs = spec.data.batch_size;
  const Timestamp origin = spec.schedule_clock == Clock::run ? Timestamp{} : stage_start;
  ScheduleTime st;
  st.epoch = static_cast<double>(now.epoch - origin.epoch) +
             static_cast<double>(now.sample_in_epoch - origin.sample_in_epoch) / static_cast<double>(n);
  st.batch = static_cast<double>(now.batch - origin.batch);
  st.sample = static_cast<double>(now.sample - origin.sample);
  st.batches_per_epoch = static_cast<double>(spec.data.drop_last ? n / bs : (n + bs - 1) / bs);
  st.samples_per_batch = static_cast<double>(bs);
  // The stage clock's horizon is the stage as written; `dur` is a fraction of the run's max.
  st.horizon = spec.schedule_clock == Clock::run ? s.max_duration : resolve(spec.duration, s.max_duration);
  return st;
}

namespace {
/// A warm-up longer than the schedule's horizon never ends: an error, before any step.
void check_warmup(const TrainingSpec& spec, const TrainState& s, std::int64_t n) {
  if (!spec.schedule.warmup) return;
  const ScheduleTime st = schedule_time(spec, s, s.time, s.time, n);
  const double warm = st.convert(*spec.schedule.warmup, TimeUnit::batch);
  const double horizon = st.convert(st.horizon, TimeUnit::batch);
  if (warm > horizon + 1e-9)
    raise(ErrorCode::invalid_spec,
                  fmt::format("schedule: the warm-up ({}, {:.0f} batches) is longer than the {} ({}, {:.0f} "
                              "batches); shorten the warm-up or lengthen the {}",
                              spec.schedule.warmup->to_string(), warm,
                              spec.schedule_clock == Clock::stage ? "stage" : "run", st.horizon.to_string(), horizon,
                              spec.schedule_clock == Clock::stage ? "stage" : "run"));
}
}  // namespace

/// Classes of the training data: max label + 1 for int64 class labels, else 0.
std::int64_t data_classes(const Dataset& d) {
  return d.classes();
}

Error finished_error(const TrainState& s) {
  return Error{ErrorCode::run_finished,
               fmt::format("the run has reached its max duration {} ({}); nothing left to train. "
                           "Start a new run with init_state, or give it a larger max_duration",
                           s.max_duration.to_string(), s.time.to_string()),
               {}};
}

Course Course::make(const TrainingSpec& spec, const TrainState& s, std::optional<Time> budget) {
  const std::int64_t n = spec.data.train.size();
  check_warmup(spec, s, n);
  const Mark end = Mark::after(spec.duration, s.stage_start, s.max_duration, n);
  return Course{spec.data.train,
                n,
                spec.data.batch_size,
                spec.data.drop_last,
                spec.data_seed.value_or(s.seed),
                s.stage_start,
                end,
                budget ? Mark::after(*budget, s.time, s.max_duration, n) : end,
                spec.algorithms.empty() ? 0 : data_classes(spec.data.train)};
}

Course Course::for_step(const TrainingSpec& spec, const TrainState& s, const Batch& batch) {
  const std::int64_t n = spec.data.train.size() > 0 ? spec.data.train.size() : batch.inputs.size(0);
  const Mark end = Mark::after(spec.duration, s.stage_start, s.max_duration, n);
  const std::int64_t classes = spec.algorithms.empty() ? 0
                                   : std::max(data_classes(spec.data.train),
                                              data_classes(Dataset{batch.inputs, batch.targets, ""}));
  return Course{spec.data.train,
                n,
                std::max<std::int64_t>(spec.data.batch_size, 1),
                spec.data.drop_last,
                spec.data_seed.value_or(s.seed),
                s.stage_start,
                end,
                end,
                classes};
}

torch::Tensor Course::indices(TrainState& s, bool shuffle, std::int64_t offset, std::int64_t size) const {
  const Timestamp& t = s.time;
  const auto& cache = s.order_cache;
  if (!cache || cache->epoch != t.epoch || cache->seed != data_seed || cache->size != n || cache->shuffle != shuffle)
    s.order_cache = std::make_shared<const OrderCache>(
        OrderCache{data_seed, t.epoch, n, shuffle, data::epoch_order(n, data_seed, t.epoch, shuffle)});
  return s.order_cache->order.narrow(0, t.sample_in_epoch + offset, size);
}

}  // namespace baton::detail
