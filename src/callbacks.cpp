// Built-in callbacks and loggers (include/baton/callbacks.hpp).
#include "baton/callbacks.hpp"

#include <sys/ioctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <mutex>
#include <ostream>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "baton/eval.hpp"
#include "baton/fit.hpp"
#include "baton/spec.hpp"
#include "baton/state.hpp"
#include "detail.hpp"
#include "horizon.hpp"
#include "io.hpp"
#include "metrics_log.hpp"

namespace baton {

namespace {
constexpr std::array<std::uint32_t, 256> crc32c_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78U : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr auto kCrc32cTable = crc32c_table();
}  // namespace

std::uint32_t crc32c(const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = 0xFFFFFFFFU;
  for (std::size_t i = 0; i < size; ++i) c = kCrc32cTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFU;
}

std::string_view to_string(Event e) {
  switch (e) {
    case Event::fit_start: return "fit_start";
    case Event::epoch_start: return "epoch_start";
    case Event::batch_start: return "batch_start";
    case Event::after_data: return "after_data";
    case Event::before_forward: return "before_forward";
    case Event::after_forward: return "after_forward";
    case Event::after_loss: return "after_loss";
    case Event::after_backward: return "after_backward";
    case Event::before_optimizer_step: return "before_optimizer_step";
    case Event::batch_end: return "batch_end";
    case Event::epoch_end: return "epoch_end";
    case Event::eval_start: return "eval_start";
    case Event::eval_end: return "eval_end";
    case Event::checkpoint: return "checkpoint";
    case Event::fit_end: return "fit_end";
  }
  return "?";
}

std::ostream& operator<<(std::ostream& out, Event e) { return out << to_string(e); }

bool EventView::due(Time every) const {
  if (!span || !every.check() || !(every.value > 0)) return false;
  const auto done = [&](const Timestamp& t) {
    return detail::intervals_done(every, t, state.stage_start, span->epoch_size, state.max_duration);
  };
  return done(span->after) > done(span->before);
}

namespace callbacks {
namespace {

bool monitor_due(const EventView& v, const Every& every) { return v.due(every.time); }

/// A monitor with what is wrong with its `every`, if anything (TrainingSpec::validate reports it).
Callback monitor_checked(Callback cb, const Every& every) {
  if (auto ok = every.time.check(); !ok) cb.invalid = fmt::format("every: {}", ok.error().message);
  else if (!(every.time.value > 0)) cb.invalid = fmt::format("every: must be more than zero, got \"{}\"", every.time.to_string());
  return cb;
}

/// metrics["test"]["accuracy"] for "test/accuracy".
std::string known_metrics(const std::map<std::string, std::map<std::string, double>>& m) {
  std::vector<std::string> keys;
  for (const auto& [set, values] : m)
    for (const auto& [metric, v] : values) keys.push_back(set + "/" + metric);
  return fmt::format("{}", fmt::join(keys, ", "));
}

}  // namespace

Callback train_monitor(MonitorOptions o) {
  return monitor_checked({"train_monitor", [o](const EventView& v) -> std::optional<std::string> {
            if (v.event != Event::batch_end || !monitor_due(v, o.every)) return std::nullopt;
            v.log->add("train/loss", v.step->loss);
            v.log->add("train/lr", v.step->lr);
            if (v.step->skipped) v.log->add("train/skipped", 1);
            return std::nullopt;
          }, /*observer=*/true}, o.every);
}

Callback lr_monitor(MonitorOptions o) {
  return monitor_checked({"lr_monitor", [o](const EventView& v) -> std::optional<std::string> {
            if (v.event == Event::batch_end && monitor_due(v, o.every)) v.log->add("train/lr", v.step->lr);
            return std::nullopt;
          }, /*observer=*/true}, o.every);
}

Callback throughput(MonitorOptions o) {
  struct Since {
    std::chrono::steady_clock::time_point at;
    std::int64_t sample = -1;
  };
  auto since = std::make_shared<Since>();
  return monitor_checked({"throughput", [o, since](const EventView& v) -> std::optional<std::string> {
            const auto now = std::chrono::steady_clock::now();
            if (v.event == Event::fit_start || since->sample < 0) {
              since->at = now, since->sample = v.state.time.sample;
              return std::nullopt;
            }
            if (v.event != Event::batch_end || !monitor_due(v, o.every)) return std::nullopt;
            const double secs = std::chrono::duration<double>(now - since->at).count();
            if (secs > 0) v.log->add("train/samples_per_s", static_cast<double>(v.state.time.sample - since->sample) / secs);
            since->at = now, since->sample = v.state.time.sample;
            return std::nullopt;
          }, /*observer=*/true}, o.every);
}

Callback memory_monitor(MonitorOptions o) {
  return monitor_checked({"memory_monitor", [o](const EventView& v) -> std::optional<std::string> {
            if (v.event != Event::batch_end || !monitor_due(v, o.every)) return std::nullopt;
            rusage ru{};
            if (getrusage(RUSAGE_SELF, &ru) == 0) v.log->add("system/peak_rss_mb", static_cast<double>(ru.ru_maxrss) / 1024.0);
            return std::nullopt;
          }, /*observer=*/true}, o.every);
}

Callback grad_norm_monitor(MonitorOptions o) {
  auto norm = std::make_shared<double>(0.0);
  return monitor_checked({"grad_norm_monitor", [o, norm](const EventView& v) -> std::optional<std::string> {
            if (v.event == Event::after_backward && monitor_due(v, o.every)) {
              // As the step computes it (clipping, the non-finite check): a tied weight once.
              std::vector<torch::Tensor> grads;
              std::set<const void*> seen;
              for (const auto& p : v.state.model.module->parameters())
                if (p.grad().defined() && seen.insert(p.unsafeGetTensorImpl()).second) grads.push_back(p.grad());
              *norm = detail::global_norm(grads);
            } else if (v.event == Event::batch_end && monitor_due(v, o.every)) {
              // The norm of this batch's gradients: a batch is due at all of its events.
              v.log->add("train/grad_norm", *norm);
            }
            return std::nullopt;
          }, /*observer=*/true}, o.every);
}

Callback nan_monitor(MonitorOptions o) {
  return monitor_checked({"nan_monitor", [o](const EventView& v) -> std::optional<std::string> {
            if (v.event != Event::batch_end || !monitor_due(v, o.every)) return std::nullopt;
            for (const auto& [name, p] : v.state.named_parameters())
              if (!torch::isfinite(p).all().item<bool>())
                return fmt::format("parameter \"{}\" holds NaN or infinity after batch {}", name, v.state.time.batch);
            return std::nullopt;
          }, false, fmt::format("nan_monitor(every={})", o.every.time.to_string())}, o.every);
}

Callback early_stopping(EarlyStoppingOptions o) {
  return {"early_stopping", [o](const EventView& v) -> std::optional<std::string> {
            if (v.event != Event::eval_end) return std::nullopt;
            const auto value = metric_value(*v.metrics, o.metric);
            if (!value)
              return fmt::format("metric \"{}\" is not among the evaluated ones ({}); stopping rather than "
                                 "training blind", o.metric, known_metrics(*v.metrics));
            auto& mem = *v.memory;
            // Per stage: the memory of another stage (told by where it started) is dropped.
            const auto stage_start = static_cast<double>(v.state.stage_start.batch);
            if (o.scope == Scope::stage && (!mem.count("stage_start") || mem["stage_start"] != stage_start))
              mem = {{"stage_start", stage_start}};
            const bool first = !mem.count("best");
            const double best = first ? 0.0 : mem["best"];
            const bool better = first || (o.mode == Mode::min ? *value < best - o.min_delta : *value > best + o.min_delta);
            if (better) {
              mem["best"] = *value, mem["bad"] = 0, mem["best_batch"] = static_cast<double>(v.state.time.batch);
              return std::nullopt;
            }
            mem["bad"] += 1;
            if (mem["bad"] >= static_cast<double>(o.patience))
              return fmt::format("{} did not improve on {} (the evaluation at batch {}{}) by more than {} for {} "
                                 "evaluations (last {})",
                                 o.metric, best, static_cast<std::int64_t>(mem["best_batch"]),
                                 o.scope == Scope::stage ? ", this stage's best" : ", the run's best", o.min_delta,
                                 o.patience, *value);
            return std::nullopt;
          },
          false,
          fmt::format("early_stopping(metric={}, mode={}, patience={}, min_delta={}, scope={})", o.metric,
                      o.mode == Mode::min ? "min" : "max", o.patience, o.min_delta, o.scope == Scope::stage ? "stage" : "run")};
}

Callback threshold_stop(ThresholdOptions o) {
  return {"threshold_stop", [o](const EventView& v) -> std::optional<std::string> {
            if (v.event != Event::eval_end) return std::nullopt;
            const auto value = metric_value(*v.metrics, o.metric);
            if (!value)
              return fmt::format("metric \"{}\" is not among the evaluated ones ({})", o.metric, known_metrics(*v.metrics));
            if (o.mode == Mode::max ? *value >= o.threshold : *value <= o.threshold)
              return fmt::format("{} reached {} (threshold {})", o.metric, *value, o.threshold);
            return std::nullopt;
          },
          false,
          fmt::format("threshold_stop(metric={}, threshold={}, mode={})", o.metric, o.threshold,
                      o.mode == Mode::min ? "min" : "max")};
}

}  // namespace callbacks

namespace loggers {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

class ConsoleLogger final : public Logger {
 public:
  explicit ConsoleLogger(std::shared_ptr<Progress> progress) : progress_(std::move(progress)) {}
  void log(const std::string& stage, const Timestamp& t, const std::map<std::string, double>& scalars) override {
    std::string line = fmt::format("[{}] epoch {} batch {}:", stage, t.epoch, t.batch);
    for (const auto& [k, v] : scalars)  // details ("eval/test/f1/3") go to the files, not the console
      if (!k.starts_with("eval/") || !is_detail(k.substr(k.find('/', 5) + 1))) line += fmt::format(" {}={:.6g}", k, v);
    progress_->line(line);
  }
  void flush() override {}
 private:
  std::shared_ptr<Progress> progress_;
};

// ---- TensorBoard's record format
void varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) out.push_back(static_cast<char>((v & 0x7F) | 0x80)), v >>= 7;
  out.push_back(static_cast<char>(v));
}
template <class T>
void little(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (as the checkpoint format)
  out.append(b, sizeof(T));
}
void bytes_field(std::string& out, int field, std::string_view data) {
  varint(out, static_cast<std::uint64_t>(field) << 3 | 2);
  varint(out, data.size());
  out.append(data);
}
std::uint32_t masked(std::uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8U; }

/// Event{wall_time = 1, step = 2, file_version = 3, summary = 5}.
std::string event(double wall_time, std::int64_t step, std::string_view file_version, std::string_view summary) {
  std::string e;
  varint(e, 1 << 3 | 1);
  little(e, wall_time);
  varint(e, 2 << 3 | 0);
  varint(e, static_cast<std::uint64_t>(step));
  if (!file_version.empty()) bytes_field(e, 3, file_version);
  if (!summary.empty()) bytes_field(e, 5, summary);
  return e;
}

class TensorBoardLogger final : public Logger {
 public:
  void log(const std::string&, const Timestamp& t, const std::map<std::string, double>& scalars) override {
    std::string summary;
    for (const auto& [k, v] : scalars) {
      std::string value;  // Summary.Value{tag = 1, simple_value = 2}
      bytes_field(value, 1, k);
      varint(value, 2 << 3 | 5);
      little(value, static_cast<float>(v));
      bytes_field(summary, 1, value);
    }
    record(event(now(), t.batch, {}, summary));
    detail::check_written(out_, path_, "TensorBoard events");
  }
  void flush() override {
    out_.flush();
    detail::check_written(out_, path_, "TensorBoard events");
  }
  void record(const std::string& data) {
    std::string head;
    little(head, static_cast<std::uint64_t>(data.size()));
    const std::uint32_t len_crc = masked(crc32c(head.data(), head.size()));
    const std::uint32_t data_crc = masked(crc32c(data.data(), data.size()));
    little(head, len_crc);
    out_ << head << data;
    std::string tail;
    little(tail, data_crc);
    out_ << tail;
  }
  static double now() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  std::ofstream out_;
  fs::path path_;
};

}  // namespace

// One schema for both files and for run directories: metrics_log.hpp.
Expected<std::shared_ptr<Logger>> jsonl(const fs::path& path) {
  return detail::MetricsWriter::open(path, std::nullopt).map([](auto w) { return std::shared_ptr<Logger>(std::move(w)); });
}

Expected<std::shared_ptr<Logger>> csv(const fs::path& path) {
  return detail::MetricsWriter::open(std::nullopt, path).map([](auto w) { return std::shared_ptr<Logger>(std::move(w)); });
}

Expected<std::shared_ptr<Logger>> tensorboard(const fs::path& dir, std::optional<std::int64_t> restart_at) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fail(ErrorCode::io, fmt::format("{}: cannot create the TensorBoard directory: {}", dir.string(), ec.message()));
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const auto secs = static_cast<std::int64_t>(TensorBoardLogger::now());
  auto l = std::make_shared<TensorBoardLogger>();
  const fs::path file = dir / fmt::format("events.out.tfevents.{}.{}.{}.baton", secs, host, ::getpid());
  l->path_ = file;
  l->out_.open(file, std::ios::binary | std::ios::trunc);
  if (!l->out_) return fail(ErrorCode::io, fmt::format("{}: cannot open for writing: {}", file.string(), std::strerror(errno)));
  l->record(event(TensorBoardLogger::now(), 0, "brain.Event:2", {}));
  if (restart_at) {
    // Event{wall_time, step, session_log = 6: SessionLog{status = 1: START}}: TensorBoard purges
    // the events of this run's other files with a step at or after this one.
    std::string e = event(TensorBoardLogger::now(), *restart_at, {}, {});
    bytes_field(e, 6, std::string{"\x08\x01", 2});
    l->record(e);
  }
  l->out_.flush();
  return l;
}

std::shared_ptr<Logger> console(std::FILE* out) { return console(std::make_shared<Progress>(out)); }
std::shared_ptr<Logger> console(std::shared_ptr<Progress> progress) { return std::make_shared<ConsoleLogger>(std::move(progress)); }

}  // namespace loggers
}  // namespace baton

// ------------------------------------------------------------------ progress display
namespace baton {

Progress::Progress(std::FILE* out) : Progress(out, ::isatty(::fileno(out)) == 1) {}

int Progress::terminal_columns() const {
  winsize ws{};
  if (::ioctl(::fileno(out_), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 10) return ws.ws_col;
  return 80;  // not a terminal, or one that does not say
}
Progress::Progress(std::FILE* out, bool bar) : out_(out), bar_(bar) {}

void Progress::update(const std::string& stage, const Timestamp& t, std::int64_t done, std::int64_t total,
                      double samples_per_s, double loss, double eta_s) {
  const double frac = total > 0 ? std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0) : 1.0;
  if (bar_) {
    // One line that never reaches the terminal's last column (a wrapped line is never redrawn):
    // the bar shrinks to fit, then goes, then the text is cut.
    const std::string left = fmt::format("[{}] epoch {} ", stage, t.epoch);
    const std::string right = fmt::format(" {:3.0f}% {:6.0f} sp/s loss {:.4f} ETA {}", frac * 100, samples_per_s, loss,
                                          duration_text(eta_s));
    const int room = terminal_columns() - 1;
    const int width = std::min(24, room - static_cast<int>(left.size() + right.size()) - 2);
    std::string text = left;
    if (width >= 5) {
      const int fill = static_cast<int>(frac * width);
      text += "[" + std::string(static_cast<std::size_t>(fill), '#') + std::string(static_cast<std::size_t>(width - fill), '.') + "]";
    }
    text += right;
    if (static_cast<int>(text.size()) > room) text.resize(static_cast<std::size_t>(std::max(room, 0)));
    fmt::print(out_, "\r\033[K{}", text);
    std::fflush(out_);
  } else if (const int tenth = static_cast<int>(std::floor(frac * 10 + 1e-9)); tenth >= next_tenth_ || done == total) {
    fmt::print(out_, "[{}] epoch {} batch {} ({:.0f}%): {:.0f} samples/s, loss {:.4f}, ETA {}\n", stage, t.epoch, t.batch,
               frac * 100, samples_per_s, loss, duration_text(eta_s));
    std::fflush(out_);
    next_tenth_ = tenth + 1;  // integer tenths: 0.1 + 0.1 + 0.1 > 0.3 would skip the 30% line
  }
}

void Progress::line(const std::string& text) {
  if (bar_) fmt::print(out_, "\r\033[K");
  fmt::print(out_, "{}\n", text);
  std::fflush(out_);
}

void Progress::finish_stage() {
  if (bar_) fmt::print(out_, "\n");
  next_tenth_ = 1;
}

namespace callbacks {
Callback progress(std::shared_ptr<Progress> display) {
  struct Run {
    std::int64_t first = 0, target = 0;
    std::chrono::steady_clock::time_point started, last;
  };
  auto run = std::make_shared<Run>();
  return {"progress", [display, run](const EventView& v) -> std::optional<std::string> {
            using Clock = std::chrono::steady_clock;
            if (v.event == Event::fit_start) {
              run->first = v.state.time.batch;
              const auto end = stage_end(v.spec, v.state);
              run->target = end ? end->batch : v.state.time.batch;
              run->started = run->last = Clock::now();
            } else if (v.event == Event::batch_end && v.step) {
              const auto now = Clock::now();
              const double secs = std::chrono::duration<double>(now - run->last).count();
              const double elapsed = std::chrono::duration<double>(now - run->started).count();
              run->last = now;
              const std::int64_t done = v.state.time.batch - run->first, total = run->target - run->first;
              const double eta = done > 0 ? elapsed * static_cast<double>(total - done) / static_cast<double>(done) : 0;
              display->update(v.spec.name, v.state.time, done, total,
                              static_cast<double>(v.step->samples) / std::max(secs, 1e-9), v.step->loss, eta);
            } else if (v.event == Event::fit_end) {
              display->finish_stage();
            }
            return std::nullopt;
          }, /*observer=*/true};
}
}  // namespace callbacks

}  // namespace baton
