// What a sweep or a tree gave: the summary file they share, their tables, and run_tree (tree.hpp),
// which is a sweep of one point with directories named by stage.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "baton/tree.hpp"
#include "detail.hpp"
#include "io.hpp"
#include "internal.hpp"

namespace baton {
namespace {
namespace fs = std::filesystem;

std::string point_label(const SweepPoint& p) { return p.empty() ? "(no overrides)" : fmt::format("{}", fmt::join(p, " ")); }
std::string score_text(double v) { return std::isnan(v) ? std::string("-") : fmt::format("{:.4f}", v); }

/// "val: accuracy 0.8123, loss 0.5120; test: ..." (every set the last stage evaluated, without details).
std::string metrics_text(const Metrics& m) {
  std::vector<std::string> sets;
  for (const auto& [set, values] : m) {
    std::vector<std::string> kv;
    for (const auto& [k, v] : values)  // a metric's details ("f1/3") are in the summary, not the table
      if (!is_detail(k)) kv.push_back(fmt::format("{} {}", k, score_text(v)));
    sets.push_back(fmt::format("{}: {}", set, fmt::join(kv, ", ")));
  }
  return sets.empty() ? "(no evaluation)" : fmt::format("{}", fmt::join(sets, "; "));
}

std::string sweep_table(const SweepResult& r) {
  std::vector<std::size_t> order(r.points.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const double x = r.points[a].score, y = r.points[b].score;
    if (std::isnan(x) || std::isnan(y)) return !std::isnan(x) && std::isnan(y);
    return r.maximize ? x > y : x < y;
  });
  std::string out = fmt::format("  {:<14} {:<8} {:<14} {}\n", r.metric.empty() ? "score" : r.metric, "shared", "params_sha256", "point");
  for (auto i : order) {
    const auto& p = r.points[i];
    out += fmt::format("{} {:<14} {:<8} {:<14} {}\n", i == r.best ? '*' : ' ', score_text(p.score),
                       fmt::format("{} st", p.shared_stages), p.params_sha256.substr(0, 12), point_label(p.overrides));
  }
  out += fmt::format("{} stage runs for {} points x stages ({} shared)\n", r.stages_trained, r.stages_total,
                     r.stages_total - r.stages_trained);
  return out;
}

/// A tree's table: a row per branch, its scratch baseline under it with the difference.
std::string tree_table(const SweepResult& r) {
  // A sweep of a tree: a row per branch and point, the point after the branch.
  const bool several = std::any_of(r.points.begin(), r.points.end(), [&](const SweepPointResult& p) { return p.overrides != r.points.front().overrides; });
  std::size_t width = 8, mwidth = 6;
  for (const auto& p : r.points) {
    width = std::max(width, p.branch.size() + (p.baseline ? 10 : 0) + (p.overrides.empty() || !several ? 0 : point_label(p.overrides).size() + 3));
    mwidth = std::max(mwidth, p.metric.size());
  }
  std::string out = fmt::format("{:<{}}  {:<{}} {:>7} {:>8}  {:>6}  {}\n", "branch", width, "metric", mwidth, "value", "vs",
                                "time", "metrics");
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    const auto& p = r.points[i];
    std::string versus;
    if (p.baseline) {  // against its branch, the row before it with the same name
      for (std::size_t j = i; j-- > 0;)
        if (r.points[j].branch == p.branch && !r.points[j].baseline) {
          const double d = r.points[j].score - p.score;
          if (!std::isnan(d)) versus = fmt::format("{:+.4f}", d);
          break;
        }
    }
    std::string label = p.baseline ? p.branch + " (scratch)" : p.branch;
    if (!p.overrides.empty() && several) label += " [" + point_label(p.overrides) + "]";
    out += fmt::format("{:<{}}  {:<{}} {:>7} {:>8}  {:>6}  {}\n", label, width, p.metric.empty() ? "-" : p.metric, mwidth,
                       score_text(p.score), versus, duration_text(p.seconds), metrics_text(p.final_metrics));
  }
  out += fmt::format("{} stage runs for {} branch stages ({} shared); \"vs\": the branch's value minus its scratch baseline's\n",
                     r.stages_trained, r.stages_total, r.stages_total - r.stages_trained);
  return out;
}
}  // namespace

std::string SweepResult::table() const {
  const bool tree = std::any_of(points.begin(), points.end(), [](const SweepPointResult& p) { return !p.branch.empty(); });
  return tree ? tree_table(*this) : sweep_table(*this);
}

namespace detail {
void write_summary(const fs::path& file, SweepResult& r) {
  nlohmann::json j = {{"metric", r.metric}, {"best", r.best}, {"stages_trained", r.stages_trained},
                      {"stages_total", r.stages_total}, {"points", nlohmann::json::array()}};
  for (const auto& p : r.points) {
    nlohmann::json metrics = nlohmann::json::object();
    for (const auto& [set, values] : p.final_metrics)
      for (const auto& [k, v] : values) metrics[set + "/" + k] = std::isnan(v) ? nlohmann::json() : nlohmann::json(v);
    j["points"].push_back({{"overrides", p.overrides}, {"branch", p.branch}, {"baseline", p.baseline ? "scratch" : ""},
                           {"shared_stages", p.shared_stages}, {"dir", p.dir.string()},
                           {"final_state", p.final_state.string()}, {"best_state", p.best_state.string()},
                           {"params_sha256", p.params_sha256}, {"seconds", p.seconds}, {"metric", p.metric},
                           {"score", std::isnan(p.score) ? nlohmann::json() : nlohmann::json(p.score)}, {"metrics", metrics}});
  }
  if (auto ok = write_file_atomic(file, j.dump(2) + "\n", "summary"); ok)
    r.summary_file = file;
  else
    fmt::print(stderr, "baton: training finished but its summary was not written: {}\n", ok.error().to_string());
}
}  // namespace detail

Expected<SweepResult> run_tree(const fs::path& file, const TreeOptions& t) {
  fs::path dir = t.dir;
  if (dir.empty()) {
    auto cur = load_curriculum(file, t.sets, t.registry);
    if (!cur) return tl::unexpected(cur.error());
    dir = cur->run().run_dir;
  }
  SweepOptions o{.dir = dir, .sets = {}, .points = {t.sets}, .metric = {}, .maximize = true, .progress = t.progress,
                 .report = t.report, .jobs = t.jobs, .threads = t.threads, .executable = t.executable, .registry = t.registry,
                 .fresh = t.fresh, .by_stage = true};
  return sweep(file, o);
}

}  // namespace baton
