// bench_gpt: the fortunes GPT (models::gpt defaults: 4 layers, 4 heads, 128 wide, 128 positions)
// trained with AdamW by baton::fit and by a hand-written LibTorch loop, in the same process,
// interleaved, the same windows in the same order from the same weights. Prints
//   gpt baton_tokens_per_s=<x> handwritten_tokens_per_s=<y> ratio=<x/y>     (goal: >= 0.98)
// and, where the CPU has native bf16 (or on --device cuda), the bf16 line of the same model:
//   gpt_bf16 baton_tokens_per_s=<x> handwritten_tokens_per_s=<y> speedup=<x/y>  (goal: >= 1.5)
// The hand-written side is what a user writes: torch::optim::AdamW, the dataset's windows by
// index (Dataset::gather, as baton's loader does), forward, token cross-entropy, zero_grad,
// backward, step; no loss.item(). benchmarks/bench_gpt.py is the same loop in Python PyTorch.
//
//   build/bench_gpt [--smoke] [--reps N] [--batches N] [--threads N] [--blas-threads N] [--device cuda]
#include <chrono>
#include <cstdio>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "baton/baton.hpp"
#include "baton/text.hpp"

namespace {
using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kSeed = 7;
constexpr double kLr = 3e-4;
constexpr std::int64_t kBatch = 16;

[[noreturn]] void die(const char* what, const baton::Error& e) {
  fmt::print(stderr, "bench_gpt: {}: {}\n", what, e.to_string());
  std::exit(1);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void sync(c10::Device d) {
  if (d.is_cuda()) torch::cuda::synchronize();
}

struct Hand {
  baton::Model model;
  const baton::Dataset& data;
  c10::Device device;
  torch::optim::AdamW opt;
  std::int64_t epoch = 0, pos = 0;
  torch::Tensor order{};

  Hand(baton::Model m, const baton::Dataset& d, c10::Device dev)
      : model(std::move(m)), data(d), device(dev),
        opt(model.module->parameters(), torch::optim::AdamWOptions(kLr).weight_decay(1e-2)) {
    model.module->train(true);
    model.module->to(device);
  }
  std::int64_t train(std::int64_t steps) {
    std::int64_t tokens = 0;
    for (std::int64_t i = 0; i < steps; ++i) {
      if (!order.defined() || pos >= order.size(0)) {
        if (order.defined()) ++epoch;
        order = baton::data::epoch_order(data.size(), kSeed, epoch);
        pos = 0;
      }
      const auto take = std::min(kBatch, order.size(0) - pos);
      auto b = data.gather(order.narrow(0, pos, take), {.seed = kSeed, .epoch = epoch});
      if (!b) die("gather", b.error());
      pos += take;
      const auto x = b->inputs.to(device), y = b->targets.to(device);
      const auto out = model.forward(x);
      const auto loss = torch::nn::functional::cross_entropy(out.reshape({-1, out.size(2)}), y.reshape({-1}));
      opt.zero_grad();
      loss.backward();
      opt.step();
      tokens += y.numel();
    }
    sync(device);
    return tokens;
  }
};

void run(const std::string& name, const baton::Dataset& data, baton::Precision precision, int reps, std::int64_t steps,
         std::int64_t warmup, c10::Device device) {
  const auto factory = baton::models::gpt({});
  auto state = baton::init_state(factory, {.seed = kSeed, .max_duration = baton::Time::batches(1 << 30)});
  if (!state) die("init_state", state.error());
  baton::TrainState copy = *state;
  baton::TrainingSpec spec;
  spec.name = name;
  spec.data = {.train = data, .batch_size = kBatch, .shuffle = true, .drop_last = false};
  spec.data_seed = kSeed;
  spec.loss = baton::loss::token_cross_entropy();
  spec.optimizer = baton::optim::adamw({.lr = kLr});
  spec.duration = baton::Time::fraction(1.0);
  spec.device = device;
  spec = spec.with_precision(precision);
  baton::TrainState s = std::move(*state);
  Hand hand(std::move(copy.model), data, device);
  auto baton_side = [&](std::int64_t n) {
    const auto before = s.time.sample;
    auto r = baton::fit(spec, std::move(s), baton::Time::batches(n));
    if (!r) die("fit", r.error());
    s = std::move(*r);
    sync(device);
    return (s.time.sample - before) * data.input_shape().at(0);
  };
  baton_side(warmup);
  hand.train(warmup);
  std::vector<double> a, b;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    const auto ta = baton_side(steps);
    a.push_back(static_cast<double>(ta) / std::chrono::duration<double>(Clock::now() - t0).count());
    t0 = Clock::now();
    const auto tb = hand.train(steps);
    b.push_back(static_cast<double>(tb) / std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const bool speedup = precision != baton::Precision::fp32;
  fmt::print("{} baton_tokens_per_s={:.0f} handwritten_tokens_per_s={:.0f} {}={:.3f}\n", name, median(a), median(b),
             speedup ? "speedup" : "ratio", median(a) / median(b));
  fmt::print("#   {}: batch {} x 128 tokens, {} warm-up + {} x {} timed batches per side; per-rep tokens/s baton [{:.0f}] "
             "handwritten [{:.0f}]\n",
             name, kBatch, warmup, reps, steps, fmt::join(a, ", "), fmt::join(b, ", "));
  std::fflush(stdout);
}
}  // namespace

int main(int argc, char** argv) {
  baton::relaunch_with_thread_policy(argv);
  bool smoke = false;
  int reps = 5, threads = 0, blas_threads = 0;
  std::int64_t batches = 30;
  std::string device_name = "cpu";
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--smoke") smoke = true;
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--batches") batches = std::stoll(next());
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--blas-threads") blas_threads = std::stoi(next());
    else if (a == "--device") device_name = next();
    else {
      fmt::print(stderr, "usage: bench_gpt [--smoke] [--reps N] [--batches N] [--threads N] [--blas-threads N] [--device cpu|cuda]\n");
      return 2;
    }
  }
  if (smoke) reps = 1, batches = 2;
  const c10::Device device(device_name);
  auto rt = baton::configure_runtime({.threads = threads, .blas_threads = blas_threads});
  if (!rt) die("configure_runtime", rt.error());
  fmt::print("{}\n", rt->to_string());
  auto corpus = baton::text::fortunes({});
  if (!corpus) die("fortunes", corpus.error());
  auto data = baton::text::lm_windows(baton::text::split(*corpus, baton::text::Part::train), {.block_size = 128});
  if (!data) die("lm_windows", data.error());
  fmt::print("# bench_gpt{}: English fortunes, {} windows of 128 bytes; GPT 4x128, AdamW lr {}, seed {}\n", smoke ? " --smoke" : "",
             data->size(), kLr, kSeed);
  const std::int64_t warmup = smoke ? 1 : 5;
  run("gpt", *data, baton::Precision::fp32, reps, batches, warmup, device);
  if (device.is_cuda() || baton::cpu_info().native_bf16) run("gpt_bf16", *data, baton::Precision::bf16, reps, batches, warmup, device);
  else fmt::print("# gpt_bf16: skipped, this CPU has no native bf16 (LibTorch would emulate it: see cnn_bf16 in README.md)\n");
  return 0;
}
