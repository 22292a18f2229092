#pragma once
// The report's model of a run directory (read.cpp) and what rendering shares (render.cpp).
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "baton/error.hpp"

namespace baton::report::internal {
namespace fs = std::filesystem;
using json = nlohmann::json;

struct Point {
  double x = 0, y = 0;
  std::string stage;
};

/// Appends a point in sample order. A resumed run re-logs the batches after its last checkpoint:
/// the later lines replace the earlier ones from that sample on.
void append(std::vector<Point>& series, Point p);

struct Stage {
  std::string name;
  std::optional<json> start;  // first stage_start event
  std::optional<json> end;    // last stage_end event
  int starts = 0;             // more than one: the stage was resumed
  double first_sample = std::numeric_limits<double>::quiet_NaN();
  std::int64_t first_epoch = 0, first_batch = 0;
  std::int64_t last_epoch = 0, last_batch = 0;
  double last_sample = 0, last_loss = std::numeric_limits<double>::quiet_NaN();
  std::map<std::string, double> final_eval;  // "set/metric" -> last value
  bool trained = false;
};

struct Run {
  fs::path dir;
  std::string label, name, config, color;
  std::vector<std::string> order;  // stage names in the order they appear
  std::map<std::string, Stage> stages;
  std::vector<Point> loss, lr, throughput;
  std::map<std::string, std::vector<Point>> eval;  // "set/metric"
  std::vector<std::string> files;

  Stage& stage(const std::string& n) {
    if (!stages.count(n)) {
      order.push_back(n);
      stages[n].name = n;
    }
    return stages[n];
  }
  /// Where a stage began in samples: its stage_start event, else where the stage before it ended.
  [[nodiscard]] double start_of(std::size_t i) const {
    const auto& s = stages.at(order[i]);
    if (s.start) return s.start->value("sample", 0.0);
    return i == 0 ? 0.0 : stages.at(order[i - 1]).last_sample;
  }
};

/// True for a metric's detail value ("test/f1/3", "test/confusion_matrix/2/7"): in tables of
/// their own, not plotted.
inline bool is_detail_key(const std::string& set_metric) {
  const auto first = set_metric.find('/');
  return first != std::string::npos && set_metric.find('/', first + 1) != std::string::npos;
}

/// `s` with &, <, > and " escaped for HTML.
std::string escape(const std::string& s);

/// The run's per-class metrics of its last evaluation (classes.cpp): for each set, the confusion
/// matrix as a heat map and a table of precision, recall and F1 per class; "" when it has none.
std::string class_sections(const Run& run, bool overlay);

/// A number in 3 significant digits with k/M: "1.23k".
std::string compact(double v);

/// The run's name from its resolved config.toml ([run] name = "..."), which baton writes itself.
std::string run_name(const std::string& config);

/// A run directory's metrics.jsonl and config.toml, read; errors name the file and line.
Expected<Run> read_run(const fs::path& given);

}  // namespace baton::report::internal
