// baton::testing: each check passes on sound training code and fails, naming the cause, on code
// with the fault it exists to catch.
#include <atomic>
#include <fstream>
#include <iterator>

#include <baton/testing_catch.hpp>

#include <fmt/format.h>

#include "helpers.hpp"

namespace bt = baton::testing;
using baton::Time;

namespace {
const baton::Dataset& data() {
  static const auto d = test::blobs(1000);  // 4 classes, 32 batches of 32 per epoch
  return d;
}
baton::TrainingSpec spec(Time t = Time::epochs(1)) { return test::spec(data(), t); }
baton::TrainState state_of(const baton::ModelFactory& f) {
  auto s = baton::init_state(f, {.seed = 1, .max_duration = Time::epochs(3)});
  REQUIRE(s);
  return std::move(*s);
}

/// fc2(fc1(x)), where `detach` cuts fc1 off the graph and `frozen` turns fc1's weight's
/// gradient off in the model itself (not through the spec's freeze).
struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl(bool detach, bool frozen) : detach(detach) {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
    if (frozen) fc1->weight.set_requires_grad(false);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(fc1(x));
    return fc2(detach ? h.detach() : h);
  }
  bool detach;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TwoLayer);

/// Adds a term that depends on how often any instance ran: randomness outside the state.
std::atomic<int> g_calls{0};
struct CountingImpl : torch::nn::Module {
  CountingImpl() { fc = register_module("fc", torch::nn::Linear(8, 4)); }
  torch::Tensor forward(const torch::Tensor& x) { return fc(x) + 1e-3 * static_cast<double>(g_calls++ % 7); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Counting);

/// Keeps a running mean of its inputs in a plain member, neither parameter nor buffer: training
/// changes it, a checkpoint does not carry it.
struct HiddenStateImpl : torch::nn::Module {
  HiddenStateImpl() { fc = register_module("fc", torch::nn::Linear(8, 4)); }
  torch::Tensor forward(const torch::Tensor& x) {
    if (is_training()) mean = 0.9 * mean + 0.1 * x.mean(0).detach();
    return fc(x - mean);
  }
  torch::Tensor mean = torch::zeros({8});
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(HiddenState);
}  // namespace

TEST_CASE("baton::testing passes on sound training code, saying what it checked", "[testing]") {
  const auto s = test::new_state();
  const auto sp = spec();
  const auto batch = bt::first_batch(sp);
  CHECK(batch.inputs.size(0) == 32);
  const auto before = s;

  const auto overfit = bt::overfits_one_batch(sp, s, batch);
  CHECK(overfit);
  CHECK_THAT(overfit.message, Catch::Contains("fell from"));
  CHECK_THAT(bt::gradients_flow(sp, s, batch), bt::Passes());
  CHECK_THAT(bt::gradients_flow(sp, s, batch).message, Catch::Contains("all 6 trained parameters"));
  CHECK(bt::deterministic(sp, s, Time::batches(10)));
  CHECK(bt::split_invariant(sp, s, {Time::batches(5), Time::samples(100), Time::fraction(0.1)}));
  CHECK(bt::resume_invariant(sp, s, Time::batches(7)));
  CHECK(bt::no_leak(data(), test::blobs(200, 8)));
  CHECK(bt::loss_at_init(sp, s, batch));
  // Checks work on copies: the caller's state is untouched.
  test::require_same_bits(before, s);
}

TEST_CASE("gradients_flow names the parameters of a detached branch and of a layer frozen in the model", "[testing]") {
  const auto sp = spec();
  const auto batch = bt::first_batch(sp);
  const auto detached = bt::gradients_flow(sp, state_of(baton::model_factory([] { return TwoLayer(true, false); })), batch);
  CHECK_FALSE(detached);
  CHECK_THAT(detached.message, Catch::Contains("no gradient (not on the loss's graph") && Catch::Contains("fc1.weight, fc1.bias"));
  CHECK_THAT(detached.message, !Catch::Contains("fc2"));

  const auto frozen = bt::gradients_flow(sp, state_of(baton::model_factory([] { return TwoLayer(false, true); })), batch);
  CHECK_FALSE(frozen);
  CHECK_THAT(frozen.message, Catch::Contains("requires_grad is off") && Catch::Contains("fc1.weight"));
  // Frozen by the spec instead: that is the stage's choice, not a fault.
  CHECK(bt::gradients_flow(sp.with_freeze({"fc1.weight"}), state_of(baton::model_factory([] { return TwoLayer(false, true); })), batch));
}

TEST_CASE("overfits_one_batch fails on a loss that cannot reach zero, giving the losses and the causes", "[testing]") {
  auto sp = spec();
  const auto ce = baton::loss::cross_entropy();
  sp.loss = baton::Loss{"ce_plus_one", [ce](const torch::Tensor& out, const torch::Tensor& y) { return ce.fn(out, y) + 1.0; }};
  const auto c = bt::overfits_one_batch(sp, test::new_state(), bt::first_batch(sp), {.steps = 30, .below = 0.05});
  CHECK_FALSE(c);
  CHECK_THAT(c.message, Catch::Contains("in 30 steps on one batch of 32") && Catch::Contains("never below 0.05") &&
                            Catch::Contains("check that the loss matches the outputs"));
}

TEST_CASE("overfits_one_batch quotes the learning rate the schedule gave, not only the base one", "[testing]") {
  // A warm-up longer than the check: the rate stays far below the base, which is what to see.
  auto sp = spec().with_schedule(baton::schedule::linear_warmup(Time::batches(1000)), baton::Clock::run);
  const auto c = bt::overfits_one_batch(sp, test::new_state(), bt::first_batch(sp), {.steps = 10, .below = 1e-6});
  CHECK_FALSE(c);
  const double base = sp.optimizer.lr();
  CHECK_THAT(c.message, Catch::Contains(fmt::format("the schedule gave {:.4g} at step 1 and {:.4g} at step 10 (base {}",
                                                    0.0, base * 9 / 1000, base)));
}

TEST_CASE("deterministic and split_invariant fail on randomness outside the state, naming the first difference", "[testing]") {
  const auto sp = spec();
  const auto s = state_of(baton::model_factory([] { return Counting(); }));
  const auto d = bt::deterministic(sp, s, Time::batches(5));
  CHECK_FALSE(d);
  CHECK_THAT(d.message, Catch::Contains("two fits of 5ba from the same state differ: parameter \"fc.") &&
                            Catch::Contains("max |difference|"));
  const auto split = bt::split_invariant(sp, s, {Time::batches(3)});
  CHECK_FALSE(split);
  CHECK_THAT(split.message, Catch::Contains("the stage cut after [3ba] differs from the stage in one fit: parameter"));
}

TEST_CASE("resume_invariant fails on training state a checkpoint cannot carry", "[testing]") {
  const auto sp = spec();
  const auto s = state_of(baton::model_factory([] { return HiddenState(); }));
  CHECK(bt::deterministic(sp, s, Time::batches(10)));  // sound in one process...
  const auto r = bt::resume_invariant(sp, s, Time::batches(10));
  CHECK_FALSE(r);  // ...but its running mean is lost by a checkpoint
  CHECK_THAT(r.message, Catch::Contains("stopped after 10ba (batch 10), saved, loaded and finished, the stage differs") &&
                            Catch::Contains("neither a parameter nor a buffer"));
}

TEST_CASE("no_leak counts held-out samples that are copies of training samples", "[testing]") {
  auto test_set = data().head(100);
  test_set.name = "test";
  const auto c = bt::no_leak(data(), test_set);
  CHECK_FALSE(c);
  CHECK_THAT(c.message, Catch::Contains("100 of the 100 samples of \"test\" are exact copies") && Catch::Contains("0 = train 0"));
  auto sp = spec();
  sp.evaluation = baton::EvalSchedule{.spec = {.sets = {{"clean", test::blobs(50, 9)}, {"test", test_set}}}};
  const auto via_spec = bt::no_leak(sp);
  CHECK_FALSE(via_spec);
  CHECK_THAT(via_spec.message, Catch::Contains("\"test\""));
}

TEST_CASE("loss_at_init fails on an initialisation that is confidently wrong", "[testing]") {
  const auto sp = spec();
  const auto loud = baton::model_factory([] {
    torch::nn::Linear fc(8, 4);
    torch::NoGradGuard no_grad;
    fc->weight.mul_(100);
    return fc;
  });
  const auto c = bt::loss_at_init(sp, state_of(loud), bt::first_batch(sp));
  CHECK_FALSE(c);
  CHECK_THAT(c.message, Catch::Contains("above ln(4) = 1.386") && Catch::Contains("confidently wrong"));
  // Regression targets: the check says it does not apply.
  auto reg = sp;
  const auto r = bt::loss_at_init(reg, test::new_state(), baton::Batch{torch::randn({4, 8}), torch::randn({4, 4})});
  CHECK_FALSE(r);
  CHECK_THAT(r.message, Catch::Contains("applies to classification"));
}

TEST_CASE("docs/testing.md quotes its example test file as it is", "[testing][docs]") {
  auto read = [](const std::string& rel) {
    std::ifstream in(std::string(BATON_SOURCE_DIR) + "/" + rel, std::ios::binary);
    REQUIRE(in);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto doc = read("docs/testing.md"), example = read("examples/testing_my_model.cpp");
  const auto section = doc.find("## A complete example");
  REQUIRE(section != std::string::npos);
  const auto begin = doc.find("```cpp\n", section);
  REQUIRE(begin != std::string::npos);
  const auto end = doc.find("```\n", begin + 7);
  REQUIRE(end != std::string::npos);
  const auto quoted = doc.substr(begin + 7, end - begin - 7);
  CHECK(quoted.size() > 500);
  CHECK(example.find(quoted) != std::string::npos);
}
