// baton's optimizers against torch::optim, bit for bit, over several steps.
#include "helpers.hpp"

namespace {
template <class TorchOptim, class TorchOptions>
void compare(const baton::Optimizer& ours, TorchOptions theirs) {
  const auto data = test::blobs(64);
  auto factory = baton::models::mlp({8, 6, 4});
  auto state = baton::init_state(factory, {.seed = 9, .max_duration = baton::Time::epochs(10)});
  REQUIRE(state);
  baton::TrainState reference = *state;  // same initial weights
  auto params = reference.model.module->parameters();
  TorchOptim opt(params, theirs);
  const baton::TrainingSpec spec{.data = {.train = data, .batch_size = 16, .shuffle = false},
                                 .optimizer = ours};
  baton::TrainState s = std::move(*state);
  for (int step = 0; step < 8; ++step) {
    const baton::Batch batch{data.inputs.narrow(0, (step % 4) * 16, 16), data.targets.narrow(0, (step % 4) * 16, 16)};
    auto r = baton::train_step(spec, std::move(s), batch);
    REQUIRE(r);
    s = std::move(r->state);
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(reference.model.forward(batch.inputs), batch.targets);
    loss.backward();
    opt.step();
    CHECK(r->loss == loss.template item<double>());
  }
  const auto a = s.named_parameters(), b = reference.named_parameters();
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(a[i].second.equal(b[i].second));
  }
}
}  // namespace

TEST_CASE("SGD matches torch::optim::SGD bit for bit", "[optim]") {
  using torch::optim::SGD;
  using torch::optim::SGDOptions;
  compare<SGD>(baton::optim::sgd({.lr = 0.1}), SGDOptions(0.1));
  compare<SGD>(baton::optim::sgd({.lr = 0.1, .momentum = 0.9}), SGDOptions(0.1).momentum(0.9));
  compare<SGD>(baton::optim::sgd({.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-3}),
               SGDOptions(0.1).momentum(0.9).dampening(0.1).weight_decay(1e-3));
  compare<SGD>(baton::optim::sgd({.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true}),
               SGDOptions(0.1).momentum(0.9).weight_decay(1e-2).nesterov(true));
}

TEST_CASE("Adam matches torch::optim::Adam bit for bit", "[optim]") {
  using torch::optim::Adam;
  using torch::optim::AdamOptions;
  compare<Adam>(baton::optim::adam({.lr = 1e-2}), AdamOptions(1e-2));
  compare<Adam>(baton::optim::adam({.lr = 1e-2, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 1e-2}),
                AdamOptions(1e-2).betas({0.8, 0.99}).eps(1e-6).weight_decay(1e-2));
  compare<Adam>(baton::optim::adam({.lr = 1e-2, .amsgrad = true}), AdamOptions(1e-2).amsgrad(true));
}

TEST_CASE("optimizer options are validated with field names", "[optim]") {
  auto e = baton::optim::sgd({.lr = -1, .momentum = 1.5}).validate();
  REQUIRE_FALSE(e);
  CHECK_THAT(e.error().message, Catch::Contains("optimizer.lr") && Catch::Contains("optimizer.momentum"));
  CHECK_FALSE(baton::optim::sgd({.lr = 0.1, .nesterov = true}).validate());
  CHECK_FALSE(baton::optim::adam({.beta1 = 1.0}).validate());
  CHECK_FALSE(baton::optim::adam({.eps = 0}).validate());
  CHECK(baton::optim::adam({}).validate());
  CHECK(baton::optim::sgd({}).with_lr(0.5).lr() == 0.5);
}

TEST_CASE("keeping moments of another optimizer kind is an error that suggests fresh", "[optim][carry]") {
  const auto data = test::blobs(100);
  auto s = test::ok(baton::fit(test::spec(data, baton::Time::batches(2)), test::new_state()));
  auto adam_keep = test::spec(data, baton::Time::batches(2)).with_name("adam-stage").with_optimizer(baton::optim::adam(), baton::Carry::keep);
  auto r = baton::fit(adam_keep, s);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("Carry::fresh"));
  auto fresh = baton::fit(adam_keep.with_optimizer_carry(baton::Carry::fresh), s);
  REQUIRE(fresh);
  CHECK(fresh->optimizer.kind == "adam");
  CHECK(fresh->optimizer.params.begin()->second.step == 2);  // started from empty moments
}
