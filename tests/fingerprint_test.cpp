// A C++ run directory's fingerprint (run.hpp: describe): a resume with any setting that can change
// the bits changed is refused with a diff naming it; bit-neutral settings resume; what baton
// cannot describe must be named, or accepted explicitly.
#include <fmt/format.h>

#include "helpers.hpp"

namespace fs = std::filesystem;
using baton::Time;

namespace {
/// Sets `flag` at the end of run batch 5 (once): a Ctrl-C there, as far as the run can tell.
baton::Callback fp_stop_at_5(std::shared_ptr<std::atomic<bool>> flag, std::shared_ptr<bool> armed) {
  return {"fp_stop_at_5",
          [flag, armed](const baton::EventView& v) -> std::optional<std::string> {
            if (*armed && v.event == baton::Event::batch_end && v.state.time.batch == 5) flag->store(true);
            return std::nullopt;
          },
          /*observer=*/true};
}

baton::ModelFactory fp_mlp(double p) {
  return baton::model_factory([p] {
    namespace nn = torch::nn;
    return nn::Sequential(nn::Linear(8, 16), nn::BatchNorm1d(16), nn::ReLU(), nn::Dropout(p), nn::Linear(16, 4));
  });
}

baton::TrainState fp_state_of(const baton::ModelFactory& factory, std::uint64_t seed = 1) {
  auto s = baton::init_state(factory, {.seed = seed, .max_duration = Time::epochs(4)});
  REQUIRE(s);
  return std::move(*s);
}

/// Two stages on blobs with a label-smoothing algorithm and an evaluation that keep_best reads.
std::vector<baton::TrainingSpec> fp_stages(const baton::Callback& watcher, const baton::Dataset& data) {
  const auto a = test::spec(data, Time::epochs(2))
                     .with_name("a")
                     .with_callbacks({watcher})
                     .with_algorithms({baton::algorithms::label_smoothing({.smoothing = 0.1})});
  const auto b = a.with_name("b")
                     .with_duration(Time::batches(5))
                     .with_evaluation(baton::EvalSchedule{.spec = {.sets = {{"val", data.head(100)}}}})
                     .with_keep_best(baton::KeepBest{.metric = "val/accuracy"});
  return {a, b};
}

/// A run directory stopped at batch 5 of stage "a", with its checkpoint.
struct FpStopped {
  test::TempDir tmp;
  std::shared_ptr<std::atomic<bool>> flag = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<bool> armed = std::make_shared<bool>(true);
  baton::Dataset data = test::blobs(300);
  baton::Callback watcher = fp_stop_at_5(flag, armed);
  std::vector<baton::TrainingSpec> specs = fp_stages(watcher, data);
  baton::RunOptions options{.dir = tmp.path, .progress = false, .stop = flag};
  FpStopped() {
    auto r = baton::run(options, specs, fp_state_of(fp_mlp(0.2)));
    REQUIRE(r);
    REQUIRE(r->interrupted);
    flag->store(false), *armed = false;
  }
};
}  // namespace

TEST_CASE("a C++ run resumed with any of 13 settings changed is refused, with a diff naming the setting", "[run][fingerprint]") {
  struct Change {
    const char* what;
    std::function<void(std::vector<baton::TrainingSpec>&, baton::Dataset&, baton::ModelFactory&, std::uint64_t&)> apply;
    const char* diff;  // a line of the diff ("+ <table>: <key> = ...")
  };
  using Specs = std::vector<baton::TrainingSpec>;
  const std::vector<Change> changes = {
      {"momentum", [](Specs& s, auto&, auto&, auto&) { s[0] = s[0].with_optimizer(baton::optim::sgd({.lr = 0.05, .momentum = 0.5}), baton::Carry::keep); },
       "+ stages[0]: optimizer = \"sgd(lr=0.05, momentum=0.5"},
      {"weight decay", [](Specs& s, auto&, auto&, auto&) { s[1] = s[1].with_optimizer(baton::optim::sgd({.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4}), baton::Carry::keep); },
       "+ stages[1]: optimizer = \"sgd(lr=0.05, momentum=0.9, dampening=0, weight_decay=0.0001"},
      {"another optimizer (the built-ins' text is what it was before they were update rules)",
       [](Specs& s, auto&, auto&, auto&) { s[0] = s[0].with_optimizer(baton::optim::adam({.lr = 0.05}), baton::Carry::fresh); },
       "+ stages[0]: optimizer = \"adam(lr=0.05, betas=(0.9, 0.999), eps=1e-08, weight_decay=0, amsgrad=false)\""},
      {"schedule", [](Specs& s, auto&, auto&, auto&) { s[0] = s[0].with_schedule(baton::schedule::cosine(), baton::Clock::run); },
       "+ stages[0]: schedule = \"cosine(over 1dur, to 0)\""},
      {"loss", [](Specs& s, auto&, auto&, auto&) {
         s[0] = s[0].with_loss(baton::loss::custom("ce_x2", [](const torch::Tensor& o, const torch::Tensor& t) { return 2 * torch::cross_entropy_loss(o, t); }));
       },
       "+ stages[0]: loss = \"ce_x2\""},
      {"an algorithm's option", [](Specs& s, auto&, auto&, auto&) { s[0] = s[0].with_algorithms({baton::algorithms::label_smoothing({.smoothing = 0.2})}); },
       "+ stages[0]: algorithms = [\"label_smoothing(smoothing=0.2)\"]"},
      {"precision", [](Specs& s, auto&, auto&, auto&) { s[0] = s[0].with_precision(baton::Precision::bf16); },
       "+ stages[0]: precision = \"bf16\""},
      {"a link of the optimizer's chain", [](Specs& s, auto&, auto&, auto&) {
         s[0] = s[0].with_optimizer(baton::optim::chain({baton::optim::clip_by_global_norm(2.5)}, baton::optim::sgd({.lr = 0.05, .momentum = 0.9})),
                                    baton::Carry::keep);
       },
       "+ stages[0]: optimizer = \"chain [clip_by_global_norm(2.5)] then sgd(lr=0.05"},
      {"clip by value", [](Specs& s, auto&, auto&, auto&) { s[0] = s[0].with_clip_grad_value(0.5); },
       "+ stages[0]: clip_grad_value = 0.5"},
      {"keep_best", [](Specs& s, auto&, auto&, auto&) { s[1] = s[1].with_keep_best(baton::KeepBest{.metric = "val/loss", .maximize = false}); },
       "+ stages[1]: keep_best = \"val/loss min"},
      {"the model (dropout 0.2 -> 0.3, same parameters)", [](Specs&, auto&, baton::ModelFactory& f, auto&) { f = fp_mlp(0.3); },
       "+ run: model = "},
      {"one label of the data (same name and size)", [](Specs& s, baton::Dataset& d, auto&, auto&) {
         auto targets = d.targets.clone();
         targets[17] = (targets[17].item<std::int64_t>() + 1) % 4;
         auto changed = *baton::make_dataset(d.inputs, targets, d.name);
         s[0] = s[0].with_train_data(changed);
       },
       "+ stages[0]: train_data = \"blobs: 300 samples, sha256 "},
      {"the seed", [](Specs&, auto&, auto&, std::uint64_t& seed) { seed = 2; }, "+ run: seed = 2"},
  };
  for (const auto& c : changes) {
    DYNAMIC_SECTION(c.what) {
      FpStopped stopped;
      auto specs = stopped.specs;
      auto data = stopped.data;
      baton::ModelFactory factory = fp_mlp(0.2);
      std::uint64_t seed = 1;
      c.apply(specs, data, factory, seed);
      const auto refused = baton::run(stopped.options, specs, fp_state_of(factory, seed));
      REQUIRE_FALSE(refused);
      CHECK(refused.error().code == baton::ErrorCode::invalid_spec);
      CHECK_THAT(refused.error().to_string(), Catch::Contains("another configuration") && Catch::Contains(c.diff));
    }
  }
}

TEST_CASE("a C++ run resumed with bit-neutral settings changed (workers, prefetch, observers) goes on to the same bits",
          "[run][fingerprint]") {
  FpStopped whole;
  *whole.armed = false;
  whole.options.fresh = true;
  const auto uninterrupted = baton::run(whole.options, whole.specs, fp_state_of(fp_mlp(0.2)));
  REQUIRE(uninterrupted);

  FpStopped stopped;
  auto specs = stopped.specs;
  for (auto& s : specs)
    s = s.with_data({.train = s.data.train, .batch_size = s.data.batch_size, .workers = 2, .prefetch = 3})
            .with_callbacks({stopped.watcher, baton::callbacks::throughput({.every = 2})});
  const auto resumed = baton::run(stopped.options, specs, fp_state_of(fp_mlp(0.2)));
  REQUIRE(resumed);
  CHECK(resumed->resumed_from);
  CHECK(baton::params_sha256(resumed->state) == baton::params_sha256(uninterrupted->state));
  test::require_same_bits(resumed->state, uninterrupted->state);
}

TEST_CASE("a C++ run with an algorithm baton cannot describe: its resume is refused naming it, unless named or accepted",
          "[run][fingerprint]") {
  test::TempDir tmp;
  auto flag = std::make_shared<std::atomic<bool>>(false);
  auto armed = std::make_shared<bool>(true);
  const auto data = test::blobs(300);
  baton::Algorithm mine{.name = "noise"};
  mine.after_data = [](const baton::AlgorithmContext&, baton::Batch b) {
    b.inputs = b.inputs + 0.01 * torch::randn_like(b.inputs);
    return b;
  };
  auto specs_with = [&](const baton::Algorithm& a) {
    return std::vector{test::spec(data, Time::epochs(2)).with_name("a").with_callbacks({fp_stop_at_5(flag, armed)}).with_algorithms({a})};
  };
  baton::RunOptions options{.dir = tmp.path, .progress = false, .stop = flag};
  REQUIRE(baton::run(options, specs_with(mine), fp_state_of(fp_mlp(0.2)))->interrupted);
  flag->store(false), *armed = false;

  const auto refused = baton::run(options, specs_with(mine), fp_state_of(fp_mlp(0.2)));
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error().to_string(), Catch::Contains("cannot be described") &&
                                              Catch::Contains("stage \"a\": algorithm \"noise\" (Algorithm::identity is empty)") &&
                                              Catch::Contains("accept_undescribed"));
  CHECK_THAT(baton::describe(specs_with(mine)), Catch::Contains("algorithms = [\"(not described: algorithm \\\"noise\\\""));

  SECTION("accepted explicitly") {
    options.accept_undescribed = true;
    const auto accepted = baton::run(options, specs_with(mine), fp_state_of(fp_mlp(0.2)));
    REQUIRE(accepted);
    CHECK(accepted->resumed_from);
  }
  SECTION("named: an identity is a setting like any other") {
    // The run directory was written with the unnamed algorithm: naming it now is a change.
    auto named = mine;
    named.identity = "noise v1, sigma 0.01";
    const auto changed = baton::run(options, specs_with(named), fp_state_of(fp_mlp(0.2)));
    REQUIRE_FALSE(changed);
    CHECK_THAT(changed.error().to_string(), Catch::Contains("+ stages[0]: algorithms = [\"noise v1, sigma 0.01\"]"));
  }
}

TEST_CASE("describe: a dataset's identity follows its content, a lazy one's its source", "[run][fingerprint]") {
  const auto a = test::blobs(300);
  const auto b = test::blobs(300, 8);  // same name and size, other samples
  CHECK(a.identity() == test::blobs(300).identity());
  CHECK(a.identity() != b.identity());
  CHECK(a.identity().find("blobs: 300 samples, sha256 ") == 0);
  // A transform of in-memory data describes itself by its base and its name.
  const auto t = baton::data::transform(a, [](const torch::Tensor& x, at::Generator&) { return x * 2; }, "double");
  CHECK_THAT(t.identity(), Catch::Contains("tensors sha256") && Catch::Contains("transform \"double\""));
  // A user's Source that gives no identity cannot be described.
  struct Mine final : baton::Source {
    std::int64_t size() const override { return 4; }
    baton::Expected<baton::Batch> batch(const torch::Tensor& i, const baton::SampleContext&) const override {
      return baton::Batch{torch::zeros({i.size(0), 8}), torch::zeros({i.size(0)}, torch::kLong)};
    }
    std::vector<std::int64_t> input_shape() const override { return {8}; }
    std::int64_t classes() const override { return 4; }
  };
  const auto lazy = baton::make_dataset(std::make_shared<Mine>(), "mine");
  CHECK(lazy.identity().empty());
  std::vector<std::string> undescribed;
  baton::describe({test::spec(lazy, Time::epochs(1))}, nullptr, &undescribed);
  REQUIRE(undescribed.size() == 1);
  CHECK_THAT(undescribed[0], Catch::Contains("the training data (its Source has no identity)"));
}
