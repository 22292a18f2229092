// The baton command line: run, validate, eval, inspect.
#include <signal.h>
#include <unistd.h>

#include <atomic>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "baton/callbacks.hpp"
#include "baton/checkpoint.hpp"
#include "baton/cli.hpp"
#include "baton/distributed.hpp"
#include "baton/fit.hpp"
#include "baton/runtime.hpp"
#include "report.hpp"
#include "launch.hpp"
#include "run_lock.hpp"

namespace baton::cli {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

// Ctrl-C and SIGTERM during `baton run`: the first asks the training loop to stop after the
// batch in flight (it then checkpoints and exits 3); a second exits at once. Checkpoints are
// written atomically, so an exit at any moment leaves the last one intact.
std::atomic<bool> g_stop{false};

extern "C" void baton_cli_on_signal(int sig) {
  if (g_stop.exchange(true)) ::_exit(128 + sig);
}

void install_run_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = baton_cli_on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int exit_code_for(const Error& e) {
  switch (e.code) {
    case ErrorCode::non_finite:
    case ErrorCode::torch:
    case ErrorCode::runtime: return exit_training_failed;
    default: return exit_invalid_input;
  }
}

int report(const Error& e) {
  fmt::print(stderr, "baton: {}\n", e.to_string());
  return exit_code_for(e);
}

/// Writes a small text file atomically (temp + rename), so a crash never leaves half of it.
void write_text(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
  }
  fs::rename(tmp, path);
}

/// Metrics as JSON lines and as a long-format CSV (event,stage,epoch,batch,sample,set,metric,value).
class MetricsLog {
 public:
  explicit MetricsLog(const fs::path& dir)
      : jsonl_(dir / "metrics.jsonl", std::ios::app), csv_path_(dir / "metrics.csv") {
    const bool fresh = !fs::exists(csv_path_) || fs::file_size(csv_path_) == 0;
    csv_.open(csv_path_, std::ios::app);
    if (fresh) csv_ << "event,stage,epoch,batch,sample,set,metric,value\n";
  }
  void write(const std::string& event, const std::string& stage, const Timestamp& t, const std::string& set,
             const std::map<std::string, double>& values) {
    json j = {{"event", event}, {"stage", stage}, {"epoch", t.epoch}, {"batch", t.batch}, {"sample", t.sample}};
    if (!set.empty()) j["set"] = set;
    for (const auto& [k, v] : values) {
      j[k] = v;
      csv_ << fmt::format("{},{},{},{},{},{},{},{}\n", event, stage, t.epoch, t.batch, t.sample, set, k, v);
    }
    jsonl_ << j.dump() << '\n';
    jsonl_.flush();
    csv_.flush();
  }
  /// A line of another kind (stage_start, stage_end) into metrics.jsonl only: the CSV holds metrics.
  void event(const json& j) {
    jsonl_ << j.dump() << '\n';
    jsonl_.flush();
  }
 private:
  std::ofstream jsonl_;
  fs::path csv_path_;
  std::ofstream csv_;
};

/// The fit's logger in the CLI: evaluation metrics (interval and stage end, run by the fit per
/// the spec's evaluation) into metrics.jsonl/csv and the terminal; other scalars to the
/// optional extra loggers (TensorBoard). Remembers the last metrics for the summary table.
class CliLogger final : public Logger {
 public:
  CliLogger(MetricsLog& log, Progress& progress, std::vector<std::shared_ptr<Logger>> extra)
      : log_(log), progress_(progress), extra_(std::move(extra)) {}
  void log(const std::string& stage, const Timestamp& t, const std::map<std::string, double>& scalars) override {
    Metrics m;
    for (const auto& [key, v] : scalars) {
      // "eval/<set>/<metric>"
      if (key.rfind("eval/", 0) != 0) continue;
      const auto slash = key.find('/', 5);
      if (slash == std::string::npos) continue;
      m[key.substr(5, slash - 5)][key.substr(slash + 1)] = v;
    }
    for (const auto& [set, values] : m) log_.write("eval", stage, t, set, values);
    if (!m.empty()) {
      last = m;
      progress_.line(fmt::format("[{}] epoch {} batch {}: {}", stage, t.epoch, t.batch, metrics_text(m)));
    }
    for (const auto& l : extra_) l->log(stage, t, scalars);
  }
  void flush() override {
    for (const auto& l : extra_) l->flush();
  }
  Metrics last;

 private:
  static std::string metrics_text(const Metrics& m) {
    std::vector<std::string> parts;
    for (const auto& [set, values] : m)
      for (const auto& [k, v] : values) parts.push_back(fmt::format("{}/{}={:.4f}", set, k, v));
    return fmt::format("{}", fmt::join(parts, " "));
  }
  MetricsLog& log_;
  Progress& progress_;
  std::vector<std::shared_ptr<Logger>> extra_;
};

struct StageSummary {
  std::string name;
  Timestamp start, end;
  double loss = 0;
  Metrics metrics;
  double seconds = 0;
  std::vector<double> losses;  // at each log point, for the summary's sparkline
};

std::string metrics_text(const Metrics& m) {
  std::vector<std::string> parts;
  for (const auto& [set, values] : m)
    for (const auto& [k, v] : values) parts.push_back(fmt::format("{}/{}={:.4f}", set, k, v));
  return fmt::format("{}", fmt::join(parts, " "));
}

// ---------------------------------------------------------------- run
struct RunArgs {
  std::string file;
  std::vector<std::string> sets;
  std::string run_dir;
  bool fresh = false;
  int nproc = 0;  // > 0: start this many ranks here (baton launch) instead of training
};

/// Checkpoints of a run directory: checkpoints/ckpt-<batch>[-end].baton, newest first (at the
/// same batch, a stage end before an interval one).
std::vector<fs::path> list_checkpoints(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".baton" && e.path().filename().string().rfind("ckpt-", 0) == 0) out.push_back(e.path());
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) { return a.filename() > b.filename(); });
  return out;
}

/// Lines of one text not in the other, for "the config changed" messages.
std::string config_diff(const std::string& before, const std::string& after) {
  auto lines = [](const std::string& t) {
    std::vector<std::string> v;
    std::stringstream ss(t);
    for (std::string l; std::getline(ss, l);) v.push_back(l);
    return v;
  };
  const auto a = lines(before), b = lines(after);
  std::string out;
  for (const auto& l : a)
    if (std::find(b.begin(), b.end(), l) == b.end()) out += "  - " + l + "\n";
  for (const auto& l : b)
    if (std::find(a.begin(), a.end(), l) == a.end()) out += "  + " + l + "\n";
  return out;
}

struct Resume {
  TrainState state;
  std::int64_t stage_index = 0;
  bool stage_done = false;
  fs::path from;
};

/// The newest valid checkpoint of the run directory, skipping (and saying so) bad ones. A
/// checkpoint of another configuration is an error: resuming it would train something else.
Expected<std::optional<Resume>> find_resume(const fs::path& dir, const Curriculum& cur, const ModelFactory& factory) {
  for (const auto& path : list_checkpoints(dir / "checkpoints")) {
    auto info = read_checkpoint_info(path);
    if (!info) {
      fmt::print(stderr, "baton: skipping checkpoint {}: {}\n", path.string(), info.error().message);
      continue;
    }
    if (info->meta.config_fingerprint != cur.fingerprint()) {
      std::string before;
      if (std::ifstream old(dir / "config.toml"); old) before.assign(std::istreambuf_iterator<char>(old), {});
      return fail(ErrorCode::invalid_spec,
                  fmt::format("{} holds a run of another configuration (its checkpoint {} has fingerprint {}, this "
                              "one {}); resuming would not train what the file says. Changes:\n{}Run with --fresh to "
                              "start over (its checkpoints and metrics are removed), or use another --run-dir",
                              dir.string(), path.filename().string(), info->meta.config_fingerprint.substr(0, 12),
                              cur.fingerprint().substr(0, 12), config_diff(before, cur.resolved_toml())));
    }
    auto state = load_checkpoint(path, factory);
    if (!state) {
      fmt::print(stderr, "baton: skipping checkpoint {}: {}\n", path.string(), state.error().message);
      continue;
    }
    const auto done = info->meta.extra.find("stage_done");
    return std::optional<Resume>(Resume{std::move(*state), info->meta.stage_index,
                                        done != info->meta.extra.end() && done->second == "1", path});
  }
  return std::optional<Resume>{};
}

int run(const RunArgs& a, const Registry& registry) {
  auto cur = load_curriculum(a.file, a.sets, registry);
  if (!cur) return report(cur.error());
  if (auto ok = cur->validate(); !ok) return report(ok.error());
  // Started by a launcher (WORLD_SIZE set): join its group; rank 0 alone writes the run
  // directory and prints, the others print only errors (or all to rank-<k>.log on request).
  std::shared_ptr<const Distributed> group;
  if (launched_distributed()) {
    auto g = Distributed::join_from_env();
    if (!g) return report(g.error());
    group = *g;
  }
  const bool lead = !group || group->rank() == 0;
  if (!lead) {
    const fs::path rank_log = (a.run_dir.empty() ? cur->run().run_dir : fs::path(a.run_dir)) / fmt::format("rank-{}.log", group->rank());
    const char* logs = std::getenv("BATON_RANK_LOGS");
    std::error_code mk;
    if (logs && std::string(logs) == "1") fs::create_directories(rank_log.parent_path(), mk);
    if (!std::freopen(logs && std::string(logs) == "1" ? rank_log.c_str() : "/dev/null", "w", stdout))
      return report(Error{ErrorCode::io, fmt::format("{}: cannot open this rank's log", rank_log.string()), {}});
  }
  int threads = cur->run().threads;
  if (threads == 0 && group) {
    // The machine's cores are shared by its ranks (idle OpenMP threads spin while a rank waits
    // in a collective): cores / ranks on this machine each, unless [run] threads says otherwise.
    const char* local = std::getenv("LOCAL_WORLD_SIZE");
    const int ranks_here = local && std::atoi(local) > 0 ? std::atoi(local) : group->world_size();
    threads = std::max(1, available_cores() / ranks_here);
  }
  auto runtime = configure_runtime({.threads = threads});
  if (!runtime) return report(runtime.error());
  fmt::print("{}\n", runtime->to_string());

  const fs::path dir = a.run_dir.empty() ? cur->run().run_dir : fs::path(a.run_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return report(Error{ErrorCode::io, fmt::format("{}: cannot create the run directory: {}", dir.string(), ec.message()), {}});
  // One writer per run directory, held until run() returns (docs/bad-inputs.md). Under a
  // launcher the ranks are one run: rank 0, the one that writes, holds it.
  std::optional<RunLock> lock;
  if (lead) {
    auto held = RunLock::acquire(dir);
    if (!held) return report(held.error());
    lock.emplace(std::move(*held));
  }
  fmt::print("run \"{}\": {} stages, max duration {}, run directory {}\n", cur->run().name, cur->stages().size(),
             cur->run().max_duration.to_string(), dir.string());

  const fs::path ckpt_dir = dir / "checkpoints";
  if (a.fresh && lead) {
    for (const char* f : {"checkpoints", "metrics.jsonl", "metrics.csv", "final.baton", "report.html"}) fs::remove_all(dir / f, ec);
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().filename().string().rfind("stage-", 0) == 0) fs::remove(e.path(), ec);
  }
  auto factory = cur->model();
  if (!factory) return report(factory.error());
  auto resume = a.fresh && !lead ? Expected<std::optional<Resume>>() : find_resume(dir, *cur, *factory);
  if (!resume) return report(resume.error());
  if (lead) write_text(dir / "config.toml", cur->resolved_toml());
  fs::create_directories(ckpt_dir, ec);
  // Temporary files of checkpoint writes that a killed run left behind (`.<name>.tmp-<pid>`):
  // never valid checkpoints, removed so they do not pile up.
  for (const auto& e : fs::directory_iterator(lead ? ckpt_dir : fs::path(), ec))
    if (const auto f = e.path().filename().string(); f.rfind(".ckpt-", 0) == 0 && f.find(".tmp-") != std::string::npos) {
      fmt::print(stderr, "baton: removing {} (an unfinished checkpoint write of an earlier run)\n", e.path().string());
      fs::remove(e.path(), ec);
    }
  Expected<TrainState> state = *resume ? Expected<TrainState>(std::move((*resume)->state)) : cur->init();
  if (!state) return report(state.error());
  if (*resume)
    fmt::print("resuming from {}: stage {}, epoch {}, batch {}\n", (*resume)->from.string(), state->stage,
               state->time.epoch, state->time.batch);
  const auto stop = std::shared_ptr<const std::atomic<bool>>(std::shared_ptr<void>(), &g_stop);
  MetricsLog log(lead ? dir : dir / fmt::format("rank-{}", group->rank()));  // absent: nothing written
  Progress progress;
  std::vector<std::shared_ptr<Logger>> extra_loggers;
  if (cur->run().tensorboard && lead) {
    auto tb = loggers::tensorboard(dir / "tensorboard");
    if (!tb) return report(tb.error());
    extra_loggers.push_back(*tb);
  }
  auto cli_logger = std::make_shared<CliLogger>(log, progress, extra_loggers);
  std::vector<StageSummary> summary;
  const auto run_started = Clock::now();

  for (std::size_t index = 0; index < cur->stages().size(); ++index) {
    const auto& builder = cur->stages()[index];
    if (*resume && (static_cast<std::int64_t>(index) < (*resume)->stage_index ||
                    (static_cast<std::int64_t>(index) == (*resume)->stage_index && (*resume)->stage_done)))
      continue;  // trained before the checkpoint
    // The stage as the file says, plus what the command line owns: the stop flag, the stage's
    // duration counted from its start (so a resumed stage ends where the file says), checkpoints
    // and the loggers. Evaluation (interval and stage end) is the spec's, run by fit.
    auto spec = builder.build().map([&](TrainingSpec s) {
      s.stop = stop;
      s.checkpoints = CheckpointPolicy{.dir = ckpt_dir,
                                       .every = cur->run().checkpoint_every,
                                       .at_stage_end = true,
                                       .on_interrupt = true,
                                       .keep = cur->run().keep_checkpoints,
                                       .meta = {.run_name = cur->run().name,
                                                .config_fingerprint = cur->fingerprint(),
                                                .stage_index = static_cast<std::int64_t>(index)}};
      s.loggers.push_back(cli_logger);
      s.distributed = group;
      return s;
    });
    if (!spec) return report(spec.error());
    auto target = stage_end(*spec, *state);
    if (!target) return report(target.error());
    StageSummary row{spec->name, state->time, state->time, 0, {}, 0, {}};
    // Where the stage begins and what it carries over, for `baton report` (metrics.jsonl).
    log.event({{"event", "stage_start"}, {"stage", spec->name}, {"epoch", state->time.epoch},
               {"batch", state->time.batch}, {"sample", state->time.sample}, {"index", index},
               {"resumed", state->stage == spec->name}, {"duration", spec->duration.to_string()},
               {"target_batch", target->batch}, {"batch_size", spec->data.batch_size},
               {"optimizer", std::string(spec->optimizer.kind())}, {"lr", spec->optimizer.lr()},
               {"optimizer_carry", spec->optimizer_carry == Carry::keep ? "keep" : "fresh"},
               {"clock", spec->schedule_clock == baton::Clock::run ? "run" : "stage"},
               {"weights", spec->model.kind == ModelCarry::Kind::keep           ? "keep"
                           : spec->model.kind == ModelCarry::Kind::reinitialize ? "reinitialize"
                                                                                : "transfer"},
               {"freeze", spec->freeze}});
    cli_logger->last.clear();
    const auto stage_started = Clock::now();
    const std::int64_t first_batch = state->time.batch, total = target->batch - first_batch;
    // Training goes in chunks (fit is split-invariant: the bits are those of one fit), which
    // gives the progress bar and the train log their moments.
    const std::int64_t chunk = std::clamp<std::int64_t>(total / 100, 1, 50);
    double loss = 0;
    bool stopped = false;
    while (state->time.batch < target->batch && !stopped) {
      const std::int64_t step = std::min(chunk, target->batch - state->time.batch);
      const auto t0 = Clock::now();
      const auto sample0 = state->time.sample;
      auto next = fit(*spec, std::move(*state), Time::batches(step));  // the spec (and its stage clock) unchanged
      if (!next) {
        progress.line("");
        return report(next.error());
      }
      state = std::move(next);
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      const double sps = static_cast<double>(state->time.sample - sample0) / std::max(secs, 1e-9);
      const auto& rec = state->history.back();
      loss = rec.last_loss;
      row.losses.push_back(loss);
      const std::int64_t done = state->time.batch - first_batch;
      const double elapsed = std::chrono::duration<double>(Clock::now() - stage_started).count();
      const double eta = done > 0 ? elapsed * static_cast<double>(total - done) / static_cast<double>(done) : 0;
      if (rec.interrupted || g_stop) {
        progress.line("");
        fmt::print(stderr, "baton: interrupted at epoch {}, batch {} (stage \"{}\"); checkpoint written to {}.\n"
                           "Resume with: baton run {}{}\n",
                   state->time.epoch, state->time.batch, spec->name, ckpt_dir.string(), a.file,
                   a.run_dir.empty() ? "" : " --run-dir " + a.run_dir);
        return exit_interrupted;
      }
      progress.update(spec->name, state->time, done, total, sps, loss, eta);
      const std::map<std::string, double> train{{"loss", loss}, {"lr", rec.last_lr}, {"samples_per_s", sps}};
      log.write("train", spec->name, state->time, "", train);
      for (const auto& l : extra_loggers)
        l->log(spec->name, state->time, {{"train/loss", loss}, {"train/lr", rec.last_lr}, {"train/samples_per_s", sps}});
      if (!rec.stop_reason.empty()) {
        progress.line(fmt::format("[{}] stage ended early: {}", spec->name, rec.stop_reason));
        stopped = true;
      }
    }
    if (const auto& h = state->history; !h.empty() && h.back().skipped_batches > 0)
      progress.line(fmt::format("[{}] {} batches skipped: non-finite loss or gradients (on_non_finite = \"skip\")",
                                spec->name, h.back().skipped_batches));
    progress.finish_stage();
    row.metrics = cli_logger->last;
    row.end = state->time;
    row.loss = loss;
    row.seconds = std::chrono::duration<double>(Clock::now() - stage_started).count();
    json end_event = {{"event", "stage_end"}, {"stage", row.name}, {"epoch", row.end.epoch}, {"batch", row.end.batch},
                      {"sample", row.end.sample}, {"seconds", row.seconds}, {"loss", row.loss}};
    if (!state->history.empty() && !state->history.back().stop_reason.empty())
      end_event["stop_reason"] = state->history.back().stop_reason;
    log.event(end_event);
    fmt::print("stage {} done: epoch {}, batch {}, loss {:.4f} {} ({})\n", row.name, row.end.epoch, row.end.batch,
               row.loss, metrics_text(row.metrics), duration_text(row.seconds));
    summary.push_back(std::move(row));
  }
  if (!lead) return exit_ok;  // rank 0 writes the final state (the ranks' states are equal)
  if (auto ok = save_checkpoint(*state, dir / "final.baton",
                                {.run_name = cur->run().name, .config_fingerprint = cur->fingerprint(),
                                 .stage_index = static_cast<std::int64_t>(cur->stages().size())});
      !ok)
    return report(ok.error());

  // Summary table.
  fmt::print("\n{:<14} {:>10} {:>8} {:>10} {:<16} {:>9}  {}\n", "stage", "epochs", "batches", "loss", " loss curve",
             "time", "eval");
  for (const auto& r : summary) {
    // The sparkline's width in bytes is 3 per bar: pad by hand so the columns line up.
    const auto spark = report::sparkline(r.losses, 16);
    const auto bars = spark.size() / 3;
    fmt::print("{:<14} {:>4} -> {:<3} {:>8} {:>10.4f}  {}{} {:>9}  {}\n", r.name, r.start.epoch, r.end.epoch,
               r.end.batch - r.start.batch, r.loss, spark, std::string(bars < 15 ? 15 - bars : 0, ' '),
               duration_text(r.seconds), metrics_text(r.metrics));
  }
  fmt::print("total time {}; final state {} (params_sha256 {})\n",
             duration_text(std::chrono::duration<double>(Clock::now() - run_started).count()),
             (dir / "final.baton").string(), params_sha256(*state));
  if (summary.empty() && !cur->stages().empty()) {  // resumed after the last stage had ended
    if (auto plan = cur->stages().back().eval(); plan && !plan->spec.sets.empty())
      if (auto m = eval(plan->spec, *state)) summary.push_back(StageSummary{state->stage, state->time, state->time, 0, *m, 0, {}});
  }
  // The report of this run directory; training succeeded, so a report that cannot be written is
  // said loudly but does not turn the run into a failure.
  if (auto page = report::write({dir}, dir / "report.html"))
    fmt::print("report: {}\n", page->string());
  else
    fmt::print(stderr, "baton: the run finished but its report was not written: {}\n", page.error().to_string());
  if (!summary.empty())
    for (const auto& [set, values] : summary.back().metrics)
      if (auto it = values.find("accuracy"); it != values.end()) fmt::print("{}_accuracy={:.4f}\n", set, it->second);
  return exit_ok;
}

// ---------------------------------------------------------------- validate, eval, inspect
int validate(const std::string& file, const std::vector<std::string>& sets, const Registry& registry) {
  auto cur = load_curriculum(file, sets, registry);
  if (!cur) return report(cur.error());
  if (auto ok = cur->validate(); !ok) return report(ok.error());
  fmt::print("{}: valid: run \"{}\", {} stages, max duration {}, fingerprint {}\n", file, cur->run().name,
             cur->stages().size(), cur->run().max_duration.to_string(), cur->fingerprint().substr(0, 16));
  return exit_ok;
}

int evaluate(const std::string& state_path, const std::string& data, std::string config, const Registry& registry) {
  if (config.empty()) {
    // A run directory holds config.toml next to its checkpoints.
    config = (fs::path(state_path).parent_path() / "config.toml").string();
  }
  auto cur = load_curriculum(config, {}, registry);
  if (!cur) return report(cur.error().with_context("--config (the run's config.toml)"));
  auto factory = cur->model();
  if (!factory) return report(factory.error());
  auto state = load_checkpoint(state_path, *factory);
  if (!state) return report(state.error());
  auto ds = cur->dataset(data);
  if (!ds) return report(ds.error());
  auto m = baton::eval({.sets = {{data, *ds}}}, *state);
  if (!m) return report(m.error());
  json j = {{"state", state_path}, {"data", data}};
  for (const auto& [k, v] : m->at(data)) j["metrics"][k] = v;
  fmt::print("{}\n", j.dump(2));
  return exit_ok;
}

int inspect(const std::string& path) {
  auto info = read_checkpoint_info(path);
  if (!info) return report(info.error());
  json j = {{"path", path},
            {"format_version", info->format_version},
            {"run", info->meta.run_name},
            {"stage", info->stage},
            {"stage_index", info->meta.stage_index},
            {"timestamp",
             {{"epoch", info->time.epoch}, {"batch", info->time.batch}, {"sample", info->time.sample},
              {"batch_in_epoch", info->time.batch_in_epoch}, {"sample_in_epoch", info->time.sample_in_epoch}}},
            {"seed", info->seed},
            {"max_duration", info->max_duration.to_string()},
            {"config_fingerprint", info->meta.config_fingerprint},
            {"params_sha256", info->params_sha256}};
  fmt::print("{}\n", j.dump(2));
  return exit_ok;
}
}  // namespace

int main(int argc, char** argv, const Registry& registry) {
  CLI::App app{"baton: train LibTorch models through pure functions, from TOML curricula"};
  app.require_subcommand(1);
  app.footer("Exit codes: 0 success, 1 training failed, 2 invalid input, 3 interrupted; a second Ctrl-C/SIGTERM: 130/143.");

  RunArgs run_args;
  auto* run_cmd = app.add_subcommand("run", "Train every stage of a curriculum, evaluate, write the run directory and its report.html");
  run_cmd->add_option("file", run_args.file, "Curriculum file (TOML)")->required()->check(CLI::ExistingFile);
  run_cmd->add_option("--set", run_args.sets, "Override a value: path=value, e.g. stage.main.optimizer.lr=1e-3");
  run_cmd->add_option("--run-dir", run_args.run_dir, "Run directory (default: run.run_dir)");
  run_cmd->add_flag("--fresh", run_args.fresh, "Start over: remove the run directory's checkpoints and metrics");
  run_cmd->add_option("--nproc", run_args.nproc, "Train data-parallel with this many local processes (see baton launch)")
      ->check(CLI::Range(1, 1024));

  LaunchOptions launch_args;
  double launch_grace = 30;
  auto* launch_cmd = app.add_subcommand(
      "launch", "Start N local ranks of a data-parallel group (RANK, WORLD_SIZE, MASTER_ADDR/PORT set): launch -n 2 -- baton run f.toml");
  launch_cmd->add_option("-n,--nproc", launch_args.nproc, "Number of processes")->required()->check(CLI::Range(1, 1024));
  launch_cmd->add_option("--grace", launch_grace, "Seconds the other ranks get to stop after one fails (default 30)")
      ->check(CLI::Range(0.0, 86400.0));
  launch_cmd->add_flag("--rank-logs", launch_args.rank_logs, "Ranks > 0 write their output to <run dir>/rank-<k>.log");
  launch_cmd->add_option("command", launch_args.command, "The command each rank runs (after --)")->required();

  std::string validate_file;
  std::vector<std::string> validate_sets;
  auto* validate_cmd = app.add_subcommand("validate", "Check a curriculum (every problem at once); train nothing");
  validate_cmd->add_option("file", validate_file, "Curriculum file (TOML)")->required()->check(CLI::ExistingFile);
  validate_cmd->add_option("--set", validate_sets, "Override a value: path=value");

  std::string eval_state, eval_data, eval_config;
  auto* eval_cmd = app.add_subcommand("eval", "Metrics of a saved state on a dataset of its config");
  eval_cmd->add_option("--state", eval_state, "Checkpoint file (.baton)")->required()->check(CLI::ExistingFile);
  eval_cmd->add_option("--data", eval_data, "Dataset name from the config's [datasets]")->required();
  eval_cmd->add_option("--config", eval_config, "Curriculum file (default: config.toml beside the state)");

  std::string inspect_path;
  auto* inspect_cmd = app.add_subcommand("inspect", "Print a checkpoint's header as JSON (timestamp, stage, params_sha256)");
  inspect_cmd->add_option("path", inspect_path, "Checkpoint file (.baton)")->required()->check(CLI::ExistingFile);

  std::vector<std::string> report_dirs;
  std::string report_out;
  auto* report_cmd = app.add_subcommand(
      "report", "One self-contained HTML page of plots and tables from run directories (several: overlaid)");
  report_cmd->add_option("run_dir", report_dirs, "Run directories written by `baton run`")->required();
  report_cmd->add_option("-o,--output", report_out,
                         "HTML file to write (default: RUN_DIR/report.html for one run, report.html for several)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? exit_ok : exit_invalid_input;
  }
  try {
    if (*launch_cmd) {
      launch_args.grace = std::chrono::milliseconds(static_cast<long>(launch_grace * 1000));
      return launch(launch_args);
    }
    if (*run_cmd && run_args.nproc > 0 && !launched_distributed()) {
      // baton run f.toml --nproc N: the same command, N times, under the launcher.
      LaunchOptions lo{.nproc = run_args.nproc, .command = {self_executable(), "run", run_args.file}};
      for (const auto& s : run_args.sets) lo.command.insert(lo.command.end(), {"--set", s});
      if (!run_args.run_dir.empty()) lo.command.insert(lo.command.end(), {"--run-dir", run_args.run_dir});
      if (run_args.fresh) lo.command.emplace_back("--fresh");
      return launch(lo);
    }
    if (*run_cmd) {
      install_run_signal_handlers();
      return run(run_args, registry);
    }
    if (*validate_cmd) return validate(validate_file, validate_sets, registry);
    if (*eval_cmd) return evaluate(eval_state, eval_data, eval_config, registry);
    if (*inspect_cmd) return inspect(inspect_path);
    if (*report_cmd) {
      std::vector<fs::path> dirs(report_dirs.begin(), report_dirs.end());
      const fs::path out = !report_out.empty() ? fs::path(report_out)
                           : dirs.size() == 1   ? dirs.front() / "report.html"
                                                : fs::path("report.html");
      auto page = report::write(dirs, out);
      if (!page) return report(page.error());
      fmt::print("report: {}\n", page->string());
      return exit_ok;
    }
  } catch (const std::exception& e) {  // I/O of logs and the like: say it and fail cleanly
    fmt::print(stderr, "baton: {}\n", e.what());
    return exit_training_failed;
  }
  return exit_invalid_input;
}

}  // namespace baton::cli
