// The baton command line: one function per subcommand declares its options and what it runs;
// main parses and dispatches. The commands themselves: run_commands.cpp (run), state_commands.cpp
// (a saved state), data_commands.cpp, curriculum_commands.cpp (sweep, validate), launch.cpp.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <torch/version.h>

#include "baton/cli.hpp"
#include "baton/distributed.hpp"
#include "baton/report.hpp"
#include "baton/runtime.hpp"
#include "commands.hpp"
#include "launch.hpp"
#include "train/signals.hpp"

namespace baton::cli {
namespace {
namespace fs = std::filesystem;

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

/// A subcommand: its options (bound to values it owns) and what it does once parsed.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> action{};
  bool handles_signals = false;  // it takes over SIGINT/SIGTERM (the held ones stay held for it)
  bool writes_files = true;      // past the file-size limit a write fails with EFBIG (not SIGXFSZ)
};

Command run_command(CLI::App& app, const std::string& program, const Registry& registry) {
  auto args = std::make_shared<RunArgs>();
  RunArgs& run_args = *args;
  run_args.program = program;
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

  return {run_cmd, [args, &registry] {
            if (args->nproc > 0 && !launched_distributed()) return run_ranks(*args);
            return run(*args, registry);
          }, true};
}

Command launch_command(CLI::App& app) {
  auto args = std::make_shared<LaunchOptions>();
  auto grace = std::make_shared<double>(30);
  LaunchOptions& launch_args = *args;
  double& launch_grace = *grace;
  auto* launch_cmd = app.add_subcommand(
      "launch", "Start N local ranks of a data-parallel group (RANK, WORLD_SIZE, MASTER_ADDR/PORT set): launch -n 2 -- baton run f.toml");
  launch_cmd->add_option("-n,--nproc", launch_args.nproc, "Number of processes")->required()->check(CLI::Range(1, 1024));
  launch_cmd->add_option("--grace", launch_grace, "Seconds the other ranks get to stop after one fails (default 30)")
      ->check(CLI::Range(0.0, 86400.0));
  launch_cmd->add_flag("--rank-logs", launch_args.rank_logs, "Ranks > 0 write their output to <run dir>/rank-<k>.log");
  launch_cmd->add_option("command", launch_args.command, "The command each rank runs (after --)")->required();

  return {launch_cmd, [args, grace] {
            args->grace = std::chrono::milliseconds(static_cast<long>(*grace * 1000));
            return launch(*args);
          }, true, false};  // launch leaves its command's signals as they were
}

Command sweep_command(CLI::App& app, const std::string& program, const Registry& registry) {
  auto args = std::make_shared<SweepArgs>();
  SweepArgs& sweep_args = *args;
  sweep_args.program = program;
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

  return {sweep_cmd, [args, &registry] { return sweep(*args, registry); }, true};
}

Command sweep_node_command(CLI::App& app, const Registry& registry) {
  auto args = std::make_shared<SweepNodeArgs>();
  SweepNodeArgs& node_args = *args;
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

  return {node_cmd, [args, &registry] { return sweep_node(*args, registry); }, true};
}

Command validate_command(CLI::App& app, const Registry& registry) {
  struct Args {
    std::string file;
    std::vector<std::string> sets;
  };
  auto args = std::make_shared<Args>();
  std::string& validate_file = args->file;
  std::vector<std::string>& validate_sets = args->sets;
  auto* validate_cmd = app.add_subcommand("validate", "Check a curriculum (every problem at once); train nothing");
  validate_cmd->add_option("file", validate_file, "Curriculum file (TOML)")->required()->check(CLI::ExistingFile);
  validate_cmd->add_option("--set", validate_sets, "Override a value: path=value");

  return {validate_cmd, [args, &registry] { return validate(args->file, args->sets, registry); }};
}

Command eval_command(CLI::App& app, const Registry& registry) {
  struct Args {
    std::string state, data, config;
    std::vector<std::string> metrics;
  };
  auto args = std::make_shared<Args>();
  std::string &eval_state = args->state, &eval_data = args->data, &eval_config = args->config;
  std::vector<std::string>& eval_metrics = args->metrics;
  auto* eval_cmd = app.add_subcommand("eval", "Metrics of a saved state on a dataset of its config");
  eval_cmd->add_option("--state", eval_state, "Checkpoint file (.baton)")->required()->check(CLI::ExistingFile);
  eval_cmd->add_option("--data", eval_data, "Dataset name from the config's [datasets]")->required();
  eval_cmd->add_option("--config", eval_config, "Curriculum file (default: config.toml beside the state)");
  eval_cmd->add_option("--metric", eval_metrics, "A metric to compute besides the loss, repeatable: accuracy, f1, "
                       "confusion_matrix, ... (docs/metrics.md); default: accuracy and top5_accuracy")->delimiter(',');

  return {eval_cmd, [args, &registry] { return evaluate(args->state, args->data, args->config, args->metrics, registry); }};
}

Command pack_command(CLI::App& app, const Registry& registry) {
  auto args = std::make_shared<PackArgs>();
  PackArgs& pack_args = *args;
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

  return {pack_cmd, [args, &registry] { return pack(*args, registry); }};
}

Command tokenize_command(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  TokenizeArgs& tok = *args;
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

  return {tokenize_cmd, [args] { return tokenize(*args); }};
}

Command export_command(CLI::App& app, const Registry& registry) {
  auto args = std::make_shared<ExportArgs>();
  ExportArgs& export_args = *args;
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

  return {export_cmd, [args, &registry] { return export_weights(*args, registry); }};
}

Command predict_command(CLI::App& app, const Registry& registry) {
  auto args = std::make_shared<PredictArgs>();
  PredictArgs& predict_args = *args;
  auto* predict_cmd = app.add_subcommand("predict", "Classify inputs with an inference artifact (baton export --inference): "
                                                    "prints or writes CSV rows input,class,name,probability");
  predict_cmd->add_option("artifact", predict_args.artifact, "Inference artifact")->required();
  predict_cmd->add_option("input", predict_args.input,
                          "An IDX file of images (.gz too), an image file (PNG, JPEG, BMP, PGM), a directory of images, "
                          "or a CSV file with the model's feature columns")->required();
  predict_cmd->add_option("-o,--output", predict_args.out, "CSV file to write (default: standard output)");
  predict_cmd->add_option("--batch-size", predict_args.batch_size, "Inputs per forward pass (default 256)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));

  return {predict_cmd, [args, &registry] { return predict(*args, registry); }};
}

Command generate_command(CLI::App& app, const Registry& registry) {
  auto args = std::make_shared<GenerateArgs>();
  GenerateArgs& generate_args = *args;
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

  return {generate_cmd, [args, &registry] { return generate(*args, registry); }};
}

Command inspect_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  std::string& inspect_path = *path;
  auto* inspect_cmd = app.add_subcommand("inspect", "Print a checkpoint's header as JSON (timestamp, stage, params_sha256)");
  inspect_cmd->add_option("path", inspect_path, "Checkpoint file (.baton)")->required()->check(CLI::ExistingFile);

  return {inspect_cmd, [path] { return inspect(*path); }};
}

Command report_command(CLI::App& app) {
  struct Args {
    std::vector<std::string> dirs;
    std::string out;
  };
  auto args = std::make_shared<Args>();
  std::vector<std::string>& report_dirs = args->dirs;
  std::string& report_out = args->out;
  auto* report_cmd = app.add_subcommand(
      "report", "One self-contained HTML page of plots and tables from run directories (several: overlaid)");
  report_cmd->add_option("run_dir", report_dirs, "Run directories written by `baton run`")->required();
  report_cmd->add_option("-o,--output", report_out,
                         "HTML file to write (default: RUN_DIR/report.html for one run, report.html for several)");

  return {report_cmd, [args] { return write_report(args->dirs, args->out); }};
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
  const std::vector<Command> commands = {
      run_command(app, program, registry), launch_command(app), sweep_command(app, program, registry),
      sweep_node_command(app, registry), validate_command(app, registry), eval_command(app, registry),
      pack_command(app, registry), tokenize_command(app), export_command(app, registry),
      predict_command(app, registry), generate_command(app, registry), inspect_command(app), report_command(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? exit_ok : exit_invalid_input;
  }
  const auto chosen = std::find_if(commands.begin(), commands.end(), [](const Command& c) { return bool(*c.app); });
  if (chosen == commands.end()) return exit_invalid_input;
  if (!chosen->handles_signals) detail::release_stop_signals();
  try {
    // Past the file-size limit (ulimit -f) a write then fails with EFBIG and is reported like a
    // full disk, instead of SIGXFSZ ending the process without a word (atomic writes hold the
    // signal back on their own; this covers the logs).
    if (chosen->writes_files) ::signal(SIGXFSZ, SIG_IGN);
    return chosen->action();
  } catch (const std::exception& e) {  // I/O of logs and the like: say it and fail cleanly
    fmt::print(stderr, "baton: {}\n", e.what());
    return exit_training_failed;
  }
}

}  // namespace baton::cli
