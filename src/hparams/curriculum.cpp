// Curriculum: the parsed document (run settings, model, datasets, stages), checked all at once,
// with its resolved form and fingerprint; parse_curriculum and load_curriculum.
#include <algorithm>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "data_internal.hpp"
#include "detail.hpp"
#include "io.hpp"
#include "train/carry.hpp"
#include "horizon.hpp"
#include "suggest.hpp"
#include "internal.hpp"

namespace baton {

using detail::Document;
using detail::Problems;
using detail::Reader;

// ---------------------------------------------------------------- Curriculum
struct Curriculum::Impl {
  std::shared_ptr<Document> doc;
  std::vector<SpecBuilder> stages;
  std::optional<ModelFactory> model;
  std::string resolved;
  std::string fingerprint;
  std::string run_copy;  // `resolved` with absolute input paths: the run directory's config.toml
  bool tree = false;
  std::vector<Branch> branches;  // a tree's: each a chain of its path's stages
};

Curriculum::Curriculum(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
const RunConfig& Curriculum::run() const { return impl_->doc->run; }
const std::vector<SpecBuilder>& Curriculum::stages() const { return impl_->stages; }
const std::string& Curriculum::resolved_toml() const { return impl_->resolved; }
const std::string& Curriculum::fingerprint() const { return impl_->fingerprint; }
bool Curriculum::is_tree() const { return impl_->tree; }
const std::vector<Branch>& Curriculum::branches() const { return impl_->branches; }

Curriculum Curriculum::with_model(ModelFactory factory) const {
  auto impl = std::make_shared<Impl>(*impl_);
  impl->model = factory;
  for (auto& b : impl->branches) b.curriculum = std::make_shared<const Curriculum>(b.curriculum->with_model(factory));
  return Curriculum(std::move(impl));
}

Curriculum Curriculum::with_dataset(const std::string& name, Dataset dataset) const {
  auto impl = std::make_shared<Impl>(*impl_);
  for (auto& s : impl->stages) s = s.with_dataset(name, dataset);
  for (auto& b : impl->branches) b.curriculum = std::make_shared<const Curriculum>(b.curriculum->with_dataset(name, dataset));
  return Curriculum(std::move(impl));
}

Expected<Dataset> Curriculum::dataset(const std::string& name) const {
  if (!impl_->stages.empty()) return impl_->stages.front().impl()->dataset(name);
  return impl_->doc->dataset(name);
}

Expected<ModelFactory> Curriculum::model() const {
  if (impl_->model) return *impl_->model;
  const auto& doc = *impl_->doc;
  Problems p{doc.source, {}};
  const auto m = detail::run_model_table(doc, p);
  if (!p.empty()) return tl::unexpected(p.error());
  if (!m) return fail(ErrorCode::invalid_spec, fmt::format("{}: no [model] table and no model bound with with_model()", doc.source));
  auto made = detail::make_model(doc, *m);
  if (!made) return tl::unexpected(made.error().with_context(fmt::format("{}: model \"{}\"", doc.source, m->name)));
  return made;
}

namespace {
/// The model table of the last stage up to `stage` (all of them: "" or a name no stage has) that
/// names a model of its own.
Expected<std::optional<detail::ModelTable>> own_model_upto(const Curriculum::Impl& impl, const std::string& stage) {
  Problems p{impl.doc->source, {}};
  std::optional<detail::ModelTable> own;
  for (const auto& s : impl.stages) {
    if (auto m = detail::stage_model_table(*impl.doc, s.impl()->get("model"), s.name(), p)) own = std::move(m);
    if (s.name() == stage) break;
  }
  if (!p.empty()) return tl::unexpected(p.error());
  return own;
}
}  // namespace

namespace {
/// A tree's branch that trains `stage` (the first branch when no branch does: "the end").
const Curriculum* branch_with(const Curriculum::Impl& impl, const std::string& stage) {
  if (!impl.tree || impl.branches.empty()) return nullptr;
  for (const auto& b : impl.branches)
    if (!b.baseline && std::find(b.stages.begin(), b.stages.end(), stage) != b.stages.end()) return b.curriculum.get();
  return impl.branches.front().curriculum.get();
}
}  // namespace

Expected<ModelFactory> Curriculum::model(const std::string& stage) const {
  if (const auto* b = branch_with(*impl_, stage)) return b->model(stage);
  auto own = own_model_upto(*impl_, stage);
  if (!own) return tl::unexpected(own.error());
  if (!*own) return model();
  auto made = detail::make_model(*impl_->doc, **own);
  if (!made) return tl::unexpected(made.error().with_context(fmt::format("{}: {}", impl_->doc->source, (*own)->where)));
  return made;
}

namespace {
/// Class names after a dataset's label_map: each new class named by the classes mapped to it
/// ("Sandal|Sneaker|Ankle boot"); none without a map.
std::vector<std::string> mapped_class_names(const std::vector<std::string>& names, const toml::array* map) {
  if (!map) return names;
  std::vector<std::string> out;
  for (std::size_t i = 0; i < map->size() && i < names.size(); ++i) {
    const auto to = map->at(i).value<std::int64_t>().value_or(-1);
    if (to < 0) continue;
    if (static_cast<std::size_t>(to) >= out.size()) out.resize(static_cast<std::size_t>(to) + 1);
    out[static_cast<std::size_t>(to)] += (out[static_cast<std::size_t>(to)].empty() ? "" : "|") + names[i];
  }
  return out;
}
}  // namespace

Expected<ModelCard> Curriculum::model_card(const std::string& name, const std::string& stage) const {
  if (const auto* b = branch_with(*impl_, stage)) return b->model_card(name, stage);
  auto ds = dataset(name);
  if (!ds) return tl::unexpected(ds.error());
  auto own = own_model_upto(*impl_, stage);
  if (!own) return tl::unexpected(own.error());
  const auto& root = impl_->doc->root;
  ModelCard card;
  Problems p{impl_->doc->source, {}};
  if (*own) {
    card.model = (*own)->name;
    card.options = (*own)->params;
  } else if (auto m = detail::run_model_table(*impl_->doc, p); m && !impl_->model) {
    card.model = m->name;
    card.options = m->params;
  }
  if (!p.empty()) return tl::unexpected(p.error());
  card.input_shape = ds->input_shape();
  // Bound datasets and other kinds: features, taken as they are.
  const auto* d = root["datasets"][name].as_table();
  const std::string kind = d && !impl_->doc->bound.count(name) ? (*d)["kind"].value<std::string>().value_or("") : "";
  if (kind == "fashion-mnist" || kind == "idx" || kind == "image_folder") {
    const data::ImageOptions image;  // the kinds' defaults (image folders do not normalize unless asked)
    card.input = InputKind::image;
    card.normalize = (*d)["normalize"].value<bool>().value_or(kind != "image_folder" && image.normalize);
    card.mean = (*d)["mean"].value<double>().value_or(image.mean);  // fashion-mnist takes none: the defaults
    card.std = (*d)["std"].value<double>().value_or(image.std);
    card.resize = kind == "image_folder" && (*d)["height"].value<std::int64_t>().value_or(0) > 0;
    if (kind == "fashion-mnist") card.classes = mapped_class_names(data::fashion_mnist_classes(), (*d)["label_map"].as_array());
    if (kind == "image_folder") card.classes = detail::class_names(ds->source);  // its class directories' names
  } else if (kind == "csv") {
    std::filesystem::path path = (*d)["path"].value<std::string>().value_or("");
    if (path.is_relative() && !impl_->doc->base_dir.empty()) path = impl_->doc->base_dir / path;
    auto header = detail::csv_header(path);
    if (!header) return tl::unexpected(header.error());
    const auto target = (*d)["target"].value<std::string>().value_or("");
    const auto at = target.empty() ? header->end() - 1 : std::find(header->begin(), header->end(), target);
    for (auto it = header->begin(); it != header->end(); ++it)
      if (it != at) card.columns.push_back(*it);
  } else if (!kind.empty()) {
    const auto& entry = impl_->doc->registry.datasets.at(kind);
    if (entry.describe) {
      auto kind_params = impl_->doc->dataset_params(name);
      if (!kind_params) return tl::unexpected(kind_params.error());
      if (auto ok = entry.describe(kind_params->second, card); !ok) return tl::unexpected(ok.error());
    }
  }
  return card;
}

Expected<std::vector<TrainingSpec>> Curriculum::specs() const {
  if (impl_->tree)
    return fail(ErrorCode::invalid_spec,
                fmt::format("{}: the stages make a tree ({} branches: stages name where they start with `from`); "
                            "train it with run_tree (baton run does), or take one branch's specs from branches()",
                            impl_->doc->source, impl_->branches.size()));
  std::vector<TrainingSpec> out;
  for (const auto& b : stages()) {
    auto spec = b.build();
    if (!spec) return tl::unexpected(spec.error());
    out.push_back(std::move(*spec));
  }
  return out;
}

RunOptions Curriculum::run_options() const {
  const RunConfig& r = run();
  return RunOptions{.dir = r.run_dir,
                    .name = r.name,
                    .config = impl_->run_copy,
                    .fingerprint = fingerprint(),
                    .checkpoint_every = r.checkpoint_every,
                    .keep_checkpoints = r.keep_checkpoints,
                    .tensorboard = r.tensorboard};
}

Expected<TrainState> Curriculum::init(TransferReport* report) const {
  auto state = model().and_then([&](const ModelFactory& f) {
    return init_state(f, {.seed = run().seed, .max_duration = run().max_duration});
  });
  Problems p{impl_->doc->source, {}};
  const auto from = detail::read_init_from(*impl_->doc, p);
  if (!p.empty()) return tl::unexpected(p.error());
  if (!state || !from) return state;
  const std::string where = fmt::format("{}: model.init_from", impl_->doc->source);
  auto loaded = detail::read_init_weights(*from).and_then([&](const StateDict& sd) { return load_weights(std::move(*state), sd, from->options); });
  if (!loaded) return tl::unexpected(loaded.error().with_context(where));
  if (report) *report = loaded->second;
  return std::move(loaded->first);
}


Expected<void> Curriculum::validate() const {
  Problems all{impl_->doc->source, {}};
  if (impl_->tree) {  // each branch as the chain it is: inheritance follows the path
    for (const auto& b : impl_->branches)
      if (auto ok = b.curriculum->validate(); !ok) detail::add_unique(all.list, detail::problem_lines(ok.error()));
    if (all.empty()) return {};
    return tl::unexpected(all.error());
  }
  auto factory = model();
  if (!factory) detail::add_unique(all.list, detail::problem_lines(factory.error()));
  // The weights [model] init_from names: the file read and fitted to the model now, not at the start of training.
  if (const auto* m = impl_->doc->root["model"].as_table(); factory && m && m->get("init_from"))
    if (auto s = init(); !s) detail::add_unique(all.list, detail::problem_lines(s.error()));
  detail::check_stages(*this, all);
  if (impl_->doc->root["sweep"]["metric"] && !impl_->stages.empty())  // checked here, where the last stage is built
    if (auto last = impl_->stages.back().build()) detail::check_sweep_metric(impl_->doc->root, *last, all);
  if (all.empty()) return {};
  return tl::unexpected(all.error());
}

// ---------------------------------------------------------------- parse_curriculum
namespace {
/// More intra-op threads than this is a typo (100000 threads hang OpenMP at start).
constexpr std::int64_t kMaxThreads = 1024;

const std::vector<std::string> kRunKeys = {"name", "seed", "device", "max_duration", "run_dir", "threads",
                                           "checkpoint_every", "keep_checkpoints", "tensorboard"};


/// [run]
void read_run(const toml::table& root, const std::string& source, RunConfig& rc, Problems& p) {
  Reader r{p, "run."};
  const auto* run = root["run"].as_table();
  if (!run) {
    p.list.push_back(fmt::format("{}: [run] table missing (it needs at least max_duration)", source));
    return;
  }
  detail::check_keys(*run, kRunKeys, "run", p);
  rc.name = r.string(run->get("name"), "name").value_or(std::filesystem::path(source).stem().string());
  if (auto v = r.integer(run->get("seed"), "seed", 0)) rc.seed = static_cast<std::uint64_t>(*v);
  if (auto v = r.one_of<c10::DeviceType>(run->get("device"), "device", {{"cpu", c10::kCPU}, {"cuda", c10::kCUDA}})) rc.device = c10::Device(*v);
  if (auto v = r.integer(run->get("threads"), "threads", 0)) {
    if (*v > kMaxThreads)
      p.add(run->get("threads"), fmt::format("run.threads: {} is more than {}; give the cores to use (0: all this process may use)", *v, kMaxThreads));
    else
      rc.threads = static_cast<int>(*v);
  }
  if (const auto* n = run->get("max_duration")) {
    if (auto t = r.time(n, "max_duration")) {
      if (t->unit == TimeUnit::duration || t->value <= 0) p.add(n, "run.max_duration: must be more than zero, in ep, ba or sp");
      else if (t->unit == TimeUnit::epoch && t->value != std::floor(t->value))
        p.add(n, fmt::format("run.max_duration: \"{}\": the run's max duration counts whole epochs; end a run inside an "
                             "epoch with ba or sp (a stage's duration may be a part of an epoch)", t->to_string()));
      else rc.max_duration = *t;
    }
  } else {
    p.add(run, "run.max_duration: required (e.g. max_duration = \"4ep\")");
  }
  rc.run_dir = r.string(run->get("run_dir"), "run_dir").value_or("runs/" + rc.name);
  if (!run->get("run_dir"))  // the name becomes a directory: runs/<name>
    if (auto bad = detail::name_problem("run.name", rc.name, "without run.run_dir the run directory is runs/<name>"); !bad.empty())
      p.add(run->get("name") ? run->get("name") : run, bad + " (or give run.run_dir, a path of any shape)");
  if (const auto* n = run->get("checkpoint_every")) {
    rc.checkpoint_every = r.time(n, "checkpoint_every");
    if (rc.checkpoint_every && rc.checkpoint_every->value <= 0) p.add(n, "run.checkpoint_every: must be more than zero");
  }
  if (auto v = r.integer(run->get("keep_checkpoints"), "keep_checkpoints", 1)) rc.keep_checkpoints = static_cast<int>(*v);
  if (auto v = r.boolean(run->get("tensorboard"), "tensorboard")) rc.tensorboard = *v;
}

/// [model]: a name the registry knows, and only its keys.
void check_model(const toml::table& root, const Registry& registry, Problems& p) {
  const auto* model = root["model"].as_table();
  if (!model) return;
  auto name = Reader{p, "model."}.string(model->get("name"), "name");
  if (!name) {
    if (!model->get("name")) p.add(model, "model.name: required");
  } else if (auto it = registry.models.find(*name); it == registry.models.end()) {
    std::vector<std::string> names;
    for (const auto& [k, v] : registry.models) names.push_back(k);
    p.add(model->get("name"), fmt::format("model.name: unknown model \"{}\"{}; models: {}", *name,
                                          detail::did_you_mean(*name, names), fmt::join(names, ", ")));
  } else {
    auto keys = it->second.keys;
    keys.insert(keys.begin(), "name");
    keys.push_back("init_from");  // every model: weights from a state_dict file (init_from.cpp)
    detail::check_keys(*model, keys, "model", p);
  }
}

/// [defaults] and [[stages]]: known keys, unique names, a duration each. True when every stage
/// is a table with a name, so that builders can be made for them.
bool check_stage_tables(const toml::table& root, const std::string& source, Problems& p) {
  using detail::kInheritable;
  if (const auto* d = root["defaults"].as_table()) detail::check_keys(*d, kInheritable, "defaults", p);
  std::vector<std::string> all_stage_keys = detail::kStageOnly;
  all_stage_keys.insert(all_stage_keys.end(), kInheritable.begin(), kInheritable.end());
  const auto* stages = root["stages"].as_array();
  if (!stages || stages->empty()) {
    p.list.push_back(fmt::format("{}: no stages: add at least one [[stages]] table with name and duration", source));
  } else {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < stages->size(); ++i) {
      const auto* t = stages->at(i).as_table();
      if (!t) { p.add(&stages->at(i), "stages: every entry must be a table ([[stages]])"); continue; }
      detail::check_keys(*t, all_stage_keys, fmt::format("stages[{}]", i), p);
      auto name = Reader{p, fmt::format("stages[{}].", i)}.string(t->get("name"), "name");
      if (!name) {
        if (!t->get("name")) p.add(t, fmt::format("stages[{}].name: required (a stage is identified by its name)", i));
      } else if (name->empty()) {
        p.add(t->get("name"), fmt::format("stages[{}].name: empty; a stage is identified by its name (in checkpoints, "
                                          "metrics and resume)", i));
      } else if (auto bad = detail::name_problem(fmt::format("stages[{}].name", i), *name, detail::kStageNameUse); !bad.empty()) {
        p.add(t->get("name"), bad);
      } else if (detail::contains(names, *name)) {
        p.add(t->get("name"), fmt::format("stages[{}].name: \"{}\" is used by an earlier stage; names must be unique", i, *name));
      } else {
        names.push_back(*name);
      }
      if (!t->get("duration")) p.add(t, fmt::format("stages[{}].duration: required (e.g. duration = \"2ep\")", i));
    }
  }
  return stages && !stages->empty() && std::all_of(stages->begin(), stages->end(), [](const toml::node& n) {
           return n.is_table() && (*n.as_table())["name"].is_string();
         });
}

/// The resolved configuration (what each stage trains with, after inheritance and overrides)
/// and its fingerprint.
Expected<void> resolve(Curriculum::Impl& impl, const std::string& source) {
  const auto& root = impl.doc->root;
  toml::table head;
  for (const char* key : {"run", "model", "datasets"})
    if (const auto* n = root.get(key)) n->visit([&](auto&& v) { head.insert(key, v); });
  toml::array resolved_stages;
  for (const auto& s : impl.stages) {
    // toml++ writes some keys it accepted (e.g. one with a quote, from --set a.b'c=1) in a form it
    // cannot read back: a problem to report, not an exception to let escape (found by fuzz_set).
    try {
      resolved_stages.push_back(toml::parse(s.to_toml()));
    } catch (const toml::parse_error& e) {
      return fail(ErrorCode::invalid_spec,
                  fmt::format("{}: stage \"{}\": a key cannot be written back as TOML ({}); keys are names such as "
                              "optimizer.lr, without quotes", source, s.name(), e.description()));
    }
  }
  head.insert("stages", std::move(resolved_stages));
  std::ostringstream ss;
  ss << "# The resolved curriculum: overrides applied, every stage with what it inherited.\n" << head << "\n";
  impl.resolved = ss.str();
  // The run directory's copy: relative input paths would start at the run directory there.
  toml::table copy = head;
  detail::absolute_paths(copy, impl.doc->base_dir);
  std::ostringstream cs;
  cs << "# The resolved curriculum: overrides applied, every stage with what it inherited; input paths\n"
     << "# made absolute, so that baton eval and baton export read the same files from this directory.\n"
     << copy << "\n";
  impl.run_copy = cs.str();
  // The fingerprint leaves out what does not change training (where to write, data workers), and threads: what
  // the machine changes is checked on resume by numerics_environment (run.hpp). It is the same for
  // a file and its resolved form.
  detail::leave_out_bit_neutral(head);
  detail::tokenizer_identities(head, impl.doc->base_dir);
  std::ostringstream fps;
  fps << head;
  impl.fingerprint = detail::sha256_hex(fps.str());
  return {};
}
}  // namespace

namespace {
/// The curriculum of `text`; with `path`, only those stages (one branch of a tree, as a chain),
/// of which the first `skip` are not trained but still pass on their keys (a scratch baseline:
/// the same stages as its branch's, from a fresh initialization).
Expected<Curriculum> parse(std::string_view text, const std::string& source, const std::vector<std::string>& overrides,
                           const Registry& registry, const std::vector<std::size_t>* path, std::size_t skip = 0) {
  auto doc = std::make_shared<Document>();
  doc->source = source;
  if (std::error_code ec; std::filesystem::is_regular_file(source, ec)) doc->base_dir = std::filesystem::path(source).parent_path();
  doc->registry = registry;
  try {
    doc->root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    return fail(ErrorCode::invalid_spec, fmt::format("{}:{}:{}: TOML syntax error: {}", source, b.line, b.column, e.description()));
  }
  Problems p{source, {}};
  auto& root = doc->root;
  detail::apply_overrides(root, overrides, p);
  if (path) detail::keep_path(root, *path);
  detail::check_keys(root, {"run", "model", "datasets", "defaults", "stages", "sweep"}, "(top level)", p);
  (void)detail::read_sweep_table(root, text, p);  // read by sweep_options; checked here, before any run
  read_run(root, source, doc->run, p);
  check_model(root, registry, p);
  detail::check_datasets(root, registry, p);
  const bool stages_ok = check_stage_tables(root, source, p);
  if (!p.empty() && !stages_ok) return tl::unexpected(p.error());
  const auto shape = path ? detail::TreeShape{} : detail::read_tree(root, p);
  // A tree's problems of the file as a whole come first; its stages are checked per branch.
  if (!p.empty() && shape.branches) return tl::unexpected(p.error());

  auto impl = std::make_shared<Curriculum::Impl>();
  impl->doc = doc;
  const auto* stages = root["stages"].as_array();
  for (std::size_t i = 0; i < stages->size(); ++i) {
    auto b = std::make_shared<SpecBuilder::Impl>();
    b->doc = doc;
    b->index = i;
    b->stage_name = *(*stages->at(i).as_table())["name"].value<std::string>();
    b->overrides = std::make_shared<toml::table>();
    impl->stages.emplace_back(std::move(b));
  }
  impl->stages.erase(impl->stages.begin(), impl->stages.begin() + static_cast<std::ptrdiff_t>(std::min(skip, impl->stages.size())));
  if (auto ok = resolve(*impl, source); !ok) return tl::unexpected(ok.error());
  impl->tree = shape.branches;
  if (impl->tree) {
    const auto* names = root["stages"].as_array();
    for (const auto& b : detail::branch_paths(detail::stage_names(*root["stages"].as_array()), shape)) {
      auto chain = parse(text, source, overrides, registry, &b.stages, b.skip);
      if (!chain) return tl::unexpected(chain.error().with_context(fmt::format("branch \"{}\"", b.name)));
      std::vector<std::string> stage_names;
      for (std::size_t k = b.skip; k < b.stages.size(); ++k)
        stage_names.push_back(*(*names->at(b.stages[k]).as_table())["name"].value<std::string>());
      impl->branches.push_back({b.name, std::move(stage_names), b.baseline, std::make_shared<const Curriculum>(std::move(*chain))});
    }
  }
  Curriculum cur(std::move(impl));
  if (!p.empty()) {
    // Report the stages' problems too: every problem at once.
    Problems more{source, {}};
    detail::check_stages(cur, more);
    detail::add_unique(p.list, more.list);
    return tl::unexpected(p.error());
  }
  return cur;
}
}  // namespace

Expected<Curriculum> parse_curriculum(std::string_view text, const std::string& source,
                                      const std::vector<std::string>& overrides, const Registry& registry) {
  return parse(text, source, overrides, registry, nullptr);
}

Expected<Curriculum> load_curriculum(const std::filesystem::path& file, const std::vector<std::string>& overrides,
                                     const Registry& registry) {
  if (auto ok = detail::check_regular_file(file, "curriculum"); !ok) return tl::unexpected(ok.error());
  std::ifstream in(file);
  if (!in) return fail(ErrorCode::io, fmt::format("{}: cannot open: {}", file.string(), std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_curriculum(ss.str(), file.string(), overrides, registry);
}

}  // namespace baton
