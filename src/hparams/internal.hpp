#pragma once
// Internals of the TOML curriculum reader, shared by src/hparams/*.cpp. Keys are looked up
// through layers (a stage's own table, then earlier stages, then [defaults]) over the parsed
// document itself, so every message can point at file:line:column.
//   toml_values.cpp  problems with their place, typed reads of TOML values, --set overrides
//   registry.cpp     the built-in models and dataset kinds
//   builder.cpp      SpecBuilder: one stage's table -> TrainingSpec
//   datasets.cpp     [datasets.<name>]: checks, loading, offset / limit / holdout
//   models.cpp       [model] and a stage's own model table
//   validate.cpp     stages tried on their models before anything trains
//   curriculum.cpp   the document, Curriculum, parse_curriculum / load_curriculum
//   sweep_table.cpp  [sweep] and --grid axes: the points of a sweep
//   sweep.cpp        sweeps that share their prefix; sweep_jobs.cpp trains nodes in processes
#include <cstdint>
#include <functional>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <toml++/toml.h>

#include "baton/hparams.hpp"
#include "baton/interop.hpp"

namespace baton {
struct SweepOptions;
struct SweepResult;
}

namespace baton::detail {

/// [run] keys that say where and how a run writes or which threads it uses, not what it trains:
/// left out of the fingerprint (and of what sweep points compare).
inline const std::vector<std::string> kRunOutputKeys = {"run_dir", "threads", "checkpoint_every", "keep_checkpoints",
                                                        "tensorboard"};

/// Stage keys that cannot change the bits (any number of data workers gives the same batches).
inline const std::vector<std::string> kBitNeutralStageKeys = {"workers", "prefetch"};

/// A resolved curriculum without what cannot change training (kRunOutputKeys of [run],
/// kBitNeutralStageKeys of every stage): the text fingerprints and sweep keys are taken from.
inline void leave_out_bit_neutral(toml::table& resolved) {
  if (auto* run = resolved["run"].as_table())
    for (const auto& k : kRunOutputKeys) run->erase(k);
  if (auto* stages = resolved["stages"].as_array())
    for (auto& s : *stages)
      if (auto* t = s.as_table())
        for (const auto& k : kBitNeutralStageKeys) t->erase(k);
}

/// Stage keys that a stage inherits from earlier stages and [defaults].
inline const std::vector<std::string> kInheritable = {"data", "batch_size", "shuffle", "drop_last", "workers", "prefetch", "loss",
                                                      "optimizer", "schedule", "clock", "grad_accum",
                                                      "clip_grad_norm", "clip_grad_value", "eval",
                                                      "algorithms", "callbacks", "on_non_finite",
                                                      "precision", "memory_format", "deterministic", "loss_scaling",
                                                      "keep_best", "restore_best"};
/// Stage keys that belong to one stage only.
inline const std::vector<std::string> kStageOnly = {"name", "duration", "optimizer_carry", "model", "freeze", "from",
                                                   "baseline"};

bool contains(const std::vector<std::string>& v, std::string_view s);

/// Problems of a file, each with its place: "file.toml:12:5: message".
struct Problems {
  std::string source;
  std::vector<std::string> list;

  void add(const toml::node* at, const std::string& message);
  [[nodiscard]] bool empty() const { return list.empty(); }
  [[nodiscard]] Error error() const;
};

/// The problem lines of an error made by Problems::error() (or its one message otherwise).
std::vector<std::string> problem_lines(const Error& e);
/// Appends the lines not in `list` yet.
void add_unique(std::vector<std::string>& list, const std::vector<std::string>& lines);
/// Every key of `t` not in `known` is a problem, with a suggestion.
void check_keys(const toml::table& t, const std::vector<std::string>& known, const std::string& path, Problems& p);
/// "a string", "an integer", ...
std::string type_name(const toml::node& n);
/// A TOML value as a by-name parameter (numbers as doubles), or nullopt for tables and mixed arrays.
std::optional<ParamValue> to_param(const toml::node& n);
/// The keys of a table (except `skip`) as by-name parameters.
Params to_params(const toml::table& t, const std::vector<std::string>& skip, const std::string& path, Problems& p);

/// Typed reads of single values, each problem placed at its node. Every read of a missing node
/// (nullptr) is nullopt without a problem.
struct Reader {
  Problems& p;
  std::string path;  ///< put before every key in messages, e.g. "stage \"main\": "

  std::optional<std::string> string(const toml::node* n, const std::string& key);
  std::optional<std::int64_t> integer(const toml::node* n, const std::string& key, std::int64_t min);
  std::optional<double> number(const toml::node* n, const std::string& key);
  std::optional<bool> boolean(const toml::node* n, const std::string& key);
  std::optional<Time> time(const toml::node* n, const std::string& key);
  std::optional<std::vector<std::string>> strings(const toml::node* n, const std::string& key);
  template <class T>
  std::optional<T> one_of(const toml::node* n, const std::string& key, const std::vector<std::pair<std::string, T>>& choices) {
    auto s = string(n, key);
    if (!s) return std::nullopt;
    for (const auto& [name, value] : choices)
      if (name == *s) return value;
    std::vector<std::string> names;
    for (const auto& c : choices) names.push_back(c.first);
    p.add(n, fmt::format("{}{}: \"{}\" is not one of {}", path, key, *s, fmt::join(names, ", ")));
    return std::nullopt;
  }
};

/// Splits "a.b.c".
std::vector<std::string> split_path(const std::string& path);
/// Inserts `value` at `parts[from..]` under `t`, creating tables on the way; false when the path
/// goes through a value that is not a table.
bool insert_at(toml::table& t, const std::vector<std::string>& parts, std::size_t from, const toml::node& value);
/// Applies `--set path=value` overrides to the document, with the file's own paths
/// (stage.<name>.key for a [[stages]] entry).
void apply_overrides(toml::table& root, const std::vector<std::string>& overrides, Problems& p);

/// [datasets.<name>] tables (datasets.cpp): each a kind the registry knows, with only its keys and
/// the keys every kind takes (offset, limit, holdout); held-out parts that could share samples.
void check_datasets(const toml::table& root, const Registry& registry, Problems& p);

/// The [sweep] table (sweep_table.cpp): its points (the grid's product, then the listed ones, each
/// a list of "path=value" overrides with the values as written) and settings; problems placed at
/// their nodes. `text` is the file's text, for the values as written.
struct SweepTable {
  std::vector<std::vector<std::string>> points;
  std::optional<std::string> metric, dir;
  std::optional<bool> maximize;
  std::optional<int> jobs;
};
SweepTable read_sweep_table(const toml::table& root, std::string_view text, Problems& p);
/// A [sweep] metric the file writes, against what `last` (the last stage) evaluates: a problem at
/// its node when no point could be scored by it (the default is checked by `sweep`, which knows
/// whether --metric replaces it).
void check_sweep_metric(const toml::table& root, const TrainingSpec& last, Problems& p);
/// The points of axes (path, values as written): their product, the last varying fastest.
std::vector<std::vector<std::string>> grid_product(const std::vector<std::pair<std::string, std::vector<std::string>>>& axes);

/// A node of a sweep's tree: one stage of the points that agree up to it (sweep.cpp).
struct SweepTask {
  std::size_t level = 0;                 ///< the stage's index
  std::string key;                       ///< SHA-256 of the configuration up to this stage
  std::optional<std::size_t> parent;     ///< the task of the stage before
  std::filesystem::path dir;             ///< its run directory
  std::vector<std::string> sets;         ///< the overrides of one point that trains it (common ones first)
  std::string stage;                     ///< the stage's name
  int users = 1;                         ///< points (or branches) that train it
  std::string branch;                    ///< the branch of a tree ("name", "name@scratch") one of them is; "" for a chain
};
/// The summary file of a sweep or a tree (sweep_result.cpp): `r` as JSON at `file`; sets
/// `r.summary_file` when written, else says on stderr why not.
void write_summary(const std::filesystem::path& file, SweepResult& r);
/// Trains the tasks not `finished` in child processes (sweep_jobs.cpp): `o.executable sweep-node`,
/// at most `o.jobs` at once, each after its parent. True when all finished; false when a Ctrl-C
/// or SIGTERM stopped them (forwarded to every child, which writes its checkpoint).
Expected<bool> train_in_processes(const std::filesystem::path& file, const std::vector<SweepTask>& tasks,
                                  std::vector<bool> finished, const SweepOptions& o);

/// The parsed file and what every builder shares.
/// Makes the relative input paths of `resolved` (built-in dataset kinds' files, model.init_from)
/// absolute from `base_dir`: the run directory's copy of a curriculum reads the same files.
/// For the fingerprint: each dataset's `tokenizer` file replaced by what it holds (its identity,
/// "sentencepiece-<sha256>"), so a tokenizer retrained into the same file is another run. A file
/// that cannot be read is left as named (loading the dataset reports it).
void tokenizer_identities(toml::table& resolved, const std::filesystem::path& base_dir);
void absolute_paths(toml::table& resolved, const std::filesystem::path& base_dir);

struct Document {
  std::string source;
  std::filesystem::path base_dir;  // the file's directory: relative data paths start there
  toml::table root;
  Registry registry;
  RunConfig run;
  std::map<std::string, Dataset> bound;  // datasets bound from C++
  mutable std::mutex mutex;
  mutable std::map<std::string, Expected<Dataset>> cache;

  /// A dataset by its name in the file, loaded once (under the mutex) and shared.
  Expected<Dataset> dataset(const std::string& name) const;
  /// The keys a file's dataset gives its kind's loader (relative paths resolved), and the kind.
  Expected<std::pair<std::string, Params>> dataset_params(const std::string& name) const;
};

}  // namespace baton::detail

namespace baton {

struct SpecBuilder::Impl {
  std::shared_ptr<const detail::Document> doc;
  std::size_t index = 0;                              // position in [[stages]]
  std::string stage_name;
  std::shared_ptr<const toml::table> overrides;       // set() from C++
  std::map<std::string, Dataset> bound;
  std::vector<std::function<TrainingSpec(TrainingSpec)>> changes;

  const toml::table& own() const { return *doc->root["stages"].as_array()->at(index).as_table(); }
  const std::string& name() const { return stage_name; }

  /// The tables a key is looked up in, most specific first.
  std::vector<const toml::table*> layers(bool inheritable) const;
  const toml::node* get(const std::string& key) const;
  /// A table key (optimizer, schedule, eval) merged across layers: keys come from the most
  /// specific layer that sets them, until a layer names another `name` (another optimizer's keys
  /// do not carry over). Returns key -> node, and the name.
  std::map<std::string, const toml::node*> merged(const std::string& key, std::optional<std::string>& name,
                                                  detail::Problems& p) const;
  Expected<Dataset> dataset(const std::string& name) const;
};

}  // namespace baton

namespace baton::detail {
/// [model] init_from (init_from.cpp): the file (relative to the curriculum's directory) and how
/// its names become the model's; none when the key is absent.
struct InitFrom {
  std::filesystem::path path;
  ImportOptions options;
  std::string weights;  ///< of a checkpoint: "" its model's, "ema" / "swa" that algorithm's
  const toml::node* at = nullptr;
};
std::optional<InitFrom> read_init_from(const Document& doc, Problems& p);
/// The tensors `from` names: a baton checkpoint's weights (any run directory's `final.baton` or
/// `ckpt-*.baton`, told by its magic) or a state_dict file's.
Expected<StateDict> read_init_weights(const InitFrom& from);

/// A model as a file names it (models.cpp): the registry's name and its keys, and where.
struct ModelTable {
  std::string name;
  Params params;
  const toml::node* at = nullptr;  ///< the table, for messages
  std::string where;               ///< "model" or "stage \"ft\": model"
};
/// The run's [model] table; none without one.
std::optional<ModelTable> run_model_table(const Document& doc, Problems& p);
/// A stage's own model: its `model` table's `name` and model keys (over [model]'s keys when it
/// is the same model, so `classes = 5` alone is [model] with a new head), its keys checked
/// against the registry; none when the table has only carry keys (or `model` is a string).
std::optional<ModelTable> stage_model_table(const Document& doc, const toml::node* model, const std::string& stage,
                                            Problems& p);
/// The factory the registry makes of `m` (its error without context: the caller says where).
Expected<ModelFactory> make_model(const Document& doc, const ModelTable& m);

/// The tree of a curriculum (tree.cpp): each stage's parent (`from`, else the stage before; none
/// for the first), which stages ask for a scratch baseline, and whether the file branches at all
/// (any `from` or `baseline`). Problems placed at their nodes: `from` naming itself, a later or
/// an unknown stage (with a suggestion), `baseline` other than "scratch" or on the first stage.
struct TreeShape {
  std::vector<std::optional<std::size_t>> parent;
  std::vector<bool> baseline;
  bool branches = false;
};
TreeShape read_tree(const toml::table& root, Problems& p);
/// The shape of stages `names` from each one's `from` (none: the stage before) and whether it
/// asks for a baseline; each problem as (stage index, whether it is of `from`, message).
TreeShape tree_shape(const std::vector<std::string>& names, const std::vector<std::optional<std::string>>& from,
                     const std::vector<bool>& baseline, const std::function<void(std::size_t, bool, std::string)>& problem);
/// The names of the [[stages]] tables of a document (each a table with a name: checked before).
std::vector<std::string> stage_names(const toml::array& stages);
/// One branch: its leaf's name and the stages from the root (or, for a scratch baseline, from
/// the stage that asks for it) to the leaf, in file order.
struct BranchPath {
  std::string name;
  std::vector<std::size_t> stages;  ///< from the first stage to the leaf
  bool baseline = false;
  /// A baseline's leading stages that it does not train: it starts from a fresh initialization at
  /// stages[skip], but every stage it trains inherits keys from them, as on its branch.
  std::size_t skip = 0;
};
std::vector<BranchPath> branch_paths(const std::vector<std::string>& names, const TreeShape& tree);
/// Keeps only the stages of `path` in `root` (moved, so that each keeps its place in the file for
/// messages), without their `from` and `baseline` keys: the document of one branch.
void keep_path(toml::table& root, const std::vector<std::size_t>& path);

/// Builds every stage of `cur` and its evaluation plan, and tries each on its model (validate.cpp),
/// adding every problem to `all`.
void check_stages(const Curriculum& cur, Problems& all);

/// A stage's evaluation (evaluation.cpp): its eval table as a plan (the loss is the caller's to
/// set), and the keys that watch one of its metrics, each checked against what it gives.
EvalPlan parse_eval(const SpecBuilder::Impl& b, Problems& p);
void check_watched_metrics(const SpecBuilder::Impl& b, const TrainingSpec& spec, Problems& p);
void read_keep_best(const SpecBuilder::Impl& b, Reader& r, TrainingSpec& spec);
/// What is wrong with ranking a sweep by `metric` ("set/metric"; "": the default, the accuracy of
/// the first set `last` evaluates) when `last` is the curriculum's last stage, whose last
/// evaluation gives a point its score; "" when nothing is. Used by validate ([sweep] metric) and
/// by `sweep` (SweepOptions::metric, --metric) before anything trains.
std::string sweep_metric_problem(const std::string& metric, const TrainingSpec& last);
}  // namespace baton::detail
