// The run directory's own observers (internal.hpp).
#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <torch/torch.h>

#include "baton/fit.hpp"
#include "baton/checkpoint.hpp"
#include "run/internal.hpp"
#include "train/observers.hpp"

namespace baton::detail {
namespace {
using Clock = std::chrono::steady_clock;

/// Batches between two training lines: ~1% of the stage as written, 1 to 50.
std::int64_t log_interval(const TrainingSpec& spec, const TrainState& s) {
  const auto end = stage_end(spec, s);
  const std::int64_t total = end ? end->batch - s.stage_start.batch : 100;
  return std::clamp<std::int64_t>(total / 100, 1, 50);
}
}  // namespace

Callback train_log(std::shared_ptr<StageTrace> trace) {
  struct Clocks {
    std::int64_t every = 1, end_batch = 0;
    Clock::time_point last, eval_started;
    std::int64_t samples = 0;
  };
  auto c = std::make_shared<Clocks>();
  return {"run_log", [trace, c](const EventView& v) -> std::optional<std::string> {
            auto& memory = *v.memory;
            switch (v.event) {
              case Event::fit_start: {
                c->every = log_interval(v.spec, v.state);
                const auto end = stage_end(v.spec, v.state);
                c->end_batch = end ? end->batch : v.state.time.batch;
                c->last = Clock::now();
                c->samples = 0;
                if (v.state.time == v.state.stage_start) memory.clear();  // a new stage: a new sum
                break;
              }
              case Event::batch_end: {
                if (!v.step->skipped) memory["loss_sum"] += v.step->loss, memory["loss_count"] += 1;
                c->samples += v.step->samples;
                const std::int64_t done = v.state.time.batch - v.state.stage_start.batch;
                if (done % c->every != 0 && v.state.time.batch < c->end_batch) break;
                const auto now = Clock::now();
                const double secs = std::max(std::chrono::duration<double>(now - c->last).count(), 1e-9);
                const double count = memory["loss_count"];
                const double loss = count > 0 ? memory["loss_sum"] / count : v.step->loss;
                v.log->add("train/loss", loss);
                v.log->add("train/lr", v.step->lr);
                v.log->add("train/samples_per_s", static_cast<double>(c->samples) / secs);
                trace->losses.push_back(loss);
                trace->last_loss = loss;
                memory["loss_sum"] = 0, memory["loss_count"] = 0;
                c->last = now, c->samples = 0;
                break;
              }
              case Event::eval_start: c->eval_started = Clock::now(); break;
              case Event::eval_end: {
                const double secs = std::chrono::duration<double>(Clock::now() - c->eval_started).count();
                trace->eval_seconds += secs;
                c->last += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(secs));
                break;
              }
              case Event::checkpoint: trace->checkpoint = *v.path; break;
              default: break;
            }
            return std::nullopt;
          }};
}

namespace {
class EvalEcho final : public Logger {
 public:
  EvalEcho(std::shared_ptr<StageTrace> trace, std::shared_ptr<Progress> progress)
      : trace_(std::move(trace)), progress_(std::move(progress)) {}
  void log(const std::string& stage, const Timestamp& t, const std::map<std::string, double>& scalars) override {
    Metrics m;
    for (const auto& [key, v] : scalars) {
      if (key.rfind("eval/", 0) != 0) continue;  // "eval/<set>/<metric>"
      const auto slash = key.find('/', 5);
      if (slash != std::string::npos) m[key.substr(5, slash - 5)][key.substr(slash + 1)] = v;
    }
    if (m.empty()) return;
    trace_->last_metrics = m;
    if (!progress_) return;
    std::vector<std::string> parts;
    for (const auto& [set, values] : m)
      for (const auto& [k, v] : values)
        if (!is_detail(k)) parts.push_back(fmt::format("{}/{}={:.4f}", set, k, v));
    progress_->line(fmt::format("[{}] epoch {} batch {}: {}", stage, t.epoch, t.batch, fmt::join(parts, " ")));
  }

 private:
  std::shared_ptr<StageTrace> trace_;
  std::shared_ptr<Progress> progress_;
};
}  // namespace

std::shared_ptr<Logger> eval_echo(std::shared_ptr<StageTrace> trace, std::shared_ptr<Progress> progress) {
  return std::make_shared<EvalEcho>(std::move(trace), std::move(progress));
}

Callback best_file(std::filesystem::path path, CheckpointMeta meta) {
  return {"run_best", [path = std::move(path), meta = std::move(meta)](const EventView& v) -> std::optional<std::string> {
            if (v.event != Event::eval_end || kept_batch(v.state) != v.state.time.batch) return std::nullopt;
            if (auto ok = save_checkpoint(v.state, path, meta); !ok) throw BatonException(ok.error().with_context("best state"));
            return std::nullopt;
          }};
}

}  // namespace baton::detail
