#pragma once
/// \file callbacks.hpp
/// Built-in callbacks (observers, see events.hpp) and loggers.
///
/// ```cpp
/// namespace cb = baton::callbacks;
/// auto tb = baton::loggers::tensorboard("runs/a/tb");            // Expected<shared_ptr<Logger>>
/// auto spec = main.with_callbacks({cb::train_monitor({.every = 50}), cb::throughput({.every = 50}),
///                                  cb::early_stopping({.metric = "test/accuracy", .patience = 3})})
///                 .with_loggers({*tb})
///                 .with_evaluation(baton::EvalSchedule{.spec = {.sets = {{"test", test}}}, .every = "1ep"_t});
/// ```
///
/// Scalars are named like "train/loss", "train/lr", "train/samples_per_s", "train/grad_norm",
/// "system/peak_rss_mb", and eval metrics "eval/<set>/<metric>".
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "baton/error.hpp"
#include "baton/events.hpp"
#include "baton/params.hpp"

namespace baton::callbacks {

/// An interval: a whole number of batches (`.every = 50`) or any Time ("0.5ep"_t, "1000sp"_t,
/// "0.1dur"_t). It must be more than zero.
struct Every {
  Time time = Time::batches(1);
  constexpr Every() = default;
  constexpr Every(std::int64_t batches) : time(Time::batches(batches)) {}  // NOLINT: `.every = 50` reads as batches
  constexpr Every(Time t) : time(t) {}                                        // NOLINT
};
/// How often a monitor logs: at the batches that reach a multiple of `every`, counted from the
/// stage's start as evaluation intervals are (EventView::due). A bad `every` ("0ba", "1.5ba") is
/// reported by TrainingSpec::validate.
struct MonitorOptions {
  Every every{};
};
/// "train/loss" and "train/lr" of the step (and "train/skipped" when a batch was skipped).
Callback train_monitor(MonitorOptions o = {});
/// "train/lr": the base learning rate after the schedule.
Callback lr_monitor(MonitorOptions o = {});
/// "train/samples_per_s": samples per wall-clock second since the last time it logged.
Callback throughput(MonitorOptions o = {});
/// "system/peak_rss_mb": the process's peak resident memory (getrusage).
Callback memory_monitor(MonitorOptions o = {});
/// "train/grad_norm": the global L2 norm of the gradients after backward (before clipping).
Callback grad_norm_monitor(MonitorOptions o = {});
/// Stops the fit when a parameter holds NaN or infinity (checked every `every` batches), naming
/// the parameter and the batch.
Callback nan_monitor(MonitorOptions o = {});

enum class Mode { max, min };
/// Whose best an evaluation is compared with.
enum class Scope {
  stage,  ///< this stage's evaluations only: a fine-tune is not judged against warm-up's score
  run,    ///< every evaluation of the run so far
};
struct EarlyStoppingOptions {
  std::string metric = "test/loss";  ///< "<eval set>/<metric>", from the spec's evaluation
  Mode mode = Mode::min;             ///< min: lower is better (a loss); max: higher (accuracy)
  std::int64_t patience = 3;         ///< evaluations without improvement before stopping
  double min_delta = 0;              ///< an improvement must beat the best by more than this
  Scope scope = Scope::stage;
};
/// Ends the fit (with the state reached and a reason in `StageRecord::stop_reason`, not an
/// error) when the metric has not improved for `patience` evaluations; the reason names the
/// best value and the batch whose evaluation set it. Its memory lives in the state
/// (`callback_state["early_stopping"]`), so it survives splits and resumes.
Callback early_stopping(EarlyStoppingOptions o);

struct ThresholdOptions {
  std::string metric = "test/accuracy";
  double threshold = 0;
  Mode mode = Mode::max;  ///< max: stop once metric >= threshold; min: once metric <= threshold
};
/// Ends the fit once an evaluated metric reaches a threshold.
Callback threshold_stop(ThresholdOptions o);

/// The callback named `name` with options from `params` (the TOML keys of docs/config.md), as a
/// stage's `callbacks = { early_stopping = { patience = 2 } }` names it: `every` for the
/// monitors (a whole number of batches, or a time such as "0.5ep"); `metric`, `mode` ("min" |
/// "max"), `patience`, `min_delta` for early_stopping; `metric`, `mode`, `threshold` (required)
/// for threshold_stop. Unknown names or keys are errors listing the known ones.
Expected<Callback> from_name(const std::string& name, const Params& params);
/// Every name `from_name` accepts.
const std::vector<std::string>& names();

}  // namespace baton::callbacks

namespace baton {
class Progress;
}  // namespace baton

namespace baton::loggers {

/// JSON lines in the schema of run directories (docs/report.md), which `baton report` reads:
/// one object per event group and log call, e.g. {"event": "train", "stage", "epoch", "batch",
/// "sample", "loss": ..., "lr": ...} for "train/*" scalars and {"event": "eval", ..., "set":
/// "test", "accuracy": ...} for "eval/test/*" (non-finite values as null). Appends to `path`.
Expected<std::shared_ptr<Logger>> jsonl(const std::filesystem::path& path);
/// Long-format CSV of the same schema: event,stage,epoch,batch,sample,set,metric,value (RFC 4180
/// quoting; a header when the file is new).
Expected<std::shared_ptr<Logger>> csv(const std::filesystem::path& path);
/// TensorBoard event files in `dir` (events.out.tfevents.<seconds>.<host>.baton): scalars with
/// the run's batch counter as step. Each record: length, masked CRC-32C of the length, an Event
/// protocol buffer (wall_time, step, summary{value{tag, simple_value}}), masked CRC-32C of it.
/// `restart_at`: this run resumes at that step (a batch count) after a stop; the file begins with
/// TensorBoard's restart marker (SessionLog START), so TensorBoard drops the events of earlier
/// files from that step on, which the stopped run logged after its checkpoint.
Expected<std::shared_ptr<Logger>> tensorboard(const std::filesystem::path& dir,
                                              std::optional<std::int64_t> restart_at = std::nullopt);
/// One line per log call on `out` (stdout by default): "[stage] epoch 1 batch 469: key=value ...",
/// through `progress` when given (so a progress bar on the same terminal is cleared first).
std::shared_ptr<Logger> console(std::FILE* out = stdout);
std::shared_ptr<Logger> console(std::shared_ptr<Progress> progress);

}  // namespace baton::loggers

namespace baton {

/// The terminal progress display of `baton run`, for any program: on a terminal a bar redrawn in
/// place ("[stage] epoch 2 [#####.....]  41%  8123 sp/s loss 0.4312 ETA 0:21"); elsewhere (a pipe,
/// a log file) a plain line at every ~10% of the stage. The bar's line fits the terminal's width
/// (read at every update; 80 columns when unknown), so it never wraps. Not thread-safe; one per output.
class Progress {
 public:
  explicit Progress(std::FILE* out = stdout);  ///< a bar when `out` is a terminal
  Progress(std::FILE* out, bool bar);
  /// `done` of `total` batches of the stage `stage` are trained, at time `t`.
  void update(const std::string& stage, const Timestamp& t, std::int64_t done, std::int64_t total,
              double samples_per_s, double loss, double eta_s);
  /// A whole line of text (the bar, if drawn, is cleared first and redrawn by the next update).
  void line(const std::string& text);
  /// Ends the stage's bar (a newline on a terminal) and restarts the 10% marks.
  void finish_stage();

 private:
  [[nodiscard]] int terminal_columns() const;
  std::FILE* out_;
  bool bar_;
  int next_tenth_ = 1;
};

namespace callbacks {
/// Drives `progress` from the fit's events: the stage's share done (against the stage's end,
/// `stage_end(spec, state)` at fit start), samples/s and the loss of each batch.
Callback progress(std::shared_ptr<Progress> progress);
}  // namespace callbacks

}  // namespace baton

namespace baton {
/// CRC-32C (Castagnoli), as TensorBoard's record format uses; exposed for tests and tools.
std::uint32_t crc32c(const void* data, std::size_t size);
}  // namespace baton
