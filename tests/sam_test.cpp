// The step's gradient function and SAM (Algorithm::gradient, algorithms::sam), through the
// public API: against SAM written by hand around torch::optim, through splits and resumes, in
// TOML, and its bad inputs.
#include "baton/testing.hpp"
#include "helpers.hpp"

namespace {
namespace F = torch::nn::functional;

/// SAM as a user writes it around torch::optim (Foret et al. 2021, Algorithm 1; adaptive: Kwon et
/// al. 2021): the gradient at w, w + rho g / ||g|| (adaptive: rho w^2 g / ||w g||), the gradient
/// there, the weights back, the optimizer's step. Returns the first pass's loss.
double hand_sam_step(baton::TrainState& ref, torch::optim::Optimizer& opt, const baton::Batch& b, double rho,
                     bool adaptive) {
  auto params = ref.model.module->parameters();
  for (auto& p : params) p.mutable_grad().reset();
  auto loss = F::cross_entropy(ref.model.forward(b.inputs), b.targets);
  loss.backward();
  std::vector<torch::Tensor> saved;
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> norms;
    for (auto& p : params) norms.push_back((adaptive ? p.abs() * p.grad() : p.grad()).norm(2));
    const double scale = rho / (torch::stack(norms).norm(2).item<double>() + 1e-12);
    for (auto& p : params) {
      saved.push_back(p.clone());
      p.add_(adaptive ? p * p * p.grad() * scale : p.grad() * scale);
    }
  }
  for (auto& p : params) p.mutable_grad().reset();
  F::cross_entropy(ref.model.forward(b.inputs), b.targets).backward();
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(saved[i]);
  }
  opt.step();
  return loss.item<double>();
}

baton::TrainState mlp_state() {
  auto s = baton::init_state(baton::models::mlp({8, 6, 4}), {.seed = 9, .max_duration = baton::Time::epochs(10)});
  REQUIRE(s);
  return std::move(*s);
}
}  // namespace

TEST_CASE("SAM: train_step equals SAM written by hand around torch::optim, bit for bit", "[sam]") {
  const auto data = test::blobs(64);
  for (const bool adaptive : {false, true}) {
    SECTION(adaptive ? "adaptive (ASAM)" : "plain") {
      const double rho = adaptive ? 0.5 : 0.05;
      baton::TrainState s = mlp_state();
      baton::TrainState reference = s;  // same initial weights
      baton::TrainState plain = s;      // the same steps without SAM
      torch::optim::SGD opt(reference.model.module->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      const baton::TrainingSpec spec{.data = {.train = data, .batch_size = 16, .shuffle = false},
                                     .optimizer = baton::optim::sgd({.lr = 0.1, .momentum = 0.9}),
                                     .algorithms = {baton::algorithms::sam({.rho = rho, .adaptive = adaptive})}};
      const auto without = spec.with_algorithms({});
      for (int step = 0; step < 8; ++step) {
        const baton::Batch batch{data.inputs.narrow(0, (step % 4) * 16, 16), data.targets.narrow(0, (step % 4) * 16, 16)};
        auto r = baton::train_step(spec, std::move(s), batch);
        REQUIRE(r);
        s = std::move(r->state);
        const double loss = hand_sam_step(reference, opt, batch, rho, adaptive);
        CHECK(r->loss == loss);  // the first pass's: the loss at the weights the step starts from
        plain = test::ok(baton::train_step(without, std::move(plain), batch)).state;
      }
      const auto a = s.named_parameters(), b = reference.named_parameters(), c = plain.named_parameters();
      bool differs_from_plain = false;
      for (std::size_t i = 0; i < a.size(); ++i) {
        INFO(a[i].first);
        CHECK(a[i].second.equal(b[i].second));
        differs_from_plain = differs_from_plain || !a[i].second.equal(c[i].second);
      }
      CHECK(differs_from_plain);  // the second gradient is what SAM applies
    }
  }
}

TEST_CASE("SAM: split fits and a checkpoint resume give one fit's bits, with dropout, BatchNorm, grad accumulation and EMA", "[sam]") {
  const auto data = test::blobs(300);
  const auto spec = test::spec(data, baton::Time::epochs(2))
                        .with_grad_accum(2)
                        .with_clip_grad_norm(1.0)
                        .with_algorithms({baton::algorithms::sam({.rho = 0.1, .adaptive = true}),
                                          baton::algorithms::ema({.decay = 0.9})});
  const auto state = test::new_state(5);
  CHECK(baton::testing::split_invariant(spec, state, {baton::Time::batches(3), baton::Time::samples(100)}));
  CHECK(baton::testing::resume_invariant(spec, state, baton::Time::batches(7)));
  // And SAM changed the run: the same fit without it ends elsewhere.
  const auto with = test::ok(baton::fit(spec, state));
  const auto without = test::ok(baton::fit(spec.with_algorithms({baton::algorithms::ema({.decay = 0.9})}), state));
  CHECK_FALSE(baton::bitwise_equal(with, without));
}

TEST_CASE("SAM: a non-finite loss in the second pass stops the step before anything is applied", "[sam]") {
  // The first pass is finite, the second (at the weights up the gradient) is not: the step must
  // apply nothing, and the state given by copy keeps its weights.
  const auto data = test::blobs(64);
  baton::Algorithm poison_second{.name = "poison", .identity = "poison v1"};
  auto passes = std::make_shared<int>(0);
  poison_second.before_loss = [passes](const baton::AlgorithmContext&, const torch::Tensor& output, torch::Tensor targets) {
    if (++*passes % 2 == 0) const_cast<torch::Tensor&>(output).fill_(std::nan(""));
    return targets;
  };
  const baton::TrainingSpec spec{.data = {.train = data, .batch_size = 16, .shuffle = false},
                                 .optimizer = baton::optim::sgd({.lr = 0.1}),
                                 .algorithms = {poison_second, baton::algorithms::sam({})}};
  const auto before = mlp_state();
  const auto copy = before;
  auto r = baton::train_step(spec, before, baton::Batch{data.inputs.narrow(0, 0, 16), data.targets.narrow(0, 0, 16)});
  REQUIRE_FALSE(r);
  CHECK(*passes == 2);
  CHECK_THAT(r.error().message, Catch::Contains("is nan") && Catch::Contains("the step was not applied"));
  CHECK(baton::bitwise_equal(before, copy));
  // Under the skip policy the clock goes on and the weights stay where they were.
  auto skipped = baton::train_step(spec.with_non_finite(baton::NonFinite::skip), before,
                                   baton::Batch{data.inputs.narrow(0, 0, 16), data.targets.narrow(0, 0, 16)});
  REQUIRE(skipped);
  CHECK(skipped->state.time.batch == 1);
  const auto a = skipped->state.named_parameters(), b = before.named_parameters();
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].second.equal(b[i].second));
}

TEST_CASE("SAM: named in TOML with its options, and its bad inputs", "[sam][hparams]") {
  auto cur = baton::parse_curriculum(test::mlp_curriculum("algorithms = { ema = {}, sam = { rho = 0.1, adaptive = true } }\n"), "sam.toml");
  REQUIRE(cur);
  const auto spec = test::ok(cur->stages()[0].build());
  REQUIRE(spec.algorithms.size() == 2);
  CHECK(spec.algorithms[0].identity == "sam(rho=0.1, adaptive=true)");  // the default order: sam before ema
  CHECK(bool(spec.algorithms[0].gradient));
  const auto s = test::ok(baton::fit(spec, test::ok(cur->init())));
  CHECK(s.time.batch == 10);

  auto bad_cur = baton::parse_curriculum(test::mlp_curriculum("algorithms = { sam = { rho = -1 } }\n"), "bad.toml");
  REQUIRE(bad_cur);
  const auto bad = bad_cur->stages()[0].build();
  REQUIRE_FALSE(bad);
  INFO(bad.error().message);
  CHECK_THAT(bad.error().message, Catch::Contains("sam.rho: must be a positive number, got -1"));
  const auto bad_key = baton::algorithms::from_name("sam", {{"radius", 0.1}});
  REQUIRE_FALSE(bad_key);
  CHECK_THAT(bad_key.error().message, Catch::Contains("radius"));
  const auto typo = baton::algorithms::from_name("sma", {});
  REQUIRE_FALSE(typo);
  CHECK_THAT(typo.error().message, Catch::Contains("did you mean \"sam\""));

  // Two algorithms that both take over the gradient are refused before anything trains.
  auto other = baton::algorithms::sam({});
  other.name = "sam2";
  const auto two = test::spec(test::blobs(64), baton::Time::batches(2)).with_algorithms({spec.algorithms[0], other});
  const auto r = baton::fit(two, test::new_state());
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("both take over the step's gradient"));
}
