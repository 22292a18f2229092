// The points of a sweep (sweep.hpp): `--grid path=[...]` axes and the curriculum's [sweep] table.
// Values stay as written (1e-4, not toml++'s 0.0001), so a point reads as the user spelled it.
#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "baton/sweep.hpp"
#include "internal.hpp"

namespace baton {
namespace detail {
namespace {

/// A value as written in `text` when it sits on one line, else as toml++ prints it.
std::string written(const toml::node& v, std::string_view text) {
  const auto& at = v.source();
  if (at.begin && at.begin.line == at.end.line && at.end.column > at.begin.column) {
    std::size_t start = 0;
    for (std::size_t line = 1; line < at.begin.line && start != std::string_view::npos; ++line) {
      start = text.find('\n', start);
      if (start != std::string_view::npos) ++start;
    }
    if (start != std::string_view::npos && start + at.end.column - 1 <= text.size())
      return std::string(text.substr(start + at.begin.column - 1, at.end.column - at.begin.column));
  }
  std::ostringstream printed;
  v.visit([&](auto&& x) { printed << x; });
  return printed.str();
}

/// A table's entries in the order written (toml++ keeps them sorted by key).
std::vector<std::pair<std::string, const toml::node*>> in_written_order(const toml::table& t) {
  std::vector<std::pair<std::string, const toml::node*>> out;
  for (const auto& [k, v] : t) out.emplace_back(std::string(k.str()), &v);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    const auto &x = a.second->source().begin, &y = b.second->source().begin;
    return x.line != y.line ? x.line < y.line : x.column < y.column;
  });
  return out;
}

const std::vector<std::string> kSweepKeys = {"grid", "points", "metric", "mode", "jobs", "dir"};
}  // namespace

std::vector<std::vector<std::string>> grid_product(const std::vector<std::pair<std::string, std::vector<std::string>>>& axes) {
  std::vector<std::vector<std::string>> points{{}};
  for (const auto& [path, values] : axes) {
    std::vector<std::vector<std::string>> next;
    for (const auto& p : points)
      for (const auto& v : values) {
        auto q = p;
        q.push_back(path + "=" + v);
        next.push_back(std::move(q));
      }
    points = std::move(next);
  }
  return points;
}

SweepTable read_sweep_table(const toml::table& root, std::string_view text, Problems& p) {
  SweepTable out;
  const auto* node = root.get("sweep");
  if (node == nullptr) return out;
  const auto* t = node->as_table();
  if (t == nullptr) {
    p.add(node, fmt::format("sweep: expected a table ([sweep]), got {}", type_name(*node)));
    return out;
  }
  const std::size_t problems_before = p.list.size();
  check_keys(*t, kSweepKeys, "sweep", p);
  Reader r{p, "sweep."};
  if (const auto* g = t->get("grid")) {
    std::vector<std::pair<std::string, std::vector<std::string>>> axes;
    if (const auto* gt = g->as_table()) {
      for (const auto& [path, values] : in_written_order(*gt)) {
        const auto* a = values->as_array();
        if (a == nullptr || a->empty()) {
          p.add(values, fmt::format("sweep.grid.\"{}\": expected a non-empty array of values, e.g. [1e-4, 3e-4]", path));
          continue;
        }
        std::vector<std::string> texts;
        for (const auto& v : *a) texts.push_back(written(v, text));
        axes.emplace_back(path, std::move(texts));
      }
    } else {
      p.add(g, "sweep.grid: expected a table of path = [values], e.g. grid = { \"stage.finetune.optimizer.lr\" = [1e-4, 3e-4] }");
    }
    if (!axes.empty()) out.points = grid_product(axes);
  }
  if (const auto* ps = t->get("points")) {
    const auto* a = ps->as_array();
    if (a == nullptr) p.add(ps, "sweep.points: expected an array of tables of path = value, e.g. [{ \"stage.finetune.optimizer.lr\" = 1e-4 }]");
    for (std::size_t i = 0; a != nullptr && i < a->size(); ++i) {
      const auto* pt = a->get(i)->as_table();
      if (pt == nullptr || pt->empty()) {
        p.add(a->get(i), fmt::format("sweep.points[{}]: expected a non-empty table of path = value", i));
        continue;
      }
      std::vector<std::string> point;
      for (const auto& [path, value] : in_written_order(*pt)) point.push_back(path + "=" + written(*value, text));
      out.points.push_back(std::move(point));
    }
  }
  out.metric = r.string(t->get("metric"), "metric");
  if (out.metric && out.metric->find('/') == std::string::npos) {
    p.add(t->get("metric"), fmt::format("sweep.metric: \"{}\" is not set/metric, e.g. \"val/accuracy\"", *out.metric));
    out.metric.reset();
  }
  out.maximize = r.one_of<bool>(t->get("mode"), "mode", {{"max", true}, {"min", false}});
  if (auto j = r.integer(t->get("jobs"), "jobs", 1)) out.jobs = static_cast<int>(std::min<std::int64_t>(*j, 1024));
  out.dir = r.string(t->get("dir"), "dir");
  if (out.points.empty() && p.list.size() == problems_before) p.add(node, "sweep: no points; give grid = { path = [values] } or points = [{ path = value }]");
  return out;
}

void check_sweep_metric(const toml::table& root, const TrainingSpec& last, Problems& p) {
  const auto* t = root["sweep"].as_table();
  const auto* n = t ? t->get("metric") : nullptr;
  const auto metric = n ? n->value<std::string>() : std::nullopt;
  if (!metric || metric->find('/') == std::string::npos) return;  // none, or read_sweep_table's problem
  if (auto bad = sweep_metric_problem(*metric, last); !bad.empty()) p.add(n, "sweep.metric: " + bad);
}
}  // namespace detail

Expected<std::vector<SweepPoint>> sweep_grid(const std::vector<std::string>& axes) {
  std::vector<std::pair<std::string, std::vector<std::string>>> parsed;
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
    std::vector<std::string> texts;
    for (const auto& v : *values) texts.push_back(detail::written(v, doc));
    parsed.emplace_back(axis.substr(0, eq), std::move(texts));
  }
  return detail::grid_product(parsed);
}

Expected<SweepOptions> sweep_options(const std::filesystem::path& file, const std::vector<std::string>& sets,
                                     const Registry& registry) {
  auto cur = load_curriculum(file, sets, registry);  // checks the [sweep] table too, with file:line
  if (!cur) return tl::unexpected(cur.error());
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  detail::Problems p{file.string(), {}};
  detail::SweepTable t;
  try {
    t = detail::read_sweep_table(toml::parse(text, file.string()), text, p);
  } catch (const toml::parse_error& e) {
    return fail(ErrorCode::io, fmt::format("{}: changed while it was read: {}", file.string(), e.description()));
  }
  if (!p.empty()) return tl::unexpected(p.error());
  SweepOptions o{.dir = t.dir ? std::filesystem::path(*t.dir) : std::filesystem::path(cur->run_options().dir.string() + "-sweep"),
                 .sets = sets, .points = t.points, .metric = t.metric.value_or(""), .maximize = t.maximize.value_or(true),
                 .jobs = t.jobs.value_or(1), .threads = cur->run().threads, .registry = registry};
  return o;
}

}  // namespace baton
