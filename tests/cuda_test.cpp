// The CUDA paths. Hidden tests ([.cuda]): a CPU-only LibTorch cannot run them, so they are not
// registered with CTest; run them on a CUDA machine with `baton_tests [cuda]`
// (scripts/cuda-check.sh). On a machine without CUDA they fail rather than pass.
#include <cstdio>
#include <cstdlib>

#include <baton/testing_catch.hpp>
#include <torch/cuda.h>

#include "helpers.hpp"

using baton::Precision;
using baton::Time;
using test::ok;

namespace {
const c10::Device kCuda("cuda:0");

baton::ModelFactory cuda_cnn() {
  return baton::model_factory([] {
    namespace nn = torch::nn;
    return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 8, 3).padding(1)), nn::BatchNorm2d(8), nn::ReLU(),
                          nn::Flatten(), nn::Dropout(0.1), nn::Linear(8 * 8 * 8, 3));
  });
}
baton::TrainState state() {
  auto s = baton::init_state(cuda_cnn(), {.seed = 1, .max_duration = Time::epochs(4)});
  REQUIRE(s.has_value());
  return std::move(*s);
}
baton::TrainingSpec spec(Precision p) {
  static const auto data = test::images(256);
  auto sp = baton::TrainingSpec{.name = "cuda",
                                .data = {.train = data, .batch_size = 32},
                                .optimizer = baton::optim::adam({.lr = 0.01}),
                                .duration = Time::epochs(2),
                                .precision = p};
  return sp.with_device(kCuda);
}
bool on_cuda(const baton::TrainState& s) {
  for (const auto& [name, t] : s.named_parameters())
    if (!t.is_cuda()) return false;
  return true;
}
}  // namespace

TEST_CASE("CUDA: fit trains on the GPU, in every precision", "[.cuda]") {
  REQUIRE(torch::cuda::is_available());
  for (auto p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    auto sp = spec(p);
    if (p == Precision::fp16) sp = sp.with_loss_scaling(baton::LossScaling{});
    const auto s = ok(baton::fit(sp, state()));
    CHECK(on_cuda(s));
    CHECK(s.history.back().last_loss < 0.5 * std::log(3.0));
    if (p == Precision::fp16) {
      REQUIRE(s.loss_scale.has_value());
      CHECK(s.loss_scale->scale > 0);
    }
  }
}

TEST_CASE("CUDA: train_step takes a CPU state and batch to the GPU, and is pure there", "[.cuda]") {
  REQUIRE(torch::cuda::is_available());
  const auto sp = spec(Precision::fp32);
  const auto s0 = state();
  const baton::Batch batch{sp.data.train.inputs.narrow(0, 0, 32), sp.data.train.targets.narrow(0, 0, 32)};
  const auto a = baton::train_step(sp, s0, batch);
  const auto b = baton::train_step(sp, s0, batch);
  REQUIRE(a.has_value());
  REQUIRE(b.has_value());
  CHECK(on_cuda(a->state));
  CHECK_FALSE(on_cuda(s0));  // the state given by copy is not changed
  REQUIRE(baton::bitwise_equal(a->state, b->state));
}

TEST_CASE("CUDA: a state with EMA, SWA and keep_best tensors from the CPU goes on training on the GPU", "[.cuda]") {
  REQUIRE(torch::cuda::is_available());
  namespace algo = baton::algorithms;
  const auto algos = std::vector<baton::Algorithm>{algo::ema(), algo::swa({.start = 0.0})};
  const auto gpu = spec(Precision::fp32).with_algorithms(algos);  // 2 epochs
  // The stage's first epoch on the CPU: every tensor there, as a checkpoint resumes it.
  const auto half = ok(baton::fit(gpu.with_device(c10::Device(c10::kCPU)), state(), Time::epochs(1)));
  REQUIRE(half.algorithm_state.count("ema") == 1);
  const auto s = ok(baton::fit(gpu, half));  // the second epoch on the GPU
  CHECK(on_cuda(s));
  for (const auto& [name, t] : s.algorithm_state.at("ema")) CHECK(t.is_cuda());
}

TEST_CASE("CUDA: split and resumed runs give the same bits (deterministic mode)", "[.cuda]") {
  REQUIRE(torch::cuda::is_available());
  const char* ws = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  REQUIRE(ws != nullptr);  // scripts/cuda-check.sh sets :4096:8
  for (auto p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
    auto sp = spec(p).with_deterministic(true);
    if (p == Precision::fp16) sp = sp.with_loss_scaling(baton::LossScaling{.init = 1e30, .interval = 3});
    INFO("precision " << static_cast<int>(p));
    std::fprintf(stderr, "cuda_test: precision %d: deterministic\n", static_cast<int>(p));
    CHECK(baton::testing::deterministic(sp, state()));
    std::fprintf(stderr, "cuda_test: precision %d: split_invariant\n", static_cast<int>(p));
    CHECK(baton::testing::split_invariant(sp, state(), {Time::batches(3), Time::batches(5)}));
    std::fprintf(stderr, "cuda_test: precision %d: resume_invariant\n", static_cast<int>(p));
    CHECK(baton::testing::resume_invariant(sp, state(), Time::batches(7)));
  }
}

TEST_CASE("CUDA: a checkpoint of a GPU state holds the same values as the CPU copy", "[.cuda]") {
  REQUIRE(torch::cuda::is_available());
  test::TempDir dir;
  auto sp = spec(Precision::fp16).with_loss_scaling(baton::LossScaling{});
  const auto s = ok(baton::fit(sp, state(), Time::batches(5)));
  REQUIRE(baton::save_checkpoint(s, dir.path / "gpu.ckpt"));
  const auto back = baton::load_checkpoint(dir.path / "gpu.ckpt", cuda_cnn());
  REQUIRE(back.has_value());
  CHECK(back->loss_scale == s.loss_scale);
  auto on_cpu = s;
  on_cpu.model.module->to(torch::kCPU);
  for (auto& [name, ps] : on_cpu.optimizer.params)
    for (auto& t : ps.slots) t = t.cpu();
  CHECK(baton::first_difference(*back, on_cpu) == std::nullopt);
}
