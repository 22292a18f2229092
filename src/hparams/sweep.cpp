// Sweeps that share their prefix (sweep.hpp): the points' resolved configurations, stage by
// stage, make a tree; each node is a one-stage `baton::run` from its parent's final state.
#include <algorithm>
#include <cmath>
#include <map>
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
  if (auto* run = t["run"].as_table())
    for (const auto& k : detail::kRunOutputKeys) run->erase(k);
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
  const auto slash = metric.find('/');
  if (slash == std::string::npos) return std::nan("");
  auto set = m.find(metric.substr(0, slash));
  if (set == m.end()) return std::nan("");
  auto v = set->second.find(metric.substr(slash + 1));
  return v == set->second.end() ? std::nan("") : v->second;
}

void write_summary(const fs::path& dir, const SweepResult& r) {
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
  (void)detail::write_file_atomic(dir / "sweep.json", j.dump(2) + "\n", "sweep summary");
}
}  // namespace

Expected<std::vector<SweepPoint>> sweep_grid(const std::vector<std::string>& axes) {
  std::vector<SweepPoint> points{{}};
  for (const auto& axis : axes) {
    const auto eq = axis.find('=');
    auto bad = [&](const std::string& why) {
      return fail(ErrorCode::invalid_argument, fmt::format("sweep axis \"{}\": {}; write path=[v1, v2, ...], e.g. "
                                                           "stage.finetune.optimizer.lr=[1e-4, 3e-4]", axis, why));
    };
    if (eq == std::string::npos || eq == 0) return bad("no path=values");
    toml::table t;
    const std::string doc = "values = " + axis.substr(eq + 1);
    try {
      t = toml::parse(doc);
    } catch (const toml::parse_error& e) {
      return bad(fmt::format("the values are not a TOML array ({})", e.description()));
    }
    const auto* values = t["values"].as_array();
    if (!values || values->empty()) return bad("the values are not a non-empty TOML array");
    std::vector<SweepPoint> next;
    for (const auto& p : points)
      for (const auto& v : *values) {
        // The value as written (toml++ would print 3e-4 as 3e-04), else as toml++ prints it.
        const auto& at = v.source();
        std::string text;
        if (at.begin.line == 1 && at.end.line == 1 && at.end.column > at.begin.column && at.end.column - 1 <= doc.size())
          text = doc.substr(at.begin.column - 1, at.end.column - at.begin.column);
        else {
          std::ostringstream printed;
          v.visit([&](auto&& x) { printed << x; });
          text = printed.str();
        }
        SweepPoint q = p;
        q.push_back(axis.substr(0, eq) + "=" + text);
        next.push_back(std::move(q));
      }
    points = std::move(next);
  }
  return points;
}

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

Expected<SweepResult> sweep(const fs::path& file, const SweepOptions& o) {
  if (o.dir.empty()) return fail(ErrorCode::invalid_argument, "sweep: SweepOptions::dir is empty; name the sweep directory");
  if (o.points.empty()) return fail(ErrorCode::invalid_argument, "sweep: no points");
  std::vector<Plan> plans;
  for (const auto& point : o.points) {  // every point's configuration is checked before any training
    auto p = plan(file, o, point);
    if (!p) return tl::unexpected(p.error().with_context(fmt::format("sweep point {}", point_text(point))));
    plans.push_back(std::move(*p));
  }
  SweepResult r;
  std::map<std::string, int> users;  // key -> points that train this node
  for (const auto& p : plans) {
    r.stages_total += p.keys.size();
    for (const auto& k : p.keys) users[k] += 1;
  }
  struct Node {
    fs::path dir;
    std::string params_sha256;
    Metrics final_metrics;
  };
  std::map<std::string, Node> done;  // key -> the node trained (its state is in dir/final.baton, not kept here)
  std::vector<fs::path> dirs;
  // Level by level: a node's parent is the node of the stage before, trained at the level above.
  for (std::size_t level = 0;; ++level) {
    bool any = false;
    for (const auto& p : plans) {
      if (level >= p.specs.size()) continue;
      any = true;
      const auto& key = p.keys[level];
      if (done.count(key)) continue;
      const auto& spec = p.specs[level];
      const fs::path node = o.dir / fmt::format("{}-{}-{}", level, spec.name, key.substr(0, 12));
      auto factory = p.cur.model();
      if (!factory) return tl::unexpected(factory.error());
      auto initial = level == 0 ? p.cur.init() : load_checkpoint(done.at(p.keys[level - 1]).dir / "final.baton", *factory);
      if (!initial) return tl::unexpected(initial.error().with_context(fmt::format("sweep node {}", node.string())));
      RunOptions ro = p.cur.run_options();
      ro.dir = node;
      ro.config = p.texts[level];
      ro.fingerprint = key;
      ro.report = false;
      ro.progress = o.progress;
      if (o.progress)
        fmt::print("sweep: stage \"{}\" for {} point{} -> {}\n", spec.name, users[key], users[key] == 1 ? "" : "s", node.string());
      auto res = run(ro, {spec}, std::move(*initial));
      if (!res) return tl::unexpected(res.error().with_context(fmt::format("sweep point {}", point_text(p.overrides))));
      if (res->interrupted) {
        r.interrupted = true;
        return r;
      }
      ++r.stages_trained;
      dirs.push_back(node);
      done.emplace(key, Node{node, params_sha256(res->state), std::move(res->final_metrics)});
    }
    if (!any) break;
  }
  for (const auto& p : plans) {
    const auto& leaf = done.at(p.keys.back());
    SweepPointResult pr{p.overrides, 0, leaf.dir / "final.baton", leaf.params_sha256, leaf.final_metrics, 0};
    while (pr.shared_stages < p.keys.size() && users[p.keys[pr.shared_stages]] > 1) ++pr.shared_stages;
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
  write_summary(o.dir, r);
  if (o.report)
    if (auto page = report::write(dirs, o.dir / "report.html"); !page)
      fmt::print(stderr, "baton: the sweep finished but its report was not written: {}\n", page.error().to_string());
  return r;
}

}  // namespace baton
