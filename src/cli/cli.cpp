// The baton command line: run, sweep, validate, report; the commands on a saved state are in
// state_commands.cpp.
#include <signal.h>
#include <unistd.h>

#include <atomic>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <tuple>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include "baton/callbacks.hpp"
#include "baton/checkpoint.hpp"
#include "baton/cli.hpp"
#include "baton/distributed.hpp"
#include "baton/fit.hpp"
#include "baton/runtime.hpp"
#include "baton/report.hpp"
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
using json = nlohmann::json;

// ---------------------------------------------------------------- run
struct RunArgs {
  std::string program = "baton";  // as the user typed it (argv[0]): the name hints repeat
  std::string file;
  std::vector<std::string> sets;
  std::string run_dir;
  bool fresh = false;
  bool accept_runtime_change = false;
  std::string for_time, until_time;  // pause after this much more / at this point of the run
  int nproc = 0;  // > 0: start this many ranks here (baton launch) instead of training
  int jobs = 1;   // a tree: stages trained at once
};

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
  if (!a.for_time.empty() || !a.until_time.empty() || launched_distributed())
    return report(Error{ErrorCode::invalid_argument,
                        fmt::format("{}: the stages make a tree (`from`): --for, --until and data-parallel ranks train "
                                    "one chain; run a branch's stages as a file of their own for that", a.file), {}});
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
int run(const RunArgs& a, const Registry& registry) {
  auto cur = load_curriculum(a.file, a.sets, registry);
  if (!cur) return report(cur.error());
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

int write_report(const std::vector<std::string>& run_dirs, const std::string& out_file) {
  std::vector<fs::path> dirs(run_dirs.begin(), run_dirs.end());
  const fs::path out = !out_file.empty() ? fs::path(out_file)
                       : dirs.size() == 1 ? dirs.front() / "report.html"
                                          : fs::path("report.html");
  auto page = report::write(dirs, out);
  if (!page) return report(page.error());
  fmt::print("report: {}\n", page->string());
  return exit_ok;
}
}  // namespace

int main(int argc, char** argv, const Registry& registry) {
  // SIGINT/SIGTERM from the start are held until the command's handler takes over (a run's:
  // a signal while the program starts stops the run as one later does, exit 3), or released
  // below for commands without one. Then the thread-policy re-exec (runtime.hpp), which keeps
  // held signals pending.
  detail::hold_stop_signals();
  relaunch_with_thread_policy(argv);
  struct Release {
    ~Release() { detail::release_stop_signals(); }
  } release_at_end;
  const std::string program = argc > 0 && argv[0] ? argv[0] : "baton";
  CLI::App app{"baton: train LibTorch models through pure functions, from TOML curricula"};
  app.set_version_flag("--version", fmt::format("baton {} (LibTorch {}.{}.{}, C++ library and command line)", BATON_VERSION,
                                               TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, TORCH_VERSION_PATCH));
  app.require_subcommand(1);
  app.footer("Exit codes: 0 success, 1 training failed, 2 invalid input, 3 interrupted; a second Ctrl-C/SIGTERM: 130/143.");

  RunArgs run_args;
  auto* run_cmd = app.add_subcommand("run", "Train every stage of a curriculum, evaluate, write the run directory and its report.html");
  run_cmd->add_option("file", run_args.file, "Curriculum file (TOML)")->required()->check(CLI::ExistingFile);
  run_cmd->add_option("--set", run_args.sets, "Override a value: path=value, e.g. stage.main.optimizer.lr=1e-3");
  run_cmd->add_option("--run-dir,--dir", run_args.run_dir, "Run directory (default: run.run_dir); --dir is an alias");
  run_cmd->add_flag("--fresh", run_args.fresh, "Start over: remove the run directory's checkpoints and metrics");
  auto* for_opt = run_cmd->add_option("--for", run_args.for_time,
                                      "Train this much more (e.g. 1ep, 0.5ep, 200ba), checkpoint and stop (exit 0); run again to go on");
  run_cmd->add_option("--until", run_args.until_time,
                      "Train until the run's clock reaches this (e.g. 3ep, 2.5ep), checkpoint and stop (exit 0)")
      ->excludes(for_opt);
  run_cmd->add_flag("--accept-runtime-change", run_args.accept_runtime_change,
                    "Resume even where threads, LibTorch, CPU kernels or BLAS differ from the checkpoint's (the run "
                    "is then marked not bit-exact)");
  run_cmd->add_option("--jobs", run_args.jobs,
                      "A curriculum that branches: train this many stages at once in child processes, run.threads / N "
                      "threads each (default 1)")
      ->check(CLI::Range(1, 1024));
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

  SweepArgs sweep_args;
  auto* sweep_cmd = app.add_subcommand("sweep", "Train a grid of overrides; stages the points share are trained once");
  sweep_cmd->add_option("file", sweep_args.file, "Curriculum file (TOML)")->required()->check(CLI::ExistingFile);
  sweep_cmd->add_option("--grid", sweep_args.grid,
                        "An axis: path=[v1, v2, ...]; several make a product (default: the file's [sweep] table)");
  sweep_cmd->add_option("--set", sweep_args.sets, "Override a value for every point: path=value");
  sweep_cmd->add_option("--run-dir,--dir", sweep_args.dir,
                        "Sweep directory (default: the run directory + \"-sweep\"); --dir is an alias");
  sweep_cmd->add_option("--metric", sweep_args.metric, "set/metric that ranks the points (default: the accuracy of the first set the last stage evaluates)");
  sweep_cmd->add_flag("--minimize", sweep_args.minimize, "The best point has the smallest metric (e.g. a loss)");
  sweep_cmd->add_option("--jobs", sweep_args.jobs,
                        "Train this many stage runs at once in child processes, run.threads / N threads each "
                        "(default: the file's [sweep] jobs, else 1)")
      ->check(CLI::Range(1, 1024));

  SweepNodeArgs node_args;
  auto* node_cmd = app.add_subcommand("sweep-node", "One stage run of a sweep with --jobs (started by baton sweep)");
  node_cmd->group("");  // not listed in --help
  node_cmd->add_option("file", node_args.file)->required();
  node_cmd->add_option("--dir", node_args.dir)->required();
  node_cmd->add_option("--stage", node_args.stage)->required();
  node_cmd->add_option("--threads", node_args.threads)->check(CLI::Range(1, 1024));
  node_cmd->add_option("--set", node_args.sets);
  node_cmd->add_option("--branch", node_args.branch);
  node_cmd->add_flag("--by-stage", node_args.by_stage);
  node_cmd->add_flag("--fresh", node_args.fresh);

  std::string validate_file;
  std::vector<std::string> validate_sets;
  auto* validate_cmd = app.add_subcommand("validate", "Check a curriculum (every problem at once); train nothing");
  validate_cmd->add_option("file", validate_file, "Curriculum file (TOML)")->required()->check(CLI::ExistingFile);
  validate_cmd->add_option("--set", validate_sets, "Override a value: path=value");

  std::string eval_state, eval_data, eval_config;
  std::vector<std::string> eval_metrics;
  auto* eval_cmd = app.add_subcommand("eval", "Metrics of a saved state on a dataset of its config");
  eval_cmd->add_option("--state", eval_state, "Checkpoint file (.baton)")->required()->check(CLI::ExistingFile);
  eval_cmd->add_option("--data", eval_data, "Dataset name from the config's [datasets]")->required();
  eval_cmd->add_option("--config", eval_config, "Curriculum file (default: config.toml beside the state)");
  eval_cmd->add_option("--metric", eval_metrics, "A metric to compute besides the loss, repeatable: accuracy, f1, "
                       "confusion_matrix, ... (docs/metrics.md); default: accuracy and top5_accuracy")->delimiter(',');

  PackArgs pack_args;
  auto* pack_cmd = app.add_subcommand("pack", "A dataset of a curriculum as packed shards on disk, for training "
                                              "by reading records from files as batches are made (kind = \"shards\"; docs/data.md); a language "
                                              "model's data as token shards (kind = \"token_shards\")");
  pack_cmd->add_option("config", pack_args.config, "Curriculum file that defines the dataset")->required()->check(CLI::ExistingFile);
  pack_cmd->add_option("data", pack_args.data, "Dataset name from its [datasets]")->required();
  pack_cmd->add_option("-o,--output", pack_args.out, "Directory to create (must not exist)")->required();
  pack_cmd->add_option("--records-per-shard", pack_args.records_per_shard, "Samples per shard file (default 65536)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  pack_cmd->add_option("--tokens-per-shard", pack_args.tokens_per_shard,
                       "A language model's data: tokens per shard file (default 16777216)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  pack_cmd->add_flag("--float", pack_args.as_float, "Store image inputs as float32, not as 8-bit pixels");
  pack_cmd->add_option("--set", pack_args.sets, "Override a value of the curriculum: path=value");

  TokenizeArgs tok;
  auto* tokenize_cmd = app.add_subcommand("tokenize", "Train a SentencePiece tokenizer on the training part of the fortune "
                                                      "databases (docs/language-models.md)");
  tokenize_cmd->add_option("-o,--output", tok.out, "The tokenizer file to write (a SentencePiece .model)")->required();
  tokenize_cmd->add_option("--languages", tok.options.corpus.languages, "Languages: en, de, es, it, ru, pl (default en)")
      ->delimiter(',');
  tokenize_cmd->add_option("--topics", tok.options.corpus.topics, "Topic files only (default: all)")->delimiter(',');
  tokenize_cmd->add_option("--dir", tok.options.corpus.dir, "The fortunes directory (default /usr/share/games/fortunes)");
  tokenize_cmd->add_flag("--skip-undecodable", tok.options.corpus.skip_undecodable, "Skip records that are not UTF-8 (counted)");
  tokenize_cmd->add_option("--val", tok.options.split.val, "The split's validation fraction, as the datasets' (default 0.05)");
  tokenize_cmd->add_option("--test", tok.options.split.test, "The split's test fraction, as the datasets' (default 0.05)");
  tokenize_cmd->add_option("--vocab-size", tok.options.tokenizer.vocab_size, "Tokens, with 3 special and 256 byte tokens (default 4096)")
      ->check(CLI::Range(std::int64_t{260}, std::int64_t{65535}));
  tokenize_cmd->add_option("--type", tok.options.tokenizer.type, "bpe (default) or unigram")->check(CLI::IsMember({"bpe", "unigram"}));

  ExportArgs export_args;
  auto* export_cmd = app.add_subcommand("export", "A saved state's weights as a state_dict file for Python "
                                                  "(model.load_state_dict(torch.load(FILE)); docs/interop.md), or "
                                                  "with --inference an artifact for baton predict");
  export_cmd->add_option("state", export_args.state, "Checkpoint file (.baton)")->required()->check(CLI::ExistingFile);
  export_cmd->add_option("-o,--output", export_args.out, "File to write, e.g. model.pt")->required();
  export_cmd->add_option("--weights", export_args.weights, "The weights an algorithm keeps instead of the model's own: ema or swa");
  export_cmd->add_option("--config", export_args.config, "Curriculum file (default: config.toml beside the state)");
  export_cmd->add_flag("--inference", export_args.inference,
                       "Write an inference artifact: the weights and a model card (model, input, class names)");
  export_cmd->add_option("--data", export_args.data,
                         "With --inference: the dataset whose inputs the model takes (default: the last stage's training data)");
  export_cmd->add_option("--classes", export_args.classes, "With --inference: class names by index, comma-separated")
      ->delimiter(',');

  PredictArgs predict_args;
  auto* predict_cmd = app.add_subcommand("predict", "Classify inputs with an inference artifact (baton export --inference): "
                                                    "prints or writes CSV rows input,class,name,probability");
  predict_cmd->add_option("artifact", predict_args.artifact, "Inference artifact")->required();
  predict_cmd->add_option("input", predict_args.input,
                          "An IDX file of images (.gz too), an image file (PNG, JPEG, BMP, PGM), a directory of images, "
                          "or a CSV file with the model's feature columns")->required();
  predict_cmd->add_option("-o,--output", predict_args.out, "CSV file to write (default: standard output)");
  predict_cmd->add_option("--batch-size", predict_args.batch_size, "Inputs per forward pass (default 256)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));

  GenerateArgs generate_args;
  auto* generate_cmd = app.add_subcommand("generate", "Text a language model continues from a prompt: from an inference "
                                                      "artifact (baton export --inference) or a checkpoint of a run");
  generate_cmd->add_option("source", generate_args.source, "Inference artifact, or checkpoint file (.baton)")
      ->required()->check(CLI::ExistingFile);
  generate_cmd->add_option("--prompt", generate_args.prompt, "The text to continue (default: none, a new record)");
  generate_cmd->add_option("--max-tokens", generate_args.options.max_tokens, "At most this many new tokens (default 200)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 20));
  generate_cmd->add_option("--temperature", generate_args.options.temperature,
                           "Logits / temperature before sampling; 0 takes the most likely token (default 1)")
      ->check(CLI::Range(0.0, 1e6));
  generate_cmd->add_option("--top-k", generate_args.options.top_k, "Sample among the k most likely tokens (default 0: all)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 30));
  generate_cmd->add_option("--seed", generate_args.options.seed, "Sampling seed: the same seed gives the same text (default 0)");
  generate_cmd->add_option("--samples", generate_args.samples, "Texts to generate, sample i with seed + i (default 1)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{10000}));
  generate_cmd->add_option("--config", generate_args.config, "A checkpoint's curriculum file (default: config.toml beside it)");

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
  run_args.program = sweep_args.program = program;
  if (!*launch_cmd && !*run_cmd && !*sweep_cmd && !*node_cmd) detail::release_stop_signals();
  try {
    if (*launch_cmd) {
      launch_args.grace = std::chrono::milliseconds(static_cast<long>(launch_grace * 1000));
      return launch(launch_args);
    }
    // Every other command writes files. Past the file-size limit (ulimit -f) a write then fails
    // with EFBIG and is reported like a full disk, instead of SIGXFSZ ending the process without a
    // word (atomic writes hold the signal back on their own; this covers the logs). `launch`
    // leaves its command's signals as they were.
    ::signal(SIGXFSZ, SIG_IGN);
    if (*run_cmd && run_args.nproc > 0 && !launched_distributed()) return run_ranks(run_args);
    if (*run_cmd) return run(run_args, registry);
    if (*sweep_cmd) return sweep(sweep_args, registry);
    if (*node_cmd) return sweep_node(node_args, registry);
    if (*validate_cmd) return validate(validate_file, validate_sets, registry);
    if (*eval_cmd) return evaluate(eval_state, eval_data, eval_config, eval_metrics, registry);
    if (*inspect_cmd) return inspect(inspect_path);
    if (*export_cmd) return export_weights(export_args, registry);
    if (*pack_cmd) return pack(pack_args, registry);
    if (*tokenize_cmd) return tokenize(tok);
    if (*predict_cmd) return predict(predict_args, registry);
    if (*generate_cmd) return generate(generate_args, registry);
    if (*report_cmd) return write_report(report_dirs, report_out);
  } catch (const std::exception& e) {  // I/O of logs and the like: say it and fail cleanly
    fmt::print(stderr, "baton: {}\n", e.what());
    return exit_training_failed;
  }
  return exit_invalid_input;
}

}  // namespace baton::cli
