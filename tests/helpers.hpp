#pragma once
// Small models and data for tests: fast, seeded, and exercising buffers (BatchNorm) and the RNG
// (Dropout) so that bit-for-bit checks cover everything a state holds.
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <baton/baton.hpp>

namespace test {

/// A seeded synthetic classification set: 4 Gaussian blobs in 8 dimensions.
inline baton::Dataset blobs(std::int64_t n, std::uint64_t seed = 7, std::string name = "blobs") {
  auto gen = at::detail::createCPUGenerator(seed);
  auto y = torch::randint(0, 4, {n}, gen, torch::kLong);
  auto centers = torch::randn({4, 8}, gen) * 2.0;
  auto x = centers.index_select(0, y) + torch::randn({n, 8}, gen);
  return *baton::make_dataset(x, y, std::move(name));
}

/// MLP with BatchNorm and Dropout: its state has buffers and its training draws random numbers.
inline baton::ModelFactory bn_dropout_mlp() {
  return baton::model_factory([] {
    namespace nn = torch::nn;
    return nn::Sequential(nn::Linear(8, 16), nn::BatchNorm1d(16), nn::ReLU(), nn::Dropout(0.2),
                          nn::Linear(16, 4));
  });
}

inline baton::TrainState new_state(std::uint64_t seed = 1, baton::Time max = baton::Time::epochs(3)) {
  auto s = baton::init_state(bn_dropout_mlp(), {.seed = seed, .max_duration = max});
  REQUIRE(s.has_value());
  return std::move(*s);
}

/// 1000 samples, batch 32: 32 batches per epoch (the last one has 8 samples).
inline baton::TrainingSpec spec(const baton::Dataset& data, baton::Time duration) {
  return baton::TrainingSpec{
      .name = "test",
      .data = {.train = data, .batch_size = 32},
      .loss = baton::loss::cross_entropy(),
      .optimizer = baton::optim::sgd({.lr = 0.05, .momentum = 0.9}),
      .duration = duration,
  };
}

/// Bit for bit: every parameter, buffer and optimizer tensor, the timestamp and the RNG state.
inline void require_same_bits(const baton::TrainState& a, const baton::TrainState& b) {
  INFO("a at " << a.time.to_string() << "; b at " << b.time.to_string());
  REQUIRE(baton::bitwise_equal(a, b));
  REQUIRE(a.rng.equal(b.rng));
}

/// A user's update rule, written as docs/optimizers.md shows: heavy-ball momentum, with a second
/// slot of another shape than the parameter's (a scalar: the sum of squared gradients seen).
inline baton::Optimizer heavy_ball(double lr = 0.05, double beta = 0.9) {
  baton::UpdateRule r{.name = "heavy_ball", .identity = "heavy_ball(beta=" + std::to_string(beta) + ") v1", .lr = lr,
                      .slots = {"velocity", "grad_sq_sum"}};
  r.init = [](const torch::Tensor& p) { return std::vector<torch::Tensor>{torch::zeros_like(p), torch::zeros({}, p.options())}; };
  r.update = [beta](torch::Tensor& p, const torch::Tensor& g, std::vector<torch::Tensor>& slots, std::int64_t, double lr,
                    double wd) {
    slots[0].mul_(beta).add_(g).add_(p, wd);
    slots[1].add_(g.square().sum());
    p.add_(slots[0], -lr);
  };
  return baton::optim::rule(std::move(r));
}

/// The value, or the test fails with the error's text.
template <class T>
T ok(baton::Expected<T> r) {
  if (!r) FAIL(r.error().to_string());
  return std::move(*r);
}

/// Tiny images: 3 classes, [n, 1, 8, 8], class c has a bright row band at c.
inline baton::Dataset images(std::int64_t n, std::uint64_t seed = 3, std::string name = "images") {
  auto gen = at::detail::createCPUGenerator(seed);
  auto y = torch::randint(0, 3, {n}, gen, torch::kLong);
  auto x = torch::rand({n, 1, 8, 8}, gen) * 0.1;
  for (std::int64_t i = 0; i < n; ++i) x[i][0][y[i].item<std::int64_t>() * 2] += 1.0;
  return *baton::make_dataset(x, y, std::move(name));
}

/// A CNN that takes any image size (global average pooling), with BatchNorm and Dropout.
inline baton::ModelFactory tiny_cnn() {
  return baton::model_factory([] {
    namespace nn = torch::nn;
    return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 4, 3).padding(1)), nn::BatchNorm2d(4), nn::ReLU(),
                          nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)), nn::Flatten(), nn::Dropout(0.1),
                          nn::Linear(4, 3));
  });
}

/// A one-stage curriculum: an mlp on 320 synthetic samples for 10 batches of 32, seed 3, with
/// `stage_keys` (TOML lines) appended to its stage.
inline std::string mlp_curriculum(const std::string& stage_keys) {
  return R"(
[run]
seed = 3
max_duration = "10ba"
[model]
name = "mlp"
widths = [8, 16, 4]
[datasets.train]
kind = "synthetic"
samples = 320
[[stages]]
name = "only"
data = "train"
batch_size = 32
duration = "10ba"
)" + stage_keys;
}

/// A fresh temporary directory (mkdtemp), removed with everything in it at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char tmpl[] = "/tmp/baton-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  /// The names of the files in it, sorted.
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

}  // namespace test
