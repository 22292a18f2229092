#pragma once
/// \file hparams.hpp
/// TOML curricula: a file gives a `Curriculum` of partially applied `SpecBuilder`s. The schema
/// (every key, type and default) is in docs/config.md.
///
/// ```cpp
/// auto cur = baton::load_curriculum("fashion.toml", {"stage.finetune.optimizer.lr=1e-4"});
/// if (!cur) { std::cerr << cur.error() << '\n'; return 2; }
/// auto mine = cur->with_model(baton::model_factory([] { return MyNet(); }));  // bind your own model
/// auto state = mine.init();
/// for (const auto& stage : mine.stages())
///   state = state.and_then([&](baton::TrainState s) {
///     return stage.build().and_then([&](const baton::TrainingSpec& spec) { return baton::fit(spec, std::move(s)); });
///   });
/// ```

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <c10/core/Device.h>

#include "baton/data.hpp"
#include "baton/error.hpp"
#include "baton/eval.hpp"
#include "baton/inference.hpp"
#include "baton/model.hpp"
#include "baton/params.hpp"
#include "baton/run.hpp"
#include "baton/spec.hpp"
#include "baton/state.hpp"

namespace baton {

/// A model a file can name: the keys it accepts and how to build it from them.
struct ModelEntry {
  std::vector<std::string> keys{};
  std::function<Expected<ModelFactory>(const Params&)> make{};
  std::string help{};  ///< one line for error messages and docs
};

/// A dataset kind a file can name: the keys it accepts and how to load it.
struct DatasetEntry {
  std::vector<std::string> keys{};
  std::function<Expected<Dataset>(const Params&)> load{};
  std::string help{};
  /// What an inference card says of this kind's inputs beyond their shape (`Curriculum::
  /// model_card`): e.g. text kinds set `input` tokens, the tokenizer and the class names. Empty:
  /// nothing more.
  std::function<Expected<void>(const Params&, ModelCard&)> describe{};
};

/// An optimizer, schedule, algorithm or callback of yours that a file can name: the keys its
/// table takes (any other is an error with a did-you-mean) and how to make it from them. Its
/// errors are reported at the table's place in the file.
///
/// ```cpp
/// registry.optimizers["signsgd"] = {.keys = {"lr"}, .make = [](const baton::Params& p) -> baton::Expected<baton::Optimizer> {
///   ... return baton::optim::rule(rule); }};   // then: optimizer = { name = "signsgd", lr = 0.01 }
/// ```
template <class T>
struct NamedEntry {
  std::vector<std::string> keys{};
  std::function<Expected<T>(const Params&)> make{};
  std::string help{};  ///< one line for error messages and docs
};

/// The names a curriculum file may use for models and dataset kinds. Add your own and pass the
/// registry to `load_curriculum` (or to `baton::cli::main`) to get the same CLI for your program.
struct Registry {
  std::map<std::string, ModelEntry> models{};
  std::map<std::string, DatasetEntry> datasets{};
  /// Metrics `[eval] metrics = [...]` may name besides the built-in ones (`metric::builtin`).
  std::map<std::string, Metric> metrics{};
  /// `optimizer = { name = ... }` besides optim::names(); the table's `groups` stay baton's.
  std::map<std::string, NamedEntry<Optimizer>> optimizers{};
  /// `optimizer.chain = [{ name = ... }, ...]` entries besides optim::transform_names().
  std::map<std::string, NamedEntry<GradientTransform>> transforms{};
  /// `schedule = { name = ... }` besides schedule::names(); `warmup`, `warmup_from` and `scale`
  /// stay baton's (schedule::with_common_keys), as for every schedule.
  std::map<std::string, NamedEntry<Schedule>> schedules{};
  /// `algorithms = { name = {...} }` besides the built-ins; they run after the built-ins in the
  /// file's order unless `algorithms.order` says otherwise.
  std::map<std::string, NamedEntry<Algorithm>> algorithms{};
  /// `callbacks = { name = {...} }` besides callbacks::names().
  std::map<std::string, NamedEntry<Callback>> callbacks{};

  /// Models `mlp` (widths) and `small_cnn` (channels1, channels2, hidden, classes, in_channels,
  /// image_size); datasets `fashion-mnist` (split, dir), `idx` (images, labels), `csv` (path,
  /// target, header), `synthetic` (samples, features, classes, seed); every dataset also takes
  /// `limit` (first N samples) and, for images, `normalize`.
  static Registry builtin();
};

/// Run-level settings (`[run]`).
struct RunConfig {
  std::string name{};
  std::uint64_t seed = 0;
  c10::Device device = c10::Device(c10::kCPU);
  Time max_duration{};
  std::filesystem::path run_dir{};
  int threads = 0;  ///< intra-op threads for configure_runtime (0: all cores)
  std::optional<Time> checkpoint_every{};  ///< also checkpoint every this much training (in a stage)
  int keep_checkpoints = 3;              ///< interval checkpoints kept (stage ends are always kept)
  bool tensorboard = false;              ///< also write TensorBoard event files to run_dir/tensorboard
};

/// When and on what a stage evaluates (`eval` in a stage).
struct EvalPlan {
  EvalSpec spec{};              ///< the sets, bound to loaded datasets
  std::optional<Time> interval{};  ///< also evaluate every `interval` within the stage
};

/// One stage as the file describes it (after inheritance from `[defaults]` and earlier stages),
/// not yet built. Every change returns a new builder.
class SpecBuilder {
 public:
  [[nodiscard]] const std::string& name() const;
  /// Overrides a value with the stage table's own key path, typed like the file's values:
  /// `set("optimizer.lr", 1e-4)`, `set("duration", std::string("2ep"))`.
  [[nodiscard]] SpecBuilder set(const std::string& key, ParamValue value) const;
  /// `set("batch_size", 64)`: an integer (ParamValue's number is a double).
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
  [[nodiscard]] SpecBuilder set(const std::string& key, T value) const {
    return set(key, ParamValue(static_cast<double>(value)));
  }
  /// `set("duration", "2ep")`: a string literal is text.
  template <std::size_t N>
  [[nodiscard]] SpecBuilder set(const std::string& key, const char (&value)[N]) const {
    return set(key, ParamValue(std::string(value)));
  }
  /// Binds a dataset name (as used by `data` and `eval.sets`) to a dataset of your own.
  [[nodiscard]] SpecBuilder with_dataset(const std::string& name, Dataset dataset) const;
  /// Any C++ change applied after the file's values (e.g. a loss of your own).
  [[nodiscard]] SpecBuilder with(std::function<TrainingSpec(TrainingSpec)> change) const;
  /// Validates and builds the spec: every problem of the stage at once.
  [[nodiscard]] Expected<TrainingSpec> build() const;
  /// The stage's evaluation plan (sets bound to datasets).
  [[nodiscard]] Expected<EvalPlan> eval() const;
  /// The stage's resolved table as TOML text.
  [[nodiscard]] std::string to_toml() const;

  struct Impl;
  explicit SpecBuilder(std::shared_ptr<const Impl> impl);
  [[nodiscard]] const Impl* impl() const { return impl_.get(); }
 private:
  std::shared_ptr<const Impl> impl_;
};

struct Branch;

/// A loaded curriculum: run settings, the model, and the stages in order, or, when stages name
/// where they start (`from = "pretrain"`), a tree of them: one branch per leaf (docs/curricula.md).
class Curriculum {
 public:
  /// True when the stages make a tree: a stage says `from` (or asks for `baseline = "scratch"`).
  /// Train it with `run_tree` (tree.hpp); each of `branches()` is a chain like any other.
  [[nodiscard]] bool is_tree() const;
  /// A tree's branches, in the order of their last stages in the file, each followed by its
  /// scratch baseline when it asks for one; a chain: none. Each branch's curriculum holds the
  /// stages of its path only, inheriting along the path, so its `specs()`, `init()`,
  /// `run_options()` and `fingerprint()` are those of an independent run of the path.
  [[nodiscard]] const std::vector<Branch>& branches() const;
  [[nodiscard]] const RunConfig& run() const;
  [[nodiscard]] const std::vector<SpecBuilder>& stages() const;
  /// Binds a model factory of your own instead of the file's `[model]`.
  [[nodiscard]] Curriculum with_model(ModelFactory factory) const;
  /// Binds a dataset name in every stage.
  [[nodiscard]] Curriculum with_dataset(const std::string& name, Dataset dataset) const;
  /// A dataset by the name the file gives it (`[datasets.<name>]`), loaded once and shared.
  [[nodiscard]] Expected<Dataset> dataset(const std::string& name) const;
  /// The model factory (the bound one, or the file's from the registry).
  [[nodiscard]] Expected<ModelFactory> model() const;
  /// The model a state has after (and while training) stage `stage`: that of the last stage up
  /// to it with a model of its own (`[stages.model]` with `name` or the model's keys), else
  /// `model()`. A name no stage has: the model the run ends with. Load a checkpoint with it
  /// (`load_checkpoint(path, *cur.model(info->stage))`).
  [[nodiscard]] Expected<ModelFactory> model(const std::string& stage) const;
  /// Every stage built, in order (the first error stops it, naming the stage). A tree has no
  /// one order: an error that says so (take a branch's).
  [[nodiscard]] Expected<std::vector<TrainingSpec>> specs() const;
  /// The run directory as `[run]` says: `dir` (run_dir), `name`, `checkpoint_every`,
  /// `keep_checkpoints`, `tensorboard`, with the resolved TOML as `config` and its fingerprint.
  /// (`[run] threads` is for `configure_runtime`, which baton never calls on its own.)
  ///
  /// ```cpp
  /// auto cur = baton::load_curriculum("fashion.toml");
  /// auto result = cur.and_then([](const baton::Curriculum& c) {
  ///   return c.specs().and_then([&](auto specs) { return c.init().and_then([&](baton::TrainState s) {
  ///     return baton::run(c.run_options(), specs, std::move(s)); }); });
  /// });
  /// ```
  [[nodiscard]] RunOptions run_options() const;
  /// A fresh state: `init_state(model(), {run().seed, run().max_duration})`, with the weights of
  /// `[model] init_from` when the file names a state_dict (`load_weights`, docs/interop.md); what
  /// that took goes to `report` when given.
  [[nodiscard]] Expected<TrainState> init(TransferReport* report = nullptr) const;
  /// What a model trained by this file is and expects, for an inference artifact
  /// (`save_for_inference`): the `[model]` name and keys, the input as the dataset `dataset`
  /// gives it (its sample shape; images: the scaling, normalization; CSV: the feature columns)
  /// and, for Fashion-MNIST, the class names. Loads the dataset. The model is the one after
  /// stage `stage` (as `model(stage)`; by default the one the run ends with). With a model bound
  /// by `with_model` (and no stage's own), `model` is "" (load it with your factory).
  [[nodiscard]] Expected<ModelCard> model_card(const std::string& dataset, const std::string& stage = {}) const;
  /// Builds every stage and plan, reporting every problem of every stage at once (and stages
  /// whose duration exceeds the run's max duration).
  [[nodiscard]] Expected<void> validate() const;
  /// The resolved configuration (overrides applied, inheritance resolved) as TOML text.
  [[nodiscard]] const std::string& resolved_toml() const;
  /// SHA-256 of the resolved configuration: two runs with the same fingerprint train the same.
  [[nodiscard]] const std::string& fingerprint() const;

  struct Impl;
  explicit Curriculum(std::shared_ptr<const Impl> impl);
 private:
  std::shared_ptr<const Impl> impl_;
};

/// One branch of a tree: a path from the first stage (or, for a baseline, from the stage that
/// asks for one) to a leaf.
struct Branch {
  std::string name{};                 ///< its last stage's name
  std::vector<std::string> stages{};  ///< its path, in order
  bool baseline = false;              ///< the scratch baseline of branch `name`: from a fresh initialization
  std::shared_ptr<const Curriculum> curriculum{};  ///< the path as a chain (set in every branch of branches())
};

/// Parses a curriculum from TOML text. `source` names it in messages ("file.toml:3:7: ...").
/// `overrides` are "path=value" strings as `baton run --set` takes them, with the file's paths:
/// `run.seed=3`, `defaults.batch_size=64`, `stage.finetune.optimizer.lr=1e-4`,
/// `datasets.test.limit=1000`; values are TOML values (`1e-4`, `true`, `[1, 2]`) or, failing
/// that, text (`2ep`). Every problem is reported at once, each with its place in the file.
Expected<Curriculum> parse_curriculum(std::string_view text, const std::string& source,
                                      const std::vector<std::string>& overrides = {},
                                      const Registry& registry = Registry::builtin());

/// Reads and parses a curriculum file.
Expected<Curriculum> load_curriculum(const std::filesystem::path& file, const std::vector<std::string>& overrides = {},
                                     const Registry& registry = Registry::builtin());

}  // namespace baton
