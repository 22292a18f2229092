// bench_fit: baton::fit against the hand-written LibTorch loop a competent user would write.
//
// Same model (the same baton factory and the same initial weights: the hand-written side trains
// a deep copy of baton's initial state), same data and data order (baton::data::epoch_order with
// the run's seed), same optimizer (SGD, momentum 0.9) and batch size. Within one case both sides
// run in this process under the same runtime settings (baton::configure_runtime(), called once at
// start), after an untimed warm-up each, in interleaved repetitions (baton, hand-written, baton,
// hand-written, ...); each side's figure is the median over the repetitions. Output, one line per
// case:
//
//   <case> baton_samples_per_s=<x> handwritten_samples_per_s=<y> ratio=<x/y> peak_rss_mb=<z>
//   sam ... ratio=<x/y>                   the mlp with SAM (rho 0.05, two passes a step) on both
//                                         sides: baton's algorithms::sam against SAM written out
//   cnn_channels_last ... speedup=<x/y>   memory_format channels_last
//   cnn_bf16 ... speedup=<x/y>            channels_last with bf16 autocast
//   cnn_bf16_nchw ... speedup=<x/y>       bf16 autocast in NCHW (which layout bf16 wants)
//   cnn_loaded idle_samples_per_s=<a> loaded_samples_per_s=<b> ratio_to_idle=<b/a>
//                                         baton's defaults with a process busy on one core
//   stream_shards shards_samples_per_s=<a> in_memory_samples_per_s=<b> ratio=<a/b> same_bits=<bool>
//                                         the CNN from packed shards on disk with 2 workers (#18)
//   image_folder samples_per_s=<x>        PNGs decoded by 2 threads (an image folder's workers)
//   many_fits baton_1000_fits_s=<a> baton_one_fit_s=<b> ratio=<a/b>        (target: <= 1.10)
//   naive_cnn baton_samples_per_s=<x> handwritten_samples_per_s=<y> ratio=<x/y>
//
// `naive_cnn` compares what a user gets out of the box: baton with configure_runtime() against
// the hand-written CNN loop with LibTorch's default process settings (no configure_runtime, no
// mallopt, no set_num_threads). Process settings cannot be undone in-process, so each side runs
// in its own process: this program re-executes itself (/proc/self/exe) with a hidden flag
// (--baton-cnn or --naive-handwritten-cnn) and reads the child's "samples_per_s=" line.
//
// The hand-written loop does not call loss.item() per step: it has no use for the value, and a
// user timing it would not add one. baton reads the loss each step (its non-finite check and the
// stage record need it), so that cost is part of baton's figure, as it should be.
//
// peak_rss_mb is getrusage(RUSAGE_SELF).ru_maxrss: the high-water mark of the whole process so
// far (both sides and the dataset). Cases run in ascending memory order (tiny, mlp, many_fits,
// cnn) so that each figure is close to that case's own peak; `--case NAME` isolates one case.
//
// `cnn` runs baton in the hand-written loop's layout (contiguous NCHW, fp32): its ratio is
// baton's overhead. `cnn_channels_last` and `cnn_bf16` run baton with those settings against the
// same fp32 NCHW hand-written loop: their speedup is what the setting buys a user.
//
// Usage: bench_fit [--smoke] [--case NAME] [--reps N] [--batches N] [--device cpu|cuda]
//   --threads N intra-op threads (configure_runtime's; default: the cores this process may use)
//   --blas-threads N  OpenBLAS threads (configure_runtime's; default: as many as --threads)
//   --device    where both sides train (the data stays on the CPU and batches are copied over,
//               as in baton); CUDA needs a CUDA LibTorch
//   --smoke     every case with very few batches (< 30 s in all; used as a ctest)
//   --reps N    timed repetitions per side (default 5; smoke 1)
//   --batches N batches per timed repetition (overrides the case's default; many_fits: fits)
//
// Defaults (about 2.5 minutes on an idle 2-core machine; the CPUs must be otherwise idle, other
// load skews the 2-thread runs badly): tiny 3000 batches, mlp 500, cnn 100, naive_cnn 40 per rep,
// many_fits 1000 fits; 20 untimed warm-up batches per side. --smoke: 1 rep, 3 warm-up, tiny 50,
// mlp 10, cnn and naive_cnn 3, many_fits 50 fits (its line then reads baton_50_fits_s).

#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <baton/baton.hpp>
#include <baton/images.hpp>
#include <stb/stb_image_write.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <torch/torch.h>

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kSeed = 42;
constexpr double kLr = 0.05;
constexpr double kMomentum = 0.9;
constexpr std::int64_t kMaxBatches = 1'000'000'000;  // init_state's max: never the limit here
c10::Device g_device(c10::kCPU);  // --device: both sides train there (the data stays on the CPU)

void sync_device() {
  if (g_device.is_cuda()) torch::cuda::synchronize();
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

double peak_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

[[noreturn]] void die(std::string_view what, const baton::Error& e) {
  std::fflush(stdout);
  fmt::print(stderr, "bench_fit: {}: {}\n", what, e.to_string());
  std::exit(1);
}

// ------------------------------------------------------------------------------------- options

enum class Mode { main, baton_cnn, naive_handwritten_cnn };

struct Options {
  Mode mode = Mode::main;
  bool smoke = false;
  std::string only_case;               // empty: every case
  std::optional<int> reps;             // default: 5 (smoke: 1)
  std::optional<std::int64_t> batches;  // default: per case
  std::string device = "cpu";          // --device cpu|cuda
  int threads = 0;                     // --threads: configure_runtime's (0: the cores)
  int blas_threads = 0;                // --blas-threads: configure_runtime's (0: as many as threads)
};

void usage(std::FILE* f) {
  fmt::print(f,
             "usage: bench_fit [--smoke] [--case cnn|cnn_channels_last|cnn_bf16|cnn_bf16_nchw|cnn_loaded|stream_shards|image_folder|mlp|tiny|many_fits|naive_cnn] "
             "[--reps N] [--batches N] [--device cpu|cuda] [--threads N]\n");
}

std::optional<Options> parse_args(int argc, char** argv) {
  Options o;
  const std::vector<std::string> known = {"cnn", "mlp", "tiny", "sam", "many_fits", "naive_cnn", "cnn_channels_last", "cnn_bf16", "cnn_bf16_nchw", "cnn_loaded", "stream_shards", "image_folder"};
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= argc) return std::nullopt;
      return std::string(argv[++i]);
    };
    auto positive = [&](std::string_view flag) -> std::optional<std::int64_t> {
      const auto v = value();
      char* end = nullptr;
      const long long n = v ? std::strtoll(v->c_str(), &end, 10) : 0;
      if (!v || end == v->c_str() || *end != '\0' || n <= 0) {
        fmt::print(stderr, "bench_fit: {} needs a positive integer\n", flag);
        return std::nullopt;
      }
      return static_cast<std::int64_t>(n);
    };
    if (a == "--smoke") {
      o.smoke = true;
    } else if (a == "--case") {
      const auto v = value();
      if (!v || std::find(known.begin(), known.end(), *v) == known.end()) {
        fmt::print(stderr, "bench_fit: --case needs one of {}\n", fmt::join(known, ", "));
        return std::nullopt;
      }
      o.only_case = *v;
    } else if (a == "--reps") {
      const auto n = positive(a);
      if (!n) return std::nullopt;
      o.reps = static_cast<int>(*n);
    } else if (a == "--batches") {
      const auto n = positive(a);
      if (!n) return std::nullopt;
      o.batches = *n;
    } else if (a == "--threads") {
      const auto n = positive(a);
      if (!n) return std::nullopt;
      o.threads = static_cast<int>(*n);
    } else if (a == "--blas-threads") {
      const auto n = positive(a);
      if (!n) return std::nullopt;
      o.blas_threads = static_cast<int>(*n);
    } else if (a == "--device") {
      const auto v = value();
      if (!v || (*v != "cpu" && *v != "cuda")) {
        fmt::print(stderr, "bench_fit: --device needs cpu or cuda\n");
        return std::nullopt;
      }
      o.device = *v;
    } else if (a == "--baton-cnn") {  // hidden: one side of naive_cnn
      o.mode = Mode::baton_cnn;
    } else if (a == "--naive-handwritten-cnn") {  // hidden: the other side of naive_cnn
      o.mode = Mode::naive_handwritten_cnn;
    } else if (a == "--help" || a == "-h") {
      usage(stdout);
      std::exit(0);
    } else {
      fmt::print(stderr, "bench_fit: unknown argument \"{}\"\n", a);
      return std::nullopt;
    }
  }
  return o;
}

// ---------------------------------------------------------------------------------------- data

/// Fashion-MNIST train, or (when its files are missing) a synthetic dataset of the same shape.
/// Says which on `log`.
baton::Dataset load_train(std::FILE* log) {
  auto real = baton::data::fashion_mnist(baton::Split::train);
  if (real) {
    fmt::print(log, "# data: {} ({} samples, inputs [{}, 1, 28, 28] float32)\n", real->name,
               real->size(), real->size());
    return *real;
  }
  constexpr std::int64_t n = 60000;
  fmt::print(log,
             "# data: Fashion-MNIST unavailable ({}); using SYNTHETIC data of the same shape: "
             "inputs randn [{}, 1, 28, 28], labels uniform in [0, 10)\n",
             real.error().to_string(), n);
  torch::manual_seed(1234);
  auto inputs = torch::randn({n, 1, 28, 28});
  auto targets = torch::randint(0, 10, {n}, torch::kLong);
  auto ds = baton::make_dataset(std::move(inputs), std::move(targets), "synthetic-fashion-mnist-shape");
  if (!ds) die("synthetic data", ds.error());
  return *ds;
}

// ------------------------------------------------------------------------------ the two sides

baton::TrainingSpec make_spec(const std::string& name, const baton::Dataset& data, std::int64_t batch) {
  baton::TrainingSpec spec;
  spec.name = name;
  spec.data = {.train = data, .batch_size = batch, .shuffle = true, .drop_last = false};
  spec.loss = baton::loss::cross_entropy();
  spec.optimizer = baton::optim::sgd({.lr = kLr, .momentum = kMomentum});
  spec.duration = baton::Time::fraction(1.0);  // one stage for the whole run: fits take budgets
  spec.data_seed = kSeed;  // the same order as the hand-written side: epoch_order(n, kSeed, epoch)
  spec.device = g_device;
  return spec;
}

baton::TrainState fresh_state(const baton::ModelFactory& factory) {
  auto st = baton::init_state(factory, {.seed = kSeed, .max_duration = baton::Time::batches(kMaxBatches)});
  if (!st) die("init_state", st.error());
  return std::move(*st);
}

/// baton's side: `fit` for a number of batches, the state moved through.
class BatonSide {
 public:
  BatonSide(baton::TrainingSpec spec, baton::TrainState state)
      : spec_(std::move(spec)), state_(std::move(state)) {}

  /// Trains `steps` batches with one call of fit; returns {samples, seconds}.
  std::pair<std::int64_t, double> train(std::int64_t steps) {
    const std::int64_t before = state_.time.sample;
    const auto t0 = Clock::now();
    auto r = baton::fit(spec_, std::move(state_), baton::Time::batches(steps));
    if (!r) die("fit", r.error());
    state_ = std::move(*r);
    sync_device();
    const double secs = seconds_since(t0);
    return {state_.time.sample - before, secs};
  }

  [[nodiscard]] const baton::TrainState& state() const { return state_; }

 private:
  baton::TrainingSpec spec_;
  baton::TrainState state_;
};

/// The hand-written loop: torch::optim::SGD, a permutation per epoch, index_select, forward,
/// cross_entropy, zero_grad, backward, step. No loss.item() (see the file comment).
class Handwritten {
 public:
  /// `sam_rho` > 0: SAM's two passes per step, written out (the `sam` case).
  Handwritten(baton::Model model, const baton::Dataset& data, std::int64_t batch, double sam_rho = 0)
      : model_(std::move(model)),
        inputs_(data.inputs),
        targets_(data.targets),
        n_(data.size()),
        batch_(batch),
        optimizer_(model_.module->parameters(), torch::optim::SGDOptions(kLr).momentum(kMomentum)),
        sam_rho_(sam_rho) {
    model_.module->train(true);
    model_.module->to(g_device);
  }

  /// Trains `steps` batches; returns {samples, seconds}.
  std::pair<std::int64_t, double> train(std::int64_t steps) {
    std::int64_t seen = 0;
    const auto t0 = Clock::now();
    for (std::int64_t i = 0; i < steps; ++i) {
      if (pos_ >= n_) {  // epoch end
        ++epoch_;
        pos_ = 0;
        order_ = torch::Tensor();
      }
      if (!order_.defined()) order_ = baton::data::epoch_order(n_, kSeed, epoch_);
      const std::int64_t take = std::min(batch_, n_ - pos_);
      const auto idx = order_.narrow(0, pos_, take);
      auto x = inputs_.index_select(0, idx);
      auto y = targets_.index_select(0, idx);
      if (g_device.is_cuda()) x = x.to(g_device, true), y = y.to(g_device, true);
      const auto out = model_.forward(x);
      const auto loss = torch::nn::functional::cross_entropy(out, y);
      optimizer_.zero_grad();
      loss.backward();
      if (sam_rho_ > 0) sam_second_pass(x, y);
      optimizer_.step();
      pos_ += take;
      seen += take;
    }
    sync_device();
    return {seen, seconds_since(t0)};
  }

  [[nodiscard]] const baton::Model& model() const { return model_; }

 private:
  /// SAM (Foret et al. 2021), as the reference implementations write it: up the gradient by
  /// rho / ||g||, the gradient there, the weights back.
  void sam_second_pass(const torch::Tensor& x, const torch::Tensor& y) {
    auto params = model_.module->parameters();
    std::vector<torch::Tensor> saved, norms;
    {
      torch::NoGradGuard no_grad;
      for (auto& p : params) norms.push_back(p.grad().norm(2));
      const double scale = sam_rho_ / (torch::stack(norms).norm(2).item<double>() + 1e-12);
      for (auto& p : params) saved.push_back(p.clone()), p.add_(p.grad() * scale);
    }
    optimizer_.zero_grad();
    torch::nn::functional::cross_entropy(model_.forward(x), y).backward();
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(saved[i]);
  }

  baton::Model model_;
  torch::Tensor inputs_, targets_;
  std::int64_t n_, batch_;
  torch::optim::SGD optimizer_;
  double sam_rho_;
  torch::Tensor order_;
  std::int64_t epoch_ = 0, pos_ = 0;
};

/// Largest absolute difference between the two sides' parameters (same names, same order).
double max_param_diff(const torch::nn::Module& a, const torch::nn::Module& b) {
  const auto pa = a.named_parameters();
  const auto pb = b.named_parameters();
  double d = 0;
  for (const auto& item : pa) {
    const auto* other = pb.find(item.key());
    if (other == nullptr) return std::numeric_limits<double>::infinity();
    d = std::max(d, (item.value() - *other).abs().max().item<double>());
  }
  return d;
}

// ---------------------------------------------------------------------------------------- cases

struct PairCase {
  std::string name;
  baton::ModelFactory factory;
  std::int64_t batch;
  std::int64_t batches;  // per timed repetition (full run)
  std::int64_t smoke_batches;
  /// baton's settings for this case (the hand-written side is always fp32 NCHW).
  std::function<baton::TrainingSpec(baton::TrainingSpec)> tune = {};
  /// The line says speedup= (what baton's setting buys) instead of ratio= (baton's overhead).
  bool speedup = false;
  double sam_rho = 0;  ///< > 0: both sides train with SAM (baton: algorithms::sam)
};

struct Settings {
  int reps;
  std::int64_t warmup;
  bool smoke;
  std::optional<std::int64_t> batches;
};

std::int64_t batches_for(const PairCase& c, const Settings& s) {
  if (s.batches) return *s.batches;
  return s.smoke ? c.smoke_batches : c.batches;
}

void run_pair_case(const PairCase& c, const baton::Dataset& data, const Settings& s) {
  const std::int64_t steps = batches_for(c, s);
  baton::TrainState state = fresh_state(c.factory);
  baton::TrainState copy = state;  // deep copy: the hand-written side starts from the same weights
  baton::TrainingSpec spec = make_spec(c.name, data, c.batch);
  if (c.tune) spec = c.tune(std::move(spec));
  if (c.sam_rho > 0) spec = spec.with_algorithms({baton::algorithms::sam({.rho = c.sam_rho})});
  BatonSide bat(std::move(spec), std::move(state));
  Handwritten hand(std::move(copy.model), data, c.batch, c.sam_rho);

  bat.train(s.warmup);
  hand.train(s.warmup);
  std::vector<double> bat_sps, hand_sps;
  for (int r = 0; r < s.reps; ++r) {
    const auto [bn, bt] = bat.train(steps);
    bat_sps.push_back(static_cast<double>(bn) / bt);
    const auto [hn, ht] = hand.train(steps);
    hand_sps.push_back(static_cast<double>(hn) / ht);
  }
  const double x = median(bat_sps), y = median(hand_sps);
  fmt::print("{} baton_samples_per_s={:.1f} handwritten_samples_per_s={:.1f} {}={:.3f} peak_rss_mb={:.1f}\n",
             c.name, x, y, c.speedup ? "speedup" : "ratio", x / y, peak_rss_mb());
  fmt::print("#   {}: batch {}, {} warm-up + {} x {} timed batches per side; per-rep samples/s baton [{:.1f}] "
             "handwritten [{:.1f}]; max |param diff| after equal steps = {:.3g}\n",
             c.name, c.batch, s.warmup, s.reps, steps, fmt::join(bat_sps, ", "), fmt::join(hand_sps, ", "),
             max_param_diff(*bat.state().model.module, *hand.model().module));
  std::fflush(stdout);
}

constexpr std::int64_t kCnnBatch = 128;

/// A process that keeps one core busy: the last core this process may use.
pid_t start_busy_core() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int last = 0;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) last = c;
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {  // child: pinned, spinning, until killed
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(last, &one);
    sched_setaffinity(0, sizeof one, &one);
    volatile unsigned long spin = 0;
    for (;;) spin = spin + 1;
  }
  return pid;
}

/// baton's default CNN (fp32, memory_format automatic) with another process busy on one core, against the
/// same on the idle machine: interleaved repetitions, the median of each.
void run_cnn_loaded(const baton::Dataset& data, const Settings& s) {
  const std::int64_t steps = s.batches ? *s.batches : (s.smoke ? 3 : 30);
  BatonSide bat(make_spec("cnn_loaded", data, kCnnBatch), fresh_state(baton::models::small_cnn()));
  bat.train(s.warmup);
  std::vector<double> idle, loaded;
  for (int r = 0; r < s.reps; ++r) {
    const auto [n, t] = bat.train(steps);
    idle.push_back(static_cast<double>(n) / t);
    const pid_t busy = start_busy_core();
    if (busy < 0) die("fork", baton::Error{baton::ErrorCode::runtime, std::strerror(errno), {}});
    bat.train(3);  // untimed: the scheduler places the busy process first
    const auto [ln, lt] = bat.train(steps);
    loaded.push_back(static_cast<double>(ln) / lt);
    kill(busy, SIGKILL);
    waitpid(busy, nullptr, 0);
  }
  const double x = median(idle), y = median(loaded);
  fmt::print("cnn_loaded idle_samples_per_s={:.1f} loaded_samples_per_s={:.1f} ratio_to_idle={:.3f}\n", x, y, y / x);
  fmt::print("#   cnn_loaded: baton's defaults (fp32, memory_format automatic, {}), batch {}, {} x {} batches each; "
             "loaded = another process spinning on the last core; per-rep idle [{:.1f}] loaded [{:.1f}]\n",
             baton::thread_wait_policy(), kCnnBatch, s.reps, steps, fmt::join(idle, ", "), fmt::join(loaded, ", "));
  std::fflush(stdout);
}

/// The CNN trained from packed shards on disk (8-bit pixels, read with pread) with 2 workers,
/// against the same CNN on the in-memory dataset, interleaved; both sides train the same bits.
void run_stream_shards(const baton::Dataset& data, const Settings& s) {
  const std::int64_t steps = s.batches ? *s.batches : (s.smoke ? 3 : 100);
  char tmpl[] = "/tmp/bench-shards-XXXXXX";
  const char* made = ::mkdtemp(tmpl);
  if (made == nullptr) die("mkdtemp", baton::Error{baton::ErrorCode::io, std::strerror(errno), {}});
  const std::filesystem::path dir = made;
  const bool pixels = data.name.rfind("fashion-mnist", 0) == 0;  // the synthetic stand-in is not pixels
  const auto t0 = Clock::now();
  auto packed = baton::data::pack(data, dir / "train", {.pixels = pixels ? std::optional(baton::data::ImageOptions{}) : std::nullopt});
  if (!packed) die("pack", packed.error());
  const double pack_s = seconds_since(t0);
  auto shards = baton::data::shards(dir / "train");
  if (!shards) die("shards", shards.error());
  auto spec = make_spec("stream_shards", data, kCnnBatch).with_memory_format(baton::MemoryFormat::contiguous);
  auto on_disk = spec.with_train_data(*shards);
  auto dd = on_disk.data;
  dd.workers = std::getenv("BATON_BENCH_WORKERS") ? std::atoi(std::getenv("BATON_BENCH_WORKERS")) : 2;  // as #18 asks
  BatonSide mem(spec, fresh_state(baton::models::small_cnn()));
  BatonSide disk(on_disk.with_data(dd), fresh_state(baton::models::small_cnn()));
  mem.train(s.warmup);
  disk.train(s.warmup);
  std::vector<double> mem_sps, disk_sps;
  for (int r = 0; r < s.reps; ++r) {
    const auto [dn, dt] = disk.train(steps);
    disk_sps.push_back(static_cast<double>(dn) / dt);
    const auto [mn, mt] = mem.train(steps);
    mem_sps.push_back(static_cast<double>(mn) / mt);
  }
  const bool same = baton::bitwise_equal(mem.state(), disk.state());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);  // made above
  const double x = median(disk_sps), y = median(mem_sps);
  fmt::print("stream_shards shards_samples_per_s={:.1f} in_memory_samples_per_s={:.1f} ratio={:.3f} same_bits={} "
             "peak_rss_mb={:.1f}\n", x, y, x / y, same, peak_rss_mb());
  fmt::print("#   stream_shards: small_cnn, batch {}, {} x {} batches per side; {} shards ({:.1f} MB, {}) packed in {:.1f} s; "
             "{} workers; per-rep samples/s shards [{:.1f}] in memory [{:.1f}]\n",
             kCnnBatch, s.reps, steps, packed->shards, static_cast<double>(packed->bytes) / 1e6,
             pixels ? "8-bit pixels" : "float32", pack_s, dd.workers, fmt::join(disk_sps, ", "), fmt::join(mem_sps, ", "));
  std::fflush(stdout);
  if (!same) die("stream_shards", baton::Error{baton::ErrorCode::runtime, "shards and memory trained different bits", {}});
}

/// Decoding an image folder of PNGs (Fashion-MNIST's first training images, written here): two
/// threads each making batches of 128 from its half, as two data workers do.
void run_image_folder(const Settings& s) {
  const std::int64_t n = s.smoke ? 256 : 4096;
  auto raw = baton::data::read_idx(baton::data::fashion_mnist_dir / "train-images-idx3-ubyte.gz");
  auto labels = baton::data::read_idx(baton::data::fashion_mnist_dir / "train-labels-idx1-ubyte.gz");
  if (!raw || !labels) {
    fmt::print("# image_folder: skipped, Fashion-MNIST is not installed\n");
    return;
  }
  char tmpl[] = "/tmp/bench-images-XXXXXX";
  const char* made = ::mkdtemp(tmpl);
  if (made == nullptr) die("mkdtemp", baton::Error{baton::ErrorCode::io, std::strerror(errno), {}});
  const std::filesystem::path dir = made;
  const auto px = raw->narrow(0, 0, n).contiguous();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto cls = dir / fmt::format("{}", (*labels)[i].item<int>());
    std::filesystem::create_directories(cls);
    if (stbi_write_png((cls / fmt::format("{:05d}.png", i)).c_str(), 28, 28, 1, px[i].data_ptr<unsigned char>(), 28) == 0)
      die("stbi_write_png", baton::Error{baton::ErrorCode::io, "cannot write a PNG", {}});
  }
  auto folder = baton::data::image_folder({.root = dir});
  if (!folder) die("image_folder", folder.error());
  std::vector<double> rates;
  for (int r = 0; r < std::max(s.reps, 1); ++r) {
    const auto t0 = Clock::now();
    std::vector<std::thread> workers;
    for (std::int64_t w = 0; w < 2; ++w)
      workers.emplace_back([&, w] {
        for (std::int64_t i = w * n / 2; i < (w + 1) * n / 2; i += kCnnBatch)
          if (!folder->dataset.range(i, std::min(kCnnBatch, (w + 1) * n / 2 - i))) std::abort();
      });
    for (auto& t : workers) t.join();
    rates.push_back(static_cast<double>(n) / seconds_since(t0));
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);  // made above
  fmt::print("image_folder samples_per_s={:.1f}\n", median(rates));
  fmt::print("#   image_folder: {} 28x28 grey PNGs decoded (stb_image) and scaled, 2 threads, batches of {}; per-rep [{:.1f}]\n",
             n, kCnnBatch, fmt::join(rates, ", "));
  std::fflush(stdout);
}

void run_many_fits(const baton::Dataset& data, const Settings& s) {
  const std::int64_t fits = s.batches ? *s.batches : (s.smoke ? 50 : 1000);
  const auto spec = make_spec("many_fits", data, 128);
  baton::TrainState state = fresh_state(baton::models::mlp({784, 256, 128, 10}));

  auto chained = [&](std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) {
      auto r = baton::fit(spec, std::move(state), baton::Time::batches(1));
      if (!r) die("fit", r.error());
      state = std::move(*r);
    }
  };
  chained(s.warmup);
  std::vector<double> many_s, one_s;
  for (int r = 0; r < s.reps; ++r) {
    auto t0 = Clock::now();
    chained(fits);
    many_s.push_back(seconds_since(t0));
    t0 = Clock::now();
    auto res = baton::fit(spec, std::move(state), baton::Time::batches(fits));
    if (!res) die("fit", res.error());
    state = std::move(*res);
    one_s.push_back(seconds_since(t0));
  }
  const double a = median(many_s), b = median(one_s);
  fmt::print("many_fits baton_{}_fits_s={:.3f} baton_one_fit_s={:.3f} ratio={:.3f}\n", fits, a, b, a / b);
  fmt::print("#   many_fits: mlp batch 128, {} fits of 1ba vs one fit of {}ba, {} reps; per-rep s chained [{:.3f}] "
             "one [{:.3f}]; target ratio <= 1.10; state.history has {} records\n",
             fits, fits, s.reps, fmt::join(many_s, ", "), fmt::join(one_s, ", "), state.history.size());
  std::fflush(stdout);
}

// ------------------------------------------------------------------- naive_cnn (two processes)

constexpr std::int64_t kNaiveBatches = 40;
constexpr std::int64_t kNaiveSmokeBatches = 3;

/// Child process, either side: trains the CNN and prints "samples_per_s=<x> threads=<t>".
int run_cnn_child(Mode mode, const Settings& s) {
  const std::int64_t steps = s.batches ? *s.batches : (s.smoke ? kNaiveSmokeBatches : kNaiveBatches);
  if (mode == Mode::baton_cnn) {
    auto rt = baton::configure_runtime();
    if (!rt) die("configure_runtime", rt.error());
    fmt::print(stderr, "#   naive_cnn baton process: {}\n", rt->to_string());
  } else {
    fmt::print(stderr, "#   naive_cnn handwritten process: LibTorch defaults, {} intra-op threads\n",
               torch::get_num_threads());
  }
  const baton::Dataset data = load_train(stderr);
  baton::TrainState state = fresh_state(baton::models::small_cnn());
  std::vector<double> sps;
  if (mode == Mode::baton_cnn) {
    BatonSide bat(make_spec("cnn", data, kCnnBatch), std::move(state));
    bat.train(s.warmup);
    for (int r = 0; r < s.reps; ++r) {
      const auto [n, t] = bat.train(steps);
      sps.push_back(static_cast<double>(n) / t);
    }
  } else {
    Handwritten hand(std::move(state.model), data, kCnnBatch);
    hand.train(s.warmup);
    for (int r = 0; r < s.reps; ++r) {
      const auto [n, t] = hand.train(steps);
      sps.push_back(static_cast<double>(n) / t);
    }
  }
  fmt::print("samples_per_s={:.3f} threads={} peak_rss_mb={:.1f}\n", median(sps), torch::get_num_threads(),
             peak_rss_mb());
  return 0;
}

struct ChildOutput {
  bool ok = false;
  std::string out;
  std::string why;
};

/// Runs this program again (/proc/self/exe) with `args`, capturing its stdout (stderr passes
/// through).
ChildOutput run_self(const std::vector<std::string>& args, bool libtorch_defaults) {
  std::string exe = "/proc/self/exe";
  // The hand-written side of naive_cnn runs with LibTorch's defaults: without the OpenMP wait
  // policy baton's relaunch put in this process's environment.
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e)
    if (!libtorch_defaults || std::strncmp(*e, "GOMP_SPINCOUNT=", 15) != 0) envp.push_back(*e);
  envp.push_back(nullptr);
  std::vector<std::string> storage = args;
  std::vector<char*> argv;
  argv.push_back(exe.data());
  for (auto& a : storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  int fds[2];
  if (pipe(fds) != 0) return {false, {}, fmt::format("pipe: {}", std::strerror(errno))};
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return {false, {}, fmt::format("fork: {}", std::strerror(errno))};
  }
  if (pid == 0) {  // child: only async-signal-safe calls until exec
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    execve("/proc/self/exe", argv.data(), envp.data());
    _exit(127);
  }
  close(fds[1]);
  ChildOutput res;
  char buf[4096];
  for (;;) {
    const ssize_t k = read(fds[0], buf, sizeof buf);
    if (k > 0) {
      res.out.append(buf, static_cast<std::size_t>(k));
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    res.ok = true;
  } else {
    res.why = WIFEXITED(status) ? fmt::format("exit status {}", WEXITSTATUS(status))
                                : fmt::format("killed by signal {}", WIFSIGNALED(status) ? WTERMSIG(status) : -1);
  }
  return res;
}

/// The number after "key=" in `text`; NaN when absent.
double field(const std::string& text, std::string_view key) {
  const auto at = text.find(std::string(key) + "=");
  if (at == std::string::npos) return std::nan("");
  const char* begin = text.c_str() + at + key.size() + 1;
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  return end == begin ? std::nan("") : v;
}

bool run_naive_cnn(const Settings& s) {
  std::vector<std::string> common = {"--reps", std::to_string(s.reps)};
  if (s.smoke) common.emplace_back("--smoke");
  if (s.batches) common.insert(common.end(), {"--batches", std::to_string(*s.batches)});
  auto with = [&](std::string flag) {
    auto v = common;
    v.insert(v.begin(), std::move(flag));
    return v;
  };
  const ChildOutput b = run_self(with("--baton-cnn"), false);
  const ChildOutput h = run_self(with("--naive-handwritten-cnn"), true);
  const double x = b.ok ? field(b.out, "samples_per_s") : std::nan("");
  const double y = h.ok ? field(h.out, "samples_per_s") : std::nan("");
  if (!std::isfinite(x) || !std::isfinite(y) || y <= 0) {
    fmt::print("naive_cnn error: baton process {} ({}), handwritten process {} ({})\n", b.ok ? "ok" : "failed",
               b.ok ? b.out : b.why, h.ok ? "ok" : "failed", h.ok ? h.out : h.why);
    return false;
  }
  fmt::print("naive_cnn baton_samples_per_s={:.1f} handwritten_samples_per_s={:.1f} ratio={:.3f}\n", x, y, x / y);
  fmt::print("#   naive_cnn: separate processes, batch {}, {} reps; baton {} intra-op threads, peak {:.1f} MB; "
             "handwritten (LibTorch defaults) {} intra-op threads, peak {:.1f} MB\n",
             kCnnBatch, s.reps, field(b.out, "threads"), field(b.out, "peak_rss_mb"), field(h.out, "threads"),
             field(h.out, "peak_rss_mb"));
  std::fflush(stdout);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const auto opts = parse_args(argc, argv);
  if (!opts) {
    usage(stderr);
    return 2;
  }
  // baton's OpenMP wait policy (runtime.hpp), as the baton command has it; not for the side that
  // stands for LibTorch's defaults.
  if (opts->mode != Mode::naive_handwritten_cnn) baton::relaunch_with_thread_policy(argv);
  const Settings settings{
      .reps = opts->reps.value_or(opts->smoke ? 1 : 5),
      .warmup = opts->smoke ? 3 : 20,
      .smoke = opts->smoke,
      .batches = opts->batches,
  };
  if (opts->mode != Mode::main) return run_cnn_child(opts->mode, settings);
  g_device = c10::Device(opts->device);
  if (g_device.is_cuda() && !torch::cuda::is_available()) {
    fmt::print(stderr, "bench_fit: --device cuda, but this LibTorch has no CUDA device\n");
    return 2;
  }

  // The same process settings for both sides of every in-process ratio.
  auto rt = baton::configure_runtime({.threads = opts->threads, .blas_threads = opts->blas_threads});
  if (!rt) {
    fmt::print("# configure_runtime failed: {}; continuing without requiring OpenBLAS (figures are not "
               "representative)\n",
               rt.error().to_string());
    rt = baton::configure_runtime({.threads = opts->threads, .blas_threads = opts->blas_threads, .require_openblas = false});
    if (!rt) die("configure_runtime", rt.error());
  }
  fmt::print("{}\n", rt->to_string());
  fmt::print("# bench_fit{}: seed {}, SGD lr {} momentum {}, {} rep(s), {} warm-up batches per side\n",
             settings.smoke ? " --smoke" : "", kSeed, kLr, kMomentum, settings.reps, settings.warmup);
  std::fflush(stdout);

  const auto wanted = [&](std::string_view name) { return opts->only_case.empty() || opts->only_case == name; };
  const bool need_data = opts->only_case != "naive_cnn";
  const baton::Dataset data = need_data ? load_train(stdout) : baton::Dataset{};

  // Ascending peak memory, so that each case's peak_rss_mb is about its own (see the top).
  const std::vector<PairCase> cases = {
      {"tiny", baton::models::mlp({784, 32, 10}), 32, 3000, 50},
      {"mlp", baton::models::mlp({784, 256, 128, 10}), 128, 500, 10},
      {"sam", baton::models::mlp({784, 256, 128, 10}), 128, 250, 10, {}, false, 0.05},
  };
  for (const auto& c : cases)
    if (wanted(c.name)) run_pair_case(c, data, settings);
  if (wanted("many_fits")) run_many_fits(data, settings);
  // cnn: the same layout as the hand-written loop (baton's overhead); the others: what
  // channels_last and bf16 autocast buy against that loop.
  const auto with = [](baton::Precision p, baton::MemoryFormat f) {
    return [p, f](baton::TrainingSpec sp) { return sp.with_precision(p).with_memory_format(f); };
  };
  const std::vector<PairCase> cnn_cases = {
      {"cnn", baton::models::small_cnn(), kCnnBatch, 100, 3, with(baton::Precision::fp32, baton::MemoryFormat::contiguous), false},
      {"cnn_channels_last", baton::models::small_cnn(), kCnnBatch, 100, 3, with(baton::Precision::fp32, baton::MemoryFormat::channels_last), true},
      {"cnn_bf16", baton::models::small_cnn(), kCnnBatch, 100, 3, with(baton::Precision::bf16, baton::MemoryFormat::channels_last), true},
      {"cnn_bf16_nchw", baton::models::small_cnn(), kCnnBatch, 100, 3, with(baton::Precision::bf16, baton::MemoryFormat::contiguous), true},
  };
  for (const auto& c : cnn_cases)
    if (wanted(c.name)) run_pair_case(c, data, settings);
  if (wanted("cnn_loaded")) run_cnn_loaded(data, settings);
  if (wanted("stream_shards")) run_stream_shards(data, settings);
  if (wanted("image_folder")) run_image_folder(settings);
  bool ok = true;
  if (wanted("naive_cnn")) ok = run_naive_cnn(settings);
  return ok ? 0 : 1;
}
