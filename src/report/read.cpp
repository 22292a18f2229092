// `baton report`: reading a run directory's files (internal.hpp).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "report/internal.hpp"

namespace baton::report::internal {

std::string compact(double v) {
  const double a = std::abs(v);
  if (a >= 1e6) return fmt::format("{:.3g}M", v / 1e6);
  if (a >= 1e3) return fmt::format("{:.3g}k", v / 1e3);
  return fmt::format("{:.3g}", v);
}

void append(std::vector<Point>& series, Point p) {
  while (!series.empty() && series.back().x >= p.x) series.pop_back();
  series.push_back(std::move(p));
}

std::string run_name(const std::string& config) {
  std::istringstream in(config);
  bool in_run = false;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '[') in_run = line.rfind("[run]", 0) == 0;
    if (in_run && line.rfind("name ", 0) == 0) {  // name = 'text' (or "text")
      const auto a = line.find_first_of("'\""), b = a == std::string::npos ? a : line.find(line[a], a + 1);
      if (b != std::string::npos) return line.substr(a + 1, b - a - 1);
    }
  }
  return "";
}

/// One metrics line of `run`'s file, added to its series and stage summaries.
void add_line(Run& run, const json& j) {
  const std::string event = j["event"];
  const std::string stage_name = j.value("stage", "");
  if (stage_name.empty()) return;  // a line of another tool: ignored
  auto& st = run.stage(stage_name);
  const double sample = j.value("sample", 0.0);
  if (event == "stage_start") {
    if (!st.start) st.start = j;
    ++st.starts;
  } else if (event == "stage_end") {
    st.end = j;
  } else if (event == "train") {
    if (!st.trained) {
      st.first_sample = sample;
      st.first_epoch = j.value("epoch", std::int64_t{0});
      st.first_batch = j.value("batch", std::int64_t{0});
    }
    st.trained = true;
    st.last_sample = sample;
    st.last_epoch = j.value("epoch", std::int64_t{0});
    st.last_batch = j.value("batch", std::int64_t{0});
    if (j.contains("loss") && j["loss"].is_number()) {
      st.last_loss = j["loss"];
      append(run.loss, {sample, j["loss"], stage_name});
    }
    if (j.contains("lr") && j["lr"].is_number()) append(run.lr, {sample, j["lr"], stage_name});
    if (j.contains("samples_per_s") && j["samples_per_s"].is_number())
      append(run.throughput, {sample, j["samples_per_s"], stage_name});
  } else if (event == "eval") {
    const std::string set = j.value("set", "");
    for (const auto& [key, v] : j.items()) {
      if (!v.is_number() || key == "epoch" || key == "batch" || key == "sample") continue;
      const std::string metric = set.empty() ? key : set + "/" + key;
      if (!is_detail_key(metric)) append(run.eval[metric], {sample, v, stage_name});
      st.final_eval[metric] = v;
    }
  }
}

Expected<Run> read_run(const fs::path& given) {
  Run run;
  run.dir = given;
  std::error_code ec;
  if (!fs::is_directory(given, ec))
    return fail(ErrorCode::io, fmt::format("{}: no such directory; give a run directory written by `baton run` "
                                           "(it holds metrics.jsonl and config.toml)", given.string()));
  const fs::path metrics = given / "metrics.jsonl";
  std::ifstream in(metrics, std::ios::binary);
  if (!in)
    return fail(ErrorCode::io, fmt::format("{}: no metrics.jsonl here, so nothing to plot; is this a run directory "
                                           "of `baton run` (see run.run_dir or --run-dir)?", given.string()));
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  std::size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    const auto nl = text.find('\n', pos);
    const std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    const bool complete = nl != std::string::npos;
    pos = complete ? nl + 1 : text.size();
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("event") || !j["event"].is_string()) {
      if (!complete) break;  // the last line of a killed run, cut off mid-write
      return fail(ErrorCode::data, fmt::format("{}:{}: not a metrics line (a JSON object with \"event\"): {:.80}",
                                               metrics.string(), line_no, line));
    }
    add_line(run, j);
  }
  if (run.loss.empty())
    return fail(ErrorCode::data, fmt::format("{}: no training lines (event \"train\") yet, so nothing to plot; "
                                             "report a run that has trained at least a few batches",
                                             metrics.string()));
  if (std::ifstream cfg(given / "config.toml"); cfg) run.config.assign(std::istreambuf_iterator<char>(cfg), {});
  run.name = run_name(run.config);
  for (const auto& e : fs::directory_iterator(given, ec)) {
    if (e.is_directory(ec)) {
      std::size_t n = 0;
      for ([[maybe_unused]] const auto& f : fs::directory_iterator(e.path(), ec)) ++n;
      run.files.push_back(fmt::format("{}/ ({} files)", e.path().filename().string(), n));
    } else {
      run.files.push_back(fmt::format("{} ({})", e.path().filename().string(), compact(static_cast<double>(e.file_size(ec)))));
    }
  }
  std::sort(run.files.begin(), run.files.end());
  return run;
}

}  // namespace baton::report::internal
