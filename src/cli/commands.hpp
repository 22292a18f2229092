#pragma once
// What the command line's files share: how an error is reported, and the commands on a saved
// state (state_commands.cpp).
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "baton/cli.hpp"
#include "baton/error.hpp"
#include "baton/hparams.hpp"
#include "baton/text.hpp"

namespace baton { struct SweepResult; }

namespace baton::cli {
/// The exit status for an error: training failures 1, bad input 2.
int exit_code_for(const Error& e);
/// Prints "baton: <error>" to stderr; returns its exit status.
int report(const Error& e);

/// The closing lines of a sweep or a tree: its table, then the total time since `started` and
/// the summary and report files it wrote (each named only when written; stderr said why not).
void print_closing(const SweepResult& r, std::chrono::steady_clock::time_point started);

/// `baton eval`: the loss and metrics of a saved state on a dataset of its config, as JSON.
int evaluate(const std::string& state_path, const std::string& data, std::string config,
             const std::vector<std::string>& metric_names, const Registry& registry);
/// `baton inspect`: a checkpoint's header as JSON.
int inspect(const std::string& path);
/// What `baton export` is asked for.
struct ExportArgs {
  std::string state, out, weights, config;
  bool inference = false;            ///< an inference artifact (weights + model card)
  std::string data;                  ///< the dataset whose inputs the card describes ("" the last stage's)
  std::vector<std::string> classes;  ///< class names instead of the dataset's
};
/// `baton export`: a saved state's weights as a state_dict file for Python's torch.load, or
/// (--inference) an artifact for `baton predict` and load_for_inference.
int export_weights(const ExportArgs& args, const Registry& registry);

/// What `baton predict` is asked for.
struct PredictArgs {
  std::string artifact, input, out;
  std::int64_t batch_size = 256;
};
/// `baton predict`: the class of every input (CSV: input, class, name, probability).
int predict(const PredictArgs& args, const Registry& registry);

/// What `baton generate` is asked for.
struct GenerateArgs {
  std::string source;  ///< an inference artifact, or a checkpoint (.baton) of a run
  std::string config;  ///< a checkpoint's curriculum (default: config.toml beside it)
  std::string prompt;
  std::int64_t samples = 1;
  GenerateOptions options{};
};
/// `baton generate`: text a language model continues from a prompt.
int generate(const GenerateArgs& args, const Registry& registry);

/// What `baton pack` is asked for.
struct PackArgs {
  std::string config, data, out;
  std::vector<std::string> sets;
  std::int64_t records_per_shard = 65536;
  std::int64_t tokens_per_shard = std::int64_t{1} << 24;  ///< a language model's token stream
  bool as_float = false;  ///< float32 inputs even for images
};
/// `baton pack`: a dataset of a curriculum written as packed shards (data::pack, docs/data.md).
int pack(const PackArgs& args, const Registry& registry);

/// What `baton tokenize` is asked for.
struct TokenizeArgs {
  std::string out;
  text::FortunesTokenizerOptions options{};
};
/// `baton tokenize`: a SentencePiece tokenizer trained on the training part of fortune databases.
int tokenize(const TokenizeArgs& args);

/// What `baton sweep` is asked for.
struct SweepArgs {
  std::string program = "baton";  // as the user typed it (argv[0])
  std::string file, dir, metric;
  std::vector<std::string> sets, grid;
  bool minimize = false;
  int jobs = 0;  // 0: the file's [sweep] jobs, else 1
};
/// `baton sweep`: the points of --grid (else the file's [sweep] table) (curriculum_commands.cpp).
int sweep(const SweepArgs& a, const Registry& registry);
/// What `baton sweep-node` (not listed) is asked for: one node, started by a sweep or a tree with jobs > 1.
struct SweepNodeArgs {
  std::string file, dir, branch;
  std::vector<std::string> sets;
  std::size_t stage = 0;
  int threads = 1;
  bool by_stage = false, fresh = false;
};
int sweep_node(const SweepNodeArgs& a, const Registry& registry);
/// What `baton run` is asked for.
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
/// `baton run` in this process (alone, or as a rank under a launcher).
int run(const RunArgs& a, const Registry& registry);
/// `baton run --nproc N`: starts N local ranks of itself (baton launch).
int run_ranks(const RunArgs& a);

/// `baton validate`: every problem at once; a tree's branches listed.
int validate(const std::string& file, const std::vector<std::string>& sets, const Registry& registry);
}  // namespace baton::cli
