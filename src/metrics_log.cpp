// The one metrics schema (metrics.hpp).
#include "metrics_log.hpp"

#include <cmath>
#include <functional>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "io.hpp"

namespace baton::detail {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
constexpr const char* kCsvHeader = "event,stage,epoch,batch,sample,set,metric,value";

Expected<void> open_append(std::ofstream& out, const fs::path& path) {
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  out.open(path, std::ios::app);
  if (!out) return fail(ErrorCode::io, fmt::format("{}: cannot open for writing", path.string()));
  return {};
}

/// "eval/test/accuracy" -> {"eval", "test", "accuracy"}; "train/loss" -> {"train", "", "loss"}.
struct Key {
  std::string event, set, metric;
};
Key split_key(const std::string& key) {
  const auto a = key.find('/');
  if (a == std::string::npos) return {"scalar", "", key};
  const std::string group = key.substr(0, a), rest = key.substr(a + 1);
  if (group == "eval") {
    if (const auto b = rest.find('/'); b != std::string::npos) return {group, rest.substr(0, b), rest.substr(b + 1)};
  }
  return {group, "", rest};
}
}  // namespace

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

Expected<std::shared_ptr<MetricsWriter>> MetricsWriter::open(const std::optional<fs::path>& jsonl,
                                                             const std::optional<fs::path>& csv) {
  auto w = std::make_shared<MetricsWriter>();
  if (jsonl) {
    if (auto ok = open_append(w->jsonl_, *jsonl); !ok) return tl::unexpected(ok.error());
    w->jsonl_path_ = *jsonl;
  }
  if (csv) {
    std::error_code ec;
    const bool fresh = !fs::exists(*csv, ec) || fs::file_size(*csv, ec) == 0;
    if (auto ok = open_append(w->csv_, *csv); !ok) return tl::unexpected(ok.error());
    w->csv_path_ = *csv;
    if (fresh) w->csv_ << kCsvHeader << '\n';
  }
  return w;
}

void MetricsWriter::log(const std::string& stage, const Timestamp& t, const std::map<std::string, double>& scalars) {
  std::map<std::pair<std::string, std::string>, json> lines;  // (event, set) -> line, in key order
  for (const auto& [key, v] : scalars) {
    const Key k = split_key(key);
    auto& j = lines[{k.event, k.set}];
    if (j.is_null()) {
      j = {{"event", k.event}, {"stage", stage}, {"epoch", t.epoch}, {"batch", t.batch}, {"sample", t.sample}};
      if (!k.set.empty()) j["set"] = k.set;
    }
    j[k.metric] = std::isfinite(v) ? json(v) : json(nullptr);
    if (csv_.is_open())
      csv_ << fmt::format("{},{},{},{},{},{},{},{}\n", csv_field(k.event), csv_field(stage), t.epoch, t.batch, t.sample,
                          csv_field(k.set), csv_field(k.metric), v);
  }
  if (jsonl_.is_open())
    for (const auto& [key, j] : lines) jsonl_ << j.dump() << '\n';
  flush();
}

void MetricsWriter::event(const json& line) {
  if (!jsonl_.is_open()) return;
  jsonl_ << line.dump() << '\n';
  flush();
}

void MetricsWriter::flush() {
  for (auto [out, path] : {std::pair{&jsonl_, &jsonl_path_}, std::pair{&csv_, &csv_path_}}) {
    if (!out->is_open()) continue;
    out->flush();
    check_written(*out, *path, "metrics");
  }
}

Expected<void> truncate_metrics(const fs::path& dir, std::int64_t batch, std::int64_t stage_index, bool stage_done) {
  // A line is kept when its batch is at or before the checkpoint's; a line cut off by a kill
  // (no newline, or not JSON) is dropped.
  auto keep_jsonl = [&](const std::string& line) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return false;
    const auto at = j.value("batch", std::int64_t{0});
    if (stage_done && at == batch && j.value("event", "") == "stage_start" && j.value("index", std::int64_t{-1}) > stage_index)
      return false;
    return at <= batch;
  };
  auto keep_csv = [&](const std::string& line) {
    if (line == kCsvHeader) return true;
    // event,stage,epoch,batch,...: the batch is the 4th field; a quoted stage may hold commas.
    std::size_t field = 0, i = 0;
    bool quoted = false;
    std::string value;
    for (; i < line.size() && field < 4; ++i) {
      const char c = line[i];
      if (c == '"') quoted = !quoted;
      else if (c == ',' && !quoted) ++field;
      else if (field == 3) value += c;
    }
    try {
      return field == 4 && std::stoll(value) <= batch;
    } catch (const std::exception&) {
      return false;
    }
  };
  for (const auto& [name, keep] : {std::pair<const char*, std::function<bool(const std::string&)>>{"metrics.jsonl", keep_jsonl},
                                   {"metrics.csv", keep_csv}}) {
    const fs::path path = dir / name;
    std::ifstream in(path, std::ios::binary);
    if (!in) continue;
    std::string kept, line;
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    std::istringstream lines(text);
    while (std::getline(lines, line))
      if (!lines.eof() && keep(line)) kept += line + '\n';  // eof: the last line had no newline
    if (kept.size() == text.size()) continue;
    if (auto ok = write_file_atomic(path, kept); !ok) return ok;
  }
  return {};
}

}  // namespace baton::detail
