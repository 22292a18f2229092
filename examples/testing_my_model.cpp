// Unit tests for your own model and training stage with baton::testing and Catch2: the example of
// docs/testing.md, built and run by baton's own test suite (ctest: example_testing_my_model).
//
// Build it like any test of yours: link baton::testing and Catch2 (find_package(baton) gives
// baton::testing). Each check trains copies, so one state serves them all.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <torch/torch.h>  // torch::nn for the model below

#include <baton/baton.hpp>
#include <baton/testing_catch.hpp>

namespace bt = baton::testing;
using namespace baton::literals;

namespace {
// The model under test: a small CNN of "yours" for 28x28 grey images, 10 classes.
struct MyNetImpl : torch::nn::Module {
  MyNetImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)));
    norm = register_module("norm", torch::nn::BatchNorm2d(8));
    head = register_module("head", torch::nn::Linear(8 * 7 * 7, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::max_pool2d(torch::relu(norm(conv(x))), 4);  // [B, 8, 7, 7]
    return head(torch::dropout(h.flatten(1), 0.1, is_training()));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d norm{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(MyNet);

// The data: a slice of Fashion-MNIST (the Debian package dataset-fashion-mnist) for speed.
baton::Dataset slice(baton::Split split, std::int64_t n) {
  auto d = baton::data::fashion_mnist(split);
  if (!d) FAIL(d.error().to_string());
  return d->head(n);
}

// The stage under test, as the training program builds it.
baton::TrainingSpec my_stage() {
  static const auto train = slice(baton::Split::train, 512), test = slice(baton::Split::test, 256);
  return baton::TrainingSpec{
      .name = "main",
      .data = {.train = train, .batch_size = 64},
      .optimizer = baton::optim::adam({.lr = 3e-3}),
      .evaluation = baton::EvalSchedule{.spec = {.sets = {{"test", test}}}},
      .duration = "1ep"_t,
  };
}

baton::TrainState fresh_state() {
  auto s = baton::init_state(baton::model_factory([] { return MyNet(); }), {.seed = 7, .max_duration = "2ep"_t});
  if (!s) FAIL(s.error().to_string());
  return std::move(*s);
}
}  // namespace

TEST_CASE("my model learns: sensible initial loss, gradients everywhere, one batch memorised") {
  const auto spec = my_stage();
  const auto state = fresh_state();
  const auto batch = bt::first_batch(spec);
  CHECK(bt::loss_at_init(spec, state, batch));       // about ln(10) before training
  CHECK(bt::gradients_flow(spec, state, batch));     // no detached or unused layer
  CHECK(bt::overfits_one_batch(spec, state, batch, {.steps = 150, .below = 0.05}));
}

TEST_CASE("my stage is reproducible: deterministic, split and resumed to the same bits") {
  const auto spec = my_stage();
  const auto state = fresh_state();
  CHECK(bt::deterministic(spec, state, "3ba"_t));
  CHECK(bt::split_invariant(spec, state, {"3ba"_t, "100sp"_t}));
  CHECK(bt::resume_invariant(spec, state, "5ba"_t));
}

TEST_CASE("my evaluation data is not in my training data") { CHECK(bt::no_leak(my_stage())); }
