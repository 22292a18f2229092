#pragma once
// The one metrics schema, written by the JSONL and CSV loggers and by run directories, and read
// by `baton report` (docs/report.md):
//
//   metrics.jsonl  {"event": "train", "stage": "main", "epoch": 1, "batch": 469, "sample": 60000, "loss": 0.41, ...}
//                  {"event": "eval", ..., "set": "test", "accuracy": 0.91, "loss": 0.25}
//                  {"event": "stage_start" | "stage_end", ...}   (run directories)
//   metrics.csv    event,stage,epoch,batch,sample,set,metric,value   (RFC 4180 quoting)
//
// A logger's scalar "train/loss" is event "train", metric "loss"; "eval/<set>/<metric>" is
// event "eval" with a set; "<group>/<metric>" in general is event "<group>".

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "baton/error.hpp"
#include "baton/events.hpp"

namespace baton::detail {

class MetricsWriter final : public Logger {
 public:
  /// Appends to either file or both (a CSV gets its header when new or empty).
  static Expected<std::shared_ptr<MetricsWriter>> open(const std::optional<std::filesystem::path>& jsonl,
                                                       const std::optional<std::filesystem::path>& csv);
  void log(const std::string& stage, const Timestamp& t, const std::map<std::string, double>& scalars) override;
  /// A line of another kind (stage_start, stage_end) into the JSONL file only.
  void event(const nlohmann::json& line);
  /// Flushes both files; an io error once a write has failed (a full disk, the file-size limit).
  void flush() override;

 private:
  std::ofstream jsonl_, csv_;
  std::filesystem::path jsonl_path_, csv_path_;
};

/// A field of a CSV line, quoted per RFC 4180 when it holds a comma, a quote or a line break.
std::string csv_field(const std::string& text);

/// Keeps the lines of `dir`'s metrics.jsonl and metrics.csv at or before run batch `batch`, the
/// batch of the checkpoint a run resumes from (its files then read as one uninterrupted run);
/// each file is rewritten atomically. From a checkpoint at the end of stage `stage_index`, the
/// next stage's stage_start line at that batch goes too: the resumed run begins that stage.
Expected<void> truncate_metrics(const std::filesystem::path& dir, std::int64_t batch, std::int64_t stage_index,
                                bool stage_done);

}  // namespace baton::detail
