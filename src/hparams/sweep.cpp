// Sweeps that share their prefix (sweep.hpp): the points' resolved configurations, stage by
// stage, make a tree; each node is a one-stage `baton::run` from its parent's final state.
#include <algorithm>
#include <cmath>
#include <map>
#include <fstream>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "baton/checkpoint.hpp"
#include "baton/report.hpp"
#include "baton/run.hpp"
#include "baton/sweep.hpp"
#include "detail.hpp"
#include "io.hpp"
#include "internal.hpp"
#include "weights.hpp"

namespace baton {
namespace {
namespace fs = std::filesystem;

/// One point, resolved: its curriculum, specs, and per stage the configuration that decides the
/// stage's training (the run less where it writes, model, datasets, the stages up to it).
struct Plan {
  SweepPoint overrides;
  Curriculum cur;
  std::vector<TrainingSpec> specs;
  std::vector<std::string> texts, keys;
};

std::string point_text(const SweepPoint& p) { return p.empty() ? "(no overrides)" : fmt::format("{}", fmt::join(p, " ")); }

Expected<Plan> plan(const fs::path& file, const SweepOptions& o, const SweepPoint& point) {
  std::vector<std::string> sets = o.sets;
  sets.insert(sets.end(), point.begin(), point.end());
  auto cur = load_curriculum(file, sets, o.registry);
  if (!cur) return tl::unexpected(cur.error());
  if (auto ok = cur->validate(); !ok) return tl::unexpected(ok.error());
  auto specs = cur->specs();
  if (!specs) return tl::unexpected(specs.error());
  toml::table t;
  try {
    t = toml::parse(cur->resolved_toml());
  } catch (const toml::parse_error& e) {
    return fail(ErrorCode::invalid_spec, fmt::format("the resolved configuration does not read back: {}", e.description()));
  }
  detail::leave_out_bit_neutral(t);
  toml::table head;
  for (const char* key : {"run", "model", "datasets"})
    if (const auto* n = t.get(key)) n->visit([&](auto&& v) { head.insert(key, v); });
  std::ostringstream text;
  text << head << "\n";
  Plan p{point, *cur, *specs, {}, {}};
  if (const auto* stages = t["stages"].as_array())
    for (const auto& s : *stages) {
      text << "\n[[stages]]\n" << *s.as_table() << "\n";
      p.texts.push_back(text.str());
      p.keys.push_back(detail::sha256_hex(text.str()));
    }
  if (p.keys.size() != p.specs.size()) return fail(ErrorCode::invalid_spec, "the resolved configuration lost a stage");
  return p;
}

/// "set/metric": the option, else the accuracy of the first set the last stage evaluates (in the
/// shipped curriculum the validation set, listed before test: a sweep must not choose on test).
std::string ranking_metric(const SweepOptions& o, const TrainingSpec& last) {
  if (!o.metric.empty()) return o.metric;
  if (!last.evaluation || last.evaluation->spec.sets.empty()) return "";
  return last.evaluation->spec.sets.front().first + "/accuracy";
}

double score_of(const Metrics& m, const std::string& metric) {
  return metric_value(m, metric).value_or(std::nan(""));
}

void write_summary(const fs::path& dir, SweepResult& r) {
  nlohmann::json j = {{"metric", r.metric}, {"best", r.best}, {"stages_trained", r.stages_trained},
                      {"stages_total", r.stages_total}, {"points", nlohmann::json::array()}};
  for (const auto& p : r.points) {
    nlohmann::json metrics = nlohmann::json::object();
    for (const auto& [set, values] : p.final_metrics)
      for (const auto& [k, v] : values) metrics[set + "/" + k] = v;
    j["points"].push_back({{"overrides", p.overrides}, {"shared_stages", p.shared_stages},
                           {"final_state", p.final_state.string()}, {"params_sha256", p.params_sha256},
                           {"score", std::isnan(p.score) ? nlohmann::json() : nlohmann::json(p.score)}, {"metrics", metrics}});
  }
  if (auto ok = detail::write_file_atomic(dir / "sweep.json", j.dump(2) + "\n", "sweep summary"); ok)
    r.summary_file = dir / "sweep.json";
  else
    fmt::print(stderr, "baton: the sweep finished but its summary was not written: {}\n", ok.error().to_string());
}
fs::path node_dir(const SweepOptions& o, const Plan& p, std::size_t level) {
  return o.dir / fmt::format("{}-{}-{}", level, p.specs[level].name, p.keys[level].substr(0, 12));
}

/// A finished node: written by the node when its run has finished (after its final.baton).
constexpr const char* kNodeFile = "sweep-node.json";

struct Node {
  fs::path dir;
  std::string params_sha256;
  Metrics final_metrics;
};

/// The node's result, when `dir` holds a finished node of configuration `key`.
std::optional<Node> read_node(const fs::path& dir, const std::string& key) {
  std::ifstream in(dir / kNodeFile);
  if (!in) return std::nullopt;
  try {
    const auto j = nlohmann::json::parse(in);
    if (j.at("key").get<std::string>() != key || !fs::exists(dir / "final.baton")) return std::nullopt;
    Node n{dir, j.at("params_sha256").get<std::string>(), {}};
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
  auto context = [&](Error e) { return tl::unexpected(e.with_context(fmt::format("sweep node {}", node.string()))); };
  auto factory = p.cur.model();
  if (!factory) return tl::unexpected(factory.error());
  const fs::path parent = level == 0 ? fs::path() : node_dir(o, p, level - 1);
  // The parent's model: a stage before may have built one of its own (a new head).
  auto initial = level == 0 ? p.cur.init()
                            : load_checkpoint(parent / "final.baton", detail::factory_after(p.specs, level - 1, *factory));
  if (!initial) return context(initial.error());
  RunOptions ro = p.cur.run_options();
  ro.dir = node;
  ro.config = p.texts[level];
  ro.fingerprint = p.keys[level];
  ro.report = false;
  ro.progress = o.progress;
  auto res = run(ro, {p.specs[level]}, std::move(*initial));
  if (!res) return context(res.error());
  if (res->interrupted) return false;
  nlohmann::json metrics = nlohmann::json::object();
  for (const auto& [set, values] : res->final_metrics)
    for (const auto& [k, v] : values) metrics[set][k] = std::isnan(v) ? nlohmann::json() : nlohmann::json(v);
  const nlohmann::json j = {{"key", p.keys[level]}, {"stage", p.specs[level].name},
                            {"parent", parent.empty() ? nlohmann::json() : nlohmann::json(parent.filename().string())},
                            {"params_sha256", params_sha256(res->state)}, {"metrics", metrics}};
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
      tree.tasks.push_back({level, p.keys[level], parent, node_dir(o, p, level), std::move(sets), p.specs[level].name, 1});
      tree.plan.push_back(i);
    }
    if (!any) return tree;
  }
}

/// Every node's result into `done`: read back when finished, else trained in this process (with
/// jobs > 1 the processes have trained them all). False: a signal stopped the training.
Expected<bool> train_here(const std::vector<Plan>& plans, const Tree& tree, const SweepOptions& o, std::map<std::string, Node>& done) {
  for (std::size_t t = 0; t < tree.tasks.size(); ++t) {
    const auto& task = tree.tasks[t];
    const std::string users = fmt::format("{} point{}", task.users, task.users == 1 ? "" : "s");
    auto node = read_node(task.dir, task.key);
    if (!node && o.jobs > 1)
      return fail(ErrorCode::io, fmt::format("sweep node {}: its process ended well but left no {}", task.dir.string(), kNodeFile));
    if (!node) {
      if (o.progress) fmt::print("sweep: stage \"{}\" for {} -> {}\n", task.stage, users, task.dir.string());
      const auto& p = plans[tree.plan[t]];
      auto trained = train_node(p, task.level, o);
      if (!trained) return tl::unexpected(trained.error().with_context(fmt::format("sweep point {}", point_text(p.overrides))));
      if (!*trained) return false;
      node = read_node(task.dir, task.key);
      if (!node) return fail(ErrorCode::io, fmt::format("sweep node {}: {} did not read back", task.dir.string(), kNodeFile));
    } else if (o.progress && o.jobs == 1) {
      fmt::print("sweep: stage \"{}\" for {}: finished before ({})\n", task.stage, users, task.dir.string());
    }
    done.emplace(task.key, std::move(*node));
  }
  return true;
}

/// Every point's result from its leaf node, its score, and the best.
void rank(const std::vector<Plan>& plans, const Tree& tree, const std::map<std::string, Node>& done, const SweepOptions& o,
          SweepResult& r) {
  for (const auto& p : plans) {
    const auto& leaf = done.at(p.keys.back());
    SweepPointResult pr{p.overrides, 0, leaf.dir / "final.baton", leaf.params_sha256, leaf.final_metrics, 0};
    while (pr.shared_stages < p.keys.size() && tree.tasks[tree.index.at(p.keys[pr.shared_stages])].users > 1) ++pr.shared_stages;
    r.points.push_back(std::move(pr));
  }
  r.metric = ranking_metric(o, plans.front().specs.back());
  r.maximize = o.maximize;
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    auto& pr = r.points[i];
    pr.score = score_of(pr.final_metrics, r.metric);
    const auto& b = r.points[r.best];
    if (!std::isnan(pr.score) && (std::isnan(b.score) || (o.maximize ? pr.score > b.score : pr.score < b.score))) r.best = i;
  }
}
}  // namespace

std::string SweepResult::table() const {
  std::vector<std::size_t> order(points.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const double x = points[a].score, y = points[b].score;
    if (std::isnan(x) || std::isnan(y)) return !std::isnan(x) && std::isnan(y);
    return maximize ? x > y : x < y;
  });
  std::string out = fmt::format("  {:<14} {:<8} {:<14} {}\n", metric.empty() ? "score" : metric, "shared", "params_sha256", "point");
  for (auto i : order) {
    const auto& p = points[i];
    out += fmt::format("{} {:<14} {:<8} {:<14} {}\n", i == best ? '*' : ' ',
                       std::isnan(p.score) ? std::string("-") : fmt::format("{:.4f}", p.score),
                       fmt::format("{} st", p.shared_stages), p.params_sha256.substr(0, 12), point_text(p.overrides));
  }
  out += fmt::format("{} stage runs for {} points x stages ({} shared)\n", stages_trained, stages_total,
                     stages_total - stages_trained);
  return out;
}

Expected<bool> sweep_node(const fs::path& file, const SweepOptions& o, std::size_t level) {
  auto p = plan(file, o, {});
  if (!p) return tl::unexpected(p.error());
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
    auto p = plan(file, o, point);
    if (!p) return tl::unexpected(p.error().with_context(fmt::format("sweep point {}", point_text(point))));
    plans.push_back(std::move(*p));
  }
  // A metric no evaluation gives would rank nothing: every score "-", the first point "best". The
  // point is named where it is not the first (its overrides changed what the last stage evaluates).
  for (std::size_t i = 0; i < plans.size(); ++i)
    if (auto bad = detail::sweep_metric_problem(o.metric, plans[i].specs.back()); !bad.empty()) {
      Error e{ErrorCode::invalid_argument, "sweep: the ranking metric (--metric, [sweep] metric, SweepOptions::metric): " + bad, {}};
      return tl::unexpected(i == 0 ? e : e.with_context(fmt::format("sweep point {}", point_text(plans[i].overrides))));
    }
  const Tree tree = build_tree(plans, o);
  SweepResult r;
  r.stages_trained = tree.tasks.size();
  for (const auto& p : plans) r.stages_total += p.keys.size();
  if (o.jobs > 1) {  // train in processes; the pass below then reads every node back
    std::vector<bool> finished;
    for (const auto& t : tree.tasks) finished.push_back(read_node(t.dir, t.key).has_value());
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
  write_summary(o.dir, r);
  std::vector<fs::path> dirs;
  for (const auto& t : tree.tasks) dirs.push_back(t.dir);
  if (o.report) {
    if (auto page = report::write(dirs, o.dir / "report.html"); page)
      r.report_file = o.dir / "report.html";
    else
      fmt::print(stderr, "baton: the sweep finished but its report was not written: {}\n", page.error().to_string());
  }
  return r;
}

}  // namespace baton
