// fit, train_step and eval: the training loop.
#include <cmath>

#include <fmt/format.h>
#include <torch/torch.h>

#include "baton/eval.hpp"
#include "baton/fit.hpp"
#include "detail.hpp"

namespace baton {
namespace {

/// One parameter and its optimizer state for the duration of a fit (the map's nodes are stable).
struct Slot {
  torch::Tensor param;
  ParamState* state;
};

/// Applies the spec's carry-over policy to the state's optimizer state and lines it up with the
/// model's parameters.
std::vector<Slot> prepare_optimizer(const TrainingSpec& spec, TrainState& s) {
  const std::string kind(spec.optimizer.kind());
  if (spec.optimizer_carry == Carry::fresh) {
    s.optimizer = OptimizerState{};
  } else if (!s.optimizer.kind.empty() && s.optimizer.kind != kind) {
    detail::raise(ErrorCode::invalid_spec,
                  fmt::format("optimizer: the state holds {} moments and the spec asks to keep them "
                              "(Carry::keep) with {}; moments of one optimizer kind cannot continue "
                              "another: use Carry::fresh",
                              s.optimizer.kind, kind));
  }
  s.optimizer.kind = kind;
  const std::size_t nslots = std::holds_alternative<SgdOptions>(spec.optimizer.options) ? 1 : 3;
  std::vector<Slot> slots;
  for (const auto& item : s.model.module->named_parameters()) {
    ParamState& ps = s.optimizer.params[item.key()];
    ps.slots.resize(nslots);
    slots.push_back(Slot{item.value(), &ps});
  }
  return slots;
}

/// The update rules of torch::optim::SGD and torch::optim::Adam (LibTorch 1.13), op for op, so
/// that results match them bit for bit.
void apply_update(const Optimizer& opt, std::vector<Slot>& slots) {
  torch::NoGradGuard no_grad;
  if (const auto* o = std::get_if<SgdOptions>(&opt.options)) {
    for (auto& sl : slots) {
      auto& p = sl.param;
      if (!p.grad().defined()) continue;
      auto d_p = p.grad();
      if (o->weight_decay != 0) d_p = d_p.add(p, o->weight_decay);
      if (o->momentum != 0) {
        auto& buf = sl.state->slots[0];
        if (!buf.defined()) {
          buf = torch::clone(d_p).detach();
        } else {
          buf.mul_(o->momentum).add_(d_p, 1 - o->dampening);
        }
        d_p = o->nesterov ? d_p.add(buf, o->momentum) : buf;
      }
      p.add_(d_p, -o->lr);
      ++sl.state->step;
    }
    return;
  }
  const auto& o = std::get<AdamOptions>(opt.options);
  for (auto& sl : slots) {
    auto& p = sl.param;
    if (!p.grad().defined()) continue;
    auto grad = p.grad();
    auto& st = *sl.state;
    if (!st.slots[0].defined()) {
      st.slots[0] = torch::zeros_like(p, torch::MemoryFormat::Preserve);
      st.slots[1] = torch::zeros_like(p, torch::MemoryFormat::Preserve);
      if (o.amsgrad) st.slots[2] = torch::zeros_like(p, torch::MemoryFormat::Preserve);
    }
    auto& exp_avg = st.slots[0];
    auto& exp_avg_sq = st.slots[1];
    st.step += 1;
    const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(st.step));
    const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(st.step));
    if (o.weight_decay != 0) grad = grad.add(p, o.weight_decay);
    exp_avg.mul_(o.beta1).add_(grad, 1 - o.beta1);
    exp_avg_sq.mul_(o.beta2).addcmul_(grad, grad, 1 - o.beta2);
    torch::Tensor denom;
    if (o.amsgrad) {
      if (!st.slots[2].defined()) st.slots[2] = torch::zeros_like(p, torch::MemoryFormat::Preserve);
      torch::max_out(st.slots[2], exp_avg_sq, st.slots[2]);
      denom = (st.slots[2].sqrt() / std::sqrt(bias_correction2)).add_(o.eps);
    } else {
      denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(o.eps);
    }
    p.addcdiv_(exp_avg, denom, -o.lr / bias_correction1);
  }
}

/// forward -> loss -> (finite check) -> backward -> update; returns the loss. Changes `s` in place.
double step_in_place(const TrainingSpec& spec, TrainState& s, std::vector<Slot>& slots, const Batch& batch) {
  torch::Tensor output;
  try {
    output = s.model.forward(batch.inputs);
  } catch (const c10::Error& e) {
    detail::raise(ErrorCode::shape_mismatch,
                  fmt::format("the model's forward failed on inputs of shape {}: {}",
                              detail::shape_string(batch.inputs), detail::torch_message(e)));
  }
  const torch::Tensor loss = spec.loss.fn(output, batch.targets);
  if (!loss.defined() || loss.dim() != 0)
    detail::raise(ErrorCode::shape_mismatch,
                  fmt::format("loss \"{}\" must return a scalar, returned {}", spec.loss.name,
                              detail::shape_string(loss)));
  // CPU sync point (cheap on CPU): a non-finite loss must stop us before the step is applied.
  const double value = loss.item<double>();
  if (!std::isfinite(value))
    detail::raise(ErrorCode::non_finite,
                  fmt::format("loss \"{}\" is {} at batch {} (epoch {}, batch {} of it); the step was "
                              "not applied. Lower the learning rate or check the data for NaN/inf",
                              spec.loss.name, value, s.time.batch, s.time.epoch, s.time.batch_in_epoch));
  loss.backward();
  apply_update(spec.optimizer, slots);
  for (auto& sl : slots) sl.param.mutable_grad().reset();  // set_to_none: no memset per step
  return value;
}

void advance(Timestamp& t, std::int64_t batch_size) {
  t.batch += 1;
  t.sample += batch_size;
  t.batch_in_epoch += 1;
  t.sample_in_epoch += batch_size;
}

/// Has `t` reached the end of the stage that began at `start`? Integer arithmetic only.
struct StageEnd {
  TimeUnit unit;           // epoch counts data positions; batch, sample count counters
  std::int64_t target;

  static StageEnd make(const TrainingSpec& spec, const TrainState& s, std::int64_t n) {
    const Timestamp& t = s.time;
    const std::int64_t position = t.epoch * n + t.sample_in_epoch;
    Time d = spec.duration;
    double amount = d.value;
    if (d.unit == TimeUnit::duration) {  // a fraction of the max duration, in its unit
      d.unit = s.max_duration.unit;
      amount = d.value * s.max_duration.value;
    }
    switch (d.unit) {
      case TimeUnit::epoch: return {TimeUnit::epoch, position + std::llround(amount * static_cast<double>(n))};
      case TimeUnit::batch: return {TimeUnit::batch, t.batch + std::llround(amount)};
      case TimeUnit::sample: return {TimeUnit::sample, t.sample + std::llround(amount)};
      case TimeUnit::duration: break;
    }
    return {TimeUnit::batch, t.batch};
  }

  [[nodiscard]] bool reached(const Timestamp& t, std::int64_t n) const {
    switch (unit) {
      case TimeUnit::epoch: return t.epoch * n + t.sample_in_epoch >= target;
      case TimeUnit::batch: return t.batch >= target;
      case TimeUnit::sample: return t.sample >= target;
      case TimeUnit::duration: break;
    }
    return true;
  }
};

Error finished_error(const TrainState& s) {
  return Error{ErrorCode::run_finished,
               fmt::format("the run has reached its max duration {} ({}); nothing left to train. "
                           "Start a new run with init_state, or give it a larger max_duration",
                           s.max_duration.to_string(), s.time.to_string()),
               {}};
}

std::string stage_context(const TrainingSpec& spec) { return fmt::format("stage \"{}\"", spec.name); }

}  // namespace

// The loop, with its event points (where algorithms and callbacks will attach):
//
//   fit_start
//   while not (stage end or run max reached):
//     [epoch_start]            order = epoch_order(seed, epoch)       (cached per epoch)
//     batch_start              batch = data[order[sample_in_epoch : +batch_size]]
//     before_forward           output = model(batch.inputs)
//     after_forward            loss = loss(output, batch.targets)     (non-finite: stop, step not applied)
//     after_loss               loss.backward()
//     after_backward           optimizer update (moments keyed by name), grads set to none
//     batch_end                timestamp += 1 batch
//     [epoch_end]              when the epoch's order is used up (or too short with drop_last)
//   fit_end                    history += {stage, start, end, last loss}
Expected<TrainState> fit(const TrainingSpec& spec, TrainState s) {
  return detail::guard([&]() -> Expected<TrainState> {
    if (auto ok = spec.validate(); !ok) return tl::unexpected(ok.error());
    if (!s.model.module) return fail(ErrorCode::invalid_argument, "fit: the state has no model; make one with init_state");
    if (s.finished()) return tl::unexpected(finished_error(s));

    const Dataset& data = spec.data.train;
    const std::int64_t n = data.size(), bs = spec.data.batch_size;
    const std::uint64_t data_seed = spec.data_seed.value_or(s.seed);
    const StageEnd end = StageEnd::make(spec, s, n);
    const Timestamp start = s.time;
    if (!spec.device.is_cpu()) s.model.module->to(spec.device);
    std::vector<Slot> slots = prepare_optimizer(spec, s);
    s.model.module->train(true);
    detail::GlobalRngScope rng(s.rng);  // dropout etc. draw from the run's RNG

    double last_loss = std::nan("");
    while (!s.finished() && !end.reached(s.time, n)) {
      Timestamp& t = s.time;
      if (t.sample_in_epoch >= n || (spec.data.drop_last && n - t.sample_in_epoch < bs)) {
        t.epoch += 1, t.batch_in_epoch = 0, t.sample_in_epoch = 0;  // epoch end
        continue;
      }
      const auto& cache = s.order_cache;
      if (!cache || cache->epoch != t.epoch || cache->seed != data_seed || cache->size != n ||
          cache->shuffle != spec.data.shuffle) {
        s.order_cache = std::make_shared<const detail::OrderCache>(detail::OrderCache{
            data_seed, t.epoch, n, spec.data.shuffle, data::epoch_order(n, data_seed, t.epoch, spec.data.shuffle)});
      }
      const std::int64_t take = std::min(bs, n - t.sample_in_epoch);
      const auto index = s.order_cache->order.narrow(0, t.sample_in_epoch, take);
      Batch batch{data.inputs.index_select(0, index), data.targets.index_select(0, index)};
      if (!spec.device.is_cpu()) {
        batch.inputs = batch.inputs.to(spec.device, /*non_blocking=*/true);
        batch.targets = batch.targets.to(spec.device, /*non_blocking=*/true);
      }
      last_loss = step_in_place(spec, s, slots, batch);
      advance(t, take);
      if (t.sample_in_epoch >= n || (spec.data.drop_last && n - t.sample_in_epoch < bs))
        t.epoch += 1, t.batch_in_epoch = 0, t.sample_in_epoch = 0;  // epoch end
    }
    s.rng = rng.current();
    s.history.push_back(StageRecord{spec.name, start, s.time, last_loss});
    return std::move(s);
  }).map_error(add_context(stage_context(spec)));
}

Expected<StepResult> train_step(const TrainingSpec& spec, TrainState s, const Batch& batch) {
  return detail::guard([&]() -> Expected<StepResult> {
    if (auto ok = spec.optimizer.validate(); !ok) return tl::unexpected(ok.error());
    if (!spec.loss.fn) return fail(ErrorCode::invalid_spec, "loss: no loss function set");
    if (!s.model.module) return fail(ErrorCode::invalid_argument, "train_step: the state has no model");
    if (s.finished()) return tl::unexpected(finished_error(s));
    if (!batch.inputs.defined() || !batch.targets.defined() || batch.inputs.dim() == 0 ||
        batch.targets.dim() == 0 || batch.inputs.size(0) != batch.targets.size(0))
      return fail(ErrorCode::shape_mismatch,
                  fmt::format("train_step: a batch needs inputs and targets with the same first "
                              "dimension; got inputs {} and targets {}",
                              detail::shape_string(batch.inputs), detail::shape_string(batch.targets)));
    std::vector<Slot> slots = prepare_optimizer(spec, s);
    s.model.module->train(true);
    detail::GlobalRngScope rng(s.rng);
    const double loss = step_in_place(spec, s, slots, batch);
    advance(s.time, batch.inputs.size(0));
    s.rng = rng.current();
    return StepResult{std::move(s), loss};
  }).map_error(add_context(stage_context(spec) + " train_step"));
}

namespace {
/// Puts a module in eval mode for a scope and restores its previous mode.
class EvalModeScope {
 public:
  explicit EvalModeScope(torch::nn::Module& m) : m_(m), was_training_(m.is_training()) { m_.eval(); }
  EvalModeScope(const EvalModeScope&) = delete;
  EvalModeScope& operator=(const EvalModeScope&) = delete;
  ~EvalModeScope() { m_.train(was_training_); }
 private:
  torch::nn::Module& m_;
  bool was_training_;
};
}  // namespace

Expected<Metrics> eval(const EvalSpec& spec, const TrainState& s) {
  return detail::guard([&]() -> Expected<Metrics> {
    if (!s.model.module) return fail(ErrorCode::invalid_argument, "eval: the state has no model");
    if (spec.batch_size <= 0)
      return fail(ErrorCode::invalid_argument, fmt::format("eval: batch_size must be positive, got {}", spec.batch_size));
    if (!spec.loss.fn) return fail(ErrorCode::invalid_argument, "eval: no loss function set");
    torch::NoGradGuard no_grad;
    EvalModeScope eval_mode(*s.model.module);
    detail::GlobalRngScope rng(s.rng);  // restores the caller's generator; the state's is not written
    Metrics metrics;
    for (const auto& [name, ds] : spec.sets) {
      if (auto ok = ds.validate(); !ok) return tl::unexpected(ok.error().with_context(fmt::format("eval set \"{}\"", name)));
      const std::int64_t n = ds.size();
      const bool classes = ds.targets.scalar_type() == torch::kLong && ds.targets.dim() == 1;
      double loss_sum = 0;
      std::int64_t correct = 0;
      std::vector<std::int64_t> topk_correct(spec.top_k.size(), 0);
      std::int64_t num_classes = 0;
      for (std::int64_t i = 0; i < n; i += spec.batch_size) {
        const std::int64_t take = std::min(spec.batch_size, n - i);
        auto x = ds.inputs.narrow(0, i, take);
        auto y = ds.targets.narrow(0, i, take);
        torch::Tensor out;
        try {
          out = s.model.forward(x);
        } catch (const c10::Error& e) {
          return fail(ErrorCode::shape_mismatch, fmt::format("eval set \"{}\": the model's forward failed on inputs of shape {}: {}",
                                                             name, detail::shape_string(x), detail::torch_message(e)));
        }
        auto l = spec.loss.fn(out, y);
        loss_sum += l.item<double>() * static_cast<double>(take);
        if (classes && out.dim() == 2) {
          num_classes = out.size(1);
          correct += out.argmax(1).eq(y).sum().item<std::int64_t>();
          for (std::size_t k = 0; k < spec.top_k.size(); ++k) {
            if (spec.top_k[k] > out.size(1) || spec.top_k[k] < 1) continue;
            auto top = std::get<1>(out.topk(spec.top_k[k], 1));
            topk_correct[k] += top.eq(y.unsqueeze(1)).any(1).sum().item<std::int64_t>();
          }
        }
      }
      auto& m = metrics[name];
      m["loss"] = loss_sum / static_cast<double>(n);
      if (classes && num_classes > 0) {
        m["accuracy"] = static_cast<double>(correct) / static_cast<double>(n);
        for (std::size_t k = 0; k < spec.top_k.size(); ++k)
          if (spec.top_k[k] >= 1 && spec.top_k[k] <= num_classes)
            m[fmt::format("top{}_accuracy", spec.top_k[k])] = static_cast<double>(topk_correct[k]) / static_cast<double>(n);
      }
    }
    return metrics;
  });
}

}  // namespace baton
