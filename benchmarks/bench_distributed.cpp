// bench_distributed: the CNN (models::small_cnn, global batch 128, SGD momentum) trained by one
// process with 2 intra-op threads against 2 data-parallel processes (c10d Gloo over loopback)
// with 1 thread each, on the same data, order and initial weights. Each side runs in its own
// processes (process settings cannot be undone in-process): this program re-executes itself
// (/proc/self/exe) with a hidden flag and reads the children's result lines. Output:
//
//   dist_cnn one_process_2_threads_samples_per_s=<a> two_processes_1_thread_samples_per_s=<b>
//            ratio=<b/a> allreduce_ms_per_step=<c> allreduce_share=<c/step time>
//            exposed_allreduce_ms_per_step=<x> exposed_allreduce_share=<x/step time>
//            broadcast_ms_per_step=<d> grad_mb_per_step=<e>
//
// allreduce_ms_per_step is rank 0's wall time from the launch of a step's first gradient bucket
// (during backward: buckets go out as their gradients are ready) to the end of the wait after
// backward; exposed_allreduce_ms_per_step is only that wait, the part backward did not hide, and
// exposed_allreduce_share its share of the step. Untimed warm-up batches first; the figure is the median of
// --reps timed repetitions of --batches batches each.
//
// Usage: bench_distributed [--smoke] [--batches N] [--reps N]
//   default: 60 batches x 3 reps (about a minute on an idle 2-core machine); --smoke: 3 x 1.

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

/// One side in this process: threads, then warm-up and timed repetitions; prints its line.
int side(int threads, std::int64_t batches, int reps) {
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
  std::vector<double> rates;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    train(batches);
    rates.push_back(static_cast<double>(batches * kBatch) / std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(rates.begin(), rates.end());
  const double rate = rates[rates.size() / 2];
  if (!group || group->rank() == 0) {
    fmt::print("samples_per_s={:.1f}", rate);
    if (group) {
      const auto s = group->stats();
      const double steps = static_cast<double>(batches) * reps;
      // Per step: one gradient all-reduce call per bucket (+ the small meta tensor).
      fmt::print(" allreduce_ms_per_step={:.3f} exposed_allreduce_ms_per_step={:.3f} broadcast_ms_per_step={:.3f} "
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

}  // namespace

int main(int argc, char** argv) {
  std::int64_t batches = 60;
  int reps = 3;
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smoke") batches = 3, reps = 1;
    else if (a == "--batches" && i + 1 < argc) batches = std::atoll(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--side" && i + 1 < argc) threads = std::atoi(argv[++i]);  // hidden: one side
    else {
      fmt::print(stderr, "usage: bench_distributed [--smoke] [--batches N] [--reps N]\n");
      return 2;
    }
  }
  if (batches <= 0 || reps <= 0) {
    fmt::print(stderr, "bench_distributed: --batches and --reps must be positive\n");
    return 2;
  }
  if (threads > 0) return side(threads, batches, reps);
  const std::vector<std::string> common = {"--batches", std::to_string(batches), "--reps", std::to_string(reps)};
  auto with = [&](int t) {
    auto v = common;
    v.insert(v.end(), {"--side", std::to_string(t)});
    return v;
  };
  const std::string one = child(with(2), 1);
  const std::string two = child(with(1), 2);
  const double a = field(one, "samples_per_s"), b = field(two, "samples_per_s");
  const double ms = field(two, "allreduce_ms_per_step");
  const double exposed = field(two, "exposed_allreduce_ms_per_step");
  const double step_ms = b > 0 ? 1000.0 * kBatch / b : 0;
  if (a <= 0 || b <= 0) {
    fmt::print(stderr, "bench_distributed: a side failed:\n  1 process: {}\n  2 processes: {}\n", one, two);
    return 1;
  }
  fmt::print("dist_cnn one_process_2_threads_samples_per_s={:.1f} two_processes_1_thread_samples_per_s={:.1f} "
             "ratio={:.3f} allreduce_ms_per_step={:.3f} allreduce_share={:.3f} exposed_allreduce_ms_per_step={:.3f} "
             "exposed_allreduce_share={:.3f} broadcast_ms_per_step={:.3f} grad_mb_per_step={:.3f}\n",
             a, b, b / a, ms, step_ms > 0 ? ms / step_ms : 0.0, exposed, step_ms > 0 ? exposed / step_ms : 0.0,
             field(two, "broadcast_ms_per_step"),
             field(two, "grad_mb_per_step"));
  return 0;
}
