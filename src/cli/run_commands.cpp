// `baton run`: a curriculum end to end (a list of stages, or a tree with --jobs), on one process,
// under a launcher's group, or starting local ranks (--nproc).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <fmt/format.h>

#include "baton/callbacks.hpp"
#include "baton/checkpoint.hpp"
#include "baton/distributed.hpp"
#include "baton/fit.hpp"
#include "baton/runtime.hpp"
#include "baton/run.hpp"
#include "baton/summary.hpp"
#include "baton/sweep.hpp"
#include "baton/tree.hpp"
#include "commands.hpp"
#include "launch.hpp"
#include "train/signals.hpp"

namespace baton::cli {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;


/// Under a launcher (WORLD_SIZE set): joins its group. Ranks > 0 print only errors (or all to
/// RUN_DIR/rank-<k>.log with BATON_RANK_LOGS=1); rank 0 writes the run directory.
Expected<std::shared_ptr<const Distributed>> join_launcher(const fs::path& dir) {
  if (!launched_distributed()) return std::shared_ptr<const Distributed>{};
  auto group = Distributed::join_from_env();
  if (!group || (*group)->rank() == 0) return group;
  const fs::path rank_log = dir / fmt::format("rank-{}.log", (*group)->rank());
  const char* logs = std::getenv("BATON_RANK_LOGS");
  const bool to_file = logs && std::string(logs) == "1";
  std::error_code ec;
  if (to_file) fs::create_directories(dir, ec);
  if (!std::freopen(to_file ? rank_log.c_str() : "/dev/null", "w", stdout))
    return fail(ErrorCode::io, fmt::format("{}: cannot open this rank's log", rank_log.string()));
  return group;
}

/// `[run] threads`; 0 under a launcher: the machine's cores shared by its ranks (idle OpenMP
/// threads spin while a rank waits in a collective).
int run_threads(int threads, const Distributed* group) {
  if (threads != 0 || !group) return threads;
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const int ranks_here = local && std::atoi(local) > 0 ? std::atoi(local) : group->world_size();
  return std::max(1, available_cores() / ranks_here);
}

/// The command that goes on with this run: the same file, directory and overrides.
std::string again(const RunArgs& a) {
  std::string cmd = a.program + " run " + a.file;
  if (!a.run_dir.empty()) cmd += " --run-dir " + a.run_dir;
  for (const auto& s : a.sets) cmd += " --set " + s;
  return cmd;
}

int interrupted(const RunArgs& a, const RunResult& r) {
  std::error_code ec;
  const bool written = !r.checkpoint.empty() && fs::is_regular_file(r.checkpoint, ec);
  fmt::print(stderr, "baton: interrupted at epoch {}, batch {} (stage \"{}\"); {}.\nResume with: {}\n",
             r.state.time.epoch, r.state.time.batch, r.state.stage,
             written ? "checkpoint written to " + r.checkpoint.string() : "no checkpoint was written by this process",
             again(a));
  return exit_interrupted;
}

/// Stopped at --for / --until: what was trained, where the state is, and how to go on.
int paused(const RunArgs& a, const RunResult& r) {
  fmt::print("\n{}", r.summary());
  std::error_code ec;
  if (!r.checkpoint.empty() && fs::is_regular_file(r.checkpoint, ec))
    fmt::print("paused at epoch {}, batch {} (stage \"{}\"); checkpoint {}\nevaluate with: baton eval --state {} --data NAME\n",
               r.state.time.epoch, r.state.time.batch, r.state.stage, r.checkpoint.string(), r.checkpoint.string());
  else
    fmt::print("paused at epoch {}, batch {} (stage \"{}\")\n", r.state.time.epoch, r.state.time.batch, r.state.stage);
  fmt::print("continue with: {} [--for TIME | --until TIME]\n", again(a));
  return exit_ok;
}

/// --for / --until as the run's pause point.
Expected<void> read_pause(const RunArgs& a, RunOptions& o) {
  for (const auto& [flag, text, field] : {std::tuple{"--for", &a.for_time, &o.pause_after}, std::tuple{"--until", &a.until_time, &o.pause_at}}) {
    if (text->empty()) continue;
    auto t = Time::parse(*text);
    if (!t) return tl::unexpected(t.error().with_context(flag));
    *field = *t;
  }
  return {};
}

/// The model summary (summary.hpp) for the first stage's training samples; a model that fails on
/// them gets a note here and its error from the fit.
void print_summary(const TrainState& initial, const std::vector<TrainingSpec>& specs) {
  if (specs.empty() || specs.front().data.train.size() == 0) return;
  const auto& data = specs.front().data.train;
  const auto sample = data.input_shape();
  // Samples as the data holds them: token ids stay integers (integral inputs other than tokens
  // are made floating by the model's own first layer, as in training).
  std::optional<c10::ScalarType> dtype;
  if (auto first = data.range(0, 1); first && first->inputs.scalar_type() == torch::kLong) dtype = torch::kLong;
  auto s = summarize(initial, sample, specs, dtype);
  if (s) fmt::print("{}", s->to_string());
  else fmt::print(stderr, "baton: no model summary: {}\n", s.error().to_string());
}

/// `baton run` of a curriculum that branches: `baton::run_tree` (tree.hpp), a run directory per
/// stage under the run's, and the table of every branch beside its scratch baseline.
int run_tree(const RunArgs& a, const Curriculum& cur, const Registry& registry) {
  TreeOptions o{.dir = a.run_dir.empty() ? cur.run().run_dir : fs::path(a.run_dir), .sets = a.sets, .fresh = a.fresh,
                .jobs = a.jobs, .threads = cur.run().threads, .executable = self_executable(), .registry = registry};
  auto runtime = configure_runtime({.threads = a.jobs > 1 ? 1 : cur.run().threads});
  if (!runtime) return report(runtime.error());
  fmt::print("{}\n", runtime->to_string());
  std::size_t baselines = 0;
  for (const auto& b : cur.branches()) baselines += b.baseline ? 1 : 0;
  fmt::print("run \"{}\": a tree of {} stage{}, {} branch{}{}, max duration {} per branch, run directory {}\n", cur.run().name,
             cur.stages().size(), cur.stages().size() == 1 ? "" : "s", cur.branches().size() - baselines,
             cur.branches().size() - baselines == 1 ? "" : "es",
             baselines ? fmt::format(" and {} scratch baseline{}", baselines, baselines == 1 ? "" : "s") : "",
             cur.run().max_duration.to_string(), o.dir.string());
  const auto started = std::chrono::steady_clock::now();
  auto r = baton::run_tree(a.file, o);
  if (!r) return report(r.error());
  if (r->interrupted) {
    fmt::print(stderr, "baton: interrupted; every finished stage is kept and the others resume from their checkpoints.\n"
                       "Resume with: {}{}\n", again(a), a.jobs > 1 ? fmt::format(" --jobs {}", a.jobs) : "");
    return exit_interrupted;
  }
  print_closing(*r, started);
  return exit_ok;
}

/// `baton run`: the curriculum's stages through `baton::run` (run.hpp), which owns the run
/// directory, resume, checkpoints, metrics, progress and the report; this prints around it.
}  // namespace

int run(const RunArgs& a, const Registry& registry) {
  auto cur = load_curriculum(a.file, a.sets, registry);
  if (!cur) return report(cur.error());
  // Refused before validate, which reads (and tokenizes) every dataset.
  if (cur->is_tree() && (!a.for_time.empty() || !a.until_time.empty() || launched_distributed()))
    return report(Error{ErrorCode::invalid_argument,
                        fmt::format("{}: the stages make a tree (`from`): --for, --until and data-parallel ranks train "
                                    "one chain; run a branch's stages as a file of their own for that", a.file), {}});
  if (auto ok = cur->validate(); !ok) return report(ok.error());
  if (cur->is_tree()) return run_tree(a, *cur, registry);
  if (a.jobs > 1)
    return report(Error{ErrorCode::invalid_argument,
                        fmt::format("{}: --jobs trains the branches of a tree at once; this curriculum is one chain "
                                    "(no stage says `from`)", a.file), {}});
  auto specs = cur->specs();
  if (!specs) return report(specs.error());
  RunOptions options = cur->run_options();
  if (!a.run_dir.empty()) options.dir = a.run_dir;
  options.fresh = a.fresh;
  options.accept_runtime_change = a.accept_runtime_change;
  if (auto ok = read_pause(a, options); !ok) return report(ok.error());
  auto group = join_launcher(options.dir);
  if (!group) return report(group.error());
  options.distributed = *group;
  auto runtime = configure_runtime({.threads = run_threads(cur->run().threads, group->get())});
  if (!runtime) return report(runtime.error());
  fmt::print("{}\n", runtime->to_string());
  TransferReport taken;
  auto initial = cur->init(&taken);
  if (!initial) return report(initial.error());
  if (!taken.copied.empty() || !taken.skipped.empty()) fmt::print("model.init_from: {}\n", taken.to_string());
  fmt::print("run \"{}\": {} stage{}, max duration {}, run directory {}\n", cur->run().name, cur->stages().size(),
             cur->stages().size() == 1 ? "" : "s", cur->run().max_duration.to_string(), options.dir.string());
  print_summary(*initial, *specs);
  const auto started = std::chrono::steady_clock::now();
  auto result = baton::run(options, *specs, std::move(*initial));
  if (!result) return report(result.error());
  if (result->interrupted) return interrupted(a, *result);
  if (*group && (*group)->rank() != 0) return exit_ok;  // rank 0 wrote the final state
  if (result->paused) return paused(a, *result);
  fmt::print("\n{}", result->summary());
  fmt::print("total time {}; final state {} (params_sha256 {})\n",
             duration_text(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()),
             (options.dir / "final.baton").string(), params_sha256(result->state));
  for (const auto& [set, values] : result->final_metrics)
    if (auto it = values.find("accuracy"); it != values.end()) fmt::print("{}_accuracy={:.4f}\n", set, it->second);
  return exit_ok;
}

// ---------------------------------------------------------------- validate, eval, inspect
int run_ranks(const RunArgs& a) {
  LaunchOptions lo{.nproc = a.nproc, .command = {self_executable(), "run", a.file}};
  for (const auto& s : a.sets) lo.command.insert(lo.command.end(), {"--set", s});
  if (!a.run_dir.empty()) lo.command.insert(lo.command.end(), {"--run-dir", a.run_dir});
  if (a.fresh) lo.command.emplace_back("--fresh");
  if (a.accept_runtime_change) lo.command.emplace_back("--accept-runtime-change");
  if (!a.for_time.empty()) lo.command.insert(lo.command.end(), {"--for", a.for_time});
  if (!a.until_time.empty()) lo.command.insert(lo.command.end(), {"--until", a.until_time});
  return launch(lo);
}

}  // namespace baton::cli
