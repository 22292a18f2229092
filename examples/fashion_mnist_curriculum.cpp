// The main job: a three-stage curriculum on Fashion-MNIST with a small CNN, chained with and_then.
//
//   warm-up   1 epoch,  SGD lr 0.02 momentum 0.9, batch 128
//   main      2 epochs, SGD lr 0.05 (moments kept), batch 128
//   fine-tune 1 epoch,  SGD lr 0.005 (moments kept), batch 256
//
// Prints the runtime settings, per-stage test accuracy, and ends with `test_accuracy=<value>`.
// Flags: --quick (a 12,000-sample subset, for the test suite), --threads N, --data-dir DIR, --seed S.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include <fmt/format.h>

#include <baton/baton.hpp>

namespace {
struct Args {
  bool quick = false;
  int threads = 0;
  std::uint64_t seed = 42;
  std::string data_dir = baton::data::fashion_mnist_dir.string();
};

baton::Expected<Args> parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> baton::Expected<std::string> {
      if (i + 1 >= argc) return baton::fail(baton::ErrorCode::invalid_argument, arg + " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--quick") {
      a.quick = true;
    } else if (arg == "--threads" || arg == "--seed" || arg == "--data-dir") {
      auto v = value();
      if (!v) return tl::unexpected(v.error());
      if (arg == "--data-dir") a.data_dir = *v;
      else if (arg == "--threads") a.threads = std::atoi(v->c_str());
      else a.seed = std::strtoull(v->c_str(), nullptr, 10);
    } else {
      return baton::fail(baton::ErrorCode::invalid_argument,
                         fmt::format("unknown argument \"{}\"; valid: --quick, --threads N, --seed S, --data-dir DIR", arg));
    }
  }
  return a;
}
}  // namespace

int main(int argc, char** argv) {
  baton::relaunch_with_thread_policy(argv);  // OpenMP's and OpenBLAS's idle threads sleep (runtime.hpp)
  using namespace baton::literals;
  const auto args = parse_args(argc, argv);
  if (!args) { std::cerr << args.error() << '\n'; return 2; }

  const auto runtime = baton::configure_runtime({.threads = args->threads});
  if (!runtime) { std::cerr << runtime.error() << '\n'; return 2; }
  fmt::print("{}\n", runtime->to_string());

  auto train = baton::data::fashion_mnist(baton::Split::train, args->data_dir);
  auto test = baton::data::fashion_mnist(baton::Split::test, args->data_dir);
  if (!train || !test) { std::cerr << (train ? test : train).error() << '\n'; return 2; }
  if (args->quick) { *train = train->head(12000); *test = test->head(2000); }
  fmt::print("data: {} ({} samples), {} ({} samples)\n", train->name, train->size(), test->name, test->size());

  const baton::TrainingSpec warmup{
      .name = "warmup",
      .data = {.train = *train, .batch_size = 128},
      .loss = baton::loss::cross_entropy(),
      .optimizer = baton::optim::sgd({.lr = 0.02, .momentum = 0.9}),
      .optimizer_carry = baton::Carry::fresh,
      .duration = "1ep"_t,
  };
  const auto main_stage = warmup.with_name("main").with_lr(0.05).with_duration("2ep"_t)
                              .with_optimizer_carry(baton::Carry::keep);
  const auto finetune = main_stage.with_name("finetune").with_lr(0.005).with_batch_size(256)
                            .with_duration("1ep"_t);
  const baton::EvalSpec evaluation{.sets = {{"test", *test}}};

  // Each stage is fit, then an evaluation that changes nothing; the first error stops the chain.
  const auto started = std::chrono::steady_clock::now();
  auto report = [&](baton::TrainState state) -> baton::Expected<baton::TrainState> {
    auto metrics = baton::eval(evaluation, state);
    if (!metrics) return tl::unexpected(metrics.error());
    const auto& rec = state.history.back();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    fmt::print("stage {:<9} epoch {} batch {:>5}  train_loss={:.4f}  test_loss={:.4f}  test_accuracy={:.4f}  ({:.0f} s)\n",
               rec.name, state.time.epoch, state.time.batch, rec.last_loss, metrics->at("test").at("loss"),
               metrics->at("test").at("accuracy"), secs);
    std::fflush(stdout);
    return state;
  };

  auto state = baton::init_state(baton::models::small_cnn(), {.seed = args->seed, .max_duration = "4ep"_t});
  auto result = std::move(state)
                    .and_then(baton::stage(warmup)).and_then(report)
                    .and_then(baton::stage(main_stage)).and_then(report)
                    .and_then(baton::stage(finetune)).and_then(report);
  if (!result) { std::cerr << result.error() << '\n'; return 1; }

  auto final_metrics = baton::eval(evaluation, *result);
  if (!final_metrics) { std::cerr << final_metrics.error() << '\n'; return 1; }
  fmt::print("test_accuracy={:.4f}\n", final_metrics->at("test").at("accuracy"));
  return 0;
}
