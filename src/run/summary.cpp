// The run's summary table and the default description of a chain of stages (run.hpp).
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <torch/torch.h>

#include "baton/callbacks.hpp"
#include "baton/report.hpp"
#include "baton/run.hpp"

namespace baton {
namespace {
std::string metrics_text(const Metrics& m) {
  std::vector<std::string> parts;
  for (const auto& [set, values] : m)
    for (const auto& [k, v] : values)
      if (!is_detail(k)) parts.push_back(fmt::format("{}/{}={:.4f}", set, k, v));
  return fmt::format("{}", fmt::join(parts, " "));
}
}  // namespace

std::string RunResult::summary() const {
  std::string out = fmt::format("{:<14} {:>10} {:>8} {:>10} {:<16} {:>9}  {}\n", "stage", "epochs", "batches", "loss",
                                " loss curve", "time", "eval");
  for (const auto& r : stages) {
    // The sparkline's width in bytes is 3 per bar: pad by hand so the columns line up.
    const auto spark = report::sparkline(r.losses, 16);
    const auto bars = spark.size() / 3;
    out += fmt::format("{:<14} {:>4} -> {:<3} {:>8} {:>10.4f}  {}{} {:>9}  {}\n", r.name, r.start.epoch, r.end.epoch,
                       r.end.batch - r.start.batch, r.loss, spark, std::string(bars < 15 ? 15 - bars : 0, ' '),
                       duration_text(r.seconds), metrics_text(r.metrics));
  }
  if (!not_bit_exact.empty()) out += fmt::format("not bit-exact: {}\n", not_bit_exact);
  return out;
}

std::string describe(const std::vector<TrainingSpec>& stages) {
  std::string out = "# the stages of a C++ run (baton::describe)\n";
  for (const auto& s : stages) {
    out += fmt::format("\n[[stages]]\nname = \"{}\"\nduration = \"{}\"\ntrain_samples = {}\nbatch_size = {}\n", s.name,
                       s.duration.to_string(), s.data.train.size(), s.data.batch_size);
    out += fmt::format("optimizer = {{ name = \"{}\", lr = {} }}\noptimizer_carry = \"{}\"\n", s.optimizer.kind(),
                       s.optimizer.lr(), s.optimizer_carry == Carry::keep ? "keep" : "fresh");
    const char* weights = s.model.kind == ModelCarry::Kind::keep ? "keep"
                          : s.model.kind == ModelCarry::Kind::reinitialize ? "reinitialize" : "transfer";
    out += fmt::format("schedule_clock = \"{}\"\nweights = \"{}\"\ngrad_accum = {}\n",
                       s.schedule_clock == Clock::run ? "run" : "stage", weights, s.grad_accum);
    if (!s.freeze.empty()) out += fmt::format("freeze = [\"{}\"]\n", fmt::join(s.freeze, "\", \""));
    std::vector<std::string> algos;
    for (const auto& a : s.algorithms) algos.push_back(a.name);
    if (!algos.empty()) out += fmt::format("algorithms = [\"{}\"]\n", fmt::join(algos, "\", \""));
    if (s.clip_grad_norm) out += fmt::format("clip_grad_norm = {}\n", *s.clip_grad_norm);
    if (s.data_seed) out += fmt::format("data_seed = {}\n", *s.data_seed);
  }
  return out;
}

}  // namespace baton
