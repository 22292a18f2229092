// bench_distributed: the CNN (models::small_cnn, global batch 128, SGD momentum) trained by one
// process with 2 intra-op threads against 2 data-parallel processes (c10d Gloo over loopback)
// with 1 thread each, on the same data, order and initial weights. Each side runs in its own
// processes (process settings cannot be undone in-process): this program re-executes itself
// (/proc/self/exe) with a hidden flag and reads the children's result lines. Output:
//
//   dist_cnn one_process_2_threads_samples_per_s=<a> two_processes_1_thread_samples_per_s=<b>
//            ratio=<b/a> allreduce_ms_per_step=<c> allreduce_share=<c/step time>
//            exposed_allreduce_ms_per_step=<x> exposed_allreduce_share=<x/step time>
//            rank_imbalance_ms_per_step=<i> rank0_wait_ms_per_step=<w> rank0_wait_share=<w/step time>
//            comm_threads_cpu_ms_per_step=<t> broadcast_ms_per_step=<d> grad_mb_per_step=<e>
//
// allreduce_ms_per_step is rank 0's wall time from the launch of a step's first gradient bucket
// (during backward: buckets go out as their gradients are ready) to the end of the wait after
// backward. Each rank records its wait after backward in every step, and the two ranks' waits
// of the same step are paired:
//   - exposed_allreduce_ms_per_step: the wait of the rank that finished backward last (the
//     smaller of the two), i.e. the communication that backward did not hide: the time the step
//     lasts beyond the last rank's compute;
//   - rank_imbalance_ms_per_step: the difference of the two waits: how long the rank that
//     finished first waited for the other one's backward (uneven compute, not communication);
//   - rank0_wait_ms_per_step: rank 0's wait, both together (what this line called "exposed"
//     before 2026-12-06).
// comm_threads_cpu_ms_per_step: CPU time per step of each rank's threads other than its main
// one (Gloo's network loop and workers; the TCPStore server on rank 0), mean over the ranks: the
// communication's CPU cost, which on a machine whose cores all compute slows someone's compute.
// Untimed warm-up batches first; the rates are the median of --reps timed repetitions of
// --batches batches each, the per-step figures the means over all timed steps.
//
// Usage: bench_distributed [--smoke] [--batches N] [--reps N]
//   default: 60 batches x 3 reps (about a minute on an idle 2-core machine); --smoke: 3 x 1.

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <baton/baton.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <torch/torch.h>

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::int64_t kBatch = 128;  // the global batch on both sides
constexpr std::uint64_t kSeed = 42;

[[noreturn]] void die(const std::string& what, const baton::Error& e) {
  std::fflush(stdout);
  fmt::print(stderr, "bench_distributed: {}: {}\n", what, e.to_string());
  std::exit(1);
}

baton::Dataset load_train() {
  if (auto real = baton::data::fashion_mnist(baton::Split::train)) return *real;
  torch::manual_seed(1234);  // the files are missing: synthetic data of the same shape
  auto ds = baton::make_dataset(torch::randn({20000, 1, 28, 28}), torch::randint(0, 10, {20000}, torch::kLong), "synthetic");
  if (!ds) die("synthetic data", ds.error());
  return *ds;
}

/// CPU seconds (user + system) of this process's threads other than the main one, from
/// /proc/self/task/<tid>/stat (fields 14 and 15, in clock ticks).
double other_threads_cpu_seconds() {
  namespace fs = std::filesystem;
  const std::string main_tid = std::to_string(::getpid());
  double ticks = 0;
  std::error_code ec;
  for (const auto& task : fs::directory_iterator("/proc/self/task", ec)) {
    if (task.path().filename() == main_tid) continue;
    std::ifstream in(task.path() / "stat");
    std::string line;
    if (!std::getline(in, line)) continue;  // the thread has ended
    const auto name_end = line.rfind(')');
    if (name_end == std::string::npos) continue;
    std::istringstream fields(line.substr(name_end + 2));  // from field 3 (state) on
    std::vector<std::string> f{std::istream_iterator<std::string>(fields), std::istream_iterator<std::string>()};
    if (f.size() > 12) ticks += std::atof(f[11].c_str()) + std::atof(f[12].c_str());
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

/// One side in this process: threads, then warm-up and timed repetitions; prints its line. With
/// a group and `waits_dir`, each rank also writes waits-<rank>.txt there: its other threads' CPU
/// ms per step, then its wait after backward of every timed step (ms), one per line.
int side(int threads, std::int64_t batches, int reps, const std::string& waits_dir) {
  if (auto rt = baton::configure_runtime({.threads = threads}); !rt) die("configure_runtime", rt.error());
  std::shared_ptr<const baton::Distributed> group;
  if (baton::launched_distributed()) {
    auto g = baton::Distributed::join_from_env();
    if (!g) die("join", g.error());
    group = *g;
  }
  const auto data = load_train();
  baton::TrainingSpec spec;
  spec.name = "bench";
  spec.data = {.train = data, .batch_size = kBatch};
  spec.optimizer = baton::optim::sgd({.lr = 0.05, .momentum = 0.9});
  spec.distributed = group;
  // Each step's wait after backward (rank 0's and rank 1's are paired by the parent).
  std::vector<double> waits;
  bool timing = false;
  double waited = 0;
  if (group)
    spec.callbacks.push_back({"step_waits", [&](const baton::EventView& v) -> std::optional<std::string> {
                                if (v.event != baton::Event::batch_end) return std::nullopt;
                                const double now = group->stats().allreduce_wait_seconds;
                                if (timing) waits.push_back((now - waited) * 1000);
                                waited = now;
                                return std::nullopt;
                              }});
  auto st = baton::init_state(baton::models::small_cnn(), {.seed = kSeed, .max_duration = baton::Time::batches(1'000'000)});
  if (!st) die("init_state", st.error());
  auto state = std::move(*st);
  auto train = [&](std::int64_t n) {
    auto r = baton::fit(spec, std::move(state), baton::Time::batches(n));  // the default stage: the whole run
    if (!r) die("fit", r.error());
    state = std::move(*r);
  };
  train(5);  // warm-up
  const auto before = group ? group->stats() : baton::DistStats{};
  const double cpu_before = other_threads_cpu_seconds();
  timing = true;
  std::vector<double> rates;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    train(batches);
    rates.push_back(static_cast<double>(batches * kBatch) / std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(rates.begin(), rates.end());
  const double rate = rates[rates.size() / 2];
  if (group && !waits_dir.empty()) {
    std::ofstream out(std::filesystem::path(waits_dir) / fmt::format("waits-{}.txt", group->rank()));
    out << fmt::format("{:.4f}\n", (other_threads_cpu_seconds() - cpu_before) * 1000 / static_cast<double>(batches * reps));
    for (const double w : waits) out << fmt::format("{:.4f}\n", w);
  }
  if (!group || group->rank() == 0) {
    fmt::print("samples_per_s={:.1f}", rate);
    if (group) {
      const auto s = group->stats();
      const double steps = static_cast<double>(batches) * reps;
      // Per step: one gradient all-reduce call per bucket (+ the small meta tensor).
      fmt::print(" allreduce_ms_per_step={:.3f} wait_ms_per_step={:.3f} broadcast_ms_per_step={:.3f} "
                 "grad_mb_per_step={:.3f}",
                 (s.allreduce_seconds - before.allreduce_seconds) * 1000 / steps,
                 (s.allreduce_wait_seconds - before.allreduce_wait_seconds) * 1000 / steps,
                 (s.broadcast_seconds - before.broadcast_seconds) * 1000 / steps,
                 static_cast<double>(s.allreduce_bytes - before.allreduce_bytes) / steps / 1e6);
    }
    fmt::print("\n");
  }
  return 0;
}

/// Runs this program with `args` (through `baton`-style env for ranks) and returns rank 0's line.
std::string child(const std::vector<std::string>& args, int nproc) {
  std::string cmd;
  if (nproc > 1) {
    // The launcher of baton's CLI would do; a plain shell loop keeps the benchmark self-contained.
    const int port = 20000 + static_cast<int>(::getpid() % 20000);
    for (int r = nproc - 1; r >= 0; --r)
      cmd += fmt::format("RANK={} LOCAL_RANK={} WORLD_SIZE={} MASTER_ADDR=127.0.0.1 MASTER_PORT={} /proc/{}/exe {}{}", r, r,
                         nproc, port, ::getpid(), fmt::join(args, " "), r > 0 ? " >/dev/null & " : "; wait");
  } else {
    cmd = fmt::format("/proc/{}/exe {}", ::getpid(), fmt::join(args, " "));
  }
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {};
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  ::pclose(p);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

double field(const std::string& line, const std::string& key) {
  const auto at = line.find(key + "=");
  return at == std::string::npos ? 0.0 : std::atof(line.c_str() + at + key.size() + 1);
}

/// The per-step figures of the two ranks' files (see side()).
struct Paired {
  double exposed_ms = 0, imbalance_ms = 0, comm_cpu_ms = 0;
  bool ok = false;
};

Paired pair_waits(const std::string& dir) {
  std::vector<std::vector<double>> ranks(2);
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(std::filesystem::path(dir) / fmt::format("waits-{}.txt", r));
    for (double x = 0; in >> x;) ranks[static_cast<std::size_t>(r)].push_back(x);
  }
  Paired p;
  if (ranks[0].size() < 2 || ranks[0].size() != ranks[1].size()) return p;  // a rank failed or differs
  p.comm_cpu_ms = (ranks[0][0] + ranks[1][0]) / 2;
  const std::size_t steps = ranks[0].size() - 1;
  for (std::size_t i = 1; i <= steps; ++i) {
    p.exposed_ms += std::min(ranks[0][i], ranks[1][i]);
    p.imbalance_ms += std::abs(ranks[0][i] - ranks[1][i]);
  }
  p.exposed_ms /= static_cast<double>(steps);
  p.imbalance_ms /= static_cast<double>(steps);
  p.ok = true;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t batches = 60;
  int reps = 3;
  int threads = 0;
  std::string waits_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smoke") batches = 3, reps = 1;
    else if (a == "--batches" && i + 1 < argc) batches = std::atoll(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--side" && i + 1 < argc) threads = std::atoi(argv[++i]);  // hidden: one side
    else if (a == "--waits" && i + 1 < argc) waits_dir = argv[++i];            // hidden: its files
    else {
      fmt::print(stderr, "usage: bench_distributed [--smoke] [--batches N] [--reps N]\n");
      return 2;
    }
  }
  if (batches <= 0 || reps <= 0) {
    fmt::print(stderr, "bench_distributed: --batches and --reps must be positive\n");
    return 2;
  }
  if (threads > 0) return side(threads, batches, reps, waits_dir);
  fmt::print("# CPU: {}\n", baton::cpu_info().to_string());  // speed figures name their machine
  const std::vector<std::string> common = {"--batches", std::to_string(batches), "--reps", std::to_string(reps)};
  auto with = [&](int t) {
    auto v = common;
    v.insert(v.end(), {"--side", std::to_string(t)});
    return v;
  };
  char dir_template[] = "/tmp/bench_distributed.XXXXXX";
  const char* dir = ::mkdtemp(dir_template);
  if (!dir) {
    fmt::print(stderr, "bench_distributed: cannot create a temporary directory\n");
    return 1;
  }
  auto two_args = with(1);
  two_args.insert(two_args.end(), {"--waits", dir});
  const std::string one = child(with(2), 1);
  const std::string two = child(two_args, 2);
  const Paired paired = pair_waits(dir);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);  // ours: made by mkdtemp above
  const double a = field(one, "samples_per_s"), b = field(two, "samples_per_s");
  const double ms = field(two, "allreduce_ms_per_step");
  const double rank0_wait = field(two, "wait_ms_per_step");
  const double step_ms = b > 0 ? 1000.0 * kBatch / b : 0;
  if (a <= 0 || b <= 0 || !paired.ok) {
    fmt::print(stderr, "bench_distributed: a side failed:\n  1 process: {}\n  2 processes: {}{}\n", one, two,
               paired.ok ? "" : "\n  (the ranks' per-step waits are missing or differ in number)");
    return 1;
  }
  fmt::print("dist_cnn one_process_2_threads_samples_per_s={:.1f} two_processes_1_thread_samples_per_s={:.1f} "
             "ratio={:.3f} allreduce_ms_per_step={:.3f} allreduce_share={:.3f} exposed_allreduce_ms_per_step={:.3f} "
             "exposed_allreduce_share={:.3f} rank_imbalance_ms_per_step={:.3f} rank0_wait_ms_per_step={:.3f} "
             "rank0_wait_share={:.3f} comm_threads_cpu_ms_per_step={:.3f} broadcast_ms_per_step={:.3f} "
             "grad_mb_per_step={:.3f}\n",
             a, b, b / a, ms, ms / step_ms, paired.exposed_ms, paired.exposed_ms / step_ms, paired.imbalance_ms, rank0_wait,
             rank0_wait / step_ms, paired.comm_cpu_ms, field(two, "broadcast_ms_per_step"),
             field(two, "grad_mb_per_step"));
  return 0;
}
