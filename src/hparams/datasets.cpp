// [datasets.<name>] of a curriculum: the checks made when the file is parsed, and loading (once per
// document) with the selection every kind takes: `offset` and `limit` pick a range of the loaded
// samples, then `holdout = { fraction, seed, part }` one part of a held-out split of that range.
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "baton/data.hpp"
#include "baton/text.hpp"
#include "detail.hpp"
#include "io.hpp"
#include "suggest.hpp"
#include "internal.hpp"

namespace baton::detail {
namespace {

/// The keys every dataset kind takes besides its own.
const std::vector<std::string> kSelectionKeys = {"label_map", "offset", "limit", "holdout"};
const std::vector<std::string> kHoldoutKeys = {"fraction", "seed", "part"};

struct Selection {
  std::vector<std::int64_t> label_map;  // empty: labels as they are
  std::int64_t offset = 0;
  std::int64_t limit = 0;  // 0: to the end
  std::optional<data::HoldOutOptions> holdout;
  bool val = false;  // which part of the hold-out
};

/// The keys of the built-in dataset kinds that name input files.
const std::map<std::string, std::vector<std::string>> kPathKeys = {
    {"fashion-mnist", {"dir"}}, {"idx", {"images", "labels"}}, {"csv", {"path"}}, {"shards", {"dir"}}, {"image_folder", {"root", "list"}},
    {"fortunes_lm", {"dir", "tokenizer"}}, {"fortunes_text", {"dir", "tokenizer"}}, {"token_shards", {"dir"}}};

/// Reads a dataset table's selection keys; problems (placed at their nodes) go to `p`.
Selection read_selection(const toml::table& t, const std::string& path, Problems& p) {
  Selection s;
  Reader r{p, path + "."};
  if (auto v = r.integer(t.get("offset"), "offset", 0)) s.offset = *v;
  if (auto v = r.integer(t.get("limit"), "limit", 0)) s.limit = *v;
  if (const auto* node = t.get("label_map")) {
    const auto* a = node->as_array();
    bool ok = a && !a->empty();
    for (std::size_t i = 0; ok && i < a->size(); ++i) {
      const auto v = a->get(i)->value<std::int64_t>();
      ok = v.has_value() && a->get(i)->is_integer() && *v >= -1;
      if (ok) s.label_map.push_back(*v);
    }
    if (!ok) {
      s.label_map.clear();
      p.add(node, fmt::format("{}.label_map: expected a list of whole numbers, the new class of each class in order "
                              "(-1 leaves a class out), e.g. [0, 1, 0, 0, 0, 2, 0, 2, 3, 2]", path));
    }
  }
  const auto* node = t.get("holdout");
  if (!node) return s;
  const auto* h = node->as_table();
  if (!h) {
    p.add(node, fmt::format("{}.holdout: expected a table such as {{ fraction = 0.1, part = \"val\" }}, got {}", path,
                            type_name(*node)));
    return s;
  }
  check_keys(*h, kHoldoutKeys, path + ".holdout", p);
  Reader hr{p, path + ".holdout."};
  data::HoldOutOptions o;
  if (auto v = hr.number(h->get("fraction"), "fraction")) {
    if (*v > 0.0 && *v < 1.0) o.fraction = *v;
    else p.add(h->get("fraction"), fmt::format("{}.holdout.fraction: must be in (0, 1), got {}", path, *v));
  }
  if (auto v = hr.integer(h->get("seed"), "seed", 0)) o.seed = static_cast<std::uint64_t>(*v);
  if (!h->get("part")) {
    p.add(h, fmt::format("{}.holdout.part: required: \"train\" (the samples not held out) or \"val\" (the held-out ones)", path));
  } else if (auto part = hr.one_of<bool>(h->get("part"), "part", {{"train", false}, {"val", true}})) {
    s.val = *part;
  }
  s.holdout = o;
  return s;
}

Expected<Dataset> apply_selection(const Dataset& ds, const Selection& s) {
  Expected<Dataset> mapped = s.label_map.empty() ? Expected<Dataset>(ds) : data::map_labels(ds, s.label_map);
  if (!mapped) return mapped;
  auto range = data::slice(*mapped, s.offset, s.limit);
  if (!range || !s.holdout) return range;
  auto parts = data::hold_out(*range, *s.holdout);
  if (!parts) return tl::unexpected(parts.error());
  return s.val ? parts->val : parts->train;
}

/// Datasets held out from the same source (kind and keys) with the same fraction and seed are
/// disjoint only when they split the same range: a "train" and a "val" part over different
/// offset / limit may share samples, a leak from training into validation that nothing would show.
void check_holdout_ranges(const toml::table& datasets, Problems& p) {
  struct Part { std::string name; std::int64_t offset, limit; std::vector<std::int64_t> map; bool val; const toml::node* at; };
  std::map<std::string, std::vector<Part>> groups;
  for (auto&& [name, node] : datasets) {
    const auto* t = node.as_table();
    if (!t || !t->get("holdout")) continue;
    Problems ignored{p.source, {}};
    const auto s = read_selection(*t, "datasets." + std::string(name.str()), ignored);
    if (!ignored.empty() || !s.holdout) continue;  // reported by check_datasets
    toml::table source = *t;
    for (const auto& k : kSelectionKeys) source.erase(k);
    std::ostringstream key;
    key << source << '|' << s.holdout->fraction << '|' << s.holdout->seed;
    groups[key.str()].push_back({std::string(name.str()), s.offset, s.limit, s.label_map, s.val, t});
  }
  auto range = [](const Part& x) {
    return x.limit == 0 ? fmt::format("[{}, end)", x.offset) : fmt::format("[{}, {})", x.offset, x.offset + x.limit);
  };
  for (const auto& [key, parts] : groups)
    for (const auto& a : parts)
      for (const auto& b : parts)
        if (!a.val && b.val && (a.offset != b.offset || a.limit != b.limit))
          p.add(b.at, fmt::format("datasets.{} (holdout part \"val\") and datasets.{} (part \"train\") split different "
                                  "ranges of the same data ({} and {}), so they may share samples; give both the same "
                                  "offset and limit",
                                  b.name, a.name, range(b), range(a)));
        else if (!a.val && b.val && a.map != b.map)
          p.add(b.at, fmt::format("datasets.{} (holdout part \"val\") and datasets.{} (part \"train\") split the same "
                                  "data with different label maps, so they may share samples; give both the same "
                                  "label_map (a map is applied before holding out)",
                                  b.name, a.name));
}

}  // namespace

void check_datasets(const toml::table& root, const Registry& registry, Problems& p) {
  const auto* ds = root["datasets"].as_table();
  if (!ds) return;
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
                                        did_you_mean(*kind, kinds), fmt::join(kinds, ", ")));
      continue;
    }
    auto keys = it->second.keys;
    keys.insert(keys.begin(), "kind");
    keys.insert(keys.end(), kSelectionKeys.begin(), kSelectionKeys.end());
    check_keys(*t, keys, path, p);
    read_selection(*t, path, p);
  }
  check_holdout_ranges(*ds, p);
}

Expected<std::pair<std::string, Params>> Document::dataset_params(const std::string& name) const {
  const auto* table = root["datasets"][name].as_table();
  if (!table) {
    std::vector<std::string> names;
    if (const auto* ds = root["datasets"].as_table())
      for (auto&& [k, v] : *ds) names.emplace_back(k.str());
    for (const auto& [k, v] : bound) names.push_back(k);
    return fail(ErrorCode::invalid_spec, fmt::format("no dataset \"{}\"; datasets: {}", name, fmt::join(names, ", ")));
  }
  const auto kind = (*table)["kind"].value<std::string>().value_or("");
  if (!registry.datasets.count(kind)) return fail(ErrorCode::invalid_spec, fmt::format("unknown dataset kind \"{}\"", kind));
  std::vector<std::string> skip = {"kind"};
  skip.insert(skip.end(), kSelectionKeys.begin(), kSelectionKeys.end());
  Problems unread{source, {}};  // tables and mixed arrays: each kind's loader says what it needs
  Params params = to_params(*table, skip, "datasets." + name, unread);
  // The built-in kinds' input paths, when relative, start at the curriculum file's directory
  // (as the file's reader expects), not the working directory; the text (and fingerprint) keeps
  // what the file says.
  if (auto keys = kPathKeys.find(kind); keys != kPathKeys.end() && !base_dir.empty())
    for (const auto& key : keys->second)
      if (auto it = params.find(key); it != params.end())
        if (auto* text = std::get_if<std::string>(&it->second);
            text && !text->empty() && *text != "bytes" && std::filesystem::path(*text).is_relative())
          *text = (base_dir / *text).string();
  return std::pair{kind, std::move(params)};
}

Expected<Dataset> Document::dataset(const std::string& name) const {
  if (auto it = bound.find(name); it != bound.end()) return it->second;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  Expected<Dataset> loaded = [&]() -> Expected<Dataset> {
    auto kind_params = dataset_params(name);
    if (!kind_params) return tl::unexpected(kind_params.error());
    // (not a structured binding: clang 14, the fuzz and sanitizer builds' compiler, cannot capture one)
    const std::string& kind = kind_params->first;
    const Params& params = kind_params->second;
    const auto* table = root["datasets"][name].as_table();
    Problems problems{source, {}};
    const Selection selection = read_selection(*table, "datasets." + name, problems);
    if (!problems.empty()) return tl::unexpected(problems.error());
    const auto& entry = registry.datasets.at(kind);
    auto ds = guard([&] { return entry.load(params); });
    if (ds) ds = apply_selection(*ds, selection);
    if (!ds) return tl::unexpected(ds.error().with_context(fmt::format("dataset \"{}\"", name)));
    ds->name = name;
    return ds;
  }();
  cache.emplace(name, loaded);
  return loaded;
}

void absolute_paths(toml::table& resolved, const std::filesystem::path& base_dir) {
  std::error_code ec;
  const auto base = std::filesystem::absolute(base_dir.empty() ? std::filesystem::path(".") : base_dir, ec);
  if (ec) return;
  const auto fix = [&](toml::node* n) {
    if (auto* text = n ? n->as_string() : nullptr;
        text && !text->get().empty() && text->get() != "bytes" && std::filesystem::path(text->get()).is_relative())
      *text = (base / text->get()).lexically_normal().string();
  };
  if (auto* datasets = resolved["datasets"].as_table())
    for (auto&& [name, node] : *datasets)
      if (auto* t = node.as_table())
        if (auto keys = kPathKeys.find((*t)["kind"].value<std::string>().value_or("")); keys != kPathKeys.end())
          for (const auto& key : keys->second) fix(t->get(key));
  if (auto* model = resolved["model"].as_table()) {
    auto* from = model->get("init_from");
    if (from && from->is_table()) from = from->as_table()->get("path");
    fix(from);
  }
}

void tokenizer_identities(toml::table& resolved, const std::filesystem::path& base_dir) {
  auto* datasets = resolved["datasets"].as_table();
  if (!datasets) return;
  for (auto&& [name, node] : *datasets) {
    auto* t = node.as_table();
    // Token shards: their manifest (each shard's checksum, the tokenizer) stands for their content.
    if (auto* dir = t && (*t)["kind"].value<std::string>() == "token_shards" ? t->get_as<std::string>("dir") : nullptr) {
      std::filesystem::path manifest = std::filesystem::path(dir->get()) / "tokens.json";
      if (manifest.is_relative() && !base_dir.empty()) manifest = base_dir / manifest;
      std::ifstream in(manifest, std::ios::binary);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (in.good() || in.eof()) *dir = "token shards " + sha256_hex(text);
      continue;
    }
    auto* file = t ? t->get_as<std::string>("tokenizer") : nullptr;
    if (!file || file->get().empty() || file->get() == "bytes") continue;
    std::filesystem::path path = file->get();
    if (path.is_relative() && !base_dir.empty()) path = base_dir / path;
    if (auto tokenizer = text::load_tokenizer(path)) *file = tokenizer->identity();
  }
}

}  // namespace baton::detail
