// The set-up and the batch that fit and train_step share (session.hpp).
#include "train/session.hpp"

#include <torch/torch.h>

#include "detail.hpp"
#include "train/course.hpp"
#include "train/data_parallel.hpp"
#include "train/observers.hpp"
#include "train/step.hpp"

namespace baton::detail {

Session::Begun::Begun(const TrainingSpec& spec, TrainState& s)
    : new_stage(stage_position(spec, s).new_stage), transfer(begin_stage(spec, s)) {
  note_runtime_once();
  if (spec.precision == Precision::bf16 && spec.device.is_cpu()) warn_bf16_once();
  if (!spec.device.is_cpu()) to_device(s, spec.device);  // before the optimizer binds to the parameters
}

Session::Session(const TrainingSpec& spec, TrainState& s, std::int64_t input_rank)
    : begun_(spec, s),
      layout_(*s.model.module, use_channels_last(spec.memory_format, input_rank, spec.device)),
      deterministic_(spec.deterministic),
      slots_(bind_optimizer(spec, s, begun_.new_stage)),
      frozen_(spec, *s.model.module) {
  s.model.module->train(true);
}

BatchResult train_batch(const TrainingSpec& spec, TrainState& s, Session& session, Observers& obs, DataParallel& dp,
                        Batch batch, std::int64_t take, std::int64_t n) {
  const AlgorithmContext actx = obs.context(s.time);
  batch = obs.after_data(actx, std::move(batch));
  const double scale = spec.schedule(schedule_time(spec, s, s.time, s.stage_start, n));
  const double lr = spec.optimizer.lr() * scale;
  StepOutput out = step_in_place(spec, s, session.slots(), batch, scale, obs.hooks(), actx, dp);
  if (out.non_finite && !obs.on_non_finite(out)) return {std::move(out), lr, false};  // error: raises; skip: goes on
  advance(s.time, take);
  obs.batch_end(actx, out, take, lr);
  return {std::move(out), lr, true};
}

}  // namespace baton::detail
