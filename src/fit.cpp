// fit, train_step and eval: the training loop.
#include <fnmatch.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <torch/torch.h>

#include "baton/checkpoint.hpp"
#include "baton/distributed.hpp"
#include "baton/eval.hpp"
#include "baton/fit.hpp"
#include "detail.hpp"

namespace baton {
namespace {

bool matches(const std::string& pattern, const std::string& name) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

std::string some_names(const torch::nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& item : m.named_parameters()) names.push_back(item.key());
  if (names.size() > 8) names.resize(8), names.emplace_back("...");
  return fmt::format("{}", fmt::join(names, ", "));
}

/// FNV-1a: a stable hash of the stage name for seeds (the same on every platform).
std::uint64_t stable_hash(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

std::uint64_t stage_seed(std::uint64_t run_seed, std::string_view stage, std::uint64_t stream) {
  std::uint64_t x = run_seed ^ stable_hash(stage) ^ (stream * 0xD1B54A32D192ED03ULL);
  return detail::splitmix64(x);
}

/// One parameter, its optimizer state and its group's hyperparameters, for the duration of a
/// fit (the optimizer-state map's nodes are stable).
struct Slot {
  torch::Tensor param;
  ParamState* state;
  double lr;            // the group's base LR (the schedule multiplies it)
  double weight_decay;
};

/// Builds a model with `factory`, seeded from the run's seed and the stage name, leaving the
/// caller's global generator intact.
Model build_model(const ModelFactory& factory, std::uint64_t seed, std::string_view stage) {
  detail::GlobalRngScope scope(detail::seeded_rng_state(stage_seed(seed, stage, 3)));
  Model m = factory();
  if (!m.module || !m.forward) detail::raise(ErrorCode::invalid_argument, "the model factory returned no module or no forward");
  return m;
}

/// Copies tensors whose name and shape match from `from` into `to`; reports what it did.
void transfer_tensors(const torch::OrderedDict<std::string, torch::Tensor>& from,
                      const torch::OrderedDict<std::string, torch::Tensor>& to, const std::vector<std::string>& fresh,
                      TransferReport& report, std::vector<std::string>* copied_params) {
  torch::NoGradGuard no_grad;
  for (const auto& item : to) {
    const auto* src = from.find(item.key());
    if (src != nullptr && std::any_of(fresh.begin(), fresh.end(), [&](const auto& p) { return matches(p, item.key()); })) {
      report.skipped.push_back(fmt::format("{} (initialized anew by request)", item.key()));
      report.initialized.push_back(item.key());
    } else if (src == nullptr) {
      report.initialized.push_back(item.key());
    } else if (src->sizes() != item.value().sizes()) {
      report.skipped.push_back(fmt::format("{} (shape {} in the source, {} here)", item.key(),
                                           detail::shape_string(*src), detail::shape_string(item.value())));
      report.initialized.push_back(item.key());
    } else {
      item.value().set_data(src->detach().clone());
      report.copied.push_back(item.key());
      if (copied_params) copied_params->push_back(item.key());
    }
  }
  for (const auto& item : from)
    if (to.find(item.key()) == nullptr) report.skipped.push_back(fmt::format("{} (not in the new model)", item.key()));
}

/// Where the next step happens when `spec` runs on `s`: a new stage closes a partial epoch and
/// starts its clock now.
struct StagePosition {
  bool new_stage;
  Timestamp time;
  Timestamp stage_start;
};

StagePosition stage_position(const TrainingSpec& spec, const TrainState& s) {
  if (s.stage == spec.name) return {false, s.time, s.stage_start};
  Timestamp t = s.time;
  if (t.sample_in_epoch > 0) t.epoch += 1, t.batch_in_epoch = 0, t.sample_in_epoch = 0;
  return {true, t, t};
}

/// Applies the stage-start carry-over policies when `spec` begins a new stage. Returns the
/// transfer report when there was a transfer.
std::optional<TransferReport> begin_stage(const TrainingSpec& spec, TrainState& s) {
  const StagePosition pos = stage_position(spec, s);
  if (!pos.new_stage) return std::nullopt;
  s.time = pos.time;
  s.stage = spec.name;
  s.stage_start = pos.stage_start;
  std::optional<TransferReport> report;
  const bool fresh_moments = spec.optimizer_carry == Carry::fresh;
  switch (spec.model.kind) {
    case ModelCarry::Kind::keep:
      break;
    case ModelCarry::Kind::reinitialize: {
      const ModelFactory& factory = spec.model.factory ? spec.model.factory : s.factory;
      s.model = build_model(factory, s.seed, spec.name);
      s.factory = factory;
      s.optimizer = OptimizerState{};  // moments of the old weights mean nothing for new ones
      break;
    }
    case ModelCarry::Kind::transfer: {
      const ModelFactory& factory = spec.model.factory ? spec.model.factory : s.factory;
      Model fresh = build_model(factory, s.seed, spec.name);
      const torch::nn::Module& source = spec.model.source ? *spec.model.source->model.module : *s.model.module;
      TransferReport r;
      std::vector<std::string> copied_params;
      transfer_tensors(source.named_parameters(), fresh.module->named_parameters(), spec.model.fresh, r, &copied_params);
      transfer_tensors(source.named_buffers(), fresh.module->named_buffers(), spec.model.fresh, r, nullptr);
      fresh.module->train(true);
      // Moments continue (with Carry::keep) only for weights copied from the incoming state.
      OptimizerState kept;
      if (!spec.model.source && !fresh_moments) {
        kept.kind = s.optimizer.kind;
        for (const auto& name : copied_params)
          if (auto it = s.optimizer.params.find(name); it != s.optimizer.params.end()) kept.params.insert(*it);
      }
      s.optimizer = std::move(kept);
      s.model = std::move(fresh);
      s.factory = factory;
      report = std::move(r);
      break;
    }
  }
  if (fresh_moments) s.optimizer = OptimizerState{};
  return report;
}

/// Lines the state's optimizer state up with the trainable parameters, resolving groups and
/// frozen patterns. Checks that every pattern matches something.
std::vector<Slot> prepare_optimizer(const TrainingSpec& spec, TrainState& s) {
  const std::string kind(spec.optimizer.kind());
  if (!s.optimizer.kind.empty() && s.optimizer.kind != kind) {
    detail::raise(ErrorCode::invalid_spec,
                  fmt::format("optimizer: the state holds {} moments and the spec asks to keep them "
                              "(Carry::keep) with {}; moments of one optimizer kind cannot continue "
                              "another: use Carry::fresh{}",
                              s.optimizer.kind, kind,
                              s.stage == spec.name ? fmt::format(" in a new stage (this fit continues stage \"{}\")", spec.name) : ""));
  }
  s.optimizer.kind = kind;
  const auto& opt = spec.optimizer;
  const std::size_t nslots = std::holds_alternative<SgdOptions>(opt.options) || std::holds_alternative<AdagradOptions>(opt.options) ? 1 : 3;
  std::vector<std::size_t> group_hits(opt.groups.size(), 0), freeze_hits(spec.freeze.size(), 0);
  std::vector<Slot> slots;
  for (const auto& item : s.model.module->named_parameters()) {
    const std::string& name = item.key();
    bool frozen = false;
    for (std::size_t f = 0; f < spec.freeze.size(); ++f)
      if (matches(spec.freeze[f], name)) frozen = true, ++freeze_hits[f];
    double lr = opt.lr(), wd = opt.weight_decay();
    for (std::size_t g = 0; g < opt.groups.size(); ++g) {
      const auto& group = opt.groups[g];
      if (std::any_of(group.patterns.begin(), group.patterns.end(), [&](const auto& p) { return matches(p, name); })) {
        ++group_hits[g];
        lr = group.lr.value_or(lr), wd = group.weight_decay.value_or(wd);
        break;
      }
    }
    if (frozen) continue;
    ParamState& ps = s.optimizer.params[name];
    ps.slots.resize(nslots);
    slots.push_back(Slot{item.value(), &ps, lr, wd});
  }
  for (std::size_t g = 0; g < opt.groups.size(); ++g)
    if (group_hits[g] == 0)
      detail::raise(ErrorCode::invalid_spec,
                    fmt::format("optimizer.groups[{}]: patterns {} match no parameter (the first one wins; "
                                "an earlier group may take them all); parameters are named like: {}",
                                g, fmt::join(opt.groups[g].patterns, ", "), some_names(*s.model.module)));
  for (std::size_t f = 0; f < spec.freeze.size(); ++f)
    if (freeze_hits[f] == 0)
      detail::raise(ErrorCode::invalid_spec,
                    fmt::format("freeze: pattern \"{}\" matches no parameter; parameters are named like: {}",
                                spec.freeze[f], some_names(*s.model.module)));
  return slots;
}

/// Turns off gradients of frozen parameters for a scope and restores them after.
class FreezeScope {
 public:
  FreezeScope(const TrainingSpec& spec, torch::nn::Module& m) {
    if (spec.freeze.empty()) return;
    for (const auto& item : m.named_parameters()) {
      if (!item.value().requires_grad()) continue;
      if (std::any_of(spec.freeze.begin(), spec.freeze.end(), [&](const auto& p) { return matches(p, item.key()); })) {
        item.value().set_requires_grad(false);
        frozen_.push_back(item.value());
      }
    }
  }
  FreezeScope(const FreezeScope&) = delete;
  FreezeScope& operator=(const FreezeScope&) = delete;
  ~FreezeScope() {
    for (auto& p : frozen_) p.set_requires_grad(true);
  }
 private:
  std::vector<torch::Tensor> frozen_;
};

/// The update rules of torch::optim's SGD, Adam, AdamW, RMSprop and Adagrad (LibTorch 1.13),
/// op for op, so that results match them bit for bit. `scale` is the schedule's multiplier.
void apply_update(const Optimizer& opt, std::vector<Slot>& slots, double scale) {
  torch::NoGradGuard no_grad;
  auto init = [](torch::Tensor& slot, const torch::Tensor& p, double value = 0.0) {
    if (!slot.defined()) slot = torch::full_like(p, value, torch::MemoryFormat::Preserve);
  };
  for (auto& sl : slots) {
    auto& p = sl.param;
    if (!p.grad().defined()) continue;
    auto grad = p.grad();
    auto& st = *sl.state;
    const double lr = sl.lr * scale, wd = sl.weight_decay;
    st.step += 1;
    std::visit(
        [&](const auto& o) {
          using O = std::decay_t<decltype(o)>;
          if constexpr (std::is_same_v<O, SgdOptions>) {
            if (wd != 0) grad = grad.add(p, wd);
            if (o.momentum != 0) {
              auto& buf = st.slots[0];
              if (!buf.defined()) buf = torch::clone(grad).detach();
              else buf.mul_(o.momentum).add_(grad, 1 - o.dampening);
              grad = o.nesterov ? grad.add(buf, o.momentum) : buf;
            }
            p.add_(grad, -lr);
          } else if constexpr (std::is_same_v<O, AdamOptions> || std::is_same_v<O, AdamWOptions>) {
            constexpr bool decoupled = std::is_same_v<O, AdamWOptions>;
            if constexpr (decoupled) {
              if (wd != 0) p.mul_(1 - lr * wd);
            }
            init(st.slots[0], p), init(st.slots[1], p);
            const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(st.step));
            const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(st.step));
            if constexpr (!decoupled) {
              if (wd != 0) grad = grad.add(p, wd);
            }
            st.slots[0].mul_(o.beta1).add_(grad, 1 - o.beta1);
            st.slots[1].mul_(o.beta2).addcmul_(grad, grad, 1 - o.beta2);
            torch::Tensor denom;
            if (o.amsgrad) {
              init(st.slots[2], p);
              torch::max_out(st.slots[2], st.slots[1], st.slots[2]);
              denom = (st.slots[2].sqrt() / std::sqrt(bias_correction2)).add_(o.eps);
            } else {
              denom = (st.slots[1].sqrt() / std::sqrt(bias_correction2)).add_(o.eps);
            }
            p.addcdiv_(st.slots[0], denom, -lr / bias_correction1);
          } else if constexpr (std::is_same_v<O, RmspropOptions>) {
            if (wd != 0) grad = grad.add(p, wd);
            init(st.slots[0], p);
            st.slots[0].mul_(o.alpha).addcmul_(grad, grad, 1 - o.alpha);
            torch::Tensor avg;
            if (o.centered) {
              init(st.slots[2], p);
              st.slots[2].mul_(o.alpha).add_(grad, 1 - o.alpha);
              avg = st.slots[0].addcmul(st.slots[2], st.slots[2], -1).sqrt_().add_(o.eps);
            } else {
              avg = st.slots[0].sqrt().add_(o.eps);
            }
            if (o.momentum > 0) {
              init(st.slots[1], p);
              st.slots[1].mul_(o.momentum).addcdiv_(grad, avg);
              p.add_(st.slots[1], -lr);
            } else {
              p.addcdiv_(grad, avg, -lr);
            }
          } else {  // Adagrad
            init(st.slots[0], p, o.initial_accumulator_value);
            if (wd != 0) grad = grad.add(p, wd);
            const double clr = lr / (1 + static_cast<double>(st.step - 1) * o.lr_decay);
            st.slots[0].addcmul_(grad, grad, 1.0);
            const auto std = st.slots[0].sqrt().add_(o.eps);
            p.addcdiv_(grad, std, -clr);
          }
        },
        opt.options);
  }
}

/// Clips gradients (by global norm, then by value); returns the global norm before clipping,
/// or 0 when not clipping by norm (computing it costs a pass over every gradient).
double clip_gradients(const TrainingSpec& spec, std::vector<Slot>& slots) {
  if (!spec.clip_grad_norm && !spec.clip_grad_value) return 0.0;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (auto& sl : slots)
    if (sl.param.grad().defined()) grads.push_back(sl.param.grad());
  double total = 0.0;
  if (spec.clip_grad_norm && !grads.empty()) {
    std::vector<torch::Tensor> norms;
    norms.reserve(grads.size());
    for (const auto& g : grads) norms.push_back(g.norm(2));
    total = torch::stack(norms).norm(2).item<double>();
    const double coef = *spec.clip_grad_norm / (total + 1e-6);
    if (coef < 1.0)
      for (auto& g : grads) g.mul_(coef);
  }
  if (spec.clip_grad_value)
    for (auto& g : grads) g.clamp_(-*spec.clip_grad_value, *spec.clip_grad_value);
  return total;
}

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
  if (spec.schedule_clock == Clock::run) {
    st.horizon = s.max_duration;
  } else {
    st.horizon = spec.duration.unit == TimeUnit::duration
                     ? Time{spec.duration.value * s.max_duration.value, s.max_duration.unit}
                     : spec.duration;
  }
  return st;
}

/// A warm-up longer than the schedule's horizon never ends: an error, before any step.
void check_warmup(const TrainingSpec& spec, const TrainState& s, std::int64_t n) {
  if (!spec.schedule.warmup) return;
  const ScheduleTime st = schedule_time(spec, s, s.time, s.time, n);
  const double warm = st.convert(*spec.schedule.warmup, TimeUnit::batch);
  const double horizon = st.convert(st.horizon, TimeUnit::batch);
  if (warm > horizon + 1e-9)
    detail::raise(ErrorCode::invalid_spec,
                  fmt::format("schedule: the warm-up ({}, {:.0f} batches) is longer than the {} ({}, {:.0f} "
                              "batches); shorten the warm-up or lengthen the {}",
                              spec.schedule.warmup->to_string(), warm,
                              spec.schedule_clock == Clock::stage ? "stage" : "run", st.horizon.to_string(), horizon,
                              spec.schedule_clock == Clock::stage ? "stage" : "run"));
}

// ---------------------------------------------------------------- data parallel (c10d)

void dist_check(Expected<void> r) {
  if (!r) throw detail::BatonException(r.error());
}

/// Overwrites `tensors` with rank 0's: the tensors of one dtype flattened into one broadcast.
void broadcast_from_rank0(const Distributed& group, const std::vector<torch::Tensor>& tensors, const std::string& what) {
  if (tensors.empty()) return;
  torch::NoGradGuard no_grad;
  std::map<int, std::vector<torch::Tensor>> by_type;
  for (const auto& t : tensors) by_type[static_cast<int>(t.scalar_type())].push_back(t);
  std::vector<torch::Tensor> flats;
  for (const auto& [type, group_tensors] : by_type) {
    std::vector<torch::Tensor> parts;
    for (const auto& t : group_tensors) parts.push_back(t.reshape({-1}));
    flats.push_back(torch::cat(parts));
  }
  dist_check(group.broadcast(flats, 0, what));
  if (group.rank() == 0) return;
  std::size_t g = 0;
  for (const auto& [type, group_tensors] : by_type) {
    std::int64_t offset = 0;
    for (const auto& t : group_tensors) {
      const_cast<torch::Tensor&>(t).copy_(flats[g].narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
    ++g;
  }
}

std::vector<torch::Tensor> buffers_of(const torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& b : m.buffers()) out.push_back(b);
  return out;
}

/// One step's part in data-parallel training: this rank's share of the global batch, and what
/// the gradient all-reduce carries besides the gradients.
struct DataParallelStep {
  const Distributed& group;
  double weight;        ///< this rank's samples / the global batch's: the loss is scaled by it
  bool stop_requested;  ///< this rank was asked to stop (signal, stop flag): all ranks stop
  std::string what;     ///< "gradients at batch 12", for errors
  bool stop_agreed = false;  ///< out: some rank asked to stop
};

/// Largest bucket of gradients in one all-reduce (PyTorch DDP's default, 25 MiB).
constexpr std::int64_t kBucketBytes = 25LL << 20;

/// Sums the ranks' weighted gradients (= the gradient of the global batch's mean loss), in
/// buckets of at most kBucketBytes launched together, plus one small float64 tensor with the
/// weighted loss, the non-finite and stop flags and which parameters have a gradient anywhere.
/// Every rank gets the same bits, so every rank applies the same update. Returns the global loss
/// and whether some rank's loss was not finite.
std::pair<double, bool> all_reduce_gradients(DataParallelStep& dp, std::vector<Slot>& slots, double weighted_loss,
                                             bool non_finite) {
  torch::NoGradGuard no_grad;
  const std::size_t n = slots.size();
  auto meta = torch::zeros({static_cast<std::int64_t>(n) + 3}, torch::kDouble);
  double* m = meta.data_ptr<double>();
  m[0] = weighted_loss, m[1] = non_finite ? 1 : 0, m[2] = dp.stop_requested ? 1 : 0;
  std::vector<torch::Tensor> buckets;
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (std::size_t i = 0; i < n;) {
    const auto type = slots[i].param.scalar_type();
    std::int64_t bytes = 0;
    std::vector<torch::Tensor> parts;
    std::size_t j = i;
    for (; j < n && slots[j].param.scalar_type() == type; ++j) {
      const auto& p = slots[j].param;
      const std::int64_t size = p.numel() * static_cast<std::int64_t>(p.element_size());
      if (j > i && bytes + size > kBucketBytes) break;
      bytes += size;
      if (p.grad().defined()) {
        m[3 + j] = 1;
        parts.push_back(p.grad().reshape({-1}));
      } else {
        parts.push_back(torch::zeros({p.numel()}, p.options()));
      }
    }
    buckets.push_back(torch::cat(parts));
    ranges.emplace_back(i, j);
    i = j;
  }
  buckets.push_back(meta);
  dist_check(dp.group.all_reduce(buckets, Distributed::Op::sum, dp.what));
  for (std::size_t b = 0; b < ranges.size(); ++b) {
    std::int64_t offset = 0;
    for (std::size_t k = ranges[b].first; k < ranges[b].second; ++k) {
      auto& p = slots[k].param;
      if (m[3 + k] > 0) p.mutable_grad() = buckets[b].narrow(0, offset, p.numel()).view_as(p);
      else p.mutable_grad().reset();  // no rank has a gradient for it (unused): as in one process
      offset += p.numel();
    }
  }
  dp.stop_agreed = m[2] > 0;
  return {m[0], m[1] > 0};
}

struct StepOutput {
  double loss;
  double grad_norm;
  bool non_finite = false;  // the loss or a gradient was not finite: no update was applied
  std::string what{};       // which one, for the message
};

/// The loop's observers and transformers for one fit, with what is attached resolved once so
/// that nothing attached costs nothing (a test of an empty vector per event point).
struct Hooks {
  const TrainingSpec& spec;
  TrainState& s;
  std::map<std::string, double> scalars_scratch{};
  bool any_callbacks = !spec.callbacks.empty();
  bool any_loggers = !spec.loggers.empty();
  bool any_before_loss = std::any_of(spec.algorithms.begin(), spec.algorithms.end(), [](const Algorithm& a) { return bool(a.before_loss); });
  bool any_after_backward = std::any_of(spec.algorithms.begin(), spec.algorithms.end(), [](const Algorithm& a) { return bool(a.after_backward); });
  std::optional<std::string> stop_reason{};

  /// Fires `e` at every callback (in order), sends what they log to the loggers. A callback's
  /// request to stop is remembered (the first one wins).
  void fire(Event e, const StepInfo* step = nullptr, const Metrics* metrics = nullptr, const std::string* path = nullptr) {
    if (!any_callbacks) return;
    Scalars log;
    for (const auto& cb : spec.callbacks) {
      EventView view{e, spec, s, step, metrics, path, &log, &s.callback_state[cb.name]};
      if (auto reason = cb.on_event(view); reason && !stop_reason) stop_reason = fmt::format("{}: {}", cb.name, *reason);
    }
    if (!log.values.empty()) send(log.values);
  }
  void send(const std::map<std::string, double>& values) {
    for (const auto& l : spec.loggers) l->log(spec.name, s.time, values);
  }
};

/// forward -> loss -> (finite check) -> backward, over `grad_accum` microbatches; then clip and
/// update. Changes `s` in place. With a non-finite loss (or gradient, when checked) nothing is
/// applied and the output says so.
StepOutput step_in_place(const TrainingSpec& spec, TrainState& s, std::vector<Slot>& slots, const Batch& batch,
                         double lr_scale, Hooks* hooks, const AlgorithmContext* actx, DataParallelStep* dp = nullptr) {
  const std::int64_t total = batch.inputs.size(0);  // data parallel: this rank's shard, maybe empty
  const std::int64_t k = std::min<std::int64_t>(std::max<std::int64_t>(spec.grad_accum, 1), std::max<std::int64_t>(total, 1));
  const std::int64_t micro = (total + k - 1) / k;
  const double rank_weight = dp ? dp->weight : 1.0;
  bool local_non_finite = false;
  double batch_loss = 0.0;
  auto drop_grads = [&] {
    for (auto& sl : slots) sl.param.mutable_grad().reset();
  };
  for (std::int64_t start = 0; start < total; start += micro) {
    const std::int64_t size = std::min(micro, total - start);
    const bool whole = size == total;
    const auto inputs = whole ? batch.inputs : batch.inputs.narrow(0, start, size);
    auto targets = whole ? batch.targets : batch.targets.narrow(0, start, size);
    if (hooks) hooks->fire(Event::before_forward);
    torch::Tensor output;
    try {
      output = s.model.forward(inputs);
    } catch (const c10::Error& e) {
      detail::raise(ErrorCode::shape_mismatch,
                    fmt::format("the model's forward failed on inputs of shape {}: {}",
                                detail::shape_string(inputs), detail::torch_message(e)));
    }
    if (hooks) {
      if (hooks->any_before_loss)
        for (const auto& a : spec.algorithms)
          if (a.before_loss) targets = a.before_loss(*actx, output, std::move(targets));
      hooks->fire(Event::after_forward);
    }
    torch::Tensor loss;
    try {
      loss = spec.loss.fn(output, targets);
    } catch (const c10::Error& e) {
      detail::raise(ErrorCode::shape_mismatch,
                    fmt::format("loss \"{}\" failed on the model's output {} and targets {}: {}", spec.loss.name,
                                detail::shape_string(output), detail::shape_string(targets), detail::torch_message(e)));
    }
    if (!loss.defined() || loss.dim() != 0)
      detail::raise(ErrorCode::shape_mismatch,
                    fmt::format("loss \"{}\" must return a scalar, returned {}", spec.loss.name,
                                detail::shape_string(loss)));
    // CPU sync point (cheap on CPU): a non-finite loss must stop us before the step is applied.
    const double value = loss.item<double>();
    if (!std::isfinite(value)) {
      drop_grads();
      if (dp) {  // the other ranks must hear of it in the all-reduce: every rank skips the step
        local_non_finite = true, batch_loss = value;
        break;
      }
      return {value, 0.0, true, fmt::format("loss \"{}\" is {}", spec.loss.name, value)};
    }
    if (hooks) hooks->fire(Event::after_loss);
    if (whole && !dp) {
      batch_loss = value;
      loss.backward();
    } else {
      // A mean over the batch is the size-weighted mean of the microbatch means (data parallel:
      // of the ranks' shards, so that the summed gradients are those of the global batch's mean).
      const double weight = static_cast<double>(size) / static_cast<double>(total) * rank_weight;
      batch_loss += value * weight;
      (loss * weight).backward();
    }
  }
  if (dp) {
    // The one gradient all-reduce of the step (none per microbatch), before anything reads them.
    const auto [global_loss, any_non_finite] = all_reduce_gradients(*dp, slots, local_non_finite ? 0.0 : batch_loss, local_non_finite);
    if (any_non_finite) {
      drop_grads();
      return {local_non_finite ? batch_loss : global_loss, 0.0, true,
              fmt::format("loss \"{}\" is not finite on {}", spec.loss.name,
                          local_non_finite ? fmt::format("rank {}", dp->group.rank()) : std::string("another rank"))};
    }
    batch_loss = global_loss;
  }
  if (hooks) {
    if (hooks->any_after_backward) {
      std::vector<std::pair<std::string, torch::Tensor>> named;
      for (const auto& item : s.model.module->named_parameters()) named.emplace_back(item.key(), item.value());
      for (const auto& a : spec.algorithms)
        if (a.after_backward) a.after_backward(*actx, named);
    }
    hooks->fire(Event::after_backward);
  }
  const double grad_norm = clip_gradients(spec, slots);
  // Gradients are checked when the policy asks to survive them, or when the norm is known anyway.
  const bool check = spec.on_non_finite != NonFinite::error || spec.clip_grad_norm.has_value();
  if (check) {
    double norm = grad_norm;
    if (!spec.clip_grad_norm) {
      torch::NoGradGuard no_grad;
      std::vector<torch::Tensor> norms;
      for (auto& sl : slots)
        if (sl.param.grad().defined()) norms.push_back(sl.param.grad().norm(2));
      norm = norms.empty() ? 0.0 : torch::stack(norms).norm(2).item<double>();
    }
    if (!std::isfinite(norm)) {
      drop_grads();
      return {batch_loss, norm, true, fmt::format("the gradient norm is {}", norm)};
    }
  }
  if (hooks) hooks->fire(Event::before_optimizer_step);
  apply_update(spec.optimizer, slots, lr_scale);
  drop_grads();  // set_to_none: no memset per step
  return {batch_loss, grad_norm};
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

  static StageEnd make(const TrainingSpec& spec, const Timestamp& t, Time max_duration, std::int64_t n) {
    const std::int64_t position = t.epoch * n + t.sample_in_epoch;
    Time d = spec.duration;
    double amount = d.value;
    if (d.unit == TimeUnit::duration) {  // a fraction of the max duration, in its unit
      d.unit = max_duration.unit;
      amount = d.value * max_duration.value;
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

/// Set by the handlers a `handle_signals` fit installs: how many SIGINT/SIGTERM arrived.
std::atomic<int> g_signals{0};

extern "C" void baton_on_signal(int sig) {
  if (g_signals.fetch_add(1) >= 1) ::_exit(128 + sig);  // the second one: leave now
}

/// Installs SIGINT and SIGTERM handlers for a scope (when asked) and restores the previous ones.
class SignalScope {
 public:
  explicit SignalScope(bool active) : active_(active) {
    if (!active_) return;
    g_signals = 0;
    struct sigaction sa {};
    sa.sa_handler = baton_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;
  ~SignalScope() {
    if (!active_) return;
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  [[nodiscard]] bool raised() const { return active_ && g_signals.load() > 0; }
 private:
  bool active_;
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

/// Rolls the epoch over when its order is used up (or too short for a batch with drop_last).
void roll_epoch(Timestamp& t, std::int64_t n, std::int64_t bs, bool drop_last) {
  if (t.sample_in_epoch >= n || (drop_last && n - t.sample_in_epoch < bs))
    t.epoch += 1, t.batch_in_epoch = 0, t.sample_in_epoch = 0;
}

/// How many whole `every` intervals lie between the stage's start and `t` (integer arithmetic
/// on the unit's counter; epochs count data positions). Interval events fire when it grows.
std::int64_t intervals_done(const Time& every, const Timestamp& t, const Timestamp& origin, std::int64_t n, const Time& max) {
  TimeUnit unit = every.unit;
  double amount = every.value;
  if (unit == TimeUnit::duration) unit = max.unit, amount *= max.value;
  switch (unit) {
    case TimeUnit::batch: return (t.batch - origin.batch) / std::max<std::int64_t>(1, std::llround(amount));
    case TimeUnit::sample: return (t.sample - origin.sample) / std::max<std::int64_t>(1, std::llround(amount));
    case TimeUnit::epoch: {
      const std::int64_t pos = (t.epoch * n + t.sample_in_epoch) - (origin.epoch * n + origin.sample_in_epoch);
      return pos / std::max<std::int64_t>(1, std::llround(amount * static_cast<double>(n)));
    }
    case TimeUnit::duration: break;
  }
  return 0;
}

/// Fraction of the stage done at `t`, in [0, 1] (for algorithms that follow the stage's course).
double stage_progress(const StageEnd& end, const Timestamp& t, const Timestamp& origin, std::int64_t n) {
  double done = 0, total = 1;
  switch (end.unit) {
    case TimeUnit::epoch:
      done = static_cast<double>((t.epoch * n + t.sample_in_epoch) - (origin.epoch * n + origin.sample_in_epoch));
      total = static_cast<double>(end.target - (origin.epoch * n + origin.sample_in_epoch));
      break;
    case TimeUnit::batch:
      done = static_cast<double>(t.batch - origin.batch), total = static_cast<double>(end.target - origin.batch);
      break;
    case TimeUnit::sample:
      done = static_cast<double>(t.sample - origin.sample), total = static_cast<double>(end.target - origin.sample);
      break;
    case TimeUnit::duration: break;
  }
  return total > 0 ? std::clamp(done / total, 0.0, 1.0) : 1.0;
}

/// Classes of the training data: max label + 1 for int64 class labels, else 0.
std::int64_t data_classes(const Dataset& d) {
  if (!d.targets.defined() || d.targets.scalar_type() != torch::kLong || d.targets.dim() != 1 || d.targets.numel() == 0) return 0;
  return d.targets.max().item<std::int64_t>() + 1;
}

/// Keeps the newest `keep` interval checkpoints (`ckpt-<10 digits>.baton`) of `dir`; stage-end
/// checkpoints and other files are never touched.
void prune_checkpoints(const std::filesystem::path& dir, int keep) {
  if (keep <= 0) return;
  std::vector<std::filesystem::path> interval;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    if (f.size() == 21 && f.rfind("ckpt-", 0) == 0 && f.ends_with(".baton") &&
        std::all_of(f.begin() + 5, f.begin() + 15, [](char c) { return c >= '0' && c <= '9'; }))
      interval.push_back(e.path());
  }
  std::sort(interval.begin(), interval.end());
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < interval.size(); ++i) std::filesystem::remove(interval[i], ec);
}

}  // namespace

// The loop, with its event points ([event] fires callbacks; "algorithms:" says which algorithm
// hook runs there, in the order of spec.algorithms):
//
//   fit_start                  a new stage (spec.name differs from state.stage): close a partial
//                              epoch, apply model and optimizer carry-over; resolve groups, freeze
//   while not (stage end or run max reached or a stop):
//     [epoch_start]            order = epoch_order(size, seed, epoch)         (cached per epoch)
//     [batch_start]            batch = data[order[sample_in_epoch : +batch_size]]
//     [after_data]             algorithms: after_data(batch) -> batch   (augmentation, MixUp, ...)
//                              lr = group lr * schedule(time on the run's or the stage's clock)
//     for each microbatch (grad_accum):
//       [before_forward]       output = model(micro.inputs)
//       [after_forward]        algorithms: before_loss(output, targets) -> targets (smoothing)
//                              loss = loss(output, targets)  (non-finite: policy, no step)
//       [after_loss]           (loss * micro/batch).backward()
//     [after_backward]         algorithms: after_backward(gradients)   (scheduled freezing)
//                              clip by global norm, then by value; (checked: non-finite grads)
//     [before_optimizer_step]  optimizer update (moments keyed by name), grads set to none
//     [batch_end]              timestamp += 1 batch; algorithms: batch_end(weights) (EMA, SWA)
//     [epoch_end]              when the epoch's order is used up (or too short with drop_last)
//     [eval_start/eval_end]    at spec.evaluation.every (from the stage's start)
//     [checkpoint]             at spec.checkpoints.every (from the stage's start)
//     stop check               a callback's reason, the stop flag, a signal
//   at the stage's end:        algorithms: stage_end(state) (SWA); [eval_*]; [checkpoint] -end
//   on interruption:           [checkpoint]
//   [fit_end]                  history: {stage, start, end, last loss, lr, grad norm, transfer, ...}
namespace {
Expected<TrainState> fit_impl(const TrainingSpec& spec, TrainState s, std::optional<std::int64_t> max_batches) {
  return detail::guard([&]() -> Expected<TrainState> {
    if (auto ok = spec.validate(); !ok) return tl::unexpected(ok.error());
    if (!s.model.module) return fail(ErrorCode::invalid_argument, "fit: the state has no model; make one with init_state");
    if (s.finished()) return tl::unexpected(finished_error(s));

    const Dataset& data = spec.data.train;
    const std::int64_t n = data.size(), bs = spec.data.batch_size;
    auto transfer = begin_stage(spec, s);
    check_warmup(spec, s, n);
    // The order is a function of (seed, epoch) and the data's size only, not of the stage: a
    // stage split in two stages with the same data trains the same bits as one stage.
    const std::uint64_t data_seed = spec.data_seed.value_or(s.seed);
    const Timestamp start = s.time;
    const Timestamp origin = spec.duration_anchor == Anchor::stage ? s.stage_start : start;
    const StageEnd end = StageEnd::make(spec, origin, s.max_duration, n);
    const std::int64_t batch_limit = max_batches ? start.batch + *max_batches : std::numeric_limits<std::int64_t>::max();
    if (!spec.device.is_cpu()) s.model.module->to(spec.device);
    std::vector<Slot> slots = prepare_optimizer(spec, s);
    FreezeScope frozen(spec, *s.model.module);
    s.model.module->train(true);
    detail::GlobalRngScope rng(s.rng);  // dropout, augmentation etc. draw from the run's RNG
    // Data parallel: every rank draws from the same stream (the state's), so states stay equal.
    const Distributed* dist = spec.distributed.get();
    const std::vector<torch::Tensor> buffers = dist ? buffers_of(*s.model.module) : std::vector<torch::Tensor>{};
    if (dist) {
      // Every rank must start from the same point of the same run; then rank 0's weights win
      // (a model built from the same seed is equal anyway; this also covers a user's own init).
      auto here = torch::tensor(std::vector<std::int64_t>{s.time.batch, s.time.sample, n, bs, static_cast<std::int64_t>(data_seed)},
                                torch::kLong);
      auto rank0 = here.clone();
      dist_check(dist->broadcast({rank0}, 0, "the starting point"));
      if (!here.equal(rank0))
        detail::raise(ErrorCode::invalid_argument,
                      fmt::format("distributed: rank {} starts at batch {} (sample {}) with {} training samples, "
                                  "global batch {} and data seed {}, rank 0 at batch {} (sample {}) with {}, {} and {}; "
                                  "every rank must start from the same state (the same checkpoint) with the same spec",
                                  dist->rank(), s.time.batch, s.time.sample, n, bs, here[4].item<std::int64_t>(),
                                  rank0[0].item<std::int64_t>(), rank0[1].item<std::int64_t>(), rank0[2].item<std::int64_t>(),
                                  rank0[3].item<std::int64_t>(), rank0[4].item<std::int64_t>()));
      std::vector<torch::Tensor> all = buffers;
      for (const auto& p : s.model.module->parameters()) all.push_back(p);
      broadcast_from_rank0(*dist, all, "the initial weights and buffers");
    }
    bool dist_stop = false;  // data parallel: some rank was asked to stop (agreed in the last step)

    // One record per stage: a fit that continues the stage extends its record, so a stage split
    // into several fits leaves the same history as one fit.
    if (transfer || s.history.empty() || s.history.back().name != spec.name || !(s.history.back().end == start))
      s.history.push_back(StageRecord{spec.name, start, start, std::nan(""), 0.0, 0.0, std::move(transfer), false});
    const std::size_t rec = s.history.size() - 1;
    s.history[rec].interrupted = false;

    const bool attached = !spec.algorithms.empty() || !spec.callbacks.empty() || !spec.loggers.empty() ||
                          spec.evaluation.has_value() || !spec.checkpoints.dir.empty();
    Hooks hooks{spec, s};
    Hooks* h = attached ? &hooks : nullptr;
    const std::int64_t num_classes = spec.algorithms.empty() ? 0 : data_classes(data);

    std::optional<std::int64_t> evaluated_at;  // the batch count of this fit's last evaluation
    auto run_eval = [&]() {
      evaluated_at = s.time.batch;
      hooks.fire(Event::eval_start);
      s.rng = rng.current();  // eval draws nothing, but reads the state's generator
      EvalSpec eval_spec = spec.evaluation->spec;
      if (dist && !eval_spec.distributed) eval_spec.distributed = spec.distributed;  // shards, reduced counts
      auto m = eval(eval_spec, s);
      if (!m) throw detail::BatonException(m.error().with_context("evaluation"));
      if (hooks.any_loggers) {
        std::map<std::string, double> flat;
        for (const auto& [set, values] : *m)
          for (const auto& [metric, v] : values) flat[fmt::format("eval/{}/{}", set, metric)] = v;
        hooks.send(flat);
      }
      hooks.fire(Event::eval_end, nullptr, &*m);
    };
    auto write_checkpoint = [&](bool stage_done) {
      if (dist && dist->rank() != 0) return;  // the ranks' states are equal: rank 0 writes
      s.rng = rng.current();
      CheckpointMeta meta = spec.checkpoints.meta;
      // (insert_or_assign of a std::string: GCC 12's -Wstringop-overflow misfires on operator=(const char*))
      meta.extra.insert_or_assign("stage_done", std::string(stage_done ? "1" : "0"));
      const auto path = spec.checkpoints.dir / fmt::format("ckpt-{:010}{}.baton", s.time.batch, stage_done ? "-end" : "");
      std::error_code ec;
      std::filesystem::create_directories(spec.checkpoints.dir, ec);
      if (auto ok = save_checkpoint(s, path, meta); !ok) throw detail::BatonException(ok.error().with_context("checkpoint"));
      if (!stage_done) prune_checkpoints(spec.checkpoints.dir, spec.checkpoints.keep);
      const std::string p = path.string();
      hooks.fire(Event::checkpoint, nullptr, nullptr, &p);
    };

    StepOutput last{std::nan(""), 0.0};
    double last_lr = 0.0;
    bool interrupted = false, any_step = false;
    SignalScope signals(spec.handle_signals);
    if (h) hooks.fire(Event::fit_start);
    for (Timestamp& t = s.time; !s.finished() && !end.reached(t, n) && t.batch < batch_limit;) {
      const bool stop_here = (spec.stop && spec.stop->load()) || signals.raised();
      if (dist ? dist_stop : stop_here) {  // checked between batches only; data parallel: agreed
        interrupted = true;
        break;
      }
      if (hooks.stop_reason) break;
      roll_epoch(t, n, bs, spec.data.drop_last);
      if (s.finished() || end.reached(t, n)) break;
      const auto& cache = s.order_cache;
      if (!cache || cache->epoch != t.epoch || cache->seed != data_seed || cache->size != n ||
          cache->shuffle != spec.data.shuffle) {
        s.order_cache = std::make_shared<const detail::OrderCache>(detail::OrderCache{
            data_seed, t.epoch, n, spec.data.shuffle, data::epoch_order(n, data_seed, t.epoch, spec.data.shuffle)});
      }
      if (h && t.sample_in_epoch == 0) hooks.fire(Event::epoch_start);
      if (h) hooks.fire(Event::batch_start);
      const std::int64_t take = std::min(bs, n - t.sample_in_epoch);
      // Data parallel: the global batch is cut from the one order; this rank takes its shard.
      const auto [shard_at, shard_size] = dist ? dist->shard(take) : std::pair<std::int64_t, std::int64_t>{0, take};
      const auto index = s.order_cache->order.narrow(0, t.sample_in_epoch + shard_at, shard_size);
      Batch batch{data.inputs.index_select(0, index), data.targets.index_select(0, index)};
      if (!spec.device.is_cpu()) {
        batch.inputs = batch.inputs.to(spec.device, /*non_blocking=*/true);
        batch.targets = batch.targets.to(spec.device, /*non_blocking=*/true);
      }
      const Timestamp before = t;
      const AlgorithmContext actx{spec, before, h ? stage_progress(end, before, origin, n) : 0.0, num_classes};
      if (h) {
        for (const auto& a : spec.algorithms)
          if (a.after_data) batch = a.after_data(actx, std::move(batch));
        hooks.fire(Event::after_data);
      }
      const double scale = spec.schedule(schedule_time(spec, s, t, s.stage_start, n));
      std::optional<DataParallelStep> dp;
      if (dist) {
        // Buffers (BatchNorm statistics) follow rank 0 before each forward, as DDP's default.
        broadcast_from_rank0(*dist, buffers, fmt::format("buffers at batch {}", t.batch));
        dp.emplace(DataParallelStep{*dist, static_cast<double>(shard_size) / static_cast<double>(take), stop_here,
                                    fmt::format("gradients at batch {}", t.batch)});
      }
      StepOutput out = step_in_place(spec, s, slots, batch, scale, h, &actx, dp ? &*dp : nullptr);
      if (dp) dist_stop = dp->stop_agreed;
      if (out.non_finite) {
        const std::string where = fmt::format("at batch {} (epoch {}, batch {} of it)", t.batch, t.epoch, t.batch_in_epoch);
        if (spec.on_non_finite == NonFinite::error)
          detail::raise(ErrorCode::non_finite,
                        fmt::format("{} {}; the step was not applied. Lower the learning rate, clip gradients, "
                                    "check the data for NaN/inf, or set the non-finite policy to skip or stop",
                                    out.what, where));
        if (spec.on_non_finite == NonFinite::stop) {
          hooks.stop_reason = fmt::format("non-finite: {} {}; stopped before the step", out.what, where);
          break;
        }
        s.history[rec].skipped_batches += 1;  // skip: the batch is consumed, nothing applied
      } else {
        last = out;
      }
      last_lr = spec.optimizer.lr() * scale;
      any_step = true;
      advance(t, take);
      if (h) {
        const StepInfo info{out.loss, last_lr, out.grad_norm, take, out.non_finite};
        for (const auto& a : spec.algorithms)
          if (a.batch_end) a.batch_end(actx, s, s.algorithm_state[a.name]);
        hooks.fire(Event::batch_end, &info);
      }
      const std::int64_t epoch_before = t.epoch;
      roll_epoch(t, n, bs, spec.data.drop_last);
      auto& r = s.history[rec];
      r.end = t;
      if (!out.non_finite) r.last_loss = last.loss, r.last_grad_norm = last.grad_norm;
      r.last_lr = last_lr;
      if (h) {
        if (t.epoch != epoch_before) hooks.fire(Event::epoch_end);
        const bool at_end = end.reached(t, n) || s.finished();
        auto crossed = [&](const std::optional<Time>& every) {
          return every && intervals_done(*every, t, s.stage_start, n, s.max_duration) >
                              intervals_done(*every, before, s.stage_start, n, s.max_duration);
        };
        if (spec.evaluation && crossed(spec.evaluation->every) && !(at_end && spec.evaluation->at_stage_end)) run_eval();
        if (!spec.checkpoints.dir.empty() && crossed(spec.checkpoints.every) && !(at_end && spec.checkpoints.at_stage_end))
          write_checkpoint(false);
      }
    }
    s.rng = rng.current();
    // Data parallel: each rank's last forward updated its own buffers; rank 0's are the state's.
    if (dist) broadcast_from_rank0(*dist, buffers, "the final buffers");
    auto& r = s.history[rec];
    r.end = s.time;
    r.interrupted = interrupted;
    if (hooks.stop_reason) r.stop_reason = *hooks.stop_reason;
    if (h) {
      // The stage ends when its duration (or the run's) is reached, or a callback ended it.
      const bool stage_done = end.reached(s.time, n) || s.finished() || hooks.stop_reason.has_value();
      if (stage_done && (any_step || hooks.stop_reason)) {
        for (const auto& a : spec.algorithms)
          if (a.stage_end) {
            const AlgorithmContext actx{spec, s.time, 1.0, num_classes};
            a.stage_end(actx, s, s.algorithm_state[a.name]);
          }
        // An evaluation that just ran on these same weights is not repeated (a callback stop right
        // after an interval evaluation), unless a stage-end algorithm (SWA) has changed them since.
        const bool weights_moved = std::any_of(spec.algorithms.begin(), spec.algorithms.end(),
                                               [](const Algorithm& a) { return static_cast<bool>(a.stage_end); });
        if (spec.evaluation && spec.evaluation->at_stage_end && (weights_moved || evaluated_at != s.time.batch)) run_eval();
        if (!spec.checkpoints.dir.empty() && spec.checkpoints.at_stage_end) write_checkpoint(true);
      } else if (interrupted && !spec.checkpoints.dir.empty() && spec.checkpoints.on_interrupt) {
        write_checkpoint(false);
      }
      hooks.fire(Event::fit_end);
      for (const auto& l : spec.loggers) l->flush();
    }
    return std::move(s);
  }).map_error(add_context(stage_context(spec)));
}
}  // namespace

Expected<TrainState> fit(const TrainingSpec& spec, TrainState state) { return fit_impl(spec, std::move(state), std::nullopt); }

Expected<TrainState> fit(const TrainingSpec& spec, TrainState state, std::int64_t max_batches) {
  if (max_batches < 0)
    return tl::unexpected(Error{ErrorCode::invalid_argument, fmt::format("fit: max_batches must be >= 0, got {}", max_batches),
                                {stage_context(spec)}});
  return fit_impl(spec, std::move(state), max_batches);
}

Expected<StepResult> train_step(const TrainingSpec& spec, TrainState s, const Batch& batch) {
  return detail::guard([&]() -> Expected<StepResult> {
    if (auto ok = spec.optimizer.validate(); !ok) return tl::unexpected(ok.error());
    if (!spec.loss.fn) return fail(ErrorCode::invalid_spec, "loss: no loss function set");
    if (!s.model.module) return fail(ErrorCode::invalid_argument, "train_step: the state has no model");
    if (spec.distributed)
      return fail(ErrorCode::invalid_spec,
                  "train_step: a spec with a process group (distributed) trains with fit, which shards the data and "
                  "averages gradients; train_step takes one batch of one process: clear spec.distributed");
    if (s.finished()) return tl::unexpected(finished_error(s));
    if (!batch.inputs.defined() || !batch.targets.defined() || batch.inputs.dim() == 0 ||
        batch.targets.dim() == 0 || batch.inputs.size(0) != batch.targets.size(0) || batch.inputs.size(0) == 0)
      return fail(ErrorCode::shape_mismatch,
                  fmt::format("train_step: a batch needs inputs and targets with the same, non-zero first "
                              "dimension; got inputs {} and targets {}",
                              detail::shape_string(batch.inputs), detail::shape_string(batch.targets)));
    const std::int64_t b = batch.inputs.size(0);
    // Without training data in the spec, an epoch is this one batch (for the schedule's units).
    const std::int64_t n = spec.data.train.size() > 0 ? spec.data.train.size() : b;
    begin_stage(spec, s);
    std::vector<Slot> slots = prepare_optimizer(spec, s);
    FreezeScope frozen(spec, *s.model.module);
    s.model.module->train(true);
    detail::GlobalRngScope rng(s.rng);
    roll_epoch(s.time, n, std::max<std::int64_t>(spec.data.batch_size, 1), spec.data.drop_last);
    const double scale = spec.schedule(schedule_time(spec, s, s.time, s.stage_start, n));
    // The spec's algorithms apply as in fit (callbacks and loggers are fit's business).
    TrainingSpec quiet = spec;
    quiet.callbacks.clear(), quiet.loggers.clear();
    Hooks hooks{quiet, s};
    const Timestamp before = s.time;
    const StageEnd end = StageEnd::make(spec, spec.duration_anchor == Anchor::stage ? s.stage_start : before, s.max_duration, n);
    const AlgorithmContext actx{spec, before, stage_progress(end, before, spec.duration_anchor == Anchor::stage ? s.stage_start : before, n),
                                spec.algorithms.empty() ? 0 : std::max(data_classes(spec.data.train), data_classes(Dataset{batch.inputs, batch.targets, ""}))};
    Batch b2 = batch;
    for (const auto& a : spec.algorithms)
      if (a.after_data) b2 = a.after_data(actx, std::move(b2));
    const StepOutput out = step_in_place(quiet, s, slots, b2, scale, spec.algorithms.empty() ? nullptr : &hooks, &actx);
    if (out.non_finite)
      detail::raise(ErrorCode::non_finite, fmt::format("{} at batch {}; the step was not applied", out.what, s.time.batch));
    for (const auto& a : spec.algorithms)
      if (a.batch_end) a.batch_end(actx, s, s.algorithm_state[a.name]);
    advance(s.time, b);
    roll_epoch(s.time, n, std::max<std::int64_t>(spec.data.batch_size, 1), spec.data.drop_last);
    s.rng = rng.current();
    return StepResult{std::move(s), out.loss, spec.optimizer.lr() * scale, out.grad_norm};
  }).map_error(add_context(stage_context(spec) + " train_step"));
}

namespace {
/// Runs the loop's timestamp arithmetic without training: from `now`, until the stage that began
/// at `origin` has run `spec.duration` (or the run's max duration is reached).
Timestamp simulate(const TrainingSpec& spec, Timestamp now, const Timestamp& origin, Time max) {
  const std::int64_t n = spec.data.train.size(), bs = spec.data.batch_size;
  const StageEnd end = StageEnd::make(spec, origin, max, n);
  while (!detail::reached_max(now, max) && !end.reached(now, n)) {
    roll_epoch(now, n, bs, spec.data.drop_last);
    if (detail::reached_max(now, max) || end.reached(now, n)) break;
    advance(now, std::min(bs, n - now.sample_in_epoch));
    roll_epoch(now, n, bs, spec.data.drop_last);
  }
  return now;
}
}  // namespace

Expected<Timestamp> fit_end(const TrainingSpec& spec, const TrainState& s) {
  if (auto ok = spec.validate(); !ok) return tl::unexpected(ok.error().with_context(stage_context(spec)));
  if (s.finished()) return s.time;
  const StagePosition pos = stage_position(spec, s);
  return simulate(spec, pos.time, spec.duration_anchor == Anchor::stage ? pos.stage_start : pos.time, s.max_duration);
}

Expected<Timestamp> stage_end(const TrainingSpec& spec, const TrainState& s) {
  if (auto ok = spec.validate(); !ok) return tl::unexpected(ok.error().with_context(stage_context(spec)));
  if (s.finished()) return s.time;
  const StagePosition pos = stage_position(spec, s);
  return simulate(spec, pos.time, pos.stage_start, s.max_duration);
}

Expected<double> scheduled_lr(const TrainingSpec& spec, const TrainState& s) {
  const std::int64_t n = spec.data.train.size();
  if (n <= 0 || spec.data.batch_size <= 0)
    return fail(ErrorCode::invalid_spec, "scheduled_lr: the spec needs training data and a positive batch size");
  const StagePosition pos = stage_position(spec, s);
  Timestamp t = pos.time;
  roll_epoch(t, n, spec.data.batch_size, spec.data.drop_last);
  return spec.optimizer.lr() * spec.schedule(schedule_time(spec, s, t, pos.stage_start, n));
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
    if (!spec.weights.empty()) {
      // Evaluate a copy that holds the weights the algorithm keeps (e.g. its EMA).
      auto it = s.algorithm_state.find(spec.weights);
      if (it == s.algorithm_state.end() || it->second.empty())
        return fail(ErrorCode::invalid_argument,
                    fmt::format("eval: weights \"{}\" requested, but the state holds none; add the algorithm \"{}\" "
                                "to the training spec and train at least one step with it",
                                spec.weights, spec.weights));
      TrainState swapped = s;
      auto take = [&](const std::vector<std::pair<std::string, torch::Tensor>>& named) -> Expected<void> {
        for (const auto& [name, t] : named) {
          auto jt = it->second.find(name);
          if (jt == it->second.end() || !jt->second.defined() || jt->second.sizes() != t.sizes())
            return fail(ErrorCode::shape_mismatch,
                        fmt::format("eval: weights \"{}\" have no tensor \"{}\" of shape {} (the model changed since "
                                    "they were recorded?)", spec.weights, name, detail::shape_string(t)));
          t.copy_(jt->second);
        }
        return {};
      };
      if (auto ok = take(swapped.named_parameters()); !ok) return tl::unexpected(ok.error());
      if (auto ok = take(swapped.named_buffers()); !ok) return tl::unexpected(ok.error());
      EvalSpec plain = spec;
      plain.weights.clear();
      return eval(plain, swapped);
    }
    EvalModeScope eval_mode(*s.model.module);
    detail::GlobalRngScope rng(s.rng);  // restores the caller's generator; the state's is not written
    Metrics metrics;
    for (const auto& [name, ds] : spec.sets) {
      if (auto ok = ds.validate(); !ok) return tl::unexpected(ok.error().with_context(fmt::format("eval set \"{}\"", name)));
      const std::int64_t n = spec.limit ? std::min(ds.size(), *spec.limit) : ds.size();
      if (n <= 0) return fail(ErrorCode::invalid_argument, fmt::format("eval set \"{}\": no samples to evaluate", name));
      const bool classes = ds.targets.scalar_type() == torch::kLong && ds.targets.dim() == 1;
      double loss_sum = 0;
      std::int64_t correct = 0;
      std::vector<std::int64_t> topk_correct(spec.top_k.size(), 0);
      std::int64_t num_classes = 0;
      // Across ranks: this rank's contiguous shard of the set; sums and counts reduced below.
      const auto [lo, count] = spec.distributed ? spec.distributed->shard(n) : std::pair<std::int64_t, std::int64_t>{0, n};
      for (std::int64_t i = lo; i < lo + count; i += spec.batch_size) {
        const std::int64_t take = std::min(spec.batch_size, lo + count - i);
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
      if (spec.distributed) {
        std::vector<double> sums{loss_sum, static_cast<double>(correct)};
        for (auto c : topk_correct) sums.push_back(static_cast<double>(c));
        auto summed = torch::tensor(sums, torch::kDouble);
        auto most = torch::tensor(std::vector<std::int64_t>{num_classes}, torch::kLong);  // a rank with an empty shard saw none
        const std::string what = fmt::format("the metrics of eval set \"{}\"", name);
        if (auto ok = spec.distributed->all_reduce({summed}, Distributed::Op::sum, what); !ok) return tl::unexpected(ok.error());
        if (auto ok = spec.distributed->all_reduce({most}, Distributed::Op::max, what); !ok) return tl::unexpected(ok.error());
        loss_sum = summed[0].item<double>();
        correct = std::llround(summed[1].item<double>());
        for (std::size_t k = 0; k < topk_correct.size(); ++k) topk_correct[k] = std::llround(summed[2 + static_cast<std::int64_t>(k)].item<double>());
        num_classes = most[0].item<std::int64_t>();
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
