// train_step (one pure step) and the planning functions: where a fit or a stage ends, and the
// next step's learning rate, without training.
#include <fmt/format.h>
#include <torch/torch.h>

#include "baton/fit.hpp"
#include "detail.hpp"
#include "train/precision.hpp"
#include "train/carry.hpp"
#include "train/course.hpp"
#include "train/data_parallel.hpp"
#include "horizon.hpp"
#include "train/observers.hpp"
#include "train/step.hpp"

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
}  // namespace

Expected<StepResult> train_step(const TrainingSpec& spec, TrainState s, const Batch& batch) {
  return detail::guard([&]() -> Expected<StepResult> {
           if (auto ok = check_batch(spec, s, batch); !ok) return tl::unexpected(ok.error());
           const std::int64_t b = batch.inputs.size(0);
           // Without training data in the spec, an epoch is this one batch (for the schedule's units).
           const std::int64_t n = spec.data.train.size() > 0 ? spec.data.train.size() : b;
           const std::int64_t bs = std::max<std::int64_t>(spec.data.batch_size, 1);
           const bool began = detail::stage_position(spec, s).new_stage;
           auto transfer = detail::begin_stage(spec, s);
           if (!spec.device.is_cpu()) detail::to_device(s, spec.device);  // as fit: before the optimizer binds
           std::vector<detail::Slot> slots = detail::bind_optimizer(spec, s, began);
           detail::FreezeScope frozen(spec, *s.model.module);
           s.model.module->train(true);
           detail::LayoutScope layout(*s.model.module, detail::use_channels_last(spec.memory_format, batch.inputs.defined() ? batch.inputs.dim() : 0, spec.device));
           const detail::DeterministicScope deterministic(spec.deterministic);
           detail::GlobalRngScope rng(s.rng);
           if (spec.device.is_cuda()) detail::seed_device_generator(spec.device);  // dropout on the GPU, as fit
           const std::size_t record = detail::open_record(s, spec.name, std::move(transfer));  // as fit keeps it
           detail::roll_epoch(s.time, n, bs, spec.data.drop_last);
           const double scale = spec.schedule(detail::schedule_time(spec, s, s.time, s.stage_start, n));
           // The spec's algorithms apply as in fit (callbacks and loggers are fit's business).
           TrainingSpec quiet = spec;
           quiet.callbacks.clear(), quiet.loggers.clear();
           detail::Hooks hooks{quiet, s};
           const Timestamp before = s.time;
           const auto end = detail::Mark::after(spec.duration, s.stage_start, s.max_duration, n);
           const std::int64_t classes = spec.algorithms.empty() ? 0
                                            : std::max(detail::data_classes(spec.data.train),
                                                       detail::data_classes(Dataset{batch.inputs, batch.targets, ""}));
           const AlgorithmContext actx{spec, before, end.progress(before, s.stage_start, n), classes};
           Batch transformed = spec.device.is_cpu() ? batch : Batch{batch.inputs.to(spec.device), batch.targets.to(spec.device)};
           for (const auto& a : spec.algorithms)
             if (a.after_data) transformed = a.after_data(actx, std::move(transformed));
           detail::DataParallel none(nullptr);
           const auto out = detail::step_in_place(quiet, s, slots, transformed, scale,
                                                  spec.algorithms.empty() ? nullptr : &hooks, actx, none);
           if (out.non_finite)
             detail::raise(ErrorCode::non_finite, fmt::format("{} at batch {}; the step was not applied", out.what, s.time.batch));
           for (const auto& a : spec.algorithms)
             if (a.batch_end) detail::with_memory(s.algorithm_state, a.name, [&](Algorithm::Tensors& m) { a.batch_end(actx, s, m); });
           detail::advance(s.time, b);
           auto& r = s.history[record];
           r.last_loss = out.loss, r.last_grad_norm = out.grad_norm, r.last_lr = spec.optimizer.lr() * scale;
           detail::roll_epoch(s.time, n, bs, spec.data.drop_last);
           r.end = s.time;
           s.rng = rng.current();
           layout.restore();
           return StepResult{std::move(s), out.loss, spec.optimizer.lr() * scale, out.grad_norm};
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
