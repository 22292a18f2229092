// What watches the loop (observers.hpp).
#include "train/observers.hpp"

#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <torch/torch.h>

#include "baton/checkpoint.hpp"
#include "baton/eval.hpp"
#include "train/precision.hpp"

namespace baton::detail {

Observers::Observers(const TrainingSpec& spec, TrainState& s, const Course& course, RngStream& rng,
                     DataParallel& dp, std::optional<TransferReport> transfer)
    : spec_(spec),
      s_(s),
      course_(course),
      rng_(rng),
      dp_(dp),
      hooks_{spec, s},
      attached_(!spec.algorithms.empty() || !spec.callbacks.empty() || !spec.loggers.empty() ||
                spec.evaluation.has_value() || !spec.checkpoints.dir.empty()),
      signals_(spec.handle_signals) {
  record_ = open_record(s, spec.name, std::move(transfer));
}

std::size_t open_record(TrainState& s, const std::string& stage, std::optional<TransferReport> transfer) {
  const Timestamp& start = s.time;
  if (transfer || s.history.empty() || s.history.back().name != stage || !(s.history.back().end == start))
    s.history.push_back(StageRecord{stage, start, start, std::nan(""), 0.0, 0.0, std::move(transfer), false});
  s.history.back().interrupted = false;
  return s.history.size() - 1;
}

void Observers::begin_batch(const Timestamp& t, std::int64_t take) {
  if (!attached_) return;  // no callback to read it
  span_ = BatchSpan{t, t, course_.n};
  advance(span_.after, take);
  roll_epoch(span_.after, course_.n, course_.batch_size, course_.drop_last);
  hooks_.span = &span_;
}

bool Observers::local_stop() const { return (spec_.stop && spec_.stop->load()) || signals_.raised(); }

bool Observers::stop_requested() {
  // Checked between batches only; data parallel: agreed in the last step's all-reduce.
  if (dp_.active() ? dp_.stop_agreed() : local_stop()) {
    interrupted_ = true;
    return true;
  }
  return hooks_.stop_reason.has_value();
}

AlgorithmContext Observers::context(const Timestamp& t) const {
  return AlgorithmContext{spec_, t, attached_ ? course_.progress(t) : 0.0, course_.num_classes};
}

Batch Observers::after_data(const AlgorithmContext& actx, Batch batch) {
  if (!attached_) return batch;
  for (const auto& a : spec_.algorithms)
    if (a.after_data) batch = a.after_data(actx, std::move(batch));
  hooks_.fire(Event::after_data);
  return batch;
}

bool Observers::on_non_finite(const StepOutput& out) {
  const Timestamp& t = s_.time;
  const std::string where = fmt::format("at batch {} (epoch {}, batch {} of it)", t.batch, t.epoch, t.batch_in_epoch);
  switch (spec_.on_non_finite) {
    case NonFinite::error:
      raise(ErrorCode::non_finite,
            fmt::format("{} {}; the step was not applied. Lower the learning rate, clip gradients, check the data "
                        "for NaN/inf, or set the non-finite policy to skip or stop",
                        out.what, where));
    case NonFinite::stop:
      hooks_.stop_reason = fmt::format("non-finite: {} {}; stopped before the step", out.what, where);
      return false;
    case NonFinite::skip: break;
  }
  s_.history[record_].skipped_batches += 1;  // the batch is consumed, nothing applied
  return true;
}

void Observers::batch_end(const AlgorithmContext& actx, const StepOutput& out, std::int64_t samples, double lr) {
  any_step_ = true;
  auto& r = s_.history[record_];
  if (!out.non_finite) r.last_loss = out.loss, r.last_grad_norm = out.grad_norm;
  r.last_lr = lr;
  if (!attached_) return;
  for (const auto& a : spec_.algorithms)
    if (a.batch_end) with_memory(s_.algorithm_state, a.name, [&](Algorithm::Tensors& m) { a.batch_end(actx, s_, m); });
  const StepInfo info{out.loss, lr, out.grad_norm, samples, out.non_finite};
  hooks_.fire(Event::batch_end, &info);
}

void Observers::after_batch(const Timestamp& before, bool epoch_ended) {
  hooks_.span = nullptr;
  const Timestamp& t = s_.time;
  s_.history[record_].end = t;
  if (!attached_) return;
  if (epoch_ended) hooks_.fire(Event::epoch_end);
  const bool at_end = course_.stage_done(s_);
  auto crossed = [&](const std::optional<Time>& every) {
    return every && intervals_done(*every, t, s_.stage_start, course_.n, s_.max_duration) >
                        intervals_done(*every, before, s_.stage_start, course_.n, s_.max_duration);
  };
  if (spec_.evaluation && crossed(spec_.evaluation->every) && !(at_end && spec_.evaluation->at_stage_end)) evaluate();
  // Never an interval checkpoint at the stage's last batch: the state there is not yet the stage's
  // end (stage-end algorithms and evaluation follow), so a resume from it could not reproduce that
  // end. The stage-end checkpoint (this policy's, or the run directory's) is that point's.
  if (!spec_.checkpoints.dir.empty() && crossed(spec_.checkpoints.every) && !at_end) write_checkpoint(false);
}

void Observers::finish() {
  hooks_.span = nullptr;  // a batch that stopped the fit (non-finite policy "stop") is over
  s_.rng = rng_.current();
  auto& r = s_.history[record_];
  r.end = s_.time;
  r.interrupted = interrupted_;
  if (hooks_.stop_reason) r.stop_reason = *hooks_.stop_reason;
  if (!attached_) return;
  // The stage ends when its duration (or the run's) is reached, or a callback ended it.
  if ((course_.stage_done(s_) && any_step_) || hooks_.stop_reason) {
    for (const auto& a : spec_.algorithms)
      if (a.stage_end)
        with_memory(s_.algorithm_state, a.name, [&](Algorithm::Tensors& m) {
          a.stage_end(AlgorithmContext{spec_, s_.time, 1.0, course_.num_classes}, s_, m);
        });
    // An evaluation that just ran on these same weights is not repeated (a callback stop right
    // after an interval evaluation), unless a stage-end algorithm (SWA) has changed them since.
    const bool weights_moved = std::any_of(spec_.algorithms.begin(), spec_.algorithms.end(),
                                           [](const Algorithm& a) { return static_cast<bool>(a.stage_end); });
    if (spec_.evaluation && spec_.evaluation->at_stage_end && (weights_moved || evaluated_at_ != s_.time.batch)) evaluate();
    if (spec_.keep_best && spec_.keep_best->restore)
      if (auto what = restore_kept(*spec_.keep_best, s_)) {
        s_.history[record_].restored_best = *what;
        if (what->rfind("restored", 0) == 0) evaluate(false);  // the stage's last metrics are of its weights
      }
    if (!spec_.checkpoints.dir.empty() && spec_.checkpoints.at_stage_end) write_checkpoint(true);
  } else if (interrupted_ && !spec_.checkpoints.dir.empty() && spec_.checkpoints.on_interrupt) {
    write_checkpoint(false);
  }
  hooks_.fire(Event::fit_end);
  for (const auto& l : spec_.loggers) l->flush();
}

void Observers::evaluate(bool callbacks) {
  evaluated_at_ = s_.time.batch;
  if (callbacks) hooks_.fire(Event::eval_start);
  s_.rng = rng_.current();  // eval draws nothing, but reads the state's generator
  EvalSpec eval_spec = spec_.evaluation->spec;
  if (spec_.distributed && !eval_spec.distributed) eval_spec.distributed = spec_.distributed;  // shards, reduced counts
  auto m = [&] {
    const AutocastScope autocast(spec_.precision, spec_.device);  // evaluation at the stage's precision
    return eval(eval_spec, s_);
  }();
  if (!m) throw BatonException(m.error().with_context("evaluation"));
  if (spec_.keep_best && callbacks) keep_if_best(*spec_.keep_best, *m, s_);
  if (hooks_.any_loggers) {
    std::map<std::string, double> flat;
    for (const auto& [set, values] : *m)
      for (const auto& [metric, v] : values) flat[fmt::format("eval/{}/{}", set, metric)] = v;
    hooks_.send(flat);
  }
  if (callbacks) hooks_.fire(Event::eval_end, nullptr, &*m);
}

void Observers::write_checkpoint(bool stage_done) {
  if (!dp_.lead()) return;  // the ranks' states are equal: rank 0 writes
  s_.rng = rng_.current();
  CheckpointMeta meta = spec_.checkpoints.meta;
  // (insert_or_assign of a std::string: GCC 12's -Wstringop-overflow misfires on operator=(const char*))
  meta.extra.insert_or_assign("stage_done", std::string(stage_done ? "1" : "0"));
  const auto path = spec_.checkpoints.dir / checkpoint_name(s_.time.batch, stage_done);
  std::error_code ec;
  std::filesystem::create_directories(spec_.checkpoints.dir, ec);
  if (auto ok = save_checkpoint(s_, path, meta); !ok) throw BatonException(ok.error().with_context("checkpoint"));
  if (!stage_done) prune_checkpoints(spec_.checkpoints.dir, spec_.checkpoints.keep);
  const std::string p = path.string();
  hooks_.fire(Event::checkpoint, nullptr, nullptr, &p);  // after the file exists
}

}  // namespace baton::detail
