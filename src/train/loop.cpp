// fit: the training loop. Its seams: where the stage ends (course.hpp, horizon.hpp), carry-over
// and the optimizer binding (carry.hpp), one step (step.hpp), data parallel (data_parallel.hpp,
// a no-op without a process group), and what watches the loop (observers.hpp).
//
// The loop, with its event points ([event] fires callbacks; "algorithms:" says which algorithm
// hook runs there, in the order of spec.algorithms):
//
//   fit_start                  a new stage (spec.name differs from state.stage): close a partial
//                              epoch, apply model and optimizer carry-over; resolve groups, freeze
//   while not (stage end, budget spent, run max reached, or a stop):
//     [epoch_start]            order = epoch_order(size, seed, epoch)         (cached per epoch)
//     [batch_start]            batch = data[order[sample_in_epoch : +batch_size]]  (a rank's shard;
//                              made ahead by spec.data.workers threads: feed.hpp)
//     [after_data]             algorithms: after_data(batch) -> batch   (augmentation, MixUp, ...)
//                              lr = group lr * schedule(time on the run's or the stage's clock)
//     gradient():              (once; or as an algorithm's gradient hook calls it: SAM twice)
//       for each microbatch (grad_accum):
//         [before_forward]     output = model(micro.inputs)
//         [after_forward]      algorithms: before_loss(output, targets) -> targets (smoothing)
//                              loss = loss(output, targets)  (non-finite: policy, no step)
//         [after_loss]         (loss * micro/batch).backward()
//                              data parallel: one all-reduce of the gradients; unscale (fp16)
//                              algorithms: after_backward(gradients)   (scheduled freezing)
//     [after_backward]         clip by global norm, then by value; (checked: non-finite grads)
//     [before_optimizer_step]  optimizer update (moments keyed by name), grads set to none
//     [batch_end]              timestamp += 1 batch; algorithms: batch_end(weights) (EMA, SWA)
//     [epoch_end]              when the epoch's order is used up (or too short with drop_last)
//     [eval_start/eval_end]    at spec.evaluation.every (from the stage's start)
//     [checkpoint]             at spec.checkpoints.every (from the stage's start)
//     stop check               a callback's reason, the stop flag, a signal
//   at the stage's end:        algorithms: stage_end(state) (SWA); [eval_*]; [checkpoint] -end
//   on interruption:           [checkpoint]
//   [fit_end]                  history: {stage, start, end, last loss, lr, grad norm, transfer, ...}
#include <cmath>

#include <fmt/format.h>
#include <torch/torch.h>

#include "baton/fit.hpp"
#include "detail.hpp"
#include "train/carry.hpp"
#include "train/course.hpp"
#include "train/data_parallel.hpp"
#include "train/feed.hpp"
#include "horizon.hpp"
#include "train/observers.hpp"
#include "train/session.hpp"

namespace baton {
namespace {

Expected<TrainState> train(const TrainingSpec& spec, TrainState s, std::optional<Time> budget) {
  const auto input_rank = static_cast<std::int64_t>(spec.data.train.input_shape().size()) + 1;
  detail::Session session(spec, s, input_rank);
  const detail::Course course = detail::Course::make(spec, s, budget);
  // Dropout, augmentation etc. draw from the run's RNG, installed in LibTorch's global generator
  // for each batch: fits in other threads take turns (docs/threads.md).
  detail::RngStream rng(s.rng);
  detail::DataParallel dp(spec.distributed.get());
  dp.start(s, course.n, course.batch_size, course.data_seed);
  detail::Feed feed(spec, course, [&dp](std::int64_t take) { return dp.shard(take); }, s.max_duration);
  detail::Observers obs(spec, s, course, rng, dp, session.take_transfer());
  {
    const auto held = rng.hold();
    obs.fire(Event::fit_start);
  }
  for (Timestamp& t = s.time; !course.done(s);) {
    const auto held = rng.hold();
    if (obs.stop_requested()) break;
    detail::roll_epoch(t, course.n, course.batch_size, course.drop_last);
    if (course.done(s)) break;
    const std::int64_t take = std::min(course.batch_size, course.n - t.sample_in_epoch);
    obs.begin_batch(t, take);
    if (t.sample_in_epoch == 0) obs.fire(Event::epoch_start);
    obs.fire(Event::batch_start);
    if (spec.device.is_cuda()) detail::seed_device_generator(spec.device);  // dropout on the GPU: from the run's stream
    const auto [offset, size] = dp.begin_step(take, t.batch, obs.local_stop());  // this rank's shard
    Batch batch = feed.next(s, take, offset, size);
    if (!spec.device.is_cpu()) batch = {batch.inputs.to(spec.device, true), batch.targets.to(spec.device, true)};
    const Timestamp before = t;
    if (!detail::train_batch(spec, s, session, obs, dp, std::move(batch), take, course.n).go_on) break;
    const std::int64_t epoch = t.epoch;
    detail::roll_epoch(t, course.n, course.batch_size, course.drop_last);
    obs.after_batch(before, t.epoch != epoch);
  }
  {
    const auto held = rng.hold();
    obs.finish();
  }
  session.restore_layout();
  return s;
}

Expected<TrainState> fit_impl(const TrainingSpec& spec, TrainState s, std::optional<Time> budget) {
  return detail::guard([&]() -> Expected<TrainState> {
           if (auto ok = spec.validate(); !ok) return tl::unexpected(ok.error());
           if (!s.model.module) return fail(ErrorCode::invalid_argument, "fit: the state has no model; make one with init_state");
           if (s.finished()) return tl::unexpected(detail::finished_error(s));
           if (budget)
             if (auto ok = detail::check_budget(*budget, "fit"); !ok) return tl::unexpected(ok.error());
           if (budget && budget->value == 0) return std::move(s);  // a zero budget changes nothing
           return train(spec, std::move(s), budget);
         })
      .map_error(add_context(fmt::format("stage \"{}\"", spec.name)));
}
}  // namespace

Expected<TrainState> fit(const TrainingSpec& spec, TrainState state) { return fit_impl(spec, std::move(state), std::nullopt); }

Expected<TrainState> fit(const TrainingSpec& spec, TrainState state, Time budget) {
  return fit_impl(spec, std::move(state), budget);
}

}  // namespace baton
