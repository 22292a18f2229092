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
#include "baton/fit.hpp"
#include "baton/runtime.hpp"
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

std::string duration_text(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  return s >= 3600 ? fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60) : fmt::format("{}:{:02}", s / 60, s % 60);
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
 private:
  std::ofstream jsonl_;
  fs::path csv_path_;
  std::ofstream csv_;
};

/// A progress bar on a terminal; plain lines every ~10% otherwise.
class Progress {
 public:
  Progress() : tty_(::isatty(STDOUT_FILENO) == 1) {}
  void update(const std::string& stage, const Timestamp& t, std::int64_t done, std::int64_t total, double samples_per_s,
              double loss, double eta_s) {
    const double frac = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    if (tty_) {
      constexpr int width = 24;
      const int fill = static_cast<int>(frac * width);
      fmt::print("\r\033[K[{}] epoch {} [{}{}] {:3.0f}% {:6.0f} sp/s loss {:.4f} ETA {}", stage, t.epoch,
                 std::string(static_cast<std::size_t>(fill), '#'), std::string(static_cast<std::size_t>(width - fill), '.'),
                 frac * 100, samples_per_s, loss, duration_text(eta_s));
      std::fflush(stdout);
    } else if (frac >= next_line_ || done == total) {
      fmt::print("[{}] epoch {} batch {} ({:.0f}%): {:.0f} samples/s, loss {:.4f}, ETA {}\n", stage, t.epoch, t.batch,
                 frac * 100, samples_per_s, loss, duration_text(eta_s));
      std::fflush(stdout);
      while (next_line_ <= frac) next_line_ += 0.1;
    }
  }
  void finish_stage() {
    if (tty_) fmt::print("\n");
    next_line_ = 0.1;
  }
  void line(const std::string& text) {
    if (tty_) fmt::print("\r\033[K");
    fmt::print("{}\n", text);
    std::fflush(stdout);
  }
 private:
  bool tty_;
  double next_line_ = 0.1;
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
  auto runtime = configure_runtime({.threads = cur->run().threads});
  if (!runtime) return report(runtime.error());
  fmt::print("{}\n", runtime->to_string());

  const fs::path dir = a.run_dir.empty() ? cur->run().run_dir : fs::path(a.run_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return report(Error{ErrorCode::io, fmt::format("{}: cannot create the run directory: {}", dir.string(), ec.message()), {}});
  // One writer per run directory, held until run() returns (docs/bad-inputs.md).
  auto lock = RunLock::acquire(dir);
  if (!lock) return report(lock.error());
  fmt::print("run \"{}\": {} stages, max duration {}, run directory {}\n", cur->run().name, cur->stages().size(),
             cur->run().max_duration.to_string(), dir.string());

  const fs::path ckpt_dir = dir / "checkpoints";
  if (a.fresh) {
    for (const char* f : {"checkpoints", "metrics.jsonl", "metrics.csv", "final.baton"}) fs::remove_all(dir / f, ec);
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().filename().string().rfind("stage-", 0) == 0) fs::remove(e.path(), ec);
  }
  auto factory = cur->model();
  if (!factory) return report(factory.error());
  auto resume = find_resume(dir, *cur, *factory);
  if (!resume) return report(resume.error());
  write_text(dir / "config.toml", cur->resolved_toml());
  fs::create_directories(ckpt_dir, ec);
  // Temporary files of checkpoint writes that a killed run left behind (`.<name>.tmp-<pid>`):
  // never valid checkpoints, removed so they do not pile up.
  for (const auto& e : fs::directory_iterator(ckpt_dir, ec))
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
  MetricsLog log(dir);
  Progress progress;
  std::vector<std::shared_ptr<Logger>> extra_loggers;
  if (cur->run().tensorboard) {
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
      s.duration_anchor = Anchor::stage;
      s.checkpoints = CheckpointPolicy{.dir = ckpt_dir,
                                       .every = cur->run().checkpoint_every,
                                       .at_stage_end = true,
                                       .on_interrupt = true,
                                       .keep = cur->run().keep_checkpoints,
                                       .meta = {.run_name = cur->run().name,
                                                .config_fingerprint = cur->fingerprint(),
                                                .stage_index = static_cast<std::int64_t>(index)}};
      s.loggers.push_back(cli_logger);
      return s;
    });
    if (!spec) return report(spec.error());
    auto target = stage_end(*spec, *state);
    if (!target) return report(target.error());
    StageSummary row{spec->name, state->time, state->time, 0, {}, 0};
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
      auto next = fit(*spec, std::move(*state), step);  // the spec (and its stage clock) unchanged
      if (!next) {
        progress.line("");
        return report(next.error());
      }
      state = std::move(next);
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      const double sps = static_cast<double>(state->time.sample - sample0) / std::max(secs, 1e-9);
      const auto& rec = state->history.back();
      loss = rec.last_loss;
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
    fmt::print("stage {} done: epoch {}, batch {}, loss {:.4f} {} ({})\n", row.name, row.end.epoch, row.end.batch,
               row.loss, metrics_text(row.metrics), duration_text(row.seconds));
    summary.push_back(std::move(row));
  }
  if (auto ok = save_checkpoint(*state, dir / "final.baton",
                                {.run_name = cur->run().name, .config_fingerprint = cur->fingerprint(),
                                 .stage_index = static_cast<std::int64_t>(cur->stages().size())});
      !ok)
    return report(ok.error());

  // Summary table.
  fmt::print("\n{:<14} {:>10} {:>8} {:>10} {:>9}  {}\n", "stage", "epochs", "batches", "loss", "time", "eval");
  for (const auto& r : summary)
    fmt::print("{:<14} {:>4} -> {:<3} {:>8} {:>10.4f} {:>9}  {}\n", r.name, r.start.epoch, r.end.epoch,
               r.end.batch - r.start.batch, r.loss, duration_text(r.seconds), metrics_text(r.metrics));
  fmt::print("total time {}; final state {} (params_sha256 {})\n",
             duration_text(std::chrono::duration<double>(Clock::now() - run_started).count()),
             (dir / "final.baton").string(), params_sha256(*state));
  if (summary.empty() && !cur->stages().empty()) {  // resumed after the last stage had ended
    if (auto plan = cur->stages().back().eval(); plan && !plan->spec.sets.empty())
      if (auto m = eval(plan->spec, *state)) summary.push_back(StageSummary{state->stage, state->time, state->time, 0, *m, 0});
  }
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
  app.footer("Exit codes: 0 success, 1 training failed, 2 invalid input, 3 interrupted.");

  RunArgs run_args;
  auto* run_cmd = app.add_subcommand("run", "Train every stage of a curriculum, evaluate, write the run directory");
  run_cmd->add_option("file", run_args.file, "Curriculum file (TOML)")->required()->check(CLI::ExistingFile);
  run_cmd->add_option("--set", run_args.sets, "Override a value: path=value, e.g. stage.main.optimizer.lr=1e-3");
  run_cmd->add_option("--run-dir", run_args.run_dir, "Run directory (default: run.run_dir)");
  run_cmd->add_flag("--fresh", run_args.fresh, "Start over: remove the run directory's checkpoints and metrics");

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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? exit_ok : exit_invalid_input;
  }
  try {
    if (*run_cmd) {
      install_run_signal_handlers();
      return run(run_args, registry);
    }
    if (*validate_cmd) return validate(validate_file, validate_sets, registry);
    if (*eval_cmd) return evaluate(eval_state, eval_data, eval_config, registry);
    if (*inspect_cmd) return inspect(inspect_path);
  } catch (const std::exception& e) {  // I/O of logs and the like: say it and fail cleanly
    fmt::print(stderr, "baton: {}\n", e.what());
    return exit_training_failed;
  }
  return exit_invalid_input;
}

}  // namespace baton::cli
