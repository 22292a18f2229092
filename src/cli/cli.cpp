// The baton command line: run, validate, eval, inspect.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "baton/checkpoint.hpp"
#include "baton/cli.hpp"
#include "baton/fit.hpp"
#include "baton/runtime.hpp"

namespace baton::cli {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

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
};

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
  write_text(dir / "config.toml", cur->resolved_toml());
  fmt::print("run \"{}\": {} stages, max duration {}, run directory {}\n", cur->run().name, cur->stages().size(),
             cur->run().max_duration.to_string(), dir.string());

  auto state = cur->init();
  if (!state) return report(state.error());
  MetricsLog log(dir);
  Progress progress;
  std::vector<StageSummary> summary;
  const auto run_started = Clock::now();

  for (std::size_t index = 0; index < cur->stages().size(); ++index) {
    const auto& builder = cur->stages()[index];
    auto spec = builder.build();
    auto plan = builder.eval();
    if (!spec) return report(spec.error());
    if (!plan) return report(plan.error());
    auto target = stage_end(*spec, *state);
    if (!target) return report(target.error());
    StageSummary row{spec->name, state->time, state->time, 0, {}, 0};
    const auto stage_started = Clock::now();
    const std::int64_t first_batch = state->time.batch, total = target->batch - first_batch;
    // Evaluation points, anchored at the stage's start: k * interval for k = 1, 2, ...
    auto next_eval = [&](const TrainState& s) -> std::int64_t {
      if (!plan->interval) return target->batch;
      for (int k = 1;; ++k) {
        Time t = *plan->interval;
        t.value *= k;
        if (t.unit == TimeUnit::duration && t.value > 1) return target->batch;
        auto at = stage_end(spec->with_duration(t), s);
        if (!at || at->batch >= target->batch) return target->batch;
        if (at->batch > s.time.batch) return at->batch;
      }
    };
    std::int64_t eval_at = next_eval(*state);
    // Training goes in chunks (fit is split-invariant: the bits are those of one fit), which
    // gives the progress bar and interval evaluation their moments.
    const std::int64_t chunk = std::clamp<std::int64_t>(total / 100, 1, 50);
    double loss = 0;
    while (state->time.batch < target->batch) {
      const std::int64_t step = std::min({chunk, target->batch - state->time.batch, eval_at - state->time.batch});
      const auto t0 = Clock::now();
      const auto sample0 = state->time.sample;
      auto next = fit(spec->with_duration(Time::batches(step)), std::move(*state));
      if (!next) {
        progress.line("");
        return report(next.error());
      }
      state = std::move(next);
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      const double sps = static_cast<double>(state->time.sample - sample0) / std::max(secs, 1e-9);
      loss = state->history.back().last_loss;
      const std::int64_t done = state->time.batch - first_batch;
      const double elapsed = std::chrono::duration<double>(Clock::now() - stage_started).count();
      const double eta = done > 0 ? elapsed * static_cast<double>(total - done) / static_cast<double>(done) : 0;
      progress.update(spec->name, state->time, done, total, sps, loss, eta);
      log.write("train", spec->name, state->time, "", {{"loss", loss}, {"lr", state->history.back().last_lr}, {"samples_per_s", sps}});
      if (state->time.batch >= eval_at && state->time.batch < target->batch) {
        auto m = eval(plan->spec, *state);
        if (!m) return report(m.error());
        for (const auto& [set, values] : *m) log.write("eval", spec->name, state->time, set, values);
        progress.line(fmt::format("[{}] epoch {} batch {}: {}", spec->name, state->time.epoch, state->time.batch, metrics_text(*m)));
        eval_at = next_eval(*state);
      }
    }
    progress.finish_stage();
    if (!plan->spec.sets.empty()) {
      auto m = eval(plan->spec, *state);
      if (!m) return report(m.error());
      for (const auto& [set, values] : *m) log.write("eval", spec->name, state->time, set, values);
      row.metrics = *m;
    }
    row.end = state->time;
    row.loss = loss;
    row.seconds = std::chrono::duration<double>(Clock::now() - stage_started).count();
    fmt::print("stage {} done: epoch {}, batch {}, loss {:.4f} {} ({})\n", row.name, row.end.epoch, row.end.batch,
               row.loss, metrics_text(row.metrics), duration_text(row.seconds));
    if (auto ok = save_checkpoint(*state, dir / fmt::format("stage-{:02}-{}.baton", index, spec->name),
                                  {.run_name = cur->run().name, .config_fingerprint = cur->fingerprint(),
                                   .stage_index = static_cast<std::int64_t>(index)});
        !ok)
      return report(ok.error());
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
    if (*run_cmd) return run(run_args, registry);
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
