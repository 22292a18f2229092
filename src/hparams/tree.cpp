// Curricula that branch: `from` and `baseline` of each stage, the tree they make, and each
// branch's path (root to leaf) as the stages of a chain. A branch is then an ordinary curriculum
// of its path's stages, so inheritance, validation, fingerprints and the run directory are those
// of a chain and a branch's bits are those of an independent run of its path.
#include <algorithm>
#include <functional>

#include "internal.hpp"
#include "suggest.hpp"

namespace baton::detail {

std::vector<std::string> stage_names(const toml::array& stages) {
  std::vector<std::string> names;
  for (const auto& s : stages) names.push_back((*s.as_table())["name"].value<std::string>().value_or(""));
  return names;
}

TreeShape tree_shape(const std::vector<std::string>& names, const std::vector<std::optional<std::string>>& from,
                     const std::vector<bool>& baseline, const std::function<void(std::size_t, bool, std::string)>& problem) {
  TreeShape t;
  t.parent.resize(names.size());
  t.baseline.resize(names.size(), false);
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string where = fmt::format("stage \"{}\": ", names[i]);
    if (i > 0) t.parent[i] = i - 1;
    if (i < baseline.size() && baseline[i]) {
      t.branches = true;
      if (i == 0)
        problem(i, false, fmt::format("{}baseline: the first stage has no pretraining to compare with; put it on the stage "
                                      "that starts a branch (the scratch baseline trains from there to the branch's end)", where));
      else
        t.baseline[i] = true;
    }
    if (i >= from.size() || !from[i]) continue;
    t.branches = true;
    const auto& f = *from[i];
    const auto at = std::find(names.begin(), names.end(), f);
    if (f == names[i]) {
      problem(i, true, fmt::format("{}from: a stage cannot start from itself; name an earlier stage", where));
    } else if (at == names.end()) {
      std::vector<std::string> earlier(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(i));
      problem(i, true, fmt::format("{}from: no stage is named \"{}\"{}; the stages before it: {}", where, f,
                                   did_you_mean(f, earlier), earlier.empty() ? "(none)" : fmt::format("{}", fmt::join(earlier, ", "))));
    } else if (static_cast<std::size_t>(at - names.begin()) > i) {
      problem(i, true, fmt::format("{}from: \"{}\" comes later (stage {} of {}); a stage starts from an earlier one, so the "
                                   "stages make a tree without cycles: move it after \"{}\"", where, f, at - names.begin() + 1,
                                   names.size(), f));
    } else {
      t.parent[i] = static_cast<std::size_t>(at - names.begin());
    }
  }
  return t;
}

TreeShape read_tree(const toml::table& root, Problems& p) {
  const auto* stages = root["stages"].as_array();
  if (!stages) return {};
  const auto names = stage_names(*stages);
  std::vector<std::optional<std::string>> from(names.size());
  std::vector<bool> baseline(names.size(), false);
  bool any = false;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& stage = *stages->at(i).as_table();
    Reader r{p, fmt::format("stage \"{}\": ", names[i])};
    if (const auto* n = stage.get("from")) {
      any = true;
      from[i] = r.string(n, "from");
    }
    if (const auto* n = stage.get("baseline")) {
      any = true;
      baseline[i] = r.one_of<bool>(n, "baseline", {{"scratch", true}}).value_or(false);
    }
  }
  auto t = tree_shape(names, from, baseline, [&](std::size_t i, bool is_from, const std::string& message) {
    p.add(stages->at(i).as_table()->get(is_from ? "from" : "baseline"), message);
  });
  t.branches = t.branches || any;
  return t;
}

std::vector<BranchPath> branch_paths(const std::vector<std::string>& names, const TreeShape& t) {
  std::vector<BranchPath> out;
  std::vector<bool> is_parent(names.size(), false);
  for (const auto& p : t.parent)
    if (p) is_parent[*p] = true;
  for (std::size_t leaf = 0; leaf < names.size(); ++leaf) {
    if (is_parent[leaf]) continue;
    std::vector<std::size_t> path;
    for (std::optional<std::size_t> s = leaf; s; s = t.parent[*s]) path.push_back(*s);
    std::reverse(path.begin(), path.end());
    out.push_back({names[leaf], path, false});
    // A scratch baseline from the last stage on the path that asks for one: that stage to the
    // leaf, from a fresh initialization, each stage resolved as on the branch (what it inherits
    // from the stages left out included: the same schedule, precision, data, ...).
    for (std::size_t k = path.size(); k-- > 0;)
      if (t.baseline[path[k]]) {
        out.push_back({names[leaf], path, true, k});
        break;
      }
  }
  return out;
}

void keep_path(toml::table& root, const std::vector<std::size_t>& path) {
  auto* stages = root["stages"].as_array();
  if (!stages) return;
  // Moved, not copied: a copied toml++ node forgets its place in the file, which messages need.
  for (std::size_t i = stages->size(); i-- > 0;)
    if (std::find(path.begin(), path.end(), i) == path.end()) stages->erase(stages->begin() + static_cast<std::ptrdiff_t>(i));
  for (auto& s : *stages)
    if (auto* t = s.as_table()) {
      t->erase("from");
      t->erase("baseline");
    }
}

}  // namespace baton::detail
