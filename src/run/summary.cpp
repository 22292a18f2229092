// The run's summary table (run.hpp).
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <torch/torch.h>

#include "baton/callbacks.hpp"
#include "baton/report.hpp"
#include "baton/run.hpp"

namespace baton {
namespace {
constexpr std::size_t kWidth = 80;  // a terminal's: the table is read there and in CI logs

/// `words` after `lead`, wrapped at kWidth, continuation lines indented like the first.
std::string wrapped(const std::string& lead, const std::vector<std::string>& words) {
  std::string out, line = lead;
  for (const auto& w : words) {
    if (line.size() > lead.size() && line.size() + 1 + w.size() > kWidth) {
      out += line + "\n";
      line = std::string(lead.size(), ' ');
    }
    line += (line.size() > lead.size() ? " " : "") + w;
  }
  return out + line + "\n";
}

std::vector<std::string> metric_words(const Metrics& m) {
  std::vector<std::string> parts;
  for (const auto& [set, values] : m)
    for (const auto& [k, v] : values)
      if (!is_detail(k)) parts.push_back(fmt::format("{}/{}={:.4f}", set, k, v));
  return parts;
}
}  // namespace

std::string RunResult::summary() const {
  if (stages.empty())
    return "no stage trained in this call: the run had already finished (its final state is final.baton)\n";
  // Each stage's row fits 80 columns; its last evaluation follows, wrapped at 80.
  std::string out = fmt::format("{:<14} {:>10} {:>8} {:>10} {:<16} {:>9}\n", "stage", "epochs", "batches", "loss",
                                " loss curve", "time");
  for (const auto& r : stages) {
    // The sparkline's width in bytes is 3 per bar: pad by hand so the columns line up.
    const auto spark = report::sparkline(r.losses, 16);
    const auto bars = spark.size() / 3;
    out += fmt::format("{:<14} {:>4} -> {:<3} {:>8} {:>10.4f}  {}{} {:>9}\n", r.name, r.start.epoch, r.end.epoch,
                       r.end.batch - r.start.batch, r.loss, spark, std::string(bars < 15 ? 15 - bars : 0, ' '),
                       duration_text(r.seconds));
    if (const auto words = metric_words(r.metrics); !words.empty()) out += wrapped("  eval:", words);
  }
  if (!not_bit_exact.empty()) {
    std::vector<std::string> words;
    for (std::size_t at = 0, sp; at < not_bit_exact.size(); at = sp + 1) {
      sp = not_bit_exact.find(' ', at);
      if (sp == std::string::npos) sp = not_bit_exact.size();
      words.push_back(not_bit_exact.substr(at, sp - at));
    }
    out += wrapped("not bit-exact:", words);
  }
  return out;
}

}  // namespace baton
