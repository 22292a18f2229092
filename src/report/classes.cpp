// The report's per-class section: the confusion matrix of a run's last evaluation as a heat map
// (an HTML table whose cells are shaded by the share of their row) and precision/recall/F1 per
// class, from the detail values metrics.jsonl carries ("test/confusion_matrix/2/7", "test/f1/3").
#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "report/internal.hpp"

namespace baton::report::internal {

std::string escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {
/// The details of one set's metric: detail key ("2/7", "3") -> value.
using Details = std::map<std::string, double>;

std::string heat_map(const std::string& set, const Details& cells) {
  std::int64_t classes = 0;
  for (const auto& [k, v] : cells) classes = std::max<std::int64_t>(classes, std::stoll(k.substr(0, k.find('/'))) + 1);
  std::string t = fmt::format("<table class=\"confusion\" data-set=\"{}\" data-classes=\"{}\"><thead><tr><th>target \\ "
                              "predicted</th>", escape(set), classes);
  for (std::int64_t p = 0; p < classes; ++p) t += fmt::format("<th>{}</th>", p);
  t += "<th>recall</th></tr></thead><tbody>\n";
  for (std::int64_t r = 0; r < classes; ++r) {
    double row = 0;
    for (std::int64_t p = 0; p < classes; ++p) row += cells.count(fmt::format("{}/{}", r, p)) ? cells.at(fmt::format("{}/{}", r, p)) : 0;
    t += fmt::format("<tr><th>{}</th>", r);
    for (std::int64_t p = 0; p < classes; ++p) {
      const auto it = cells.find(fmt::format("{}/{}", r, p));
      const double n = it == cells.end() ? 0 : it->second;
      const double share = row > 0 ? n / row : 0;
      // Blue on the diagonal (right), red off it (wrong); the share of the row sets the depth.
      const char* rgb = r == p ? "31,119,180" : "214,39,40";
      t += fmt::format("<td data-count=\"{:.0f}\" style=\"background:rgba({},{:.3f});color:{}\" title=\"target {}, "
                       "predicted {}: {:.0f} ({:.1f}% of the row)\">{:.0f}</td>",
                       n, rgb, 0.04 + 0.96 * share, share > 0.55 ? "#fff" : "#222", r, p, n, 100 * share, n);
    }
    const auto diag = cells.find(fmt::format("{}/{}", r, r));
    t += fmt::format("<td>{:.3f}</td></tr>\n", row > 0 && diag != cells.end() ? diag->second / row : 0.0);
  }
  return t + "</tbody></table>\n";
}

std::string class_table(const std::string& set, const std::map<std::string, Details>& by_metric) {
  std::set<std::string> classes;
  std::vector<std::string> columns;
  for (const char* m : {"precision", "recall", "f1"})
    if (by_metric.count(m)) {
      columns.push_back(m);
      for (const auto& [k, v] : by_metric.at(m)) classes.insert(k);
    }
  if (columns.empty()) return "";
  std::vector<std::string> sorted(classes.begin(), classes.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return std::stoll(a) < std::stoll(b); });
  std::string t = fmt::format("<table class=\"classes\" data-set=\"{}\"><thead><tr><th>class</th>", escape(set));
  for (const auto& c : columns) t += fmt::format("<th>{}</th>", c);
  t += "</tr></thead><tbody>\n";
  for (const auto& k : sorted) {
    t += fmt::format("<tr><td>{}</td>", escape(k));
    for (const auto& c : columns) {
      const auto it = by_metric.at(c).find(k);
      t += it == by_metric.at(c).end() ? "<td>–</td>" : fmt::format("<td>{:.4f}</td>", it->second);
    }
    t += "</tr>\n";
  }
  return t + "</tbody></table>\n";
}
}  // namespace

std::string class_sections(const Run& run, bool overlay) {
  // The last stage whose evaluation has details: set -> metric -> details.
  std::map<std::string, std::map<std::string, Details>> sets;
  std::string stage;
  for (auto it = run.order.rbegin(); it != run.order.rend() && sets.empty(); ++it) {
    for (const auto& [key, v] : run.stages.at(*it).final_eval) {
      if (!is_detail_key(key)) continue;
      const auto a = key.find('/'), b = key.find('/', a + 1);
      sets[key.substr(0, a)][key.substr(a + 1, b - a - 1)][key.substr(b + 1)] = v;
    }
    stage = *it;
  }
  if (sets.empty()) return "";
  std::string html = fmt::format("<h2>Per class{}</h2>\n<p class=\"caption\">The last evaluation of stage {}. In the "
                                 "confusion matrix a row is the samples of one target class; a cell's shade is its "
                                 "share of the row (blue: right, red: wrong).</p>\n",
                                 overlay ? ": " + escape(run.label) : "", escape(stage));
  for (const auto& [set, by_metric] : sets) {
    html += fmt::format("<h3>{}</h3>\n", escape(set));
    if (by_metric.count("confusion_matrix")) html += heat_map(set, by_metric.at("confusion_matrix"));
    html += class_table(set, by_metric);
  }
  return html;
}

}  // namespace baton::report::internal
