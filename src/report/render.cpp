// `baton report`: run directories -> one HTML page of inline SVG plots and tables.
//
// Why SVG written here rather than a charting library: the page must work offline and be
// checkable in a browser's DOM. Debian's charting packages (libjs-chart.js, libjs-jquery-flot)
// draw on a <canvas>, whose pixels a test cannot count series points in, and would put ~200 KB of
// JavaScript into every report; libjs-d3 is a toolkit for drawing SVG yourself, which is what
// this file does in a few hundred lines. Each series is one <polyline> carrying data-series and
// data-points, so a browser test counts the points the browser actually parsed.
#include "baton/report.hpp"
#include "baton/time.hpp"
#include "io.hpp"
#include "report/internal.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <nlohmann/json.hpp>

namespace baton::report {
namespace {
using namespace internal;

constexpr double kSmoothing = 0.8;  // EMA weight of the smoothed loss (reset at each stage start)
const std::vector<std::string> kColors = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

// ---------------------------------------------------------------- SVG plots
struct Series {
  std::string name;
  std::vector<Point> points;
  std::string color;
  double width = 1.8, opacity = 1;
  bool markers = false;
};

struct Boundary {
  double x;
  std::string label, color;
};

/// Round step for about `n` ticks over `range`: 1, 2 or 5 times a power of ten.
double nice_step(double range, int n) {
  const double raw = range / n, mag = std::pow(10.0, std::floor(std::log10(raw))), f = raw / mag;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

/// A y tick's label: as many decimals as the step needs, so neighbours never read the same
/// (0.9985 | 0.9990, not 0.998 | 0.999 | 0.999); large values as compact() writes them.
std::string tick_label(double y, double step) {
  if (std::abs(y) < step * 1e-6) return "0";
  if (step >= 1 || std::abs(y) >= 1e3) return compact(y);
  const int decimals = std::clamp(static_cast<int>(std::ceil(-std::log10(step) - 1e-9)), 0, 12);
  return fmt::format("{:.{}f}", y, decimals);
}

std::string plot(const std::string& id, const std::string& title, const std::string& caption,
                 const std::vector<Series>& series, const std::vector<Boundary>& bounds, double xmax) {
  constexpr double W = 760, H = 250, L = 64, R = 16, T = 8, B = 40;
  double ymin = std::numeric_limits<double>::infinity(), ymax = -ymin;
  for (const auto& s : series)
    for (const auto& p : s.points)
      if (std::isfinite(p.y)) ymin = std::min(ymin, p.y), ymax = std::max(ymax, p.y);
  if (!std::isfinite(ymin)) ymin = 0, ymax = 1;
  if (ymax - ymin < 1e-12 * std::max(1.0, std::abs(ymax))) {
    const double pad = ymax == 0 ? 1 : std::abs(ymax) * 0.1;
    ymin -= pad, ymax += pad;
  } else {
    const double pad = (ymax - ymin) * 0.05;
    ymin -= pad, ymax += pad;
  }
  if (xmax <= 0) xmax = 1;
  auto px = [&](double x) { return L + x / xmax * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - ymin) / (ymax - ymin) * (H - T - B); };

  std::string svg = fmt::format(
      "<svg id=\"{}\" class=\"plot\" viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{}\" "
      "xmlns=\"http://www.w3.org/2000/svg\">\n",
      id, W, H, escape(title));
  // Grid and ticks.
  const double ystep = nice_step(ymax - ymin, 5), xstep = nice_step(xmax, 8);
  for (double y = std::ceil(ymin / ystep) * ystep; y <= ymax; y += ystep)
    svg += fmt::format("<line class=\"grid\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>"
                       "<text class=\"tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
                       L, W - R, py(y), py(y), L - 6, py(y) + 4, tick_label(y, ystep));
  for (double x = 0; x <= xmax * (1 + 1e-9); x += xstep)
    svg += fmt::format("<line class=\"grid\" x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>"
                       "<text class=\"tick\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                       px(x), px(x), T, H - B, px(x), H - B + 16, compact(x));
  svg += fmt::format("<rect class=\"frame\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n", L, T, W - L - R, H - T - B);
  svg += fmt::format("<text class=\"axis\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">samples seen</text>\n",
                     (L + W - R) / 2, H - 6);
  // Stage boundaries, named at the top.
  for (const auto& b : bounds) {
    svg += fmt::format("<g class=\"stage\" data-stage=\"{}\"><line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{}\" y2=\"{}\" "
                       "stroke=\"{}\"/><text x=\"{:.1f}\" y=\"{}\" fill=\"{}\">{}</text></g>\n",
                       escape(b.label), px(b.x), px(b.x), T, H - B, b.color, px(b.x) + 3, T + 12, b.color,
                       escape(b.label));
  }
  // Series: one polyline each, with its point count for checks in a browser.
  for (const auto& s : series) {
    std::string pts;
    std::size_t n = 0;
    for (const auto& p : s.points) {
      if (!std::isfinite(p.y)) continue;
      pts += fmt::format("{}{:.1f},{:.1f}", n ? " " : "", px(p.x), py(p.y));
      ++n;
    }
    svg += fmt::format("<polyline class=\"series\" data-series=\"{}\" data-points=\"{}\" points=\"{}\" fill=\"none\" "
                       "stroke=\"{}\" stroke-width=\"{}\" stroke-opacity=\"{}\"><title>{}</title></polyline>\n",
                       escape(s.name), n, pts, s.color, s.width, s.opacity, escape(s.name));
    if (s.markers)
      for (const auto& p : s.points)
        if (std::isfinite(p.y))
          svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"><title>{}: {:.4g} at {} samples "
                             "({})</title></circle>\n",
                             px(p.x), py(p.y), s.color, escape(s.name), p.y, compact(p.x), escape(p.stage));
  }
  svg += "</svg>\n";

  std::string legend = "<div class=\"legend\">";
  for (const auto& s : series)
    legend += fmt::format("<span><i style=\"background:{};opacity:{}\"></i>{}</span>", s.color, s.opacity, escape(s.name));
  legend += "</div>\n";
  return fmt::format("<section class=\"figure\"><h3>{}</h3><p class=\"caption\">{}</p>\n{}{}</section>\n",
                     escape(title), escape(caption), svg, legend);
}

std::vector<Boundary> boundaries(const std::vector<Run>& runs) {
  // (sample, stage) -> runs that have it; a boundary all runs share is drawn once, in grey.
  std::map<std::pair<double, std::string>, std::vector<std::size_t>> all;
  for (std::size_t r = 0; r < runs.size(); ++r)
    for (std::size_t i = 0; i < runs[r].order.size(); ++i) all[{runs[r].start_of(i), runs[r].order[i]}].push_back(r);
  std::vector<Boundary> out;
  for (const auto& [key, who] : all) {
    if (who.size() == runs.size())
      out.push_back({key.first, key.second, "#555"});
    else
      for (auto r : who) out.push_back({key.first, fmt::format("{} ({})", key.second, runs[r].label), runs[r].color});
  }
  return out;
}

std::vector<Point> smoothed_loss(const std::vector<Point>& loss) {
  std::vector<Point> out;
  for (std::size_t i = 0; i < loss.size();) {  // per stage: a new stage starts a new average
    std::size_t j = i;
    std::vector<double> ys;
    while (j < loss.size() && loss[j].stage == loss[i].stage) ys.push_back(loss[j++].y);
    const auto sm = smooth(ys, kSmoothing);
    for (std::size_t k = i; k < j; ++k) out.push_back({loss[k].x, sm[k - i], loss[k].stage});
    i = j;
  }
  return out;
}

std::string text_or(const json& j, const char* key, const std::string& fallback = "–") {
  if (!j.contains(key)) return fallback;
  if (j[key].is_string()) return j[key].get<std::string>();
  if (j[key].is_array()) {
    std::vector<std::string> parts;
    for (const auto& v : j[key]) parts.push_back(v.is_string() ? v.get<std::string>() : v.dump());
    return parts.empty() ? "none" : fmt::format("{}", fmt::join(parts, ", "));
  }
  if (j[key].is_number_float()) return fmt::format("{:.4g}", j[key].get<double>());
  return j[key].dump();
}

std::string stage_table(const Run& run) {
  std::string t =
      "<table class=\"stages\"><thead><tr><th>stage</th><th>samples</th><th>epochs</th><th>batches</th>"
      "<th>wall time</th><th>final loss</th><th>final eval</th><th>batch size, optimizer</th>"
      "<th>carry-over</th><th>notes</th></tr></thead><tbody>\n";
  double total = 0;
  for (std::size_t i = 0; i < run.order.size(); ++i) {
    const auto& s = run.stages.at(run.order[i]);
    const json start = s.start.value_or(json::object()), end = s.end.value_or(json::object());
    const double from = run.start_of(i), to = end.value("sample", s.last_sample);
    const auto e0 = start.value("epoch", s.first_epoch), e1 = end.value("epoch", s.last_epoch);
    const auto b0 = start.value("batch", s.first_batch), b1 = end.value("batch", s.last_batch);
    std::string wall = "–";
    if (end.contains("seconds")) {
      total += end["seconds"].get<double>();
      wall = duration_text(end["seconds"].get<double>());
    }
    std::vector<std::string> evals;
    for (const auto& [k, v] : s.final_eval)
      if (!is_detail_key(k)) evals.push_back(fmt::format("{}&nbsp;{:.4f}", escape(k), v));
    std::string opt = "–", carry = "–";
    if (s.start) {
      opt = fmt::format("{}, {} lr {}", text_or(start, "batch_size"), escape(text_or(start, "optimizer")),
                        text_or(start, "lr"));
      carry = fmt::format("moments {}, clock {}, weights {}", escape(text_or(start, "optimizer_carry")),
                          escape(text_or(start, "clock")), escape(text_or(start, "weights")));
      if (const auto f = text_or(start, "freeze", "none"); f != "none") carry += ", frozen " + escape(f);
    }
    std::vector<std::string> notes;
    if (s.starts > 1) notes.push_back(fmt::format("resumed {}×", s.starts - 1));
    if (end.contains("stop_reason")) notes.push_back("ended early: " + escape(text_or(end, "stop_reason")));
    if (end.contains("restored_best")) notes.push_back("restored best: " + escape(text_or(end, "restored_best")));
    if (s.start && !s.end) notes.push_back("not finished");
    t += fmt::format("<tr data-stage=\"{}\"><td>{}</td><td>{} → {}</td><td>{} → {}</td><td>{}</td><td>{}</td>"
                     "<td>{:.4f}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                     escape(s.name), escape(s.name), compact(from), compact(to), e0, e1, b1 - b0, wall, s.last_loss,
                     fmt::join(evals, "<br>"), opt, carry, fmt::join(notes, "; "));
  }
  t += "</tbody></table>\n";
  if (total > 0) t += fmt::format("<p>Total wall time of the stages: {}.</p>\n", duration_text(total));
  return t;
}

const char* kStyle = R"(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;max-width:1000px;margin:24px auto;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}h3{font-size:15px;margin:18px 0 2px}
.caption{color:#666;margin:0 0 4px;font-size:12.5px}
svg.plot{width:100%;height:auto;display:block;font-size:11px}
svg .grid{stroke:#eee}svg .frame{fill:none;stroke:#bbb}svg .tick{fill:#666}svg .axis{fill:#444}
svg .stage line{stroke-dasharray:4 3;stroke-width:1.2}svg .stage text{font-size:11px}
.legend span{margin-right:14px;font-size:12.5px;white-space:nowrap}.legend i{display:inline-block;width:14px;height:3px;margin:0 5px 3px 0;vertical-align:middle}
table{border-collapse:collapse;font-size:12.5px;width:100%}td,th{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f5f5f5}pre{background:#f7f7f7;padding:8px;overflow:auto;font-size:12px}
.runs span{margin-right:16px}.runs i{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-1px}
table.confusion{width:auto}table.confusion td{text-align:right;min-width:34px}table.classes{width:auto}
#self-check{display:none;background:#fee;border:1px solid #c33;padding:6px;margin:8px 0}
)";

// Runs in the browser after load: counts the points each polyline really has (as the SVG parser
// read them) and records script errors, into data attributes and, if something is off, a visible
// banner. No network, no libraries.
const char* kScript = R"(
(function () {
  var errors = [];
  window.addEventListener('error', function (e) { errors.push(String(e.message)); });
  window.addEventListener('load', function () {
    var bad = [];
    var all = document.querySelectorAll('polyline[data-series]');
    for (var i = 0; i < all.length; i++) {
      var el = all[i], n = el.points.numberOfItems, box = el.getBBox();
      el.setAttribute('data-drawn', n);
      el.setAttribute('data-drawn-box', box.width.toFixed(1) + 'x' + box.height.toFixed(1));
      if (String(n) !== el.getAttribute('data-points')) bad.push(el.getAttribute('data-series'));
    }
    document.body.setAttribute('data-series-drawn', all.length);
    document.body.setAttribute('data-series-mismatch', bad.length);
    // Each confusion matrix has classes x classes cells, each painted.
    var grids = document.querySelectorAll('table.confusion'), cells = 0, badGrids = 0;
    for (var g = 0; g < grids.length; g++) {
      var tds = grids[g].querySelectorAll('td[data-count]'), c = Number(grids[g].getAttribute('data-classes'));
      var painted = 0;
      for (var t = 0; t < tds.length; t++) if (getComputedStyle(tds[t]).backgroundColor !== 'rgba(0, 0, 0, 0)') ++painted;
      cells += tds.length;
      if (tds.length !== c * c || painted !== tds.length) {
        ++badGrids;
        bad.push('confusion matrix of ' + grids[g].getAttribute('data-set') + ': ' + tds.length + ' cells, ' + painted + ' painted');
      }
    }
    document.body.setAttribute('data-confusion-cells', cells);
    document.body.setAttribute('data-confusion-mismatch', badGrids);
    document.body.setAttribute('data-errors', errors.length);
    if (bad.length || errors.length) {
      var box = document.getElementById('self-check');
      box.textContent = 'This page did not draw correctly: ' + bad.concat(errors).join('; ');
      box.style.display = 'block';
    }
    document.body.setAttribute('data-ready', '1');
  });
})();
)";
}  // namespace

std::string sparkline(const std::vector<double>& values, std::size_t width) {
  static const char* const bars[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  std::vector<double> v;
  for (double x : values)
    if (std::isfinite(x)) v.push_back(x);
  if (v.empty() || width == 0) return "";
  const std::size_t n = std::min(width, v.size());
  std::vector<double> buckets(n);
  for (std::size_t b = 0; b < n; ++b) {  // bucket b averages v[b*size/n, (b+1)*size/n)
    const std::size_t lo = b * v.size() / n, hi = (b + 1) * v.size() / n;
    double sum = 0;
    for (std::size_t i = lo; i < hi; ++i) sum += v[i];
    buckets[b] = sum / static_cast<double>(hi - lo);
  }
  const auto [mn, mx] = std::minmax_element(buckets.begin(), buckets.end());
  const double lo = *mn, range = *mx - *mn;
  std::string out;
  for (double b : buckets) {
    const int level = range > 0 ? static_cast<int>(std::lround((b - lo) / range * 7)) : 3;
    out += bars[std::clamp(level, 0, 7)];
  }
  return out;
}

std::vector<double> smooth(const std::vector<double>& values, double weight) {
  std::vector<double> out;
  out.reserve(values.size());
  double avg = 0, norm = 0;
  for (double v : values) {
    if (!std::isfinite(v)) {  // a skipped (non-finite) batch does not poison the average
      out.push_back(v);
      continue;
    }
    avg = weight * avg + (1 - weight) * v;
    norm = weight * norm + (1 - weight);
    out.push_back(avg / norm);
  }
  return out;
}

/// The runs of `run_dirs`, each labelled (its directory's name, numbered when two are the same)
/// and given its colour.
Expected<std::vector<Run>> load_runs(const std::vector<fs::path>& run_dirs) {
  std::vector<Run> runs;
  std::map<std::string, int> seen_labels;
  for (const auto& d : run_dirs) {
    auto r = read_run(d);
    if (!r) return tl::unexpected(r.error());
    const fs::path norm = d.lexically_normal();
    std::string label = (norm.has_filename() ? norm.filename() : norm.parent_path().filename()).string();
    if (label.empty() || label == ".") label = r->name.empty() ? "run" : r->name;
    // Two directories of one name (a tree's stage and its scratch baseline, scratch/<stage>): the
    // parent's name tells them apart; numbered only when that does not.
    if (seen_labels.count(label) && norm.has_parent_path() && norm.parent_path().has_filename())
      label = (norm.parent_path().filename() / label).string();
    if (const int n = ++seen_labels[label]; n > 1) label += fmt::format(" ({})", n);
    r->label = label;
    r->color = kColors[runs.size() % kColors.size()];
    runs.push_back(std::move(*r));
  }
  return runs;
}

Expected<std::string> render(const std::vector<fs::path>& run_dirs) {
  if (run_dirs.empty()) return fail(ErrorCode::invalid_argument, "baton report: give at least one run directory");
  auto loaded = load_runs(run_dirs);
  if (!loaded) return tl::unexpected(loaded.error());
  const std::vector<Run>& runs = *loaded;
  const bool overlay = runs.size() > 1;
  auto named = [&](const Run& r, const std::string& what) { return overlay ? r.label + ": " + what : what; };
  double xmax = 0;
  for (const auto& r : runs) {
    xmax = std::max(xmax, r.loss.back().x);
    for (const auto& [k, pts] : r.eval)
      if (!pts.empty()) xmax = std::max(xmax, pts.back().x);
  }
  const auto bounds = boundaries(runs);

  // The title: the runs' names, or their labels when the names do not tell them apart (the stages
  // of a tree or the nodes of a sweep share their curriculum's name).
  std::vector<std::string> labels;
  std::set<std::string> names;
  for (const auto& r : runs) names.insert(r.name);
  for (const auto& r : runs) labels.push_back(r.name.empty() || names.size() < runs.size() ? r.label : r.name);
  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<meta name=\"viewport\" "
      "content=\"width=device-width, initial-scale=1\">\n<title>baton report: {}</title>\n<style>{}</style>\n"
      "<script>{}</script>\n</head>\n<body>\n<h1>baton report: {}</h1>\n<div id=\"self-check\"></div>\n",
      escape(fmt::format("{}", fmt::join(labels, " vs "))), kStyle, kScript,
      escape(fmt::format("{}", fmt::join(labels, " vs "))));
  html += "<p class=\"runs\">";
  for (const auto& r : runs)
    html += fmt::format("<span><i style=\"background:{}\"></i><b>{}</b> ({}, {} stages, {} samples)</span>", r.color,
                        escape(r.label), escape(r.dir.string()), r.order.size(), compact(r.loss.back().x));
  html += "</p>\n<p class=\"caption\">Dashed vertical lines mark where each stage began. The smoothed loss is an "
          "exponential moving average (weight 0.8, bias-corrected) restarted at each stage.</p>\n";

  html += "<h2>Training</h2>\n";
  {
    std::vector<Series> s;
    for (const auto& r : runs) {
      s.push_back({named(r, "loss"), r.loss, r.color, 1.0, 0.35, false});
      s.push_back({named(r, "loss (smoothed)"), smoothed_loss(r.loss), r.color, 2.0, 1.0, false});
    }
    html += plot("plot-loss", "Training loss", "The last batch's loss at each log point, raw and smoothed.", s, bounds, xmax);
  }
  {
    std::vector<Series> s;
    for (const auto& r : runs) s.push_back({named(r, "learning rate"), r.lr, r.color, 1.8, 1.0, false});
    html += plot("plot-lr", "Learning rate", "The base learning rate after the schedule.", s, bounds, xmax);
  }
  std::set<std::string> metrics;
  for (const auto& r : runs)
    for (const auto& [k, v] : r.eval) metrics.insert(k);
  if (!metrics.empty()) html += "<h2>Evaluation</h2>\n";
  int plot_no = 0;
  for (const auto& m : metrics) {
    std::vector<Series> s;
    for (const auto& r : runs)
      if (auto it = r.eval.find(m); it != r.eval.end()) s.push_back({named(r, m), it->second, r.color, 1.8, 1.0, true});
    html += plot(fmt::format("plot-eval-{}", plot_no++), m, "At each evaluation (interval and stage end).", s, bounds, xmax);
  }
  for (const auto& r : runs) html += class_sections(r, overlay);
  html += "<h2>Throughput</h2>\n";
  {
    std::vector<Series> s;
    for (const auto& r : runs) s.push_back({named(r, "samples/s"), r.throughput, r.color, 1.5, 1.0, false});
    html += plot("plot-throughput", "Throughput (samples/s)", "Training samples per second between log points.", s,
                 bounds, xmax);
  }
  html += "<h2>Stages</h2>\n";
  for (const auto& r : runs) {
    if (overlay) html += fmt::format("<h3 style=\"color:{}\">{}</h3>\n", r.color, escape(r.label));
    html += stage_table(r);
    html += fmt::format("<p class=\"caption\">Run directory {}: {}</p>\n", escape(r.dir.string()),
                        escape(fmt::format("{}", fmt::join(r.files, ", "))));
  }
  html += "<h2>Resolved config</h2>\n";
  for (const auto& r : runs)
    html += fmt::format("<details{}><summary>{}</summary><pre>{}</pre></details>\n", overlay ? "" : " open",
                        escape((r.dir / "config.toml").lexically_normal().string()), r.config.empty() ? "(no config.toml in this directory)" : escape(r.config));
  html += "</body>\n</html>\n";
  return html;
}

Expected<fs::path> write(const std::vector<fs::path>& run_dirs, const fs::path& out) {
  auto html = render(run_dirs);
  if (!html) return tl::unexpected(html.error());
  if (auto ok = detail::write_file_atomic(out, *html, "report"); !ok)
    return fail(ErrorCode::io, fmt::format("{}: cannot write the report there (does its directory exist and is it "
                                           "writable?); choose another file with -o ({})",
                                           out.string(), ok.error().message));
  return out;
}

}  // namespace baton::report
