// baton::run: a chain of stages with a run directory (run.hpp). The CLI's `baton run` is this
// call on a TOML curriculum.
#include <chrono>
#include <cmath>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "baton/checkpoint.hpp"
#include "baton/distributed.hpp"
#include "baton/fit.hpp"
#include "baton/report.hpp"
#include "baton/run.hpp"
#include "baton/runtime.hpp"
#include "detail.hpp"
#include "io.hpp"
#include "run/internal.hpp"
#include "metrics_log.hpp"
#include "run/run_lock.hpp"
#include "train/carry.hpp"
#include "horizon.hpp"
#include "train/signals.hpp"

namespace baton {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using WallClock = std::chrono::steady_clock;

std::string carry_text(const TrainingSpec& s) { return s.optimizer_carry == Carry::keep ? "keep" : "fresh"; }
std::string weights_text(const TrainingSpec& s) {
  switch (s.model.kind) {
    case ModelCarry::Kind::keep: return "keep";
    case ModelCarry::Kind::reinitialize: return "reinitialize";
    case ModelCarry::Kind::transfer: return "transfer";
  }
  return "keep";
}

Expected<void> check_stages(const RunOptions& o, const std::vector<TrainingSpec>& stages) {
  if (o.dir.empty()) return fail(ErrorCode::invalid_argument, "run: RunOptions::dir is empty; name the run directory");
  if (stages.empty()) return fail(ErrorCode::invalid_argument, "run: no stages to train");
  std::set<std::string> names;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const auto& s = stages[i];
    // Checked for every stage before the first trains: a name joins file names (best-<stage>.baton).
    if (auto bad = detail::name_problem(fmt::format("run: stages[{}].name", i), s.name, detail::kStageNameUse); !bad.empty())
      return fail(ErrorCode::invalid_spec, bad);
    if (!names.insert(s.name).second)
      return fail(ErrorCode::invalid_spec,
                  fmt::format("run: two stages are named \"{}\"; a run resumes by stage, so give each its own name", s.name));
  }
  return {};
}

/// A pause point on the run's clock: epochs (a part of one allowed), batches or samples.
struct PausePoint {
  TimeUnit unit = TimeUnit::batch;
  double target = 0;  // batches, samples: a whole count

  /// Where `s` stands on this point's clock once `spec`'s fit has entered its stage (a new stage
  /// first closes a partial epoch, so that epoch counts as ended): epochs are the epoch counter
  /// plus the part of the current epoch's order consumed.
  [[nodiscard]] double now(const TrainingSpec& spec, const TrainState& s) const {
    if (unit == TimeUnit::batch) return static_cast<double>(s.time.batch);
    if (unit == TimeUnit::sample) return static_cast<double>(s.time.sample);
    const Timestamp t = detail::stage_position(spec, s).time;
    const std::int64_t n = spec.data.train.size();
    return static_cast<double>(t.epoch) + (n > 0 ? static_cast<double>(t.sample_in_epoch) / static_cast<double>(n) : 0.0);
  }
  [[nodiscard]] std::string text() const { return Time{target, unit}.to_string(); }

  /// From RunOptions::pause_at, or pause_after counted from where `s` stands before `next`'s fit
  /// ("1ep" in the middle of epoch 3, at 3.4 epochs, pauses at 4.4, as fit's budget counts). A
  /// point the run has reached already is an error, not a no-op.
  static Expected<std::optional<PausePoint>> make(const RunOptions& o, const TrainingSpec& next, const TrainState& s) {
    if (o.pause_at && o.pause_after)
      return fail(ErrorCode::invalid_argument, "run: pause_at and pause_after are both set; give at most one");
    const auto& when = o.pause_at ? o.pause_at : o.pause_after;
    if (!when) return std::optional<PausePoint>{};
    if (auto ok = when->check(); !ok) return tl::unexpected(ok.error().with_context("run: the pause point"));
    const Time t = detail::resolve(*when, s.max_duration);  // "dur": a fraction of the max, in its unit
    PausePoint p{t.unit, t.unit == TimeUnit::epoch ? t.value : std::round(t.value)};
    if (o.pause_after) p.target += p.now(next, s);
    if (p.target <= p.now(next, s))
      return fail(ErrorCode::invalid_argument,
                  fmt::format("run: nothing to train before the pause point {}: the run is at {}", p.text(), s.time.to_string()));
    return std::optional<PausePoint>{p};
  }

  /// What `spec`'s fit on `s` may train before the pause point, in batches or samples (zero: pause
  /// now). Epochs: to the first batch end at or past `floor(target)` epochs and
  /// `round(frac(target) * n)` samples of the next epoch's order.
  [[nodiscard]] Time budget(const TrainingSpec& spec, const TrainState& s) const {
    if (unit != TimeUnit::epoch)
      return Time{std::max(0.0, target - now(spec, s)), unit};
    const Timestamp t = detail::stage_position(spec, s).time;
    const std::int64_t n = spec.data.train.size();
    const double whole = std::floor(target);
    const detail::Mark mark{TimeUnit::epoch, static_cast<std::int64_t>(whole) * n + std::llround((target - whole) * static_cast<double>(n))};
    if (mark.reached(t, n)) return Time::batches(0);
    const Timestamp u = detail::simulate(t, mark, s.max_duration, n, spec.data.batch_size, spec.data.drop_last);
    return Time::batches(u.batch - t.batch);
  }
};

/// One call of `run`: the directory, its writers, and the stages trained so far.
class Runner {
 public:
  Runner(const RunOptions& o, const std::vector<TrainingSpec>& stages) : o_(o), stages_(stages) {}

  Expected<RunResult> go(TrainState initial) {
    // From the start: a signal while the directory is opened or a checkpoint is read stops the
    // run where it stands, with a checkpoint there, like one later on.
    detail::SignalScope signals(o_.handle_signals);
    if (auto ok = open(initial); !ok) return tl::unexpected(ok.error());
    auto resume = find_resume_here(initial.factory);
    if (!resume) return tl::unexpected(resume.error());
    std::size_t first = 0;
    result_.state = std::move(initial);
    if (*resume) {
      auto& r = **resume;
      first = static_cast<std::size_t>(std::max<std::int64_t>(0, r.stage_index + (r.stage_done ? 1 : 0)));
      result_.state = std::move(r.state);
      result_.resumed_from = r.from;
      resumed_mid_stage_ = !r.stage_done;
      resume_index_ = r.stage_index;
      result_.not_bit_exact = r.not_bit_exact;
      say(fmt::format("resuming from {}: stage {}, epoch {}, batch {}", r.from.string(), result_.state.stage,
                      result_.state.time.epoch, result_.state.time.batch));
      if (!r.not_bit_exact.empty()) say(fmt::format("not bit-exact: {}", r.not_bit_exact));
    }
    auto pause = first < stages_.size() ? PausePoint::make(o_, stages_[first], result_.state)
                                        : Expected<std::optional<PausePoint>>{std::nullopt};
    if (!pause) return tl::unexpected(pause.error());
    pause_ = *pause;
    for (std::size_t i = first; i < stages_.size(); ++i) {
      if (auto ok = train_stage(i); !ok) return tl::unexpected(ok.error());
      if (result_.interrupted || result_.paused) return std::move(result_);
    }
    if (auto ok = finish(); !ok) return tl::unexpected(ok.error());
    return std::move(result_);
  }

 private:
  Expected<void> open(const TrainState& initial) {
    lead_ = !o_.distributed || o_.distributed->rank() == 0;
    config_ = o_.config.empty() ? describe(stages_, &initial, &undescribed_) : o_.config;
    if (o_.config.empty()) tools_ = detail::tools_record(stages_, initial, o_.name, o_.dir);
    fingerprint_ = o_.fingerprint.empty() ? detail::sha256_hex(config_) : o_.fingerprint;
    numerics_ = fmt::format("{}; ranks={}", numerics_environment(), o_.distributed ? o_.distributed->world_size() : 1);
    if (!lead_) return {};  // rank 0 writes the directory; the others read its checkpoints
    if (auto ok = detail::make_run_directory(o_.dir); !ok) return ok;
    auto held = detail::RunLock::acquire(o_.dir);  // one writer per directory, until run returns
    if (!held) return tl::unexpected(held.error());
    lock_.emplace(std::move(*held));
    if (o_.fresh) {
      detail::remove_run_files(o_.dir);
      if (auto ok = detail::make_run_directory(o_.dir); !ok) return ok;  // checkpoints/ went if it was empty
    }
    detail::remove_unfinished_writes(o_.dir);
    if (auto ok = detail::check_run_files(o_.dir); !ok) return ok;
    if (o_.progress) progress_ = std::make_shared<Progress>();
    return {};
  }

  Expected<std::optional<detail::Resume>> find_resume_here(const ModelFactory& factory) {
    if (o_.fresh && !lead_) return std::optional<detail::Resume>{};
    auto resume = detail::find_resume(o_.dir, {fingerprint_, config_, numerics_, o_.accept_runtime_change, &stages_}, factory);
    if (!resume || !lead_) return resume;
    // A fingerprint of the caller's own (RunOptions::fingerprint) is the caller's word for all of it.
    if (*resume && !undescribed_.empty() && o_.fingerprint.empty() && !o_.accept_undescribed)
      return fail(ErrorCode::invalid_spec,
                  fmt::format("{}: cannot resume from {}: part of this run cannot be described, so baton cannot tell "
                              "whether it changed since the checkpoint:\n  {}\nGive each an identity that changes when "
                              "it does (Algorithm::identity, Callback::identity, Source::identity(), Loss::name, "
                              "Schedule::name), or resume anyway with RunOptions::accept_undescribed = true",
                              o_.dir.string(), (*resume)->from.string(), fmt::join(undescribed_, "\n  ")));
    // The files read as one uninterrupted run: lines after the checkpoint are dropped (they are
    // logged again), and the configuration is written (checked) after the fingerprint passed.
    // Without a checkpoint (a run killed before its first) the run starts over, and so do its
    // metrics files.
    std::error_code ec;
    if (*resume) {
      if (auto ok = detail::truncate_metrics(o_.dir, (*resume)->state.time.batch, (*resume)->stage_index, (*resume)->stage_done);
          !ok)
        return tl::unexpected(ok.error());
    } else {
      for (const char* f : {"metrics.jsonl", "metrics.csv"}) fs::remove(o_.dir / f, ec);
    }
    if (auto ok = detail::write_file_atomic(o_.dir / "config.toml", config_, "config"); !ok) return tl::unexpected(ok.error());
    // A C++ run's config.toml is its description, not a curriculum: the tools read tools.toml.
    if (!tools_.empty())
      if (auto ok = detail::write_file_atomic(o_.dir / "tools.toml", tools_, "tools record"); !ok) return tl::unexpected(ok.error());
    auto metrics = detail::MetricsWriter::open(o_.dir / "metrics.jsonl", o_.dir / "metrics.csv");
    if (!metrics) return tl::unexpected(metrics.error());
    metrics_ = *metrics;
    if (o_.tensorboard) {
      // Resumed: TensorBoard drops what the stopped run logged after its checkpoint (all of it,
      // when a run killed before its first checkpoint starts over).
      const bool earlier = !fs::is_empty(o_.dir / "tensorboard", ec) && !ec;
      auto tb = loggers::tensorboard(o_.dir / "tensorboard",
                                     *resume ? std::optional((*resume)->state.time.batch + 1)
                                             : earlier ? std::optional<std::int64_t>(0) : std::nullopt);
      if (!tb) return tl::unexpected(tb.error());
      tensorboard_ = *tb;
    }
    return resume;
  }

  /// The stage as the caller wrote it, plus what the directory owns: checkpoints, the stop
  /// flag, the metrics loggers and the run's observers.
  TrainingSpec attach(const TrainingSpec& stage, std::size_t index, const std::shared_ptr<detail::StageTrace>& trace) const {
    TrainingSpec s = stage;
    s.checkpoints = CheckpointPolicy{.dir = o_.dir / "checkpoints",
                                     .every = o_.checkpoint_every,
                                     .at_stage_end = false,  // written by the run, after the stage_end line
                                     .on_interrupt = true,
                                     .keep = o_.keep_checkpoints,
                                     .meta = meta(index, false)};
    if (o_.stop) s.stop = o_.stop;
    s.handle_signals = o_.handle_signals;
    if (o_.distributed) s.distributed = o_.distributed;
    s.callbacks.push_back(detail::train_log(trace));
    if (s.keep_best && lead_)
      s.callbacks.push_back(detail::best_file(o_.dir / s.keep_best->file_name(s.name), meta(index, false)));
    if (progress_) s.callbacks.push_back(callbacks::progress(progress_));
    s.loggers.push_back(detail::eval_echo(trace, progress_));
    if (metrics_) s.loggers.push_back(metrics_);
    if (tensorboard_) s.loggers.push_back(tensorboard_);
    return s;
  }

  CheckpointMeta meta(std::size_t index, bool stage_done) const {
    CheckpointMeta m{.run_name = o_.name, .config_fingerprint = fingerprint_, .stage_index = static_cast<std::int64_t>(index)};
    m.extra.insert_or_assign("stage_done", std::string(stage_done ? "1" : "0"));
    return with_numerics(std::move(m));
  }

  /// What the bits depend on, recorded for the next resume to compare.
  CheckpointMeta with_numerics(CheckpointMeta m) const {
    m.extra.insert_or_assign("numerics", numerics_);
    if (!result_.not_bit_exact.empty()) m.extra.insert_or_assign("not_bit_exact", result_.not_bit_exact);
    return m;
  }

  Expected<void> train_stage(std::size_t index) {
    auto trace = std::make_shared<detail::StageTrace>();
    const TrainingSpec spec = attach(stages_[index], index, trace);
    const bool resumed = resumed_mid_stage_ && static_cast<std::int64_t>(index) == resume_index_;
    const Timestamp start = result_.state.time;
    std::optional<Time> budget;
    bool pauses = false;  // the pause point comes before the stage's end
    if (pause_) {
      budget = pause_->budget(spec, result_.state);
      if (budget->value == 0) return pause_here(index, false);
      auto until = fit_end(spec, result_.state, budget), end = stage_end(spec, result_.state);
      if (!until || !end) return tl::unexpected((until ? end : until).error());
      pauses = until->batch < end->batch;
    }
    if (!resumed) log_stage_start(spec, index);
    const auto t0 = WallClock::now();
    auto next = budget ? fit(spec, std::move(result_.state), *budget) : fit(spec, std::move(result_.state));
    if (!next) {
      if (progress_) progress_->line("");
      return tl::unexpected(next.error());
    }
    result_.state = std::move(*next);
    const auto& rec = result_.state.history.back();
    StageSummary row{spec.name, start, result_.state.time, trace->last_loss, trace->last_metrics,
                     std::chrono::duration<double>(WallClock::now() - t0).count() - trace->eval_seconds, trace->losses};
    if (!trace->last_metrics.empty()) result_.final_metrics = trace->last_metrics;
    result_.stages.push_back(row);
    if (rec.interrupted) {
      result_.interrupted = true;
      result_.checkpoint = trace->checkpoint;
      return {};
    }
    if (rec.skipped_batches > 0)
      say(fmt::format("[{}] {} batches skipped: non-finite loss or gradients (on_non_finite = \"skip\")", spec.name,
                      rec.skipped_batches));
    if (!rec.restored_best.empty()) say(fmt::format("[{}] {}", spec.name, rec.restored_best));
    if (!rec.stop_reason.empty()) say(fmt::format("[{}] stage ended early: {}", spec.name, rec.stop_reason));
    else if (pauses) return pause_here(index, true);
    return end_stage(row, index, rec.stop_reason);
  }

  /// At the pause point: a checkpoint of the stage in progress (none when the point is a stage's
  /// start: the previous stage's end checkpoint, written by this call, is where a rerun goes on).
  Expected<void> pause_here(std::size_t index, bool mid_stage) {
    result_.paused = true;
    say(fmt::format("paused at {} ({}), as asked", pause_->text(), result_.state.time.to_string()));
    if (!lead_ || !mid_stage) return {};
    const fs::path path = o_.dir / "checkpoints" / checkpoint_name(result_.state.time.batch, false);
    if (auto ok = save_checkpoint(result_.state, path, meta(index, false)); !ok)
      return tl::unexpected(ok.error().with_context("checkpoint"));
    result_.checkpoint = path;
    return {};
  }

  void log_stage_start(const TrainingSpec& spec, std::size_t index) {
    if (!metrics_) return;
    const auto pos = detail::stage_position(spec, result_.state).time;
    const auto target = stage_end(spec, result_.state);
    metrics_->event({{"event", "stage_start"}, {"stage", spec.name}, {"epoch", pos.epoch}, {"batch", pos.batch},
                     {"sample", pos.sample}, {"index", index}, {"duration", spec.duration.to_string()},
                     {"target_batch", target ? target->batch : pos.batch}, {"batch_size", spec.data.batch_size},
                     {"optimizer", std::string(spec.optimizer.kind())}, {"lr", spec.optimizer.lr()},
                     {"optimizer_carry", carry_text(spec)}, {"clock", spec.schedule_clock == baton::Clock::run ? "run" : "stage"},
                     {"weights", weights_text(spec)}, {"freeze", spec.freeze}});
  }

  /// The stage_end line, then the stage-end checkpoint (so a resume from it finds the line).
  Expected<void> end_stage(const StageSummary& row, std::size_t index, const std::string& stop_reason) {
    if (progress_) progress_->finish_stage();
    say(fmt::format("stage {} done: epoch {}, batch {}, loss {:.4f} ({})", row.name, row.end.epoch, row.end.batch,
                    row.loss, duration_text(row.seconds)));
    if (!lead_) return {};
    json end = {{"event", "stage_end"}, {"stage", row.name}, {"epoch", row.end.epoch}, {"batch", row.end.batch},
                {"sample", row.end.sample}, {"seconds", row.seconds}, {"loss", row.loss}};
    if (!stop_reason.empty()) end["stop_reason"] = stop_reason;
    if (const auto& rec = result_.state.history.back(); !rec.restored_best.empty()) end["restored_best"] = rec.restored_best;
    metrics_->event(end);
    const fs::path path = o_.dir / "checkpoints" / checkpoint_name(result_.state.time.batch, true);
    if (auto ok = save_checkpoint(result_.state, path, meta(index, true)); !ok)
      return tl::unexpected(ok.error().with_context("checkpoint"));
    result_.checkpoint = path;
    return {};
  }

  Expected<void> finish() {
    if (result_.final_metrics.empty() && stages_.back().evaluation)  // resumed after the last stage ended
      if (auto m = eval(stages_.back().evaluation->spec, result_.state)) result_.final_metrics = *m;
    if (!lead_) return {};
    // The last stage, done: as its stage-end checkpoint says (stage_index counts from 0).
    if (auto ok = save_checkpoint(result_.state, o_.dir / "final.baton", meta(stages_.size() - 1, true)); !ok)
      return tl::unexpected(ok.error());
    if (!o_.report) return {};
    // Training succeeded: a report that cannot be written is said loudly, not a failure.
    if (auto page = report::write({o_.dir}, o_.dir / "report.html"))
      say(fmt::format("report: {}", page->string()));
    else
      fmt::print(stderr, "baton: the run finished but its report was not written: {}\n", page.error().to_string());
    return {};
  }

  void say(const std::string& line) {
    if (progress_) progress_->line(line);
  }

  const RunOptions& o_;
  const std::vector<TrainingSpec>& stages_;
  bool lead_ = true, resumed_mid_stage_ = false;
  std::int64_t resume_index_ = -1;
  std::optional<PausePoint> pause_;
  std::string config_, fingerprint_, numerics_;
  std::string tools_;  // tools.toml of a C++ run (detail::tools_record); "" for a curriculum's
  std::vector<std::string> undescribed_;  // what describe() could not: refuses a resume
  std::optional<detail::RunLock> lock_;
  std::shared_ptr<Progress> progress_;
  std::shared_ptr<detail::MetricsWriter> metrics_;
  std::shared_ptr<Logger> tensorboard_;
  RunResult result_;
};
}  // namespace

Expected<RunResult> run(const RunOptions& options, const std::vector<TrainingSpec>& stages, TrainState initial) {
  if (auto ok = check_stages(options, stages); !ok) return tl::unexpected(ok.error());
  return detail::guard([&]() -> Expected<RunResult> { return Runner(options, stages).go(std::move(initial)); })
      .map_error(add_context(fmt::format("run directory {}", options.dir.string())));
}

}  // namespace baton
