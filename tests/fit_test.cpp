#include <csignal>

#include <baton/testing_catch.hpp>

#include "helpers.hpp"

using baton::Time;
using test::ok;

namespace {
const baton::Dataset& data() {
  static const auto d = test::blobs(1000);  // 32 batches of 32 per epoch, the last one 8 samples
  return d;
}
baton::TrainingSpec spec(Time t) { return test::spec(data(), t); }

using test::require_same_bits;
}  // namespace

TEST_CASE("splitting a run into several fits gives the same bits", "[fit][property]") {
  const auto whole = ok(baton::fit(spec(Time::epochs(3)), test::new_state()));
  CHECK(whole.time.epoch == 3);
  CHECK(whole.time.batch == 96);
  CHECK(whole.time.sample == 3000);

  const auto stage = spec(Time::epochs(3));
  SECTION("budgets of 1ep then 2ep") {
    auto s = ok(baton::fit(stage, test::new_state(), Time::epochs(1)));
    s = ok(baton::fit(stage, std::move(s), Time::epochs(2)));
    require_same_bits(whole, s);
  }
  SECTION("a split in the middle of an epoch, then the rest") {
    auto s = ok(baton::fit(stage, test::new_state(), Time::batches(45)));
    CHECK(s.time.epoch == 1);
    CHECK(s.time.batch_in_epoch == 13);
    CHECK(s.time.sample_in_epoch == 13 * 32);
    s = ok(baton::fit(stage, std::move(s), Time::epochs(10)));  // the stage ends first
    require_same_bits(whole, s);
  }
  SECTION("the stage's length belongs to the stage: a second fit finishes it") {
    auto s = ok(baton::fit(stage, test::new_state(), Time::batches(45)));
    s = ok(baton::fit(stage, std::move(s)));
    require_same_bits(whole, s);
    CHECK(s.history.size() == 1);
    const auto again = baton::fit(stage, s);  // the stage was the whole run: nothing is left
    REQUIRE_FALSE(again);
    CHECK(again.error().code == baton::ErrorCode::run_finished);
  }
  SECTION("many small budgets in mixed units") {
    auto s = test::new_state();
    for (Time t : {Time::batches(7), Time::samples(500), Time::batches(1), Time::epochs(1), Time::fraction(0.25),
                   Time::epochs(5)})
      s = ok(baton::fit(stage, std::move(s), t));
    require_same_bits(whole, s);
    REQUIRE(s.history.size() == 1);  // one stage, split into six fits
    CHECK(s.history[0].end == whole.history[0].end);
    CHECK(s.history[0].last_loss == whole.history[0].last_loss);
  }
  SECTION("baton::testing::split_invariant, cuts of each unit") {
    CHECK(baton::testing::split_invariant(stage, test::new_state(),
                                          {Time::batches(7), Time::samples(500), Time::epochs(1), Time::fraction(0.25)}));
  }
}

TEST_CASE("fit leaves a state passed by copy bit-identical", "[fit][property]") {
  const auto s = ok(baton::fit(spec(Time::batches(10)), test::new_state()));
  const baton::TrainState before = s;
  const auto rng_before = s.rng.clone();
  auto trained = ok(baton::fit(spec(Time::epochs(1)), s));
  CHECK_FALSE(baton::bitwise_equal(trained, s));
  require_same_bits(before, s);
  CHECK(s.rng.equal(rng_before));
  CHECK(s.history.back().end.batch == 10);
  CHECK(trained.history.back().end.epoch == 1);
}

TEST_CASE("a copy trained two ways branches -- the original is intact", "[fit][property]") {
  const auto root = ok(baton::fit(spec(Time::epochs(2)), test::new_state(), Time::epochs(1)));
  const baton::TrainState snapshot = root;
  auto a = ok(baton::fit(spec(Time::epochs(2)), root));
  auto b = ok(baton::fit(spec(Time::epochs(2)).with_lr(0.01), root));
  auto a_again = ok(baton::fit(spec(Time::epochs(2)), root));
  CHECK_FALSE(baton::bitwise_equal(a, b));
  require_same_bits(a, a_again);
  require_same_bits(root, snapshot);
}

TEST_CASE("the same seed gives the same bits, another seed other bits", "[fit][property]") {
  auto run = [](std::uint64_t seed) { return ok(baton::fit(spec(Time::epochs(1)), test::new_state(seed))); };
  require_same_bits(run(11), run(11));
  CHECK_FALSE(baton::bitwise_equal(run(11), run(12)));
  // The data order seed alone changes the result too.
  auto other_order = ok(baton::fit(spec(Time::epochs(1)).with_data_seed(99), test::new_state(11)));
  CHECK_FALSE(baton::bitwise_equal(run(11), other_order));
}

TEST_CASE("a run never trains past its max duration -- a finished run is a clean error", "[fit]") {
  auto s = ok(baton::fit(spec(Time::epochs(10)), test::new_state(1, Time::epochs(3))));
  CHECK(s.time.epoch == 3);
  CHECK(s.time.batch == 96);
  CHECK(s.finished());
  const auto again = baton::fit(spec(Time::batches(1)), s);
  REQUIRE_FALSE(again);
  CHECK(again.error().code == baton::ErrorCode::run_finished);
  CHECK_THAT(again.error().message, Catch::Contains("3ep") && Catch::Contains("epoch 3"));
  CHECK_THAT(again.error().to_string(), Catch::StartsWith("stage \"test\""));

  auto by_batches = ok(baton::fit(spec(Time::epochs(10)), test::new_state(1, Time::batches(50))));
  CHECK(by_batches.time.batch == 50);
  auto by_samples = ok(baton::fit(spec(Time::epochs(10)), test::new_state(1, Time::samples(100))));
  CHECK(by_samples.time.sample == 128);  // stops at the first batch boundary at or past it
}

TEST_CASE("durations in samples and fractions of the max duration", "[fit]") {
  auto s = ok(baton::fit(spec(Time::samples(100)), test::new_state()));
  CHECK(s.time.batch == 4);
  auto half = ok(baton::fit(spec(Time::fraction(0.5)), test::new_state(1, Time::epochs(3))));
  CHECK(half.time.epoch == 1);  // 1.5 epochs = 1500 positions: 32 batches + 16 batches of 32
  CHECK(half.time.sample_in_epoch == 512);
  auto quarter = ok(baton::fit(spec(Time::fraction(0.25)), test::new_state(1, Time::batches(100))));
  CHECK(quarter.time.batch == 25);
}

TEST_CASE("drop_last and a batch size changed mid-epoch", "[fit]") {
  auto dl = spec(Time::epochs(1));
  dl = dl.with_data({.train = data(), .batch_size = 32, .drop_last = true});
  auto s = ok(baton::fit(dl, test::new_state()));
  CHECK(s.time.batch == 31);
  CHECK(s.time.sample == 992);
  CHECK(s.time.epoch == 1);

  auto t = ok(baton::fit(spec(Time::epochs(2)), test::new_state(), Time::batches(10)));
  CHECK(t.time.sample_in_epoch == 320);
  t = ok(baton::fit(spec(Time::epochs(2)).with_batch_size(100), std::move(t), Time::epochs(1)));
  CHECK(t.time.epoch == 1);
  CHECK(t.time.sample_in_epoch == 400);  // first batch boundary at or past one epoch's worth
  CHECK(t.time.batch == 10 + 7 + 4);    // 680 left of epoch 0 in 100s, then 320 in 100s
}

TEST_CASE("a non-finite loss stops fit at that batch -- the caller's state is intact", "[fit][errors]") {
  auto x = data().inputs.clone();
  x[40][0] = std::numeric_limits<float>::quiet_NaN();
  const auto bad = *baton::make_dataset(x, data().targets, "with-nan");
  auto sp = test::spec(bad, Time::epochs(1)).with_data({.train = bad, .batch_size = 32, .shuffle = false});
  const auto s = test::new_state();
  const baton::TrainState before = s;
  auto r = baton::fit(sp, s);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == baton::ErrorCode::non_finite);
  CHECK_THAT(r.error().message, Catch::Contains("at batch 1"));
  require_same_bits(before, s);
}

TEST_CASE("shape mismatches name both shapes", "[fit][errors]") {
  auto mse = spec(Time::epochs(1)).with_loss(baton::loss::mse());
  auto r = baton::fit(mse, test::new_state());
  REQUIRE_FALSE(r);
  CHECK(r.error().code == baton::ErrorCode::shape_mismatch);
  CHECK_THAT(r.error().message, Catch::Contains("[32, 4]") && Catch::Contains("[32]"));

  const auto wide = *baton::make_dataset(torch::randn({64, 5}), torch::zeros({64}, torch::kLong), "wide");
  auto f = baton::fit(test::spec(wide, Time::epochs(1)), test::new_state());
  REQUIRE_FALSE(f);
  CHECK(f.error().code == baton::ErrorCode::shape_mismatch);
  CHECK_THAT(f.error().message, Catch::Contains("[32, 5]"));

  const auto labels = *baton::make_dataset(torch::randn({64, 8}), torch::full({64}, 7, torch::kLong), "labels");
  auto l = baton::fit(test::spec(labels, Time::epochs(1)), test::new_state());
  REQUIRE_FALSE(l);
  CHECK_THAT(l.error().message, Catch::Contains("4 classes"));
}

TEST_CASE("an invalid spec reports every problem with its field", "[fit][errors][spec]") {
  auto bad = spec(Time::epochs(1)).with_batch_size(0).with_lr(-1).with_name("broken");
  auto v = bad.validate();
  REQUIRE_FALSE(v);
  CHECK_THAT(v.error().message, Catch::Contains("data.batch_size") && Catch::Contains("optimizer.lr"));
  auto r = baton::fit(bad, test::new_state());
  REQUIRE_FALSE(r);
  CHECK(r.error().code == baton::ErrorCode::invalid_spec);
  CHECK_THAT(r.error().to_string(), Catch::StartsWith("stage \"broken\""));
  CHECK_FALSE(spec(Time::batches(0)).validate());
  CHECK_FALSE(spec(Time::epochs(1)).with_data({.train = data().head(10), .batch_size = 32, .drop_last = true}).validate());
  CHECK(spec(Time::epochs(1)).validate());
}

TEST_CASE("with_* returns changed copies and leaves the spec alone", "[spec]") {
  const auto a = spec(Time::epochs(1));
  const auto b = a.with_lr(0.5).with_batch_size(7).with_duration(Time::batches(3)).with_name("b");
  CHECK(a.optimizer.lr() == 0.05);
  CHECK(a.data.batch_size == 32);
  CHECK(a.name == "test");
  CHECK(b.optimizer.lr() == 0.5);
  CHECK(b.data.batch_size == 7);
  CHECK(b.duration == Time::batches(3));
  CHECK(b.optimizer_carry == baton::Carry::keep);
  CHECK(a.with_optimizer(baton::optim::adam(), baton::Carry::fresh).optimizer_carry == baton::Carry::fresh);
}

TEST_CASE("train_step is one pure step, equal to fit(1ba)", "[fit][step]") {
  auto sp = spec(Time::batches(1)).with_data({.train = data(), .batch_size = 32, .shuffle = false});
  const auto s = test::new_state();
  const baton::TrainState before = s;
  const baton::Batch first{data().inputs.narrow(0, 0, 32), data().targets.narrow(0, 0, 32)};
  auto step = baton::train_step(sp, s, first);
  REQUIRE(step);
  require_same_bits(before, s);
  CHECK(std::isfinite(step->loss));
  CHECK(step->state.time.batch == 1);
  CHECK(step->state.time.sample == 32);
  auto fitted = ok(baton::fit(sp, s));
  require_same_bits(step->state, fitted);
  CHECK(fitted.history.back().last_loss == step->loss);

  auto bad = baton::train_step(sp, s, baton::Batch{torch::zeros({3, 8}), torch::zeros({4}, torch::kLong)});
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == baton::ErrorCode::shape_mismatch);
}

TEST_CASE("a fit of N batches equals N train_steps, with algorithms at after_data and batch_end", "[fit][step]") {
  // MixUp draws from the run's RNG after the data; EMA averages the weights at batch_end; the
  // schedule reads the clock. 40 batches cross an epoch (its last batch has 8 samples) and a
  // reshuffle, so the order of events and the clock must agree between the two.
  // A user's algorithm that keeps the clock its batch_end sees (after the batch is counted, as
  // docs/events.md says), and SWA, whose stage_end replaces the weights when the stage is done.
  namespace algo = baton::algorithms;
  baton::Algorithm clock{.name = "clock", .identity = "clock"};
  clock.batch_end = [](const baton::AlgorithmContext&, const baton::TrainState& st, baton::Algorithm::Tensors& m) {
    const auto seen = torch::tensor({st.time.sample, st.time.epoch}, torch::kLong);
    m["seen"] = m.count("seen") ? torch::cat({m["seen"], seen}) : seen;
  };
  const auto sp = spec(Time::batches(40))
                      .with_algorithms({algo::mixup({.alpha = 0.4}), algo::ema({.decay = 0.9}), clock,
                                        algo::swa({.start = 0.5})})
                      .with_schedule(baton::schedule::linear_warmup(Time::batches(5), baton::schedule::cosine()), baton::Clock::stage);
  const auto start = test::new_state();
  const auto fitted = ok(baton::fit(sp, start));

  baton::TrainState s = start;
  const std::int64_t n = data().size();
  for (int i = 0; i < 40; ++i) {
    const std::int64_t take = std::min<std::int64_t>(32, n - s.time.sample_in_epoch);
    const auto order = baton::data::epoch_order(n, s.seed, s.time.epoch).narrow(0, s.time.sample_in_epoch, take);
    auto r = ok(baton::train_step(sp, s, {data().inputs.index_select(0, order), data().targets.index_select(0, order)}));
    s = std::move(r.state);
  }
  CHECK(s.time.batch == 40);
  CHECK(s.time.epoch == 1);
  const auto& seen = fitted.algorithm_state.at("clock").at("seen");
  CHECK(seen[0].item<std::int64_t>() == 32);  // the first batch_end sees its own 32 samples counted
  require_same_bits(fitted, s);
}

TEST_CASE("stages chain with and_then -- the first error stops the chain with its stage", "[fit][stage]") {
  const auto warm = spec(Time::epochs(1)).with_name("warmup");
  const auto bad = warm.with_name("broken").with_batch_size(-1);
  const auto never = warm.with_name("never");
  int calls = 0;
  auto count = [&calls](baton::TrainState s) -> baton::Expected<baton::TrainState> { ++calls; return s; };
  auto r = baton::fit(warm, test::new_state()).and_then(count).and_then(baton::stage(bad)).and_then(count).and_then(baton::stage(never));
  REQUIRE_FALSE(r);
  CHECK(calls == 1);
  CHECK_THAT(r.error().to_string(), Catch::StartsWith("stage \"broken\""));

  auto good = baton::fit(warm, test::new_state()).and_then(baton::stage(warm.with_name("main").with_duration(Time::epochs(2))));
  REQUIRE(good);
  CHECK(good->history.size() == 2);
  CHECK(good->history[1].name == "main");
  CHECK(good->history[1].start.epoch == 1);
  CHECK(good->history[1].end.epoch == 3);
}

TEST_CASE("training converges on real Fashion-MNIST data, and splits there give the same bits", "[fit][convergence]") {
  auto train = baton::data::fashion_mnist(baton::Split::train);
  auto test_set = baton::data::fashion_mnist(baton::Split::test);
  REQUIRE(train);
  REQUIRE(test_set);
  const auto subset = train->head(8000);
  auto init = baton::init_state(baton::models::mlp({784, 64, 10}), {.seed = 4, .max_duration = Time::epochs(2)});
  REQUIRE(init);
  const baton::TrainingSpec sp{.name = "fmnist",
                               .data = {.train = subset, .batch_size = 64},
                               .optimizer = baton::optim::adam({.lr = 2e-3}),
                               .duration = Time::epochs(2)};
  const baton::EvalSpec ev{.sets = {{"test", test_set->head(2000)}}};
  const auto before = baton::eval(ev, *init);
  REQUIRE(before);
  auto trained = ok(baton::fit(sp, *init));
  const auto after = baton::eval(ev, trained);
  REQUIRE(after);
  INFO("accuracy before " << before->at("test").at("accuracy") << ", after " << after->at("test").at("accuracy"));
  CHECK(before->at("test").at("accuracy") < 0.3);
  CHECK(after->at("test").at("accuracy") > 0.80);
  CHECK(after->at("test").at("loss") < before->at("test").at("loss") / 3);

  auto split = ok(baton::fit(sp, *init, Time::batches(77)));
  split = ok(baton::fit(sp, std::move(split)));
  require_same_bits(trained, split);
}

TEST_CASE("a fit asked to stop returns the state reached, marked interrupted -- handlers are scoped", "[fit][interrupt]") {
  const auto whole = ok(baton::fit(spec(Time::epochs(1)), test::new_state()));
  // A stop flag set during batch 5: the batch in flight finishes, then fit returns.
  auto flag = std::make_shared<std::atomic<bool>>(false);
  int calls = 0;
  auto stopping = spec(Time::epochs(1));
  const auto ce = baton::loss::cross_entropy();
  stopping.loss = baton::loss::custom("ce", [&, ce](const torch::Tensor& y, const torch::Tensor& t) {
    if (++calls == 5) flag->store(true);
    return ce.fn(y, t);
  });
  stopping.stop = flag;
  auto part = ok(baton::fit(stopping, test::new_state()));
  CHECK(part.time.batch == 5);
  CHECK(part.history.back().interrupted);
  // Nothing is lost: finishing the stage gives the bits of the uninterrupted fit.
  auto rest = ok(baton::fit(spec(Time::epochs(1)), std::move(part)));  // the rest of the stage
  require_same_bits(whole, rest);
  CHECK_FALSE(rest.history.back().interrupted);

  // Ctrl-C during a fit that handles signals: same, and the caller's handler is back afterwards.
  struct sigaction before {};
  sigaction(SIGINT, nullptr, &before);
  auto on_signal = spec(Time::epochs(1));
  calls = 0;
  on_signal.loss = baton::loss::custom("ce", [&, ce](const torch::Tensor& y, const torch::Tensor& t) {
    if (++calls == 3) std::raise(SIGINT);
    return ce.fn(y, t);
  });
  on_signal.handle_signals = true;
  auto signalled = ok(baton::fit(on_signal, test::new_state()));
  CHECK(signalled.time.batch == 3);
  CHECK(signalled.history.back().interrupted);
  struct sigaction after {};
  sigaction(SIGINT, nullptr, &after);
  CHECK(after.sa_handler == before.sa_handler);
}
