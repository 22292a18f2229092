// train_step (one pure step) and the planning functions: where a fit or a stage ends, and the
// next step's learning rate, without training.
#include <fmt/format.h>
#include <torch/torch.h>

#include "baton/fit.hpp"
#include "detail.hpp"
#include "train/carry.hpp"
#include "train/course.hpp"
#include "train/data_parallel.hpp"
#include "horizon.hpp"
#include "train/observers.hpp"
#include "train/session.hpp"

namespace baton {
namespace {
std::string stage_context(const TrainingSpec& spec) { return fmt::format("stage \"{}\"", spec.name); }

Expected<void> check_batch(const TrainingSpec& spec, const TrainState& s, const Batch& batch) {
  if (auto ok = spec.optimizer.validate(); !ok) return tl::unexpected(ok.error());
  if (!spec.loss.fn) return fail(ErrorCode::invalid_spec, "loss: no loss function set");
  if (!s.model.module) return fail(ErrorCode::invalid_argument, "train_step: the state has no model");
  if (spec.distributed)
    return fail(ErrorCode::invalid_spec,
                "train_step: a spec with a process group (distributed) trains with fit, which shards the data and "
                "averages gradients; train_step takes one batch of one process: clear spec.distributed");
  if (s.finished()) return tl::unexpected(detail::finished_error(s));
  if (!batch.inputs.defined() || !batch.targets.defined() || batch.inputs.dim() == 0 || batch.targets.dim() == 0 ||
      batch.inputs.size(0) != batch.targets.size(0) || batch.inputs.size(0) == 0)
    return fail(ErrorCode::shape_mismatch,
                fmt::format("train_step: a batch needs inputs and targets with the same, non-zero first dimension; "
                            "got inputs {} and targets {}",
                            detail::shape_string(batch.inputs), detail::shape_string(batch.targets)));
  return {};
}

/// The spec a train_step trains by: its algorithms apply as in fit; callbacks, loggers, evaluation,
/// checkpoints and stop requests are fit's business.
TrainingSpec step_spec(const TrainingSpec& spec) {
  TrainingSpec quiet = spec;
  quiet.callbacks.clear(), quiet.loggers.clear();
  quiet.evaluation.reset(), quiet.keep_best.reset();
  quiet.checkpoints = CheckpointPolicy{};
  quiet.stop.reset(), quiet.handle_signals = false;
  return quiet;
}
}  // namespace

Expected<StepResult> train_step(const TrainingSpec& spec, TrainState s, const Batch& batch) {
  return detail::guard([&]() -> Expected<StepResult> {
           if (auto ok = check_batch(spec, s, batch); !ok) return tl::unexpected(ok.error());
           const TrainingSpec quiet = step_spec(spec);
           // The set-up and the batch are fit's own (session.hpp), so a fit of N batches is N steps.
           detail::Session session(quiet, s, batch.inputs.dim());
           const detail::Course course = detail::Course::for_step(quiet, s, batch);
           detail::RngStream rng(s.rng);
           detail::DataParallel none(nullptr);
           detail::Observers obs(quiet, s, course, rng, none, session.take_transfer());
           const auto held = rng.hold();
           if (spec.device.is_cuda()) detail::seed_device_generator(spec.device);  // dropout on the GPU, as fit
           detail::roll_epoch(s.time, course.n, course.batch_size, course.drop_last);
           const Timestamp before = s.time;
           const std::int64_t b = batch.inputs.size(0);
           Batch on_device = spec.device.is_cpu() ? batch : Batch{batch.inputs.to(spec.device), batch.targets.to(spec.device)};
           const auto r = detail::train_batch(quiet, s, session, obs, none, std::move(on_device), b, course.n);
           // One step has nothing to skip to: a non-finite step is an error unless the policy skips it.
           if (r.out.non_finite && spec.on_non_finite != NonFinite::skip)
             detail::raise(ErrorCode::non_finite,
                           fmt::format("{} at batch {}; the step was not applied", r.out.what, s.time.batch));
           const std::int64_t epoch = s.time.epoch;
           detail::roll_epoch(s.time, course.n, course.batch_size, course.drop_last);
           obs.after_batch(before, s.time.epoch != epoch);
           obs.finish();
           session.restore_layout();
           return StepResult{std::move(s), r.out.loss, r.lr, r.out.grad_norm};
         })
      .map_error(add_context(stage_context(spec) + " train_step"));
}

Expected<Timestamp> fit_end(const TrainingSpec& spec, const TrainState& s, std::optional<Time> budget) {
  if (auto ok = spec.validate(); !ok) return tl::unexpected(ok.error().with_context(stage_context(spec)));
  if (budget)
    if (auto ok = detail::check_budget(*budget, "fit_end"); !ok)
      return tl::unexpected(ok.error().with_context(stage_context(spec)));
  if (s.finished() || (budget && budget->value == 0)) return s.time;
  const auto pos = detail::stage_position(spec, s);
  const std::int64_t n = spec.data.train.size();
  const auto end = detail::Mark::after(spec.duration, pos.stage_start, s.max_duration, n);
  Timestamp t = detail::simulate(pos.time, end, s.max_duration, n, spec.data.batch_size, spec.data.drop_last);
  if (budget) {
    const auto limit = detail::Mark::after(*budget, pos.time, s.max_duration, n);
    const Timestamp u = detail::simulate(pos.time, limit, s.max_duration, n, spec.data.batch_size, spec.data.drop_last);
    if (u.batch < t.batch) t = u;
  }
  return t;
}

Expected<Timestamp> stage_end(const TrainingSpec& spec, const TrainState& s) { return fit_end(spec, s, std::nullopt); }

Expected<double> scheduled_lr(const TrainingSpec& spec, const TrainState& s) {
  const std::int64_t n = spec.data.train.size();
  if (n <= 0 || spec.data.batch_size <= 0)
    return fail(ErrorCode::invalid_spec, "scheduled_lr: the spec needs training data and a positive batch size");
  const auto pos = detail::stage_position(spec, s);
  Timestamp t = pos.time;
  detail::roll_epoch(t, n, spec.data.batch_size, spec.data.drop_last);
  return spec.optimizer.lr() * spec.schedule(detail::schedule_time(spec, s, t, pos.stage_start, n));
}

}  // namespace baton
