// TOML curricula -> Curriculum of SpecBuilders. Keys are looked up through layers (a stage's
// own table, then earlier stages, then [defaults]) over the parsed document itself, so every
// message can point at file:line:column.
#include <algorithm>
#include <cmath>
#include <limits>
#include <fstream>
#include <mutex>
#include <sstream>

#include <fmt/format.h>
#include <openssl/evp.h>
#include <toml++/toml.h>
#include <torch/torch.h>

#include "baton/hparams.hpp"
#include "baton/schedule.hpp"
#include "baton/algorithms.hpp"
#include "baton/callbacks.hpp"
#include "detail.hpp"
#include "params_reader.hpp"

namespace baton {
namespace {

const std::vector<std::string> kInheritable = {"data", "batch_size", "shuffle", "drop_last", "loss",
                                               "optimizer", "schedule", "clock", "grad_accum",
                                               "clip_grad_norm", "clip_grad_value", "eval",
                                               "algorithms", "callbacks", "on_non_finite"};
const std::vector<std::string> kStageOnly = {"name", "duration", "optimizer_carry", "model", "freeze"};
const std::vector<std::string> kRunKeys = {"name", "seed", "device", "max_duration", "run_dir", "threads",
                                           "checkpoint_every", "keep_checkpoints", "tensorboard"};
const std::vector<std::string> kEvalKeys = {"sets", "interval", "batch_size", "top_k", "limit", "weights"};
const std::vector<std::string> kGroupKeys = {"patterns", "lr", "weight_decay"};
const std::vector<std::string> kLosses = {"cross_entropy", "mse"};

std::string sha256_hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

bool contains(const std::vector<std::string>& v, std::string_view s) { return std::find(v.begin(), v.end(), s) != v.end(); }

/// Problems of a file, each with its place: "file.toml:12:5: message".
struct Problems {
  std::string source;
  std::vector<std::string> list;

  void add(const toml::node* at, const std::string& message) {
    if (at != nullptr && at->source().begin)
      list.push_back(fmt::format("{}:{}:{}: {}", source, at->source().begin.line, at->source().begin.column, message));
    else if (at != nullptr)
      list.push_back(fmt::format("{} (from --set or set()): {}", source, message));
    else
      list.push_back(fmt::format("{}: {}", source, message));
  }
  [[nodiscard]] bool empty() const { return list.empty(); }
  [[nodiscard]] Error error() const {
    return Error{ErrorCode::invalid_spec,
                 fmt::format("{} problem{}:\n  {}", list.size(), list.size() == 1 ? "" : "s", fmt::join(list, "\n  ")), {}};
  }
};

/// The problem lines of an error made by Problems::error() (or its one message otherwise).
std::vector<std::string> problem_lines(const Error& e) {
  std::vector<std::string> out;
  std::stringstream ss(e.message);
  std::string line;
  std::getline(ss, line);
  if (line.find("problem") != std::string::npos && line.back() == ':') {
    while (std::getline(ss, line)) out.push_back(line.substr(line.find_first_not_of(' ')));
  } else {
    out.push_back(e.context.empty() ? e.message : e.to_string());
  }
  return out;
}

void add_unique(std::vector<std::string>& list, const std::vector<std::string>& lines) {
  for (const auto& l : lines)
    if (std::find(list.begin(), list.end(), l) == list.end()) list.push_back(l);
}

void check_keys(const toml::table& t, const std::vector<std::string>& known, const std::string& path, Problems& p) {
  for (auto&& [key, value] : t) {
    const std::string k(key.str());
    if (contains(known, k)) continue;
    p.add(&value, fmt::format("{}: unknown key \"{}\"{}; valid keys: {}", path, k, detail::did_you_mean(k, known),
                              fmt::join(known, ", ")));
  }
}

std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    default: return "a date/time";
  }
}

/// A TOML value as a by-name parameter (numbers as doubles), or nullopt for tables and mixed arrays.
std::optional<ParamValue> to_param(const toml::node& n) {
  // is_integer first: toml++'s value<int64_t>() converts a float node with an unchecked cast (UB for 2e44).
  if (n.is_integer()) return static_cast<double>(*n.value<std::int64_t>());
  if (n.is_floating_point()) return *n.value<double>();
  if (n.is_boolean()) return *n.value<bool>();
  if (n.is_string()) return *n.value<std::string>();
  if (const auto* a = n.as_array()) {
    if (a->empty()) return std::vector<std::string>{};
    if (a->is_homogeneous(toml::node_type::string)) {
      std::vector<std::string> out;
      for (const auto& e : *a) out.push_back(*e.value<std::string>());
      return out;
    }
    std::vector<double> out;
    for (const auto& e : *a) {
      if (!e.is_number()) return std::nullopt;
      out.push_back(*e.value<double>());
    }
    return out;
  }
  return std::nullopt;
}

/// The keys of a table (except `skip`) as by-name parameters.
Params to_params(const toml::table& t, const std::vector<std::string>& skip, const std::string& path, Problems& p) {
  Params out;
  for (auto&& [key, value] : t) {
    const std::string k(key.str());
    if (contains(skip, k)) continue;
    if (auto v = to_param(value)) out[k] = *v;
    else p.add(&value, fmt::format("{}.{}: {} is not allowed here", path, k, type_name(value)));
  }
  return out;
}

/// Typed reads of single values, each problem placed at its node.
struct Reader {
  Problems& p;
  std::string path;

  std::optional<std::string> string(const toml::node* n, const std::string& key) {
    if (!n) return std::nullopt;
    if (auto v = n->value<std::string>(); v && n->is_string()) return *v;
    p.add(n, fmt::format("{}{}: expected a string, got {}", path, key, type_name(*n)));
    return std::nullopt;
  }
  std::optional<std::int64_t> integer(const toml::node* n, const std::string& key, std::int64_t min) {
    if (!n) return std::nullopt;
    if (!n->is_integer()) {
      p.add(n, fmt::format("{}{}: expected an integer, got {}", path, key, type_name(*n)));
      return std::nullopt;
    }
    const auto v = *n->value<std::int64_t>();
    if (v < min) {
      p.add(n, fmt::format("{}{}: must be >= {}, got {}", path, key, min, v));
      return std::nullopt;
    }
    return v;
  }
  std::optional<double> number(const toml::node* n, const std::string& key) {
    if (!n) return std::nullopt;
    if (!n->is_number()) {
      p.add(n, fmt::format("{}{}: expected a number, got {}", path, key, type_name(*n)));
      return std::nullopt;
    }
    return *n->value<double>();
  }
  std::optional<bool> boolean(const toml::node* n, const std::string& key) {
    if (!n) return std::nullopt;
    if (!n->is_boolean()) {
      p.add(n, fmt::format("{}{}: expected true or false, got {}", path, key, type_name(*n)));
      return std::nullopt;
    }
    return *n->value<bool>();
  }
  std::optional<Time> time(const toml::node* n, const std::string& key) {
    auto s = string(n, key);
    if (!s) return std::nullopt;
    auto t = Time::parse(*s);
    if (!t) {
      p.add(n, fmt::format("{}{}: {}", path, key, t.error().message));
      return std::nullopt;
    }
    return *t;
  }
  std::optional<std::vector<std::string>> strings(const toml::node* n, const std::string& key) {
    if (!n) return std::nullopt;
    const auto* a = n->as_array();
    if (!a || !(a->empty() || a->is_homogeneous(toml::node_type::string))) {
      p.add(n, fmt::format("{}{}: expected an array of strings", path, key));
      return std::nullopt;
    }
    std::vector<std::string> out;
    for (const auto& e : *a) out.push_back(*e.value<std::string>());
    return out;
  }
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
std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) parts.push_back(part);
  return parts;
}

/// Parses the right side of `--set k=v` as a TOML value, or takes it as text.
toml::table value_table(const std::string& text) {
  try {
    auto t = toml::parse("v = " + text);
    if (t.contains("v")) return t;
  } catch (const toml::parse_error&) {
  }
  toml::table t;
  t.insert("v", text);
  return t;
}

/// Inserts `value` at `parts` under `t`, creating tables on the way.
bool insert_at(toml::table& t, const std::vector<std::string>& parts, std::size_t from, const toml::node& value) {
  toml::table* cur = &t;
  for (std::size_t i = from; i + 1 < parts.size(); ++i) {
    auto* next = cur->get(parts[i]);
    if (!next) next = &cur->insert_or_assign(parts[i], toml::table{}).first->second;
    if (!next->is_table()) return false;
    cur = next->as_table();
  }
  value.visit([&](auto&& v) { cur->insert_or_assign(parts.back(), v); });
  return true;
}

}  // namespace

// ---------------------------------------------------------------- registry
namespace {
Expected<Dataset> load_csv(const Params& params) {
  detail::ParamReader r(params, "dataset");
  const auto path_it = params.find("path");
  if (path_it == params.end() || !std::holds_alternative<std::string>(path_it->second))
    return fail(ErrorCode::invalid_argument, "dataset.path: required (the CSV file)");
  data::CsvOptions o;
  o.path = std::get<std::string>(path_it->second);
  if (const auto it = params.find("target"); it != params.end() && std::holds_alternative<std::string>(it->second))
    o.target = std::get<std::string>(it->second);
  o.classification = r.flag("classification", true);
  r.flag("header", true);
  return data::csv(o);
}

Expected<Dataset> load_synthetic(const Params& params) {
  detail::ParamReader r(params, "dataset");
  data::SyntheticOptions o;
  // Sizes are capped so that samples x features stays a tensor that fits in memory (2^31 floats).
  o.samples = r.whole("samples", 1000, 1, std::int64_t{1} << 31);
  o.features = r.whole("features", 8, 1, std::int64_t{1} << 20);
  o.classes = r.whole("classes", 4, 2, std::int64_t{1} << 20);
  o.seed = static_cast<std::uint64_t>(r.whole("seed", 0, 0));
  o.sample_seed = static_cast<std::uint64_t>(r.whole("sample_seed", static_cast<std::int64_t>(o.seed) + 1, 0));
  if (o.samples * o.features > (std::int64_t{1} << 31) || o.classes * o.features > (std::int64_t{1} << 31))
    r.problem(fmt::format("dataset: synthetic data of {} samples x {} features ({} classes) is too large",
                          o.samples, o.features, o.classes));
  if (auto ok = r.finish(); !ok) return tl::unexpected(ok.error());
  return data::synthetic(o);
}

std::vector<std::int64_t> int_list(const Params& params, const std::string& key) {
  std::vector<std::int64_t> out;
  if (auto it = params.find(key); it != params.end())
    if (const auto* v = std::get_if<std::vector<double>>(&it->second))
      for (double d : *v)  // a fraction or an out-of-range width reads as 0, which the caller rejects
        out.push_back(d == std::floor(d) && std::abs(d) <= 9.0e15 ? static_cast<std::int64_t>(d) : 0);
  return out;
}
}  // namespace

Registry Registry::builtin() {
  Registry r;
  r.models["mlp"] = ModelEntry{{"widths"}, [](const Params& p) -> Expected<ModelFactory> {
    const auto widths = int_list(p, "widths");
    if (widths.size() < 2 || std::any_of(widths.begin(), widths.end(), [](auto w) { return w < 1; }))
      return fail(ErrorCode::invalid_argument, "model.widths: needs at least two positive integers, e.g. [784, 256, 10]");
    return models::mlp(widths);
  }, "mlp: widths = [in, hidden..., out]"};
  r.models["small_cnn"] = ModelEntry{{"channels1", "channels2", "hidden", "classes", "in_channels", "image_size", "dropout"},
                                     [](const Params& p) -> Expected<ModelFactory> {
    detail::ParamReader rd(p, "model");
    models::SmallCnnOptions o;
    constexpr std::int64_t big = std::int64_t{1} << 20;
    o.channels1 = rd.whole("channels1", 32, 1, big);
    o.channels2 = rd.whole("channels2", 64, 1, big);
    o.hidden = rd.whole("hidden", 128, 1, big);
    o.classes = rd.whole("classes", 10, 1, big);
    o.in_channels = rd.whole("in_channels", 1, 1, big);
    o.image_size = rd.whole("image_size", 28, 4, big);
    o.dropout = rd.number("dropout", 0.0);
    if (auto ok = rd.finish(); !ok) return tl::unexpected(ok.error());
    if (o.image_size % 4 != 0 || o.channels1 < 1 || o.channels2 < 1 || o.hidden < 1 || o.classes < 1)
      return fail(ErrorCode::invalid_argument, "model: small_cnn needs positive sizes and image_size divisible by 4");
    if (!(o.dropout >= 0 && o.dropout < 1))
      return fail(ErrorCode::invalid_argument, fmt::format("model.dropout: must be in [0, 1), got {}", o.dropout));
    return models::small_cnn(o);
  }, "small_cnn: channels1, channels2, hidden, classes, in_channels, image_size, dropout"};

  r.datasets["fashion-mnist"] = DatasetEntry{{"split", "dir", "normalize"}, [](const Params& p) -> Expected<Dataset> {
    detail::ParamReader rd(p, "dataset");
    const bool normalize = rd.flag("normalize", true);
    std::string split = "train", dir = data::fashion_mnist_dir.string();
    if (auto it = p.find("split"); it != p.end() && std::holds_alternative<std::string>(it->second)) split = std::get<std::string>(it->second);
    if (auto it = p.find("dir"); it != p.end() && std::holds_alternative<std::string>(it->second)) dir = std::get<std::string>(it->second);
    if (split != "train" && split != "test")
      return fail(ErrorCode::invalid_argument, fmt::format("dataset.split: \"{}\" is not one of train, test", split));
    return data::fashion_mnist(split == "train" ? Split::train : Split::test, dir, {.normalize = normalize});
  }, "fashion-mnist: split = \"train\" | \"test\", dir"};
  r.datasets["idx"] = DatasetEntry{{"images", "labels", "normalize", "mean", "std"}, [](const Params& p) -> Expected<Dataset> {
    detail::ParamReader rd(p, "dataset");
    data::ImageOptions o;
    o.normalize = rd.flag("normalize", true), o.mean = rd.number("mean", o.mean), o.std = rd.number("std", o.std);
    auto images = p.find("images"), labels = p.find("labels");
    if (images == p.end() || labels == p.end() || !std::holds_alternative<std::string>(images->second) ||
        !std::holds_alternative<std::string>(labels->second))
      return fail(ErrorCode::invalid_argument, "dataset: idx needs images = \"path\" and labels = \"path\"");
    return data::idx_images(std::get<std::string>(images->second), std::get<std::string>(labels->second),
                            std::get<std::string>(images->second), o);
  }, "idx: images, labels (MNIST-format files, plain or .gz)"};
  r.datasets["csv"] = DatasetEntry{{"path", "target", "header", "classification"}, load_csv,
                                   "csv: path, target (column name; default: the last), classification"};
  r.datasets["synthetic"] = DatasetEntry{{"samples", "features", "classes", "seed", "sample_seed"}, load_synthetic,
                                         "synthetic: samples, features, classes, seed (the task), sample_seed (Gaussian blobs)"};
  return r;
}

// ---------------------------------------------------------------- the document
/// The parsed file and what every builder shares.
struct Document {
  std::string source;
  toml::table root;
  Registry registry;
  RunConfig run;
  std::map<std::string, Dataset> bound;  // datasets bound from C++
  mutable std::mutex mutex;
  mutable std::map<std::string, Expected<Dataset>> cache;

  Expected<Dataset> dataset(const std::string& name) const {
    if (auto it = bound.find(name); it != bound.end()) return it->second;
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find(name); it != cache.end()) return it->second;
    const auto* table = root["datasets"][name].as_table();
    Expected<Dataset> loaded = [&]() -> Expected<Dataset> {
      if (!table) {
        std::vector<std::string> names;
        if (const auto* ds = root["datasets"].as_table())
          for (auto&& [k, v] : *ds) names.emplace_back(k.str());
        for (const auto& [k, v] : bound) names.push_back(k);
        return fail(ErrorCode::invalid_spec, fmt::format("no dataset \"{}\"; datasets: {}", name, fmt::join(names, ", ")));
      }
      const auto kind = (*table)["kind"].value<std::string>().value_or("");
      const auto entry_it = registry.datasets.find(kind);
      if (entry_it == registry.datasets.end())
        return fail(ErrorCode::invalid_spec, fmt::format("unknown dataset kind \"{}\"", kind));
      const auto& entry = entry_it->second;
      Problems ignored{source, {}};
      Params params = to_params(*table, {"kind", "limit"}, "datasets." + name, ignored);
      auto ds = detail::guard([&] { return entry.load(params); });
      if (!ds) return tl::unexpected(ds.error().with_context(fmt::format("dataset \"{}\"", name)));
      if (const auto* limit = table->get("limit"); limit && limit->is_integer() && *limit->value<std::int64_t>() > 0)
        *ds = ds->head(*limit->value<std::int64_t>());
      ds->name = name;
      return ds;
    }();
    cache.emplace(name, loaded);
    return loaded;
  }
};

struct SpecBuilder::Impl {
  std::shared_ptr<const Document> doc;
  std::size_t index = 0;                              // position in [[stages]]
  std::string stage_name;
  std::shared_ptr<const toml::table> overrides;       // set() from C++
  std::map<std::string, Dataset> bound;
  std::vector<std::function<TrainingSpec(TrainingSpec)>> changes;

  const toml::table& own() const { return *doc->root["stages"].as_array()->at(index).as_table(); }
  const std::string& name() const { return stage_name; }

  /// The tables a key is looked up in, most specific first.
  std::vector<const toml::table*> layers(bool inheritable) const {
    std::vector<const toml::table*> out = {overrides.get(), &own()};
    if (!inheritable) return out;
    const auto* stages = doc->root["stages"].as_array();
    for (std::size_t i = index; i-- > 0;) out.push_back(stages->at(i).as_table());
    if (const auto* d = doc->root["defaults"].as_table()) out.push_back(d);
    return out;
  }

  const toml::node* get(const std::string& key) const {
    for (const auto* t : layers(contains(kInheritable, key)))
      if (const auto* n = t->get(key)) return n;
    return nullptr;
  }

  /// A table key (optimizer, schedule, eval) merged across layers: keys come from the most
  /// specific layer that sets them, until a layer names another `name` (another optimizer's keys
  /// do not carry over). Returns key -> node, and the name.
  std::map<std::string, const toml::node*> merged(const std::string& key, std::optional<std::string>& name, Problems& p) const {
    std::map<std::string, const toml::node*> out;
    for (const auto* layer : layers(true)) {
      const auto* n = layer->get(key);
      if (!n) continue;
      const auto* t = n->as_table();
      if (!t) {
        if (key != "eval" && n->is_string() && !name) {  // shorthand: optimizer = "adam"
          name = *n->value<std::string>();
          continue;
        }
        p.add(n, fmt::format("stage \"{}\": {}: expected a table, got {}", this->name(), key, type_name(*n)));
        break;
      }
      if (const auto* nm = t->get("name")) {
        const auto this_name = nm->value<std::string>().value_or("");
        if (!name) name = this_name;
        else if (*name != this_name) break;
      }
      for (auto&& [k, v] : *t)
        if (k.str() != "name" && !out.count(std::string(k.str()))) out[std::string(k.str())] = &v;
    }
    return out;
  }

  Expected<Dataset> dataset(const std::string& name) const {
    if (auto it = bound.find(name); it != bound.end()) return it->second;
    return doc->dataset(name);
  }
};

SpecBuilder::SpecBuilder(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
const std::string& SpecBuilder::name() const { return impl_->name(); }

SpecBuilder SpecBuilder::set(const std::string& key, ParamValue value) const {
  auto impl = std::make_shared<Impl>(*impl_);
  auto table = std::make_shared<toml::table>(impl->overrides ? *impl->overrides : toml::table{});
  toml::table holder;
  std::visit([&](const auto& v) {
    using V = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<V, std::vector<double>> || std::is_same_v<V, std::vector<std::string>>) {
      toml::array a;
      for (const auto& e : v) a.push_back(e);
      holder.insert("v", a);
    } else if constexpr (std::is_same_v<V, double>) {
      // ParamValue has one number type: whole numbers become TOML integers (batch_size = 8),
      // which every number-valued key accepts too.
      if (std::floor(v) == v && std::abs(v) < 9.0e15) holder.insert("v", static_cast<std::int64_t>(v));
      else holder.insert("v", v);
    } else {
      holder.insert("v", v);
    }
  }, value);
  insert_at(*table, split_path(key), 0, *holder.get("v"));
  impl->overrides = std::move(table);
  return SpecBuilder(std::move(impl));
}

SpecBuilder SpecBuilder::with_dataset(const std::string& name, Dataset dataset) const {
  auto impl = std::make_shared<Impl>(*impl_);
  impl->bound[name] = std::move(dataset);
  return SpecBuilder(std::move(impl));
}

SpecBuilder SpecBuilder::with(std::function<TrainingSpec(TrainingSpec)> change) const {
  auto impl = std::make_shared<Impl>(*impl_);
  impl->changes.push_back(std::move(change));
  return SpecBuilder(std::move(impl));
}

static EvalPlan parse_eval(const SpecBuilder::Impl& b, Problems& p);

Expected<TrainingSpec> SpecBuilder::build() const {
  const Impl& b = *impl_;
  Problems p{b.doc->source, {}};
  const std::string stage = b.name();
  Reader r{p, fmt::format("stage \"{}\": ", stage)};
  TrainingSpec spec;
  spec.name = stage;
  spec.device = b.doc->run.device;
  if (const auto* n = b.get("duration")) {
    if (auto t = r.time(n, "duration")) spec.duration = *t;
  } else {
    p.add(&b.own(), fmt::format("stage \"{}\": duration: required (e.g. duration = \"2ep\")", stage));
  }
  const std::string data_name = r.string(b.get("data"), "data").value_or("train");
  if (auto ds = b.dataset(data_name)) spec.data.train = *ds;
  else p.add(b.get("data"), fmt::format("stage \"{}\": data: {}", stage, ds.error().to_string()));
  if (auto v = r.integer(b.get("batch_size"), "batch_size", 1)) spec.data.batch_size = *v;
  if (auto v = r.boolean(b.get("shuffle"), "shuffle")) spec.data.shuffle = *v;
  if (auto v = r.boolean(b.get("drop_last"), "drop_last")) spec.data.drop_last = *v;
  if (auto v = r.one_of<Loss>(b.get("loss"), "loss", {{"cross_entropy", loss::cross_entropy()}, {"mse", loss::mse()}})) spec.loss = *v;
  if (auto v = r.integer(b.get("grad_accum"), "grad_accum", 1)) spec.grad_accum = *v;
  if (auto v = r.number(b.get("clip_grad_norm"), "clip_grad_norm")) spec.clip_grad_norm = *v;
  if (auto v = r.number(b.get("clip_grad_value"), "clip_grad_value")) spec.clip_grad_value = *v;
  if (auto v = r.one_of<Clock>(b.get("clock"), "clock", {{"run", Clock::run}, {"stage", Clock::stage}})) spec.schedule_clock = *v;
  if (auto v = r.one_of<Carry>(b.get("optimizer_carry"), "optimizer_carry", {{"keep", Carry::keep}, {"fresh", Carry::fresh}}))
    spec.optimizer_carry = *v;
  if (auto v = r.strings(b.get("freeze"), "freeze")) spec.freeze = *v;
  if (auto v = r.one_of<NonFinite>(b.get("on_non_finite"), "on_non_finite",
                                   {{"error", NonFinite::error}, {"skip", NonFinite::skip}, {"stop", NonFinite::stop}}))
    spec.on_non_finite = *v;

  // algorithms = { mixup = { alpha = 0.2 }, ema = {}, order = ["ema", "mixup"] }: the most
  // specific layer's table replaces the others whole, so a stage can switch algorithms off
  // with `algorithms = {}`.
  if (const auto* n = b.get("algorithms")) {
    if (const auto* t = n->as_table()) {
      std::vector<std::string> order = algorithms::default_order();
      if (const auto* o = t->get("order")) {
        if (auto v = r.strings(o, "algorithms.order")) {
          for (const auto& name : *v)
            if (!t->contains(name))
              p.add(o, fmt::format("{}algorithms.order: \"{}\" is not one of this stage's algorithms", r.path, name));
          order = *v;
          for (const auto& name : algorithms::default_order())  // the rest keep the default order
            if (std::find(order.begin(), order.end(), name) == order.end()) order.push_back(name);
        }
      }
      for (const auto& [key, node] : *t) {
        const std::string name(key.str());
        if (name == "order") continue;
        if (std::find(order.begin(), order.end(), name) == order.end()) order.push_back(name);  // unknown: error below
      }
      for (const auto& name : order) {
        const auto* node = t->get(name);
        if (!node) continue;
        const auto* opts = node->as_table();
        if (!opts) {
          p.add(node, fmt::format("{}algorithms.{}: expected a table of options (e.g. {} = {{}})", r.path, name, name));
          continue;
        }
        auto a = algorithms::from_name(name, to_params(*opts, {}, r.path + "algorithms." + name, p));
        if (a) spec.algorithms.push_back(std::move(*a));
        else p.add(node, r.path + a.error().message);
      }
    } else {
      p.add(n, fmt::format("{}algorithms: expected a table such as {{ mixup = {{ alpha = 0.2 }} }}, got {}", r.path, type_name(*n)));
    }
  }
  // callbacks = { early_stopping = { metric = "test/accuracy", mode = "max", patience = 2 }, ... }
  if (const auto* n = b.get("callbacks")) {
    if (const auto* t = n->as_table()) {
      for (const auto& [key, node] : *t) {
        const std::string name(key.str());
        const auto* opts = node.as_table();
        if (!opts) {
          p.add(&node, fmt::format("{}callbacks.{}: expected a table of options", r.path, name));
          continue;
        }
        auto c = callbacks::from_name(name, to_params(*opts, {}, r.path + "callbacks." + name, p));
        if (c) spec.callbacks.push_back(std::move(*c));
        else p.add(&node, r.path + c.error().message);
      }
    } else {
      p.add(n, fmt::format("{}callbacks: expected a table such as {{ early_stopping = {{ patience = 3 }} }}, got {}", r.path, type_name(*n)));
    }
  }

  // model carry-over: "keep" | "reinitialize" | "transfer" | {carry = ..., fresh = [...]}
  if (const auto* n = b.get("model")) {
    const std::vector<std::pair<std::string, ModelCarry::Kind>> kinds = {
        {"keep", ModelCarry::Kind::keep}, {"reinitialize", ModelCarry::Kind::reinitialize}, {"transfer", ModelCarry::Kind::transfer}};
    if (const auto* t = n->as_table()) {
      check_keys(*t, {"carry", "fresh"}, r.path + "model", p);
      if (auto k = r.one_of(t->get("carry"), "model.carry", kinds)) spec.model.kind = *k;
      if (auto f = r.strings(t->get("fresh"), "model.fresh")) spec.model.fresh = *f;
    } else if (auto k = r.one_of(n, "model", kinds)) {
      spec.model.kind = *k;
    }
  }

  // optimizer
  {
    std::optional<std::string> name;
    auto keys = b.merged("optimizer", name, p);
    Params params;
    std::vector<ParamGroup> groups;
    for (const auto& [k, node] : keys) {
      if (k == "groups") {
        const auto* arr = node->as_array();
        if (!arr) { p.add(node, r.path + "optimizer.groups: expected an array of tables"); continue; }
        for (const auto& g : *arr) {
          const auto* gt = g.as_table();
          if (!gt) { p.add(&g, r.path + "optimizer.groups: expected tables {patterns = [...], lr = ...}"); continue; }
          check_keys(*gt, kGroupKeys, r.path + "optimizer.groups[]", p);
          ParamGroup group;
          if (auto pats = r.strings(gt->get("patterns"), "optimizer.groups.patterns")) group.patterns = *pats;
          if (auto lr = r.number(gt->get("lr"), "optimizer.groups.lr")) group.lr = *lr;
          if (auto wd = r.number(gt->get("weight_decay"), "optimizer.groups.weight_decay")) group.weight_decay = *wd;
          groups.push_back(std::move(group));
        }
        continue;
      }
      if (auto v = to_param(*node)) params[k] = *v;
      else p.add(node, fmt::format("{}optimizer.{}: {} is not allowed here", r.path, k, type_name(*node)));
    }
    auto opt = optim::from_name(name.value_or("sgd"), params);
    if (opt) spec.optimizer = opt->with_groups(std::move(groups));
    else p.add(b.get("optimizer"), r.path + opt.error().message);
  }
  // schedule
  {
    std::optional<std::string> name;
    auto keys = b.merged("schedule", name, p);
    Params params;
    for (const auto& [k, node] : keys) {
      if (auto v = to_param(*node)) params[k] = *v;
      else p.add(node, fmt::format("{}schedule.{}: {} is not allowed here", r.path, k, type_name(*node)));
    }
    auto s = schedule::from_name(name.value_or("constant"), params);
    if (s) spec.schedule = *s;
    else p.add(b.get("schedule"), r.path + s.error().message);
  }
  // Evaluation during the fit: at the eval interval and at the stage's end.
  if (EvalPlan plan = parse_eval(b, p); !plan.spec.sets.empty()) {
    plan.spec.loss = spec.loss;
    spec.evaluation = EvalSchedule{plan.spec, plan.interval, true};
  }
  if (!p.empty()) return tl::unexpected(p.error());
  for (const auto& change : b.changes) spec = change(std::move(spec));
  if (auto ok = spec.validate(); !ok) return tl::unexpected(ok.error());
  return spec;
}

/// The stage's eval table as a plan (the loss is the caller's to set).
static EvalPlan parse_eval(const SpecBuilder::Impl& b, Problems& p) {
  Reader r{p, fmt::format("stage \"{}\": eval.", b.name())};
  std::optional<std::string> unused;
  auto keys = b.merged("eval", unused, p);
  auto at = [&](const char* k) { auto it = keys.find(k); return it == keys.end() ? nullptr : it->second; };
  EvalPlan plan;
  for (const auto& name : r.strings(at("sets"), "sets").value_or(std::vector<std::string>{})) {
    if (auto ds = b.dataset(name)) plan.spec.sets.emplace_back(name, *ds);
    else p.add(at("sets"), r.path + "sets: " + ds.error().to_string());
  }
  if (const auto* n = at("interval")) plan.interval = r.time(n, "interval");
  if (auto v = r.integer(at("batch_size"), "batch_size", 1)) plan.spec.batch_size = *v;
  if (auto v = r.integer(at("limit"), "limit", 1)) plan.spec.limit = *v;
  if (auto v = r.string(at("weights"), "weights")) plan.spec.weights = *v;
  if (const auto* n = at("top_k")) {
    if (const auto* a = n->as_array()) {
      plan.spec.top_k.clear();
      for (const auto& e : *a)
        if (e.is_integer() && *e.value<std::int64_t>() >= 1) plan.spec.top_k.push_back(*e.value<std::int64_t>());
        else p.add(&e, r.path + "top_k: expected positive integers");
    } else {
      p.add(n, r.path + "top_k: expected an array of integers");
    }
  }
  for (const auto& [k, node] : keys)
    if (!contains(kEvalKeys, k)) {
      p.add(node, fmt::format("{}{}: unknown key{}; valid keys: {}", r.path, k, detail::did_you_mean(k, kEvalKeys),
                              fmt::join(kEvalKeys, ", ")));
    }
  if (plan.interval && plan.interval->value <= 0) p.add(at("interval"), r.path + "interval: must be more than zero");
  return plan;
}

Expected<EvalPlan> SpecBuilder::eval() const {
  Problems p{impl_->doc->source, {}};
  EvalPlan plan = parse_eval(*impl_, p);
  if (!p.empty()) return tl::unexpected(p.error());
  if (auto spec = build()) plan.spec.loss = spec->loss;
  return plan;
}

std::string SpecBuilder::to_toml() const {
  toml::table out;
  out.insert("name", impl_->name());
  for (const auto& key : kStageOnly)
    if (const auto* n = impl_->get(key); n && key != "name") n->visit([&](auto&& v) { out.insert(key, v); });
  Problems ignored{impl_->doc->source, {}};
  for (const auto& key : kInheritable) {
    if (key == "optimizer" || key == "schedule" || key == "eval") {
      std::optional<std::string> name;
      auto keys = impl_->merged(key, name, ignored);
      if (keys.empty() && !name) continue;
      toml::table t;
      if (name) t.insert("name", *name);
      for (const auto& [k, node] : keys) node->visit([&, k = k](auto&& v) { t.insert(k, v); });
      out.insert(key, std::move(t));
    } else if (const auto* n = impl_->get(key)) {
      n->visit([&](auto&& v) { out.insert(key, v); });
    }
  }
  std::ostringstream ss;
  ss << out;
  return ss.str();
}

// ---------------------------------------------------------------- Curriculum
struct Curriculum::Impl {
  std::shared_ptr<Document> doc;
  std::vector<SpecBuilder> stages;
  std::optional<ModelFactory> model;
  std::string resolved;
  std::string fingerprint;
};

Curriculum::Curriculum(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
const RunConfig& Curriculum::run() const { return impl_->doc->run; }
const std::vector<SpecBuilder>& Curriculum::stages() const { return impl_->stages; }
const std::string& Curriculum::resolved_toml() const { return impl_->resolved; }
const std::string& Curriculum::fingerprint() const { return impl_->fingerprint; }

Curriculum Curriculum::with_model(ModelFactory factory) const {
  auto impl = std::make_shared<Impl>(*impl_);
  impl->model = std::move(factory);
  return Curriculum(std::move(impl));
}

Curriculum Curriculum::with_dataset(const std::string& name, Dataset dataset) const {
  auto impl = std::make_shared<Impl>(*impl_);
  for (auto& s : impl->stages) s = s.with_dataset(name, dataset);
  return Curriculum(std::move(impl));
}

Expected<Dataset> Curriculum::dataset(const std::string& name) const {
  if (!impl_->stages.empty()) return impl_->stages.front().impl()->dataset(name);
  return impl_->doc->dataset(name);
}

Expected<ModelFactory> Curriculum::model() const {
  if (impl_->model) return *impl_->model;
  const auto& root = impl_->doc->root;
  const auto* t = root["model"].as_table();
  if (!t) return fail(ErrorCode::invalid_spec, fmt::format("{}: no [model] table and no model bound with with_model()", impl_->doc->source));
  const auto name = (*t)["name"].value<std::string>().value_or("");
  Problems p{impl_->doc->source, {}};
  const Params params = to_params(*t, {"name"}, "model", p);
  if (!p.empty()) return tl::unexpected(p.error());
  const auto it = impl_->doc->registry.models.find(name);
  if (it == impl_->doc->registry.models.end())
    return fail(ErrorCode::invalid_spec, fmt::format("{}: unknown model \"{}\"", impl_->doc->source, name));
  auto made = it->second.make(params);
  if (!made) return tl::unexpected(made.error().with_context(fmt::format("{}: model \"{}\"", impl_->doc->source, name)));
  return made;
}

Expected<TrainState> Curriculum::init() const {
  return model().and_then([&](const ModelFactory& f) {
    return init_state(f, {.seed = run().seed, .max_duration = run().max_duration});
  });
}

namespace {
/// Builds every stage and its evaluation plan, adding their problems.
void check_stages(const Curriculum& cur, Problems& all) {
  const auto& run = cur.run();
  for (const auto& stage : cur.stages()) {
    auto plan = stage.eval();
    if (!plan) add_unique(all.list, problem_lines(plan.error()));
    auto spec = stage.build();
    if (!spec) {
      add_unique(all.list, problem_lines(spec.error()));
      continue;
    }
    // A stage longer than the whole run can never be trained as written.
    const auto n = spec->data.train.size(), bs = spec->data.batch_size;
    const double per_epoch = static_cast<double>(spec->data.drop_last ? n / bs : (n + bs - 1) / bs);
    auto batches = [&](Time t) {
      switch (t.unit) {
        case TimeUnit::epoch: return t.value * per_epoch;
        case TimeUnit::batch: return t.value;
        case TimeUnit::sample: return std::ceil(t.value / static_cast<double>(bs));
        case TimeUnit::duration: return 0.0;
      }
      return 0.0;
    };
    const double stage_b = batches(spec->duration), max_b = batches(run.max_duration);
    if (run.max_duration.value > 0 && stage_b > max_b)
      all.list.push_back(fmt::format("{}: stage \"{}\": duration {} ({:.0f} batches) exceeds the run's max_duration {} "
                                     "({:.0f} batches); raise run.max_duration or shorten the stage",
                                     all.source, spec->name, spec->duration.to_string(), stage_b,
                                     run.max_duration.to_string(), max_b));
  }
}
}  // namespace

Expected<void> Curriculum::validate() const {
  Problems all{impl_->doc->source, {}};
  auto factory = model();
  if (!factory) add_unique(all.list, problem_lines(factory.error()));
  check_stages(*this, all);
  if (all.empty()) return {};
  return tl::unexpected(all.error());
}

Expected<Curriculum> parse_curriculum(std::string_view text, const std::string& source,
                                      const std::vector<std::string>& overrides, const Registry& registry) {
  auto doc = std::make_shared<Document>();
  doc->source = source;
  doc->registry = registry;
  try {
    doc->root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    return fail(ErrorCode::invalid_spec, fmt::format("{}:{}:{}: TOML syntax error: {}", source, b.line, b.column, e.description()));
  }
  Problems p{source, {}};
  auto& root = doc->root;

  // --set path=value, with the file's own paths (stage.<name>.key for a [[stages]] entry).
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      p.list.push_back(fmt::format("--set \"{}\": expected path=value, e.g. stage.main.optimizer.lr=1e-3", o));
      continue;
    }
    const auto parts = split_path(o.substr(0, eq));
    const auto value = value_table(o.substr(eq + 1));
    const auto& v = *value.get("v");
    if ((parts[0] == "stage" || parts[0] == "stages") && parts.size() >= 3) {
      auto* stages = root["stages"].as_array();
      toml::table* target = nullptr;
      std::vector<std::string> names;
      if (stages)
        for (auto& s : *stages)
          if (auto* t = s.as_table()) {
            names.push_back((*t)["name"].value<std::string>().value_or(""));
            if (names.back() == parts[1]) target = t;
          }
      if (!target) {
        p.list.push_back(fmt::format("--set \"{}\": no stage \"{}\"{}; stages: {}", o, parts[1],
                                     detail::did_you_mean(parts[1], names), fmt::join(names, ", ")));
        continue;
      }
      if (!insert_at(*target, parts, 2, v)) p.list.push_back(fmt::format("--set \"{}\": the path goes through a value that is not a table", o));
    } else if (contains({"run", "model", "datasets", "defaults"}, parts[0]) && parts.size() >= 2) {
      if (!insert_at(root, parts, 0, v)) p.list.push_back(fmt::format("--set \"{}\": the path goes through a value that is not a table", o));
    } else {
      p.list.push_back(fmt::format("--set \"{}\": paths start with run., model., datasets.<name>., defaults. or stage.<name>.", o));
    }
  }

  check_keys(root, {"run", "model", "datasets", "defaults", "stages"}, "(top level)", p);
  Reader r{p, "run."};
  // [run]
  if (const auto* run = root["run"].as_table()) {
    check_keys(*run, kRunKeys, "run", p);
    auto& rc = doc->run;
    rc.name = r.string(run->get("name"), "name").value_or(std::filesystem::path(source).stem().string());
    if (auto v = r.integer(run->get("seed"), "seed", 0)) rc.seed = static_cast<std::uint64_t>(*v);
    if (auto v = r.one_of<c10::DeviceType>(run->get("device"), "device", {{"cpu", c10::kCPU}, {"cuda", c10::kCUDA}})) rc.device = c10::Device(*v);
    if (auto v = r.integer(run->get("threads"), "threads", 0)) rc.threads = static_cast<int>(*v);
    if (const auto* n = run->get("max_duration")) {
      if (auto t = r.time(n, "max_duration")) {
        if (t->unit == TimeUnit::duration || t->value <= 0) p.add(n, "run.max_duration: must be more than zero, in ep, ba or sp");
        else rc.max_duration = *t;
      }
    } else {
      p.add(run, "run.max_duration: required (e.g. max_duration = \"4ep\")");
    }
    rc.run_dir = r.string(run->get("run_dir"), "run_dir").value_or("runs/" + rc.name);
    if (const auto* n = run->get("checkpoint_every")) {
      rc.checkpoint_every = r.time(n, "checkpoint_every");
      if (rc.checkpoint_every && rc.checkpoint_every->value <= 0) p.add(n, "run.checkpoint_every: must be more than zero");
    }
    if (auto v = r.integer(run->get("keep_checkpoints"), "keep_checkpoints", 1)) rc.keep_checkpoints = static_cast<int>(*v);
    if (auto v = r.boolean(run->get("tensorboard"), "tensorboard")) rc.tensorboard = *v;
  } else {
    p.list.push_back(fmt::format("{}: [run] table missing (it needs at least max_duration)", source));
  }
  // [model]
  if (const auto* model = root["model"].as_table()) {
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
      check_keys(*model, keys, "model", p);
    }
  }
  // [datasets.<name>]
  if (const auto* ds = root["datasets"].as_table()) {
    std::vector<std::string> kinds;
    for (const auto& [k, v] : registry.datasets) kinds.push_back(k);
    for (auto&& [name, node] : *ds) {
      const std::string path = fmt::format("datasets.{}", name.str());
      const auto* t = node.as_table();
      if (!t) { p.add(&node, path + ": expected a table with kind = ..."); continue; }
      auto kind = Reader{p, path + "."}.string(t->get("kind"), "kind");
      if (!kind) {
        if (!t->get("kind")) p.add(t, fmt::format("{}.kind: required; kinds: {}", path, fmt::join(kinds, ", ")));
        continue;
      }
      auto it = registry.datasets.find(*kind);
      if (it == registry.datasets.end()) {
        p.add(t->get("kind"), fmt::format("{}.kind: unknown dataset kind \"{}\"{}; kinds: {}", path, *kind,
                                          detail::did_you_mean(*kind, kinds), fmt::join(kinds, ", ")));
        continue;
      }
      auto keys = it->second.keys;
      keys.insert(keys.begin(), {"kind", "limit"});
      check_keys(*t, keys, path, p);
      Reader{p, path + "."}.integer(t->get("limit"), "limit", 0);
    }
  }
  // [defaults] and [[stages]]
  if (const auto* d = root["defaults"].as_table()) check_keys(*d, kInheritable, "defaults", p);
  std::vector<std::string> all_stage_keys = kStageOnly;
  all_stage_keys.insert(all_stage_keys.end(), kInheritable.begin(), kInheritable.end());
  const auto* stages = root["stages"].as_array();
  if (!stages || stages->empty()) {
    p.list.push_back(fmt::format("{}: no stages: add at least one [[stages]] table with name and duration", source));
  } else {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < stages->size(); ++i) {
      const auto* t = stages->at(i).as_table();
      if (!t) { p.add(&stages->at(i), "stages: every entry must be a table ([[stages]])"); continue; }
      check_keys(*t, all_stage_keys, fmt::format("stages[{}]", i), p);
      auto name = Reader{p, fmt::format("stages[{}].", i)}.string(t->get("name"), "name");
      if (!name) {
        if (!t->get("name")) p.add(t, fmt::format("stages[{}].name: required (a stage is identified by its name)", i));
      } else if (contains(names, *name)) {
        p.add(t->get("name"), fmt::format("stages[{}].name: \"{}\" is used by an earlier stage; names must be unique", i, *name));
      } else {
        names.push_back(*name);
      }
      if (!t->get("duration")) p.add(t, fmt::format("stages[{}].duration: required (e.g. duration = \"2ep\")", i));
    }
  }
  const bool stages_ok = stages && !stages->empty() &&
                         std::all_of(stages->begin(), stages->end(), [](const toml::node& n) {
                           return n.is_table() && (*n.as_table())["name"].is_string();
                         });
  if (!p.empty() && !stages_ok) return tl::unexpected(p.error());

  auto impl = std::make_shared<Curriculum::Impl>();
  impl->doc = doc;
  for (std::size_t i = 0; i < stages->size(); ++i) {
    auto b = std::make_shared<SpecBuilder::Impl>();
    b->doc = doc;
    b->index = i;
    b->stage_name = *(*stages->at(i).as_table())["name"].value<std::string>();
    b->overrides = std::make_shared<toml::table>();
    impl->stages.emplace_back(std::move(b));
  }
  // The resolved configuration: what each stage trains with, after inheritance and overrides.
  toml::table head;
  for (const char* key : {"run", "model", "datasets"})
    if (const auto* n = root.get(key)) n->visit([&](auto&& v) { head.insert(key, v); });
  toml::array resolved_stages;
  for (const auto& s : impl->stages) {
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
  impl->resolved = ss.str();
  // The fingerprint leaves out what does not change training (where to write, how many threads),
  // and is the same for a file and its resolved form.
  if (auto* run = head["run"].as_table())
    for (const char* k : {"run_dir", "threads", "checkpoint_every", "keep_checkpoints", "tensorboard"}) run->erase(k);
  std::ostringstream fps;
  fps << head;
  impl->fingerprint = sha256_hex(fps.str());
  Curriculum cur(std::move(impl));
  if (!p.empty()) {
    // Report the stages' problems too: every problem at once.
    Problems more{source, {}};
    check_stages(cur, more);
    add_unique(p.list, more.list);
    return tl::unexpected(p.error());
  }
  return cur;
}

Expected<Curriculum> load_curriculum(const std::filesystem::path& file, const std::vector<std::string>& overrides,
                                     const Registry& registry) {
  std::ifstream in(file);
  if (!in) return fail(ErrorCode::io, fmt::format("{}: cannot open: {}", file.string(), std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_curriculum(ss.str(), file.string(), overrides, registry);
}

}  // namespace baton
