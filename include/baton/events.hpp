#pragma once
/// \file events.hpp
/// Event points of the training loop, and the two kinds of things that attach to them:
///
/// - an **Algorithm** transforms the batch, the targets, the gradients or the weights at its
///   event points (MixUp, label smoothing, EMA, ...). It is a set of pure functions; whatever it
///   remembers between steps lives in `TrainState::algorithm_state` under its name, so it is
///   copied with the state, saved in checkpoints, and split/resume-invariant.
/// - a **Callback** observes: it gets a read-only view of the state at each event and may write
///   scalars to the spec's loggers, keep a few numbers of its own (`EventView::memory`, saved with
///   the state), and ask the fit to stop (early stopping). It never changes training.
///
/// The loop and where each event fires is the pseudocode comment in src/train/loop.cpp. When several
/// algorithms act at one event they run in the order of `TrainingSpec::algorithms` (a TOML
/// curriculum uses the documented default order, or `algorithms.order`).
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <torch/types.h>

#include "baton/data.hpp"
#include "baton/time.hpp"

namespace baton {

struct TrainingSpec;
struct TrainState;

/// Named points of the loop, in the order they fire for one step.
enum class Event {
  fit_start,              ///< after the stage's carry-over is applied, before the first batch
  epoch_start,            ///< before the first batch of an epoch
  batch_start,            ///< before the batch is taken from the data
  after_data,             ///< the batch is taken: algorithms may transform inputs and targets
  before_forward,         ///< per microbatch
  after_forward,          ///< per microbatch: algorithms may transform the targets given the output
  after_loss,             ///< per microbatch
  after_backward,         ///< gradients of the whole batch are there: algorithms may change them
  before_optimizer_step,  ///< after clipping
  batch_end,              ///< the update is applied: algorithms may read/update weights
  epoch_end,              ///< the epoch's order is used up
  eval_start,
  eval_end,               ///< `EventView::metrics` holds the results
  checkpoint,             ///< a checkpoint was written (`EventView::path`)
  fit_end,                ///< the fit returns (stage end, max duration, a stop or an interruption)
};
std::string_view to_string(Event e);
std::ostream& operator<<(std::ostream& out, Event e);

/// What an algorithm sees at its event points.
struct AlgorithmContext {
  const TrainingSpec& spec;
  const Timestamp& time;        ///< time of the step in progress (before it is counted)
  double stage_progress{};      ///< fraction of the stage done when the step began, in [0, 1]
  std::int64_t num_classes{};   ///< classes of the training data (max label + 1); 0 if not class labels
};

/// What one gradient computation gave (`Algorithm::gradient`).
struct GradientResult {
  double loss = 0;     ///< the global batch's loss at the weights the gradient was taken at
  bool usable = true;  ///< false: the loss was not finite, or the gradients overflowed (loss scaling); the step applies nothing
};
/// The step's gradient at the model's current weights, as the step computes it when no algorithm
/// takes over: forward, loss and backward over the microbatches (grad_accum), the data-parallel
/// all-reduce (one more per call), loss-scale unscaling, the after_backward hooks. Each call
/// replaces every trainable parameter's `.grad()` (undefined: no gradient, e.g. frozen). The
/// per-microbatch events and the after_backward algorithms run at each call; the callbacks'
/// after_backward fires once, on the gradient the step applies.
using GradientFn = std::function<GradientResult()>;

/// A training algorithm: pure functions at event points. Unset members do nothing (and cost
/// nothing). `state` is the algorithm's own memory in `TrainState::algorithm_state[name]`.
struct Algorithm {
  using Tensors = std::map<std::string, torch::Tensor>;
  std::string name{};
  std::string invalid{};  ///< set by a factory given bad options; TrainingSpec::validate reports it
  /// What it does, with every option that can change the bits, e.g. `mixup(alpha=0.2)`: a run
  /// directory's fingerprint (run.hpp) holds it, so a resume with other options is refused. The
  /// built-ins fill it in. Empty: baton cannot describe it, and `baton::run` refuses to resume
  /// until it is named (say `"my_algo v2, p=0.3"`: change the text when the behaviour changes)
  /// or `RunOptions::accept_undescribed` is set.
  std::string identity{};
  /// after_data: returns the transformed batch (e.g. mixed inputs, soft targets [B, C]).
  std::function<Batch(const AlgorithmContext&, Batch)> after_data{};
  /// after_forward (per microbatch): returns the targets the loss gets for `output`.
  std::function<torch::Tensor(const AlgorithmContext&, const torch::Tensor& output, torch::Tensor targets)> before_loss{};
  /// after_backward: may change gradients (e.g. reset them to freeze a parameter); named params.
  std::function<void(const AlgorithmContext&, const std::vector<std::pair<std::string, torch::Tensor>>& params)>
      after_backward{};
  /// gradient: takes over how the step gets its gradient (e.g. SAM: a gradient, a step up it, a
  /// second gradient there, the weights back). `gradient` computes one; `params` are the
  /// trainable parameters (each once). It must leave in their `.grad()` the gradient to apply and
  /// the weights as it found them, and return the step's loss; clipping, the non-finite policy
  /// and the update follow. At most one algorithm of a spec may set it.
  std::function<GradientResult(const AlgorithmContext&, const std::vector<torch::Tensor>& params, const GradientFn& gradient)>
      gradient{};
  /// batch_end: reads the updated model, updates its own tensors (e.g. an EMA of the weights).
  std::function<void(const AlgorithmContext&, const TrainState& state, Tensors& memory)> batch_end{};
  /// At the end of the stage (the fit that reaches the stage's duration): may replace the
  /// model's weights (e.g. SWA) from its memory.
  std::function<void(const AlgorithmContext&, TrainState& state, Tensors& memory)> stage_end{};
};

/// Scalars a callback writes; the fit sends them to every logger of the spec.
struct Scalars {
  std::map<std::string, double> values{};
  void add(const std::string& key, double value) { values[key] = value; }
};

/// What the training loop reports at batch_end.
struct StepInfo {
  double loss = 0;
  double lr = 0;                ///< base LR after the schedule
  double grad_norm = 0;         ///< global gradient norm before clipping (0 when not computed)
  std::int64_t samples = 0;     ///< samples in the batch
  bool skipped = false;         ///< the step was not applied (non-finite policy "skip")
};

/// The batch in progress on the run's clock, as `EventView::due` counts it.
struct BatchSpan {
  Timestamp before{};           ///< the clock when the batch began
  Timestamp after{};            ///< the clock once it is counted (the epoch rolled over if its order is used up)
  std::int64_t epoch_size = 0;  ///< training samples in the stage's epoch (what `ep` counts)
};

/// The read-only view a callback gets.
struct EventView {
  Event event{};
  const TrainingSpec& spec;
  const TrainState& state;
  const StepInfo* step = nullptr;  ///< batch_end only
  const std::map<std::string, std::map<std::string, double>>* metrics = nullptr;  ///< eval_end only
  const std::string* path = nullptr;  ///< checkpoint only
  Scalars* log = nullptr;             ///< write scalars here (to the loggers)
  std::map<std::string, double>* memory = nullptr;  ///< the callback's own numbers, saved with the state
  const BatchSpan* span = nullptr;  ///< the events of one batch, epoch_start/batch_start to batch_end; else null

  /// True at the events of a batch that reaches a multiple of `every` ("50ba", "0.5ep", "1000sp",
  /// "0.1dur") counted from the stage's start: the rule of evaluation and checkpoint intervals, so
  /// whatever splits the stage into fits or resumes it, the same batches are due. False at the
  /// events outside a batch, and for an `every` that is not more than zero (Time::check).
  [[nodiscard]] bool due(Time every) const;
};

/// An observer. Returns a reason to end the fit (with the state reached, not an error), or
/// nothing to go on.
struct Callback {
  std::string name{};
  std::function<std::optional<std::string>(const EventView&)> on_event{};
  /// True for a callback that only watches: it never returns a stop reason, so it cannot change
  /// the bits and a run directory's fingerprint leaves it out (monitors, progress). One that says
  /// so and returns a reason anyway fails the fit (ErrorCode::invalid_spec).
  bool observer = false;
  /// For a callback that can stop a stage: what it does, with every option that can change when
  /// it stops, e.g. `early_stopping(metric=val/loss, mode=min, patience=3, ...)`, for a run
  /// directory's fingerprint (as `Algorithm::identity`). Empty: baton cannot describe it, and
  /// `baton::run` refuses to resume until it is named or `RunOptions::accept_undescribed` is set.
  std::string identity{};
  /// Set by a factory given bad options (a monitor's `every` of "0ba"); TrainingSpec::validate
  /// reports it, so the fit fails before its first batch.
  std::string invalid{};
};

/// A sink for scalars: the loop sends every callback's scalars (and eval metrics) here.
class Logger {
 public:
  virtual ~Logger() = default;
  /// `stage` is the spec's name; keys are like "train/loss", "eval/test/accuracy".
  virtual void log(const std::string& stage, const Timestamp& time, const std::map<std::string, double>& scalars) = 0;
  virtual void flush() {}
};

}  // namespace baton
