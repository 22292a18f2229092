// What carries over between stages, each choice checked bit for bit.
#include "helpers.hpp"

using baton::Carry;
using baton::Clock;
using baton::ModelCarry;
using baton::Time;
using test::ok;

namespace {
const baton::Dataset& data() {
  static const auto d = test::blobs(1000);
  return d;
}
baton::TrainingSpec stage(const std::string& name, Time t) { return test::spec(data(), t).with_name(name); }

using test::require_same_bits;

torch::Tensor param(const baton::TrainState& s, const std::string& name) {
  for (const auto& [n, t] : s.named_parameters())
    if (n == name) return t;
  FAIL("no parameter " << name);
  return {};
}
}  // namespace

TEST_CASE("continuing a stage after a split equals the unsplit stage (Adam, run-clock schedule)", "[carry]") {
  const auto a = stage("a", Time::epochs(3))
                     .with_optimizer(baton::optim::adam({.lr = 1e-2}), Carry::fresh)
                     .with_schedule(baton::schedule::linear_warmup(Time::batches(8), baton::schedule::cosine()), Clock::run);
  const auto whole = ok(baton::fit(a, test::new_state()));
  auto split = ok(baton::fit(a, test::new_state(), Time::batches(40)));
  split = ok(baton::fit(a, std::move(split)));
  require_same_bits(whole, split);
  REQUIRE(split.history.size() == 1);
}

TEST_CASE("fresh moments equal a state whose optimizer state was reset -- keep differs", "[carry]") {
  const auto s = ok(baton::fit(stage("a", Time::epochs(1)), test::new_state()));
  REQUIRE_FALSE(s.optimizer.params.empty());
  const auto b = stage("b", Time::epochs(1)).with_lr(0.02);
  const auto fresh = ok(baton::fit(b.with_optimizer_carry(Carry::fresh), s));
  auto reset = s;
  reset.optimizer = baton::OptimizerState{};
  const auto by_hand = ok(baton::fit(b.with_optimizer_carry(Carry::keep), reset));
  require_same_bits(fresh, by_hand);
  const auto kept = ok(baton::fit(b.with_optimizer_carry(Carry::keep), s));
  CHECK_FALSE(baton::bitwise_equal(kept, fresh));
  // A continued stage keeps its moments whatever its carry says: carry applies when a stage begins.
  auto first = ok(baton::fit(b.with_optimizer_carry(Carry::fresh), s, Time::batches(5)));
  first = ok(baton::fit(b.with_optimizer_carry(Carry::fresh), std::move(first)));
  require_same_bits(first, fresh);
}

TEST_CASE("the stage clock restarts at each stage -- the run clock continues", "[carry][schedule]") {
  const auto s = ok(baton::fit(stage("a", Time::batches(10)), test::new_state()));  // lr 0.05
  const auto sched = baton::schedule::linear(1.0, 0.0, Time::batches(20));
  for (Clock clock : {Clock::stage, Clock::run}) {
    const auto b = stage("b", Time::batches(10)).with_lr(0.1).with_schedule(sched, clock);
    auto t = s;
    for (int k = 0; k < 10; ++k) {
      const double step_on_clock = clock == Clock::stage ? k : 10 + k;
      const double expected = 0.1 * (1.0 - step_on_clock / 20.0);
      INFO((clock == Clock::stage ? "stage" : "run") << " clock, step " << k);
      auto lr = baton::scheduled_lr(b, t);
      REQUIRE(lr);
      CHECK(*lr == Approx(expected).margin(1e-15));
      t = ok(baton::fit(b, std::move(t), Time::batches(1)));
      CHECK(t.history.back().last_lr == Approx(expected).margin(1e-15));
    }
  }
  // dur on the stage clock is a fraction of the stage's duration.
  const auto c = stage("c", Time::batches(10)).with_schedule(baton::schedule::linear(1.0, 0.0, Time::fraction(1.0)), Clock::stage);
  auto half = ok(baton::fit(c, s, Time::batches(5)));
  CHECK(*baton::scheduled_lr(c, half) == Approx(0.05 * 0.5));
}

TEST_CASE("re-initializing the model gives fresh weights seeded by run and stage", "[carry][model]") {
  const auto s = ok(baton::fit(stage("a", Time::epochs(1)), test::new_state()));
  const auto b = stage("b", Time::batches(1)).with_model(ModelCarry::reinitialize());
  const auto r1 = ok(baton::fit(b, s));
  const auto r2 = ok(baton::fit(b, s));
  require_same_bits(r1, r2);
  const auto init = test::new_state();
  CHECK_FALSE(param(r1, "0.weight").equal(param(s, "0.weight")));
  // One step from the new weights: far from the trained ones, close to a fresh initialization's scale.
  CHECK((param(r1, "0.weight") - param(s, "0.weight")).abs().max().item<double>() > 0.05);
}

TEST_CASE("a new dataset in a later stage starts a clean epoch -- split invariance holds within it", "[carry][data]") {
  const auto other = test::blobs(500, 99, "other");
  const auto s = ok(baton::fit(stage("a", Time::batches(45)), test::new_state(1, Time::epochs(10))));
  CHECK(s.time.epoch == 1);
  CHECK(s.time.sample_in_epoch == 13 * 32);
  const auto b = test::spec(other, Time::epochs(3)).with_name("b").with_batch_size(50);
  const auto whole = ok(baton::fit(b, s));
  CHECK(whole.history.back().start.epoch == 2);  // the partial epoch of stage a was closed
  CHECK(whole.history.back().start.sample_in_epoch == 0);
  CHECK(whole.time.epoch == 5);
  CHECK(whole.time.batch == 45 + 30);
  CHECK(whole.time.sample == (31 * 32 + 8) + 13 * 32 + 1500);  // epoch 0 ends with a batch of 8
  auto split = ok(baton::fit(b, s, Time::epochs(1)));
  split = ok(baton::fit(b, std::move(split), Time::batches(7)));
  require_same_bits(whole, ok(baton::fit(b, split)));
  // The same stage written longer (the rest of the run) continues to the max duration.
  split = ok(baton::fit(b.with_duration(Time::fraction(1.0)), std::move(split)));
  CHECK(split.time.epoch == 10);
  const auto to_five = ok(baton::fit(b, ok(baton::fit(b, s, Time::epochs(1))), Time::epochs(2)));
  require_same_bits(whole, to_five);
}

TEST_CASE("gradient accumulation gives the update of the whole batch", "[carry][accum]") {
  auto mlp = baton::models::mlp({8, 16, 4});  // no BatchNorm: microbatches see the same function
  auto init = baton::init_state(mlp, {.seed = 2, .max_duration = Time::epochs(5)});
  REQUIRE(init);
  for (std::int64_t batch : {32, 30}) {
    const auto sp = test::spec(data().head(300), Time::epochs(2)).with_batch_size(batch);
    const auto one = ok(baton::fit(sp, *init));
    const auto four = ok(baton::fit(sp.with_grad_accum(4), *init));  // 30: microbatches 8, 8, 8, 6
    const auto a = one.named_parameters(), b = four.named_parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("batch " << batch << ", " << a[i].first);
      CHECK(torch::allclose(a[i].second, b[i].second, 1e-4, 1e-6));
    }
    CHECK(one.history.back().last_loss == Approx(four.history.back().last_loss).epsilon(1e-5));
  }
  CHECK_FALSE(test::spec(data(), Time::epochs(1)).with_grad_accum(0).validate());
  CHECK_FALSE(test::spec(data(), Time::epochs(1)).with_grad_accum(33).validate());
}

TEST_CASE("clipping bounds the global norm and every value -- the pre-clip norm is reported", "[carry][clip]") {
  auto sp = test::spec(data(), Time::batches(1))
                .with_optimizer(baton::optim::sgd({.lr = 1.0}), Carry::fresh)
                .with_data({.train = data(), .batch_size = 32, .shuffle = false});
  const baton::Batch batch{data().inputs.narrow(0, 0, 32) * 50, data().targets.narrow(0, 0, 32)};
  const auto s = test::new_state();
  auto delta_of = [&](const baton::TrainingSpec& spec, double& norm) {
    auto r = baton::train_step(spec, s, batch);
    REQUIRE(r);
    norm = r->grad_norm;
    std::vector<torch::Tensor> d;
    const auto before = s.named_parameters(), after = r->state.named_parameters();
    for (std::size_t i = 0; i < before.size(); ++i) d.push_back((after[i].second - before[i].second).flatten());
    return torch::cat(d);
  };
  double pre = 0;
  const auto by_norm = delta_of(sp.with_clip_grad_norm(0.5), pre);
  CHECK(pre > 0.5);  // the gradient was larger: clipping happened
  CHECK(by_norm.norm().item<double>() == Approx(0.5).epsilon(1e-3));
  const auto by_value = delta_of(sp.with_clip_grad_value(0.01), pre);
  CHECK(by_value.abs().max().item<double>() <= 0.01 + 1e-7);
  const auto unclipped = delta_of(sp, pre);
  CHECK(unclipped.abs().max().item<double>() > 0.01);
  CHECK_FALSE(sp.with_clip_grad_norm(0.0).validate());
}

TEST_CASE("carry-over errors say what to do", "[carry][errors]") {
  const auto s = ok(baton::fit(stage("a", Time::batches(5)).with_optimizer(baton::optim::adam(), Carry::fresh), test::new_state()));
  auto sgd_keep = baton::fit(stage("b", Time::batches(5)), s);
  REQUIRE_FALSE(sgd_keep);
  CHECK_THAT(sgd_keep.error().message, Catch::Contains("adam moments") && Catch::Contains("Carry::fresh"));

  auto long_warmup = stage("b", Time::batches(10))
                         .with_optimizer_carry(Carry::fresh)
                         .with_schedule(baton::schedule::linear_warmup(Time::batches(20), baton::schedule::cosine()), Clock::stage);
  auto w = baton::fit(long_warmup, s);
  REQUIRE_FALSE(w);
  CHECK_THAT(w.error().message, Catch::Contains("warm-up (20ba") && Catch::Contains("longer than the stage"));
  auto run_warm = baton::fit(long_warmup.with_schedule(long_warmup.schedule, Clock::run), test::new_state(1, Time::batches(15)));
  REQUIRE_FALSE(run_warm);
  CHECK_THAT(run_warm.error().message, Catch::Contains("longer than the run"));

  auto negative = baton::fit(stage("b", Time::batches(1)).with_lr(-0.1).with_optimizer_carry(Carry::fresh), s);
  REQUIRE_FALSE(negative);
  CHECK_THAT(negative.error().message, Catch::Contains("optimizer.lr") && Catch::Contains("-0.1"));

  auto freeze = baton::fit(stage("b", Time::batches(1)).with_freeze({"encoder.*"}).with_optimizer_carry(Carry::fresh), s);
  REQUIRE_FALSE(freeze);
  CHECK_THAT(freeze.error().message, Catch::Contains("\"encoder.*\" matches no parameter"));
}

namespace {
// A model with a named backbone and head, for transfer and freezing.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(std::int64_t classes)
      : backbone(register_module("backbone", torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(784, 64),
                                                                      torch::nn::ReLU()))),
        head(register_module("head", torch::nn::Linear(64, classes))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head(backbone->forward(x)); }
  torch::nn::Sequential backbone;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);
}  // namespace

TEST_CASE("pretrain, swap the head, freeze the backbone, then fine-tune all with group LRs", "[carry][fashion]") {
  auto train = baton::data::fashion_mnist(baton::Split::train);
  auto test_set = baton::data::fashion_mnist(baton::Split::test);
  REQUIRE(train);
  REQUIRE(test_set);
  const auto pretrain_data = train->head(6000);
  const auto finetune_data = baton::Dataset{train->inputs.narrow(0, 6000, 6000), train->targets.narrow(0, 6000, 6000), "fmnist[6000:12000]"};
  auto factory = baton::model_factory([] { return Net(10); });
  auto init = baton::init_state(factory, {.seed = 8, .max_duration = Time::epochs(3)});
  REQUIRE(init);

  const baton::TrainingSpec pretrain{.name = "pretrain",
                                     .data = {.train = pretrain_data, .batch_size = 64},
                                     .optimizer = baton::optim::adam({.lr = 2e-3}),
                                     .duration = Time::epochs(1)};
  const auto head_only = pretrain.with_name("head-only")
                             .with_train_data(finetune_data)
                             .with_model(ModelCarry::transfer(factory).reinitializing({"head.*"}))
                             .with_freeze({"backbone.*"})
                             .with_optimizer(baton::optim::sgd({.lr = 0.05, .momentum = 0.9}), Carry::fresh);
  const auto all = head_only.with_name("all")
                       .with_model(ModelCarry::keep())
                       .with_freeze({})
                       .with_optimizer(baton::optim::sgd({.lr = 0.02, .momentum = 0.9})
                                           .with_groups({{.patterns = {"backbone.*"}, .lr = 0.002}}),
                                       Carry::keep)
                       .with_schedule(baton::schedule::cosine(), Clock::stage);

  const auto pre = ok(baton::fit(pretrain, *init));
  const auto mid = ok(baton::fit(head_only, pre));
  const auto& rec = mid.history.back();
  REQUIRE(rec.transfer);
  INFO(rec.transfer->to_string());
  CHECK(rec.transfer->copied == std::vector<std::string>{"backbone.1.weight", "backbone.1.bias"});
  CHECK(rec.transfer->initialized == std::vector<std::string>{"head.weight", "head.bias"});
  CHECK(rec.transfer->skipped.size() == 2);
  CHECK_THAT(rec.transfer->skipped[0], Catch::Contains("head.weight") && Catch::Contains("anew"));
  // The backbone was frozen: bit-identical to the pretrained one; the new head trained.
  CHECK(param(mid, "backbone.1.weight").equal(param(pre, "backbone.1.weight")));
  CHECK_FALSE(param(mid, "head.weight").equal(param(pre, "head.weight")));
  CHECK(param(mid, "backbone.1.weight").requires_grad());  // frozen only during the stage
  CHECK(mid.optimizer.params.count("backbone.1.weight") == 0);

  const auto done = ok(baton::fit(all, mid));
  CHECK_FALSE(param(done, "backbone.1.weight").equal(param(mid, "backbone.1.weight")));
  CHECK(done.time.epoch == 3);
  const auto m = baton::eval({.sets = {{"test", test_set->head(2000)}}}, done);
  REQUIRE(m);
  INFO("test accuracy " << m->at("test").at("accuracy"));
  CHECK(m->at("test").at("accuracy") > 0.78);
}

TEST_CASE("a stage trained in pieces with fit(spec, state, budget) equals one fit, stage-clock schedules included", "[carry][schedule]") {
  const auto sp = stage("s", Time::epochs(2))
                      .with_schedule(baton::schedule::linear_warmup(Time::fraction(0.2), baton::schedule::cosine()), Clock::stage);
  const auto whole = ok(baton::fit(sp, test::new_state()));
  auto pieces = test::new_state();
  for (std::int64_t n : {1, 7, 13, 3, 40}) pieces = ok(baton::fit(sp, std::move(pieces), Time::batches(n)));
  CHECK(pieces.time.batch == 64);
  require_same_bits(whole, pieces);
  CHECK(pieces.history.back().last_lr == whole.history.back().last_lr);
  CHECK_FALSE(baton::fit(sp, test::new_state(), Time{-1, baton::TimeUnit::batch}));
}
