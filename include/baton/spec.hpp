#pragma once
/// \file spec.hpp
/// TrainingSpec: an immutable description of one stage of training. Build variants with the
/// copy-returning `with_*` functions; check one with `validate()`.
///
/// ```cpp
/// const baton::TrainingSpec warmup{
///     .name = "warmup",
///     .data = {.train = *train, .batch_size = 128},
///     .loss = baton::loss::cross_entropy(),
///     .optimizer = baton::optim::sgd({.lr = 0.05, .momentum = 0.9}),
///     .duration = "1ep"_t,
/// };
/// const auto main = warmup.with_name("main").with_duration("3ep"_t);
/// ```

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <c10/core/Device.h>

#include "baton/checkpoint.hpp"
#include "baton/data.hpp"
#include "baton/eval.hpp"
#include "baton/events.hpp"
#include "baton/error.hpp"
#include "baton/loss.hpp"
#include "baton/optim.hpp"
#include "baton/schedule.hpp"
#include "baton/state.hpp"
#include "baton/time.hpp"

namespace baton {

class Distributed;  // distributed.hpp

/// Training data and how it is batched.
struct DataSpec {
  Dataset train{};
  std::int64_t batch_size = 64;
  bool shuffle = true;     ///< order from (seed, epoch); false: dataset order
  bool drop_last = false;  ///< drop the last incomplete batch of each epoch
  /// Threads that make the next batches while the step runs (0: the loop makes each batch when
  /// it needs it). Any number gives the same bits: a batch is a pure function of its indices.
  int workers = 0;
  int prefetch = 2;  ///< batches made ahead, per worker (bounds the memory of the queue)
};

/// What a stage does with the model it finds in the state, when the stage begins.
///
/// ```cpp
/// // Fine-tune with a new 5-class head: copy every parameter whose name and shape match.
/// auto finetune = main.with_name("finetune").with_model(baton::ModelCarry::transfer(make_net_5));
/// ```
struct ModelCarry {
  enum class Kind {
    keep,          ///< continue training the state's model
    reinitialize,  ///< a freshly initialized model (seeded from the run's seed and stage name)
    transfer,      ///< a fresh model that takes every parameter and buffer whose name and shape
                   ///< match from `source` (default: the incoming state)
  };
  Kind kind = Kind::keep;
  ModelFactory factory{};                    ///< architecture for reinitialize/transfer; default: the state's
  std::shared_ptr<const TrainState> source{};  ///< transfer from this state instead of the incoming one
  std::vector<std::string> fresh{};          ///< transfer: name patterns initialized anew even if they match

  /// A copy that initializes parameters matching `patterns` anew in a transfer (a new head of the
  /// same shape): `ModelCarry::transfer().reinitializing({"head.*"})`.
  [[nodiscard]] ModelCarry reinitializing(std::vector<std::string> patterns) const {
    ModelCarry copy = *this;
    copy.fresh = std::move(patterns);
    return copy;
  }

  static ModelCarry keep() { return {}; }
  static ModelCarry reinitialize(ModelFactory factory = {}) { return {Kind::reinitialize, std::move(factory), nullptr, {}}; }
  static ModelCarry transfer(ModelFactory factory = {}, std::shared_ptr<const TrainState> source = nullptr) {
    return {Kind::transfer, std::move(factory), std::move(source), {}};
  }
};

/// Evaluation during a fit: at intervals from the stage's start and at the stage's end. The
/// results go to the callbacks (eval_end, e.g. early stopping) and the loggers.
struct EvalSchedule {
  EvalSpec spec{};
  std::optional<Time> every{};  ///< in any unit, counted from the stage's start; none: stage end only
  bool at_stage_end = true;
};

/// Keep the weights of the best evaluation: at every evaluation of the stage whose `metric` beats
/// the kept one (ties keep the earlier), the state records its parameters and buffers in
/// `algorithm_state["keep_best"]` (with the value and the batch), so the best survives splits,
/// copies and resumes like any part of the state. `baton::run` also writes that state to the run
/// directory (`best-<stage>.baton`, or `best.baton` for the run scope).
struct KeepBest {
  enum class Scope {
    stage,  ///< this stage's evaluations only: a fine-tune is not judged against warm-up's score
    run,    ///< the best kept so far in the run, by any stage that keeps its best
  };
  std::string metric = "val/accuracy";  ///< "<eval set>/<metric>", one the stage's evaluation gives
  bool maximize = true;                  ///< true: larger is better (accuracy); false: a loss
  Scope scope = Scope::stage;
  /// End the stage with the kept weights (parameters and buffers; the optimizer's moments and the
  /// clock go on from the last step). Recorded in `StageRecord::restored_best`; the stage's last
  /// evaluation is then of those weights.
  bool restore = false;
  /// Where a run directory (run.hpp) keeps the best state: "best-<stage>.baton", or "best.baton"
  /// when the scope is the run.
  [[nodiscard]] std::string file_name(const std::string& stage) const {
    return scope == Scope::run ? "best.baton" : "best-" + stage + ".baton";
  }
};

/// Checkpoints a fit writes by itself: files `ckpt-<batch, 10 digits>.baton` in `dir` at intervals
/// from the stage's start, `ckpt-<batch>-end.baton` when the stage ends, and one when the fit
/// is interrupted (stop flag or signal). An interval that falls on the stage's last batch writes
/// nothing: the state there is not yet the stage's end (stage-end algorithms and evaluation
/// follow), so only the stage-end checkpoint (or the returned state) holds that point. Writes are atomic (see checkpoint.hpp). A failed
/// write is an error of the fit (the state in memory is lost to the caller only if the caller
/// did not keep it: fit takes its state by value).
struct CheckpointPolicy {
  std::filesystem::path dir{};     ///< empty: no checkpoints
  std::optional<Time> every{};     ///< interval, in any unit, counted from the stage's start
  bool at_stage_end = true;
  bool on_interrupt = true;
  int keep = 3;                    ///< newest interval checkpoints kept; stage-end ones always kept (<= 0: all)
  CheckpointMeta meta{};           ///< written into each; `extra["stage_done"]` is set to "1" at stage end
};

/// What a fit does with a non-finite loss (or, when it checks them, gradients).
enum class NonFinite {
  error,  ///< the fit fails with ErrorCode::non_finite; the step is not applied (default)
  skip,   ///< the batch is consumed without an update; counted in `StageRecord::skipped_batches`
  stop,   ///< the fit ends before the step with the state reached and a stop reason
};

/// The arithmetic of the forward pass and the loss (the backward pass follows it). docs/precision.md.
enum class Precision {
  fp32,  ///< float32 throughout (default)
  bf16,  ///< autocast to bfloat16 (CPU and CUDA); weights, gradients and optimizer moments stay float32
  fp16,  ///< autocast to float16 (CUDA only); pair it with `loss_scaling`
};

/// The memory layout of 4-D tensors (image batches and conv weights) while a fit runs. Values, and so
/// checkpoints and `bitwise_equal`, do not depend on it; the kernels LibTorch picks, their speed and
/// their rounding do. A fit returns its weights in the default (contiguous) layout whatever it used.
enum class MemoryFormat {
  automatic,      ///< baton's measured choice (default): channels_last for 4-D inputs on the CPU, contiguous on CUDA (docs/precision.md)
  contiguous,     ///< NCHW
  channels_last,  ///< NHWC for 4-D inputs and weights (others as they are)
};

/// Dynamic loss scaling, as PyTorch's GradScaler: the loss is multiplied by the scale before
/// backward and the gradients divided by it after; a batch whose gradients are then not finite is
/// consumed without an update (counted in `LossScaleState::skipped`) and the scale multiplied by
/// `backoff`; after `interval` updates in a row with finite gradients it is multiplied by `growth`.
/// The scale lives in the state (`TrainState::loss_scale`), so split and resumed runs go on with it.
struct LossScaling {
  double init = 65536.0;        ///< the scale a state without one starts from
  double growth = 2.0;          ///< > 1
  double backoff = 0.5;         ///< in (0, 1)
  std::int64_t interval = 2000; ///< >= 1
};

/// One stage of training. Everything a stage changes, and what it keeps, is written here:
///
/// | what                     | carried over                          | field              |
/// | ------------------------ | ------------------------------------- | ------------------ |
/// | weights                  | keep, reinitialize or transfer        | `model`            |
/// | optimizer moments        | keep or fresh                         | `optimizer_carry`  |
/// | schedule clock           | the run's or the stage's              | `schedule_clock`   |
/// | timestamp, RNG           | always continue                       |                    |
/// | data order               | (seed, epoch, data size): a new stage starts at a new epoch | `data` |
///
/// A stage is identified by its `name`: a `fit` whose name differs from the state's current
/// stage begins a new stage (applying the carry-over policies and closing a partial epoch); a
/// `fit` with the same name continues it. The stage's length belongs to the stage (`duration`,
/// from its start), and everything that reads progress (schedules on the stage clock, SWA,
/// scheduled freezing, progressive resizing, intervals) reads it against the stage as written,
/// so a stage split into several fits, or resumed from a checkpoint, gives the same bits.
struct TrainingSpec {
  /// Names the stage in errors and history, and in file names (a run's best-<stage>.baton, a
  /// sweep's node directories): any text but '/', '\\' and control characters, at most 100
  /// bytes, not "." or ".." (`validate` refuses others).
  std::string name = "fit";
  DataSpec data{};
  Loss loss = baton::loss::cross_entropy();
  Optimizer optimizer = baton::optim::sgd();
  Carry optimizer_carry = Carry::keep;            ///< keep the state's moments, or start fresh
  Schedule schedule = baton::schedule::constant(); ///< LR multiplier as a function of time
  Clock schedule_clock = Clock::run;               ///< which clock the schedule reads
  ModelCarry model = ModelCarry::keep();           ///< what happens to the weights at stage start
  std::vector<std::string> freeze{};               ///< parameter-name patterns not trained in this stage
  std::int64_t grad_accum = 1;                     ///< microbatches per batch (one update per batch)
  std::optional<double> clip_grad_norm{};          ///< clip the global gradient L2 norm to this
  std::optional<double> clip_grad_value{};         ///< clamp every gradient element to [-v, v]
  /// Stop after the batch in flight once this flag is set (by a signal handler of the caller's,
  /// another thread, ...). The returned state is the one reached, marked `interrupted` in its
  /// history record, so no work is lost and the caller can tell it apart from a completed fit.
  std::shared_ptr<const std::atomic<bool>> stop{};
  /// Honour Ctrl-C (SIGINT) and SIGTERM during this fit: the first finishes the batch in flight
  /// and returns as with `stop`; a second exits the process at once (status 130 or 143; files
  /// baton writes are atomic, so nothing is left half-written). The handlers are installed only
  /// while this fit runs and the previous ones restored after.
  bool handle_signals = false;
  /// Training algorithms, applied at their event points in this order (events.hpp).
  std::vector<Algorithm> algorithms{};
  /// Observers (monitors, early stopping); called in this order at each event.
  std::vector<Callback> callbacks{};
  /// Where callbacks' scalars and eval metrics go (JSONL, CSV, TensorBoard, console).
  std::vector<std::shared_ptr<Logger>> loggers{};
  std::optional<EvalSchedule> evaluation{};        ///< evaluation during the fit
  CheckpointPolicy checkpoints{};                  ///< checkpoints the fit writes itself
  std::optional<KeepBest> keep_best{};             ///< keep (and restore) the best evaluation's weights; needs `evaluation`
  /// Non-finite loss: error, skip the batch or stop. Gradients are checked too when the policy
  /// is skip or stop, or when clipping by norm computes the norm anyway.
  NonFinite on_non_finite = NonFinite::error;
  /// The stage's length, counted from the stage's start (not from a fit's): `fit(spec, s)`
  /// finishes the stage from wherever `s` is in it. Default "1dur": the rest of the run.
  Time duration = Time::fraction(1.0);
  c10::Device device = c10::Device(c10::kCPU);    ///< CPU; CUDA when LibTorch has it
  Precision precision = Precision::fp32;            ///< forward and loss arithmetic (fp32, bf16, fp16)
  MemoryFormat memory_format = MemoryFormat::automatic;  ///< layout of 4-D tensors during the fit
  std::optional<LossScaling> loss_scaling{};        ///< dynamic loss scaling; none: the loss as it is
  /// LibTorch's deterministic algorithms for the fit (an op without one fails the fit, naming the
  /// op; on CUDA also cuDNN's deterministic kernels, no benchmarking, and the cuBLAS workspace
  /// setting CUBLAS_WORKSPACE_CONFIG=:4096:8 required). Process-wide while the fit runs.
  bool deterministic = false;
  std::optional<std::uint64_t> data_seed{};         ///< data order seed; default: the run's seed
  /// Data-parallel training in this process group (distributed.hpp); null: one process. With a
  /// group, `data.batch_size` is the global batch: each rank takes its contiguous shard of every
  /// global batch of the one (seed, epoch) order, gradients are averaged across ranks (weighted
  /// by shard sizes) after backward, buffers follow rank 0, only rank 0 writes checkpoints, and
  /// every rank's state ends identical. See docs/distributed.md.
  std::shared_ptr<const Distributed> distributed{};

  [[nodiscard]] TrainingSpec with_name(std::string v) const;
  [[nodiscard]] TrainingSpec with_data(DataSpec v) const;
  [[nodiscard]] TrainingSpec with_train_data(Dataset v) const;
  [[nodiscard]] TrainingSpec with_batch_size(std::int64_t v) const;
  [[nodiscard]] TrainingSpec with_loss(Loss v) const;
  /// A new optimizer, saying explicitly what happens to the state's moments.
  [[nodiscard]] TrainingSpec with_optimizer(Optimizer v, Carry carry) const;
  [[nodiscard]] TrainingSpec with_optimizer_carry(Carry v) const;
  [[nodiscard]] TrainingSpec with_lr(double lr) const;
  [[nodiscard]] TrainingSpec with_duration(Time v) const;
  [[nodiscard]] TrainingSpec with_device(c10::Device v) const;
  [[nodiscard]] TrainingSpec with_precision(Precision v) const;
  [[nodiscard]] TrainingSpec with_memory_format(MemoryFormat v) const;
  [[nodiscard]] TrainingSpec with_loss_scaling(std::optional<LossScaling> v) const;
  [[nodiscard]] TrainingSpec with_deterministic(bool v) const;
  [[nodiscard]] TrainingSpec with_data_seed(std::uint64_t v) const;
  [[nodiscard]] TrainingSpec with_schedule(Schedule v, Clock clock) const;
  [[nodiscard]] TrainingSpec with_model(ModelCarry v) const;
  [[nodiscard]] TrainingSpec with_freeze(std::vector<std::string> patterns) const;
  [[nodiscard]] TrainingSpec with_grad_accum(std::int64_t microbatches) const;
  [[nodiscard]] TrainingSpec with_clip_grad_norm(std::optional<double> max_norm) const;
  [[nodiscard]] TrainingSpec with_clip_grad_value(std::optional<double> max_value) const;
  [[nodiscard]] TrainingSpec with_algorithms(std::vector<Algorithm> v) const;
  [[nodiscard]] TrainingSpec with_callbacks(std::vector<Callback> v) const;
  [[nodiscard]] TrainingSpec with_loggers(std::vector<std::shared_ptr<Logger>> v) const;
  [[nodiscard]] TrainingSpec with_evaluation(std::optional<EvalSchedule> v) const;
  [[nodiscard]] TrainingSpec with_checkpoints(CheckpointPolicy v) const;
  [[nodiscard]] TrainingSpec with_keep_best(std::optional<KeepBest> v) const;
  [[nodiscard]] TrainingSpec with_non_finite(NonFinite v) const;
  [[nodiscard]] TrainingSpec with_distributed(std::shared_ptr<const Distributed> v) const;

  /// Every problem of the spec at once, in one error (code invalid_spec), each line naming the
  /// field, e.g. `data.batch_size: must be positive, got 0`.
  [[nodiscard]] Expected<void> validate() const;
};

}  // namespace baton
