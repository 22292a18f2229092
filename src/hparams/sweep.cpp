// Sweeps that share their prefix (sweep.hpp): the points' resolved configurations, stage by
// stage, make a tree; each node is a one-stage `baton::run` from its parent's final state.
#include <algorithm>
#include <functional>
#include <cmath>
#include <map>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "baton/checkpoint.hpp"
#include "baton/report.hpp"
#include "baton/run.hpp"
#include "baton/sweep.hpp"
#include "baton/tree.hpp"
#include "detail.hpp"
#include "io.hpp"
#include "internal.hpp"
#include "run/internal.hpp"
#include "weights.hpp"

namespace baton {
namespace {
namespace fs = std::filesystem;

/// One chain to train: a point of a sweep, or a branch of a tree (of a point), resolved: its
/// curriculum, specs, and per stage the configuration that decides the stage's training (the
/// run less where it writes, model, the datasets its stages up to it name, the stages up to it).
struct Plan {
  SweepPoint overrides;
  std::function<Expected<TrainState>()> init;  // the state its first stage starts from
  ModelFactory factory;                         // the model init() builds
  RunOptions base;                              // name, checkpoints, TensorBoard (dir, config: the node's)
  std::vector<TrainingSpec> specs;
  std::vector<std::string> texts, keys;
  std::string branch;     // a tree's branch (its last stage); "" for a chain
  bool baseline = false;  // the branch's scratch baseline
  bool tools = false;     // from C++ specs: each node gets a tools.toml (the model and data for the tools)
};

std::string point_text(const SweepPoint& p) { return p.empty() ? "(no overrides)" : fmt::format("{}", fmt::join(p, " ")); }
std::string plan_text(const Plan& p) {
  if (p.branch.empty()) return "sweep point " + point_text(p.overrides);
  return fmt::format("branch \"{}\"{}{}", p.branch, p.baseline ? " (scratch baseline)" : "",
                     p.overrides.empty() ? "" : " of sweep point " + point_text(p.overrides));
}

/// Every string in a table, at any depth: the dataset names a stage can refer to.
void strings_in(const toml::node& n, std::set<std::string>& out) {
  if (const auto* s = n.as_string()) out.insert(s->get());
  else if (const auto* t = n.as_table()) for (const auto& [k, v] : *t) strings_in(v, out);
  else if (const auto* a = n.as_array()) for (const auto& v : *a) strings_in(v, out);
}

Expected<toml::table> read_back(const std::string& text) {
  try {
    return toml::parse(text);
  } catch (const toml::parse_error& e) {
    return fail(ErrorCode::invalid_spec, fmt::format("the resolved configuration does not read back: {}", e.description()));
  }
}

/// `t` with its first `n` stages only, and of its datasets those in `keep` (all: null), as TOML.
std::string first_stages(const toml::table& t, std::size_t n, const std::set<std::string>* keep) {
  toml::table out;
  for (const char* key : {"run", "model"})
    if (const auto* v = t.get(key)) v->visit([&](auto&& x) { out.insert(key, x); });
  if (const auto* ds = t["datasets"].as_table()) {
    toml::table used;
    for (const auto& [name, v] : *ds)
      if (!keep || keep->count(std::string(name.str()))) v.visit([&, name = name](auto&& x) { used.insert(name, x); });
    if (!used.empty()) out.insert("datasets", std::move(used));
  }
  toml::array stages;
  if (const auto* all = t["stages"].as_array())
    for (std::size_t i = 0; i < n && i < all->size(); ++i) stages.push_back(*all->at(i).as_table());
  out.insert("stages", std::move(stages));
  std::ostringstream ss;
  ss << out << "\n";
  return ss.str();
}

/// The plan of a validated chain (a tree's branches: validated with their tree).
Expected<Plan> plan_of(const Curriculum& cur, const SweepPoint& point, std::string branch, bool baseline) {
  auto specs = cur.specs();
  if (!specs) return tl::unexpected(specs.error());
  auto t = read_back(cur.resolved_toml());
  if (!t) return tl::unexpected(t.error());
  detail::leave_out_bit_neutral(*t);
  const auto ro = cur.run_options();
  auto copy = read_back(ro.config);  // input paths absolute: the node's config.toml serves baton eval and export
  if (!copy) return tl::unexpected(copy.error());
  auto factory = cur.model();
  if (!factory) return tl::unexpected(factory.error());
  Plan p{point, [cur] { return cur.init(); }, *factory, ro, *specs, {}, {}, std::move(branch), baseline};
  const auto* stages = (*t)["stages"].as_array();
  if (!stages) return fail(ErrorCode::invalid_spec, "the resolved configuration has no stages");
  // A stage's key holds the datasets named by the stages up to it, not all of them: a branch's
  // own dataset, edited, changes that branch only.
  std::set<std::string> named;
  for (std::size_t level = 0; level < stages->size(); ++level) {
    strings_in(stages->at(level), named);
    p.keys.push_back(detail::sha256_hex(first_stages(*t, level + 1, &named)));
    p.texts.push_back("# The resolved curriculum up to this stage (input paths absolute): what it trained.\n" +
                      first_stages(*copy, level + 1, nullptr));
  }
  if (p.keys.size() != p.specs.size()) return fail(ErrorCode::invalid_spec, "the resolved configuration lost a stage");
  return p;
}

/// "name", or "name@scratch" for a baseline: how a child process is told which branch to train.
std::string branch_id(const std::string& branch, bool baseline) { return baseline ? branch + "@scratch" : branch; }

/// The chains of one point: the curriculum itself, or each branch of its tree (only `o.branch`
/// when set).
Expected<std::vector<Plan>> plans_of(const fs::path& file, const SweepOptions& o, const SweepPoint& point) {
  std::vector<std::string> sets = o.sets;
  sets.insert(sets.end(), point.begin(), point.end());
  auto cur = load_curriculum(file, sets, o.registry);
  if (!cur) return tl::unexpected(cur.error());
  std::vector<Plan> out;
  if (!cur->is_tree()) {
    // run_tree of a chain: a tree of one branch, named by its last stage.
    if (auto ok = cur->validate(); !ok) return tl::unexpected(ok.error());
    auto p = plan_of(*cur, point, o.by_stage ? cur->stages().back().name() : "", false);
    if (!p) return tl::unexpected(p.error());
    out.push_back(std::move(*p));
    return out;
  }
  if (auto ok = cur->validate(); !ok) return tl::unexpected(ok.error());  // every branch's problems at once
  for (const auto& b : cur->branches()) {
    if (!o.branch.empty() && o.branch != branch_id(b.name, b.baseline)) continue;
    auto p = plan_of(*b.curriculum, point, b.name, b.baseline);
    if (!p) return tl::unexpected(p.error().with_context(fmt::format("branch \"{}\"", b.name)));
    out.push_back(std::move(*p));
  }
  if (out.empty()) return fail(ErrorCode::invalid_argument, fmt::format("{}: no branch \"{}\"", file.string(), o.branch));
  return out;
}

/// "set/metric": the option, else of the first set the last stage evaluates (in the shipped
/// curriculum the validation set, listed before test: a sweep must not choose on test) its
/// accuracy, or when the stage lists metrics without accuracy, the first listed one that has a
/// value of its own (a language model's bits_per_token).
std::string ranking_metric(const SweepOptions& o, const TrainingSpec& last) {
  if (!o.metric.empty()) return o.metric;
  if (!last.evaluation || last.evaluation->spec.sets.empty()) return "";
  const auto& e = last.evaluation->spec;
  const bool accuracy = e.metrics.empty() || std::any_of(e.metrics.begin(), e.metrics.end(), [](const Metric& m) { return m.name == "accuracy"; });
  const auto first = std::find_if(e.metrics.begin(), e.metrics.end(), [](const Metric& m) { return m.scalar; });
  return e.sets.front().first + "/" + (accuracy || first == e.metrics.end() ? std::string("accuracy") : first->name);
}

fs::path node_dir(const SweepOptions& o, const Plan& p, std::size_t level) {
  if (o.by_stage) return p.baseline ? o.dir / "scratch" / p.specs[level].name : o.dir / p.specs[level].name;
  return o.dir / fmt::format("{}-{}-{}", level, p.specs[level].name, p.keys[level].substr(0, 12));
}

/// A finished node: written by the node when its run has finished (after its final.baton).
constexpr const char* kNodeFile = "sweep-node.json";

struct Node {
  fs::path dir;
  std::string params_sha256;
  Metrics final_metrics;
  double seconds = 0;  // training time of its stage (resumed parts included)
};

/// The node's result, when `dir` holds a finished node of configuration `key`.
std::optional<Node> read_node(const fs::path& dir, const std::string& key) {
  std::ifstream in(dir / kNodeFile);
  if (!in) return std::nullopt;
  try {
    const auto j = nlohmann::json::parse(in);
    if (j.at("key").get<std::string>() != key || !fs::exists(dir / "final.baton")) return std::nullopt;
    Node n{dir, j.at("params_sha256").get<std::string>(), {}, j.value("seconds", 0.0)};
    for (const auto& [set, values] : j.at("metrics").items())
      for (const auto& [k, v] : values.items()) n.final_metrics[set][k] = v.is_null() ? std::nan("") : v.get<double>();
    return n;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // not ours or damaged: the node resumes, finds its run finished, writes it again
  }
}

/// Trains stage `level` of `p` as a one-stage run in its node directory, from its parent's
/// final.baton; on success records the node (kNodeFile). False: stopped by a signal.
Expected<bool> train_node(const Plan& p, std::size_t level, const SweepOptions& o) {
  const fs::path node = node_dir(o, p, level);
  auto context = [&](Error e) {
    return tl::unexpected(e.with_context(fmt::format("{}: stage \"{}\" in {}", plan_text(p), p.specs[level].name, node.string())));
  };
  const fs::path parent = level == 0 ? fs::path() : node_dir(o, p, level - 1);
  // The parent's model: a stage before may have built one of its own (a new head).
  auto initial = level == 0 ? p.init() : load_checkpoint(parent / "final.baton", detail::factory_after(p.specs, level - 1, p.factory));
  if (!initial) return context(initial.error());
  RunOptions ro = p.base;
  ro.dir = node;
  ro.config = p.texts[level];
  ro.fingerprint = p.keys[level];
  ro.report = false;
  ro.progress = o.progress;
  ro.fresh = o.fresh;
  if (o.by_stage) ro.name = fmt::format("{}/{}{}", ro.name, p.baseline ? "scratch/" : "", p.specs[level].name);
  // A node from C++ specs has no curriculum the tools could read: it gets a tools.toml, as a
  // C++ run does (its model after this stage, its data), written once the run has its files.
  const std::string tools = p.tools ? detail::tools_record({p.specs[level]}, *initial, ro.name, node) : std::string();
  auto res = run(ro, {p.specs[level]}, std::move(*initial));
  if (!tools.empty() && fs::is_directory(node))
    if (auto ok = detail::write_file_atomic(node / "tools.toml", tools, "tools record"); !ok) return context(ok.error());
  if (!res) return context(res.error());
  if (res->interrupted) return false;
  double seconds = 0;
  for (const auto& st : res->stages) seconds += st.seconds;
  nlohmann::json metrics = nlohmann::json::object();
  for (const auto& [set, values] : res->final_metrics)
    for (const auto& [k, v] : values) metrics[set][k] = std::isnan(v) ? nlohmann::json() : nlohmann::json(v);
  const nlohmann::json j = {{"key", p.keys[level]}, {"stage", p.specs[level].name},
                            {"parent", parent.empty() ? nlohmann::json() : nlohmann::json(parent.filename().string())},
                            {"params_sha256", params_sha256(res->state)}, {"metrics", metrics}, {"seconds", seconds}};
  if (auto ok = detail::write_file_atomic(node / kNodeFile, j.dump(2) + "\n", "sweep node record"); !ok) return context(ok.error());
  return true;
}

/// The tree: one task per distinct configuration, level by level (a parent before its children).
struct Tree {
  std::vector<detail::SweepTask> tasks;
  std::vector<std::size_t> plan;             // per task: the first point that trains it
  std::map<std::string, std::size_t> index;  // key -> task
};

Tree build_tree(const std::vector<Plan>& plans, const SweepOptions& o) {
  Tree tree;
  for (std::size_t level = 0;; ++level) {
    bool any = false;
    for (std::size_t i = 0; i < plans.size(); ++i) {
      const auto& p = plans[i];
      if (level >= p.specs.size()) continue;
      any = true;
      if (auto it = tree.index.find(p.keys[level]); it != tree.index.end()) {
        ++tree.tasks[it->second].users;
        continue;
      }
      std::vector<std::string> sets = o.sets;
      sets.insert(sets.end(), p.overrides.begin(), p.overrides.end());
      std::optional<std::size_t> parent;
      if (level > 0) parent = tree.index.at(p.keys[level - 1]);
      tree.index.emplace(p.keys[level], tree.tasks.size());
      tree.tasks.push_back({level, p.keys[level], parent, node_dir(o, p, level), std::move(sets), p.specs[level].name, 1,
                            p.branch.empty() ? "" : branch_id(p.branch, p.baseline)});
      tree.plan.push_back(i);
    }
    if (!any) return tree;
  }
}

/// Every node's result into `done`: read back when finished, else trained in this process (with
/// jobs > 1 the processes have trained them all). False: a signal stopped the training. A node
/// that fails (e.g. a resume refused because its stage changed) stops its own subtree only; the
/// others train, and the error names every node that failed.
Expected<bool> train_here(const std::vector<Plan>& plans, const Tree& tree, const SweepOptions& o, std::map<std::string, Node>& done) {
  std::vector<bool> failed(tree.tasks.size(), false);
  std::vector<Error> errors;
  for (std::size_t t = 0; t < tree.tasks.size(); ++t) {
    const auto& task = tree.tasks[t];
    if (task.parent && failed[*task.parent]) {
      failed[t] = true;
      continue;
    }
    const std::string users = o.by_stage ? fmt::format("{} branch{}", task.users, task.users == 1 ? "" : "es")
                                         : fmt::format("{} point{}", task.users, task.users == 1 ? "" : "s");
    auto node = o.fresh && o.jobs == 1 ? std::nullopt : read_node(task.dir, task.key);
    if (!node && o.jobs > 1)
      return fail(ErrorCode::io, fmt::format("sweep node {}: its process ended well but left no {}", task.dir.string(), kNodeFile));
    if (!node) {
      if (o.progress) fmt::print("{}: stage \"{}\" for {} -> {}\n", o.by_stage ? "tree" : "sweep", task.stage, users, task.dir.string());
      const auto& p = plans[tree.plan[t]];
      auto trained = train_node(p, task.level, o);
      if (!trained) {
        failed[t] = true;
        errors.push_back(trained.error());
        continue;
      }
      if (!*trained) return false;
      node = read_node(task.dir, task.key);
      if (!node) return fail(ErrorCode::io, fmt::format("sweep node {}: {} did not read back", task.dir.string(), kNodeFile));
    } else if (o.progress && o.jobs == 1) {
      fmt::print("{}: stage \"{}\" for {}: finished before ({})\n", o.by_stage ? "tree" : "sweep", task.stage, users, task.dir.string());
    }
    done.emplace(task.key, std::move(*node));
  }
  if (errors.size() == 1) return tl::unexpected(errors.front());
  if (!errors.empty()) {
    std::vector<std::string> texts;
    for (const auto& e : errors) texts.push_back(e.to_string());
    return fail(errors.front().code, fmt::format("{} stage runs failed (the others finished; each one's stages after "
                                                 "it were not trained):\n{}", errors.size(), fmt::join(texts, "\n")));
  }
  return true;
}

/// Every chain's result from its leaf node, its own time (the nodes no other chain trains),
/// its score, and the best.
void rank(const std::vector<Plan>& plans, const Tree& tree, const std::map<std::string, Node>& done, const SweepOptions& o,
          SweepResult& r) {
  for (const auto& p : plans) {
    const auto& leaf = done.at(p.keys.back());
    SweepPointResult pr{p.overrides, 0, leaf.dir / "final.baton", leaf.params_sha256, leaf.final_metrics, 0};
    while (pr.shared_stages < p.keys.size() && tree.tasks[tree.index.at(p.keys[pr.shared_stages])].users > 1) ++pr.shared_stages;
    pr.branch = p.branch;
    pr.baseline = p.baseline;
    pr.dir = leaf.dir;
    for (std::size_t l = pr.shared_stages; l < p.keys.size(); ++l) pr.seconds += done.at(p.keys[l]).seconds;
    if (const auto& keep = p.specs.back().keep_best) {
      const fs::path best = leaf.dir / keep->file_name(p.specs.back().name);
      if (std::error_code ec; fs::is_regular_file(best, ec)) pr.best_state = best;
    }
    pr.metric = ranking_metric(o, p.specs.back());
    r.points.push_back(std::move(pr));
  }
  r.metric = ranking_metric(o, plans.front().specs.back());
  r.maximize = o.maximize;
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    auto& pr = r.points[i];
    pr.score = metric_value(pr.final_metrics, pr.metric).value_or(std::nan(""));
    const auto& b = r.points[r.best];
    if (!std::isnan(pr.score) && (std::isnan(b.score) || (o.maximize ? pr.score > b.score : pr.score < b.score))) r.best = i;
  }
}
/// Trains the plans' tree (each node once), then ranks and writes what they gave. `file`: the
/// curriculum child processes read (jobs > 1 only).
Expected<SweepResult> run_plans(const fs::path& file, const std::vector<Plan>& plans, const SweepOptions& o) {
  const bool is_tree = !plans.front().branch.empty();
  // A metric no evaluation gives would rank nothing: every score "-", the first point "best". The
  // point is named where it is not the first (its overrides changed what the last stage evaluates).
  for (std::size_t i = 0; i < plans.size() && !(is_tree && o.metric.empty()); ++i)
    if (auto bad = detail::sweep_metric_problem(o.metric, plans[i].specs.back()); !bad.empty()) {
      Error e{ErrorCode::invalid_argument, "sweep: the ranking metric (--metric, [sweep] metric, SweepOptions::metric): " + bad, {}};
      return tl::unexpected(i == 0 ? e : e.with_context(plan_text(plans[i])));
    }
  const Tree tree = build_tree(plans, o);
  SweepResult r;
  r.stages_trained = tree.tasks.size();
  for (const auto& p : plans) r.stages_total += p.keys.size();
  if (o.jobs > 1) {  // train in processes; the pass below then reads every node back
    std::vector<bool> finished;
    for (const auto& t : tree.tasks) finished.push_back(!o.fresh && read_node(t.dir, t.key).has_value());
    auto all = detail::train_in_processes(file, tree.tasks, finished, o);
    if (!all) return tl::unexpected(all.error());
    r.interrupted = !*all;
  }
  std::map<std::string, Node> done;  // key -> the node's result (its state is in dir/final.baton)
  if (!r.interrupted) {
    auto ok = train_here(plans, tree, o, done);
    if (!ok) return tl::unexpected(ok.error());
    r.interrupted = !*ok;
  }
  if (r.interrupted) return r;
  rank(plans, tree, done, o, r);
  detail::write_summary(o.dir / (o.by_stage ? "summary.json" : "sweep.json"), r);
  // The report's runs in the plans' order (a branch's stages, then its baseline's), each once.
  std::vector<fs::path> dirs;
  for (const auto& p : plans)
    for (const auto& key : p.keys)
      if (const auto& d = tree.tasks[tree.index.at(key)].dir; std::find(dirs.begin(), dirs.end(), d) == dirs.end()) dirs.push_back(d);
  if (o.report) {
    if (auto page = report::write(dirs, o.dir / "report.html"); page)
      r.report_file = o.dir / "report.html";
    else
      fmt::print(stderr, "baton: the sweep finished but its report was not written: {}\n", page.error().to_string());
  }
  return r;
}
}  // namespace

Expected<SweepResult> run_tree(const RunOptions& options, const std::vector<TreeStage>& stages, const TrainState& initial) {
  if (options.dir.empty()) return fail(ErrorCode::invalid_argument, "run_tree: RunOptions::dir is empty; name the tree's directory");
  if (stages.empty()) return fail(ErrorCode::invalid_argument, "run_tree: no stages");
  if (options.distributed) return fail(ErrorCode::invalid_argument, "run_tree: one rank only (RunOptions::distributed is set)");
  std::vector<std::string> names, problems;
  std::vector<std::optional<std::string>> from;
  std::vector<bool> baseline;
  for (const auto& s : stages) {
    if (std::find(names.begin(), names.end(), s.spec.name) != names.end())
      problems.push_back(fmt::format("two stages are named \"{}\"; a stage's name is its directory, so give each its own", s.spec.name));
    if (auto bad = detail::name_problem("stage name", s.spec.name, "it names the stage's directory"); !bad.empty()) problems.push_back(bad);
    names.push_back(s.spec.name);
    from.push_back(s.from.empty() ? std::nullopt : std::optional<std::string>(s.from));
    baseline.push_back(s.scratch_baseline);
  }
  const auto shape = detail::tree_shape(names, from, baseline, [&](std::size_t, bool, std::string m) { problems.push_back(std::move(m)); });
  if (!problems.empty())
    return fail(ErrorCode::invalid_spec, fmt::format("run_tree: {}", fmt::join(problems, "\n  ")));
  std::vector<Plan> plans;
  for (const auto& b : detail::branch_paths(names, shape)) {
    Plan p{{}, [&initial] { return Expected<TrainState>(initial); }, initial.factory, options, {}, {}, {}, b.name, b.baseline};
    p.tools = true;
    for (std::size_t k = b.skip; k < b.stages.size(); ++k) p.specs.push_back(stages[b.stages[k]].spec);  // specs are whole: nothing to inherit
    std::vector<std::string> undescribed;
    for (std::size_t level = 0; level < p.specs.size(); ++level) {
      const std::vector<TrainingSpec> upto(p.specs.begin(), p.specs.begin() + static_cast<std::ptrdiff_t>(level) + 1);
      p.texts.push_back(describe(upto, &initial, &undescribed));
      p.keys.push_back(detail::sha256_hex(p.texts.back()));
    }
    if (!undescribed.empty() && !options.accept_undescribed)
      return fail(ErrorCode::invalid_spec,
                  fmt::format("run_tree: branch \"{}\": part of it cannot be described, so a resume could not tell whether "
                              "it changed:\n  {}\nGive each an identity, or set RunOptions::accept_undescribed", b.name,
                              fmt::join(undescribed, "\n  ")));
    plans.push_back(std::move(p));
  }
  SweepOptions o{.dir = options.dir, .points = {{}}, .progress = options.progress, .report = options.report, .fresh = options.fresh,
                 .by_stage = true};
  return run_plans({}, plans, o);
}

Expected<bool> sweep_node(const fs::path& file, const SweepOptions& o, std::size_t level) {
  auto plans = plans_of(file, o, {});
  if (!plans) return tl::unexpected(plans.error());
  if (plans->size() != 1)
    return fail(ErrorCode::invalid_argument, fmt::format("sweep node: {} branches; name one (SweepOptions::branch)", plans->size()));
  const auto* p = &plans->front();
  if (level >= p->specs.size())
    return fail(ErrorCode::invalid_argument, fmt::format("sweep node: stage {} of a curriculum of {} stages", level, p->specs.size()));
  return train_node(*p, level, o);
}

Expected<SweepResult> sweep(const fs::path& file, const SweepOptions& o) {
  if (o.dir.empty()) return fail(ErrorCode::invalid_argument, "sweep: SweepOptions::dir is empty; name the sweep directory");
  if (o.points.empty()) return fail(ErrorCode::invalid_argument, "sweep: no points");
  if (o.jobs < 1) return fail(ErrorCode::invalid_argument, fmt::format("sweep: jobs is {}; at least 1", o.jobs));
  std::vector<Plan> plans;
  for (const auto& point : o.points) {  // every point's configuration is checked before any training
    auto ps = plans_of(file, o, point);
    if (!ps) return tl::unexpected(point.empty() ? ps.error() : ps.error().with_context(fmt::format("sweep point {}", point_text(point))));
    for (auto& p : *ps) plans.push_back(std::move(p));
  }
  return run_plans(file, plans, o);
}

}  // namespace baton
