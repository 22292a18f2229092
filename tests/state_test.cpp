#include "helpers.hpp"

namespace {
torch::Tensor first_param(const baton::TrainState& s) { return s.named_parameters().front().second; }

// A user module that is not Cloneable: only a factory makes copies.
struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl() : a(register_module("a", torch::nn::Linear(8, 5))), b(register_module("b", torch::nn::Linear(5, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) { return b(torch::tanh(a(x))); }
  torch::nn::Linear a, b;
};
TORCH_MODULE(TwoLayer);
}  // namespace

TEST_CASE("init_state is a function of the seed and leaves the global RNG alone", "[state]") {
  torch::manual_seed(123);
  const auto global_before = torch::rand({4});
  torch::manual_seed(123);
  auto a = test::new_state(5);
  auto b = test::new_state(5);
  auto c = test::new_state(6);
  CHECK(torch::rand({4}).equal(global_before));  // init drew from its own seeded generator
  CHECK(baton::bitwise_equal(a, b));
  CHECK_FALSE(first_param(a).equal(first_param(c)));
  CHECK(a.time == baton::Timestamp{});
  CHECK(a.optimizer.kind.empty());
  CHECK_FALSE(a.finished());
}

TEST_CASE("copying a state is deep -- moving it is free", "[state]") {
  auto a = test::new_state();
  auto copy = a;
  CHECK(baton::bitwise_equal(a, copy));
  CHECK(copy.model.module != a.model.module);
  {
    torch::NoGradGuard g;
    first_param(copy).add_(1.0);
    copy.named_buffers().front().second.add_(1.0);
  }
  CHECK_FALSE(first_param(a).equal(first_param(copy)));
  CHECK_FALSE(baton::bitwise_equal(a, copy));
  copy.rng.fill_(0);
  CHECK_FALSE(a.rng.equal(copy.rng));

  const auto* module = a.model.module.get();
  const auto data = first_param(a).data_ptr();
  baton::TrainState moved = std::move(a);
  CHECK(moved.model.module.get() == module);
  CHECK(first_param(moved).data_ptr() == data);

  baton::TrainState assigned;
  assigned = moved;
  CHECK(baton::bitwise_equal(assigned, moved));
  CHECK(first_param(assigned).data_ptr() != first_param(moved).data_ptr());
}

TEST_CASE("copies include the optimizer moments, deeply", "[state]") {
  const auto data = test::blobs(200);
  auto s = test::ok(baton::fit(test::spec(data, baton::Time::batches(3)), test::new_state()));
  REQUIRE(s.optimizer.kind == "sgd");
  auto copy = s;
  REQUIRE(baton::bitwise_equal(s, copy));
  auto& buf = copy.optimizer.params.begin()->second.slots[0];
  REQUIRE(buf.defined());
  buf.add_(1.0);
  CHECK_FALSE(baton::bitwise_equal(s, copy));
}

TEST_CASE("any torch::nn::Module with a factory can be trained and copied", "[state]") {
  auto factory = baton::model_factory([] { return TwoLayer(); });
  auto s = baton::init_state(factory, {.seed = 3, .max_duration = baton::Time::epochs(1)});
  REQUIRE(s);
  auto copy = *s;
  CHECK(baton::bitwise_equal(*s, copy));
  auto trained = baton::fit(test::spec(test::blobs(100), baton::Time::epochs(1)), copy);
  REQUIRE(trained);
  CHECK(baton::bitwise_equal(*s, copy));
  CHECK(trained->named_parameters().size() == 4);
  CHECK(trained->named_parameters()[0].first == "a.weight");
}

TEST_CASE("a factory that builds another architecture on another call is an init_state error, not a throwing copy",
          "[state]") {
  int calls = 0;
  auto factory = baton::model_factory([&calls] { return torch::nn::Linear(8, ++calls < 2 ? 4 : 5); });
  auto s = baton::init_state(factory, {.seed = 3, .max_duration = baton::Time::epochs(1)});
  REQUIRE_FALSE(s);
  CHECK(s.error().code == baton::ErrorCode::invalid_argument);
  CHECK_THAT(s.error().message, Catch::Contains("a factory must build the same architecture every time"));
  // A factory that builds the same architecture every time: the state copies cleanly.
  const auto good = test::new_state();
  CHECK(baton::bitwise_equal(good, baton::TrainState(good)));
}

TEST_CASE("init_state rejects bad options", "[state]") {
  CHECK_FALSE(baton::init_state(nullptr, {}));
  CHECK_FALSE(baton::init_state(test::bn_dropout_mlp(), {.max_duration = baton::Time::fraction(0.5)}));
  CHECK_FALSE(baton::init_state(test::bn_dropout_mlp(), {.max_duration = baton::Time::epochs(0)}));
}

TEST_CASE("a callback that keeps nothing leaves no entry in the state: bitwise_equal to the fit without it", "[state][callbacks]") {
  const auto data = test::blobs(200);
  const auto spec = test::spec(data, baton::Time::batches(3));
  auto calls = std::make_shared<int>(0);
  const baton::Callback watcher{"watcher", [calls](const baton::EventView&) -> std::optional<std::string> {
                                  ++*calls;
                                  return std::nullopt;
                                }};
  const auto without = test::ok(baton::fit(spec, test::new_state()));
  // A user's callback and a built-in one (lr_monitor logs, keeps nothing).
  const auto with = test::ok(baton::fit(spec.with_callbacks({watcher, baton::callbacks::lr_monitor()}), test::new_state()));
  CHECK(*calls > 0);
  CHECK(with.callback_state.empty());
  CHECK(baton::first_difference(with, without) == std::nullopt);
  CHECK(baton::bitwise_equal(with, without));
  // One that keeps something is in the state, and then the states differ.
  const baton::Callback counter{"counter", [](const baton::EventView& v) -> std::optional<std::string> {
                                  (*v.memory)["events"] += 1;
                                  return std::nullopt;
                                }};
  const auto counted = test::ok(baton::fit(spec.with_callbacks({watcher, counter}), test::new_state()));
  CHECK(counted.callback_state.size() == 1);
  CHECK(counted.callback_state.at("counter").at("events") > 0);
  CHECK(baton::first_difference(counted, without) == std::optional<std::string>("callback state \"counter\": only in the first state"));
}

TEST_CASE("an algorithm that keeps nothing yet leaves no entry: SWA before its start survives a checkpoint bit for bit",
          "[state][algorithms][checkpoint]") {
  const auto data = test::blobs(200);
  // 2 of the stage's 10 batches: before SWA's start (half the stage), it has averaged nothing.
  const auto spec = test::spec(data, baton::Time::batches(10)).with_algorithms({baton::algorithms::swa({.start = 0.5})});
  const auto s = test::ok(baton::fit(spec, test::new_state(), baton::Time::batches(2)));
  CHECK(s.algorithm_state.count("swa") == 0);
  CHECK(baton::first_difference(s, test::ok(baton::fit(test::spec(data, baton::Time::batches(10)), test::new_state(),
                                                         baton::Time::batches(2)))) == std::nullopt);
  test::TempDir dir;
  REQUIRE(baton::save_checkpoint(s, dir.path / "s.baton"));
  const auto loaded = test::ok(baton::load_checkpoint(dir.path / "s.baton", test::bn_dropout_mlp()));
  CHECK(baton::first_difference(s, loaded) == std::nullopt);
  // Past the start it keeps the mean.
  const auto later = test::ok(baton::fit(spec, s, baton::Time::batches(5)));
  CHECK(later.algorithm_state.at("swa").count("#count") == 1);
}
