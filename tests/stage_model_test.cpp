// The stage model: a stage's length belongs to the stage, and every cut of it into fits (with
// budgets), with a save/load in the middle, trains the bits of the uncut stage -- for every
// algorithm and every schedule kind.
#include <cmath>
#include <filesystem>

#include "helpers.hpp"

namespace {
using baton::Clock;
using baton::Time;
using test::ok;
using test::require_same_bits;
namespace algo = baton::algorithms;
namespace sched = baton::schedule;

/// Everything a resume must reproduce that `bitwise_equal` does not look at.
void require_same_memory(const baton::TrainState& a, const baton::TrainState& b) {
  REQUIRE(a.algorithm_state.size() == b.algorithm_state.size());
  for (const auto& [name, tensors] : a.algorithm_state) {
    INFO("algorithm " << name);
    REQUIRE(b.algorithm_state.count(name));
    const auto& other = b.algorithm_state.at(name);
    REQUIRE(tensors.size() == other.size());
    for (const auto& [key, t] : tensors) {
      INFO("tensor " << key);
      REQUIRE(other.count(key));
      REQUIRE(t.defined() == other.at(key).defined());
      if (t.defined()) REQUIRE(t.equal(other.at(key)));
    }
  }
  REQUIRE(a.history.size() == b.history.size());
  for (std::size_t i = 0; i < a.history.size(); ++i) {
    CHECK(a.history[i].end == b.history[i].end);
    CHECK(a.history[i].last_lr == b.history[i].last_lr);
    CHECK(a.history[i].last_loss == b.history[i].last_loss);
  }
}

/// `spec` from `init` in one fit, and cut by two budgets with a checkpoint save/load after the
/// second, then finished by a plain fit: the same bits.
void require_cut_invariant(const baton::TrainingSpec& spec, const baton::TrainState& init, const baton::ModelFactory& factory,
                           Time first, Time second) {
  test::TempDir dir;
  const auto whole = ok(baton::fit(spec, init));
  auto s = ok(baton::fit(spec, init, first));
  s = ok(baton::fit(spec, std::move(s), second));
  REQUIRE(s.time.batch < whole.time.batch);  // the cuts are inside the stage
  REQUIRE(baton::save_checkpoint(s, dir.path / "cut.baton"));
  s = ok(baton::load_checkpoint(dir.path / "cut.baton", factory));
  s = ok(baton::fit(spec, std::move(s)));
  require_same_bits(whole, s);
  require_same_memory(whole, s);
}
}  // namespace

TEST_CASE("every algorithm: a stage cut into 3 fits at odd points, with a save/load, equals the uncut stage",
          "[stage][algorithms][property]") {
  const auto data = test::images(120);  // batch 16: 8 batches an epoch, the last of 8 samples
  const baton::TrainingSpec base{.name = "img",
                                 .data = {.train = data, .batch_size = 16},
                                 .optimizer = baton::optim::adam({.lr = 1e-2}),
                                 .duration = Time::epochs(3)};
  auto init = baton::init_state(test::tiny_cnn(), {.seed = 5, .max_duration = Time::epochs(5)});
  REQUIRE(init);
  // A first stage, so that the stage's clock and progress differ from the run's.
  const auto pre = ok(baton::fit(base.with_name("pre").with_duration(Time::batches(3)), *init));
  const std::vector<std::pair<std::string, baton::Algorithm>> all = {
      {"label_smoothing", algo::label_smoothing({.smoothing = 0.1})},
      {"mixup", algo::mixup({.alpha = 0.4})},
      {"cutmix", algo::cutmix({.alpha = 1.0})},
      {"cutout", algo::cutout({.size = 4})},
      {"random_crop_flip", algo::random_crop_flip({.padding = 1})},
      {"progressive_resizing", algo::progressive_resizing({.initial_scale = 0.5, .finetune_fraction = 0.25, .size_increment = 2})},
      {"ema", algo::ema({.decay = 0.9})},
      {"swa", algo::swa({.start = 0.5, .every = 2, .apply_at_end = true})},
      {"layer_freezing", algo::layer_freezing({{"0.*", 0.4}, {"1.*", 0.7}})},
  };
  for (const auto& [name, a] : all) {
    INFO("algorithm " << name);
    require_cut_invariant(base.with_algorithms({a}), pre, test::tiny_cnn(), Time::batches(5), Time::samples(50));
  }
}

TEST_CASE("every schedule kind on the stage clock: a stage cut into 3 fits, with a save/load, equals the uncut stage",
          "[stage][schedule][property]") {
  const auto data = test::blobs(300);  // batch 32: 10 batches an epoch, the last of 12 samples
  const auto base = test::spec(data, Time::epochs(3)).with_optimizer(baton::optim::sgd({.lr = 0.1, .momentum = 0.9}),
                                                                      baton::Carry::keep);
  const auto pre = ok(baton::fit(base.with_name("pre").with_duration(Time::batches(4)), test::new_state(1, Time::epochs(6))));
  const std::vector<std::pair<std::string, baton::Schedule>> all = {
      {"constant", sched::constant(0.5)},
      {"step", sched::step(Time::batches(7), 0.5)},
      {"multistep", sched::multistep({Time::batches(5), Time::epochs(2)}, 0.3)},
      {"exponential", sched::exponential(0.9, Time::batches(3))},
      {"linear", sched::linear()},
      {"polynomial", sched::polynomial(2.0)},
      {"cosine", sched::cosine()},
      {"cosine_warm_restarts", sched::cosine_warm_restarts(Time::batches(8), 2.0)},
      {"one_cycle", sched::one_cycle()},
      {"inverse_sqrt", sched::inverse_sqrt(Time::batches(4))},
      {"linear_warmup", sched::linear_warmup(Time::fraction(0.2), sched::cosine())},
      {"join", sched::join({sched::linear(0.1, 1.0, Time::batches(6)), sched::cosine()}, {Time::batches(6)})},
      {"scale", sched::scale(sched::cosine(), 0.5)},
  };
  for (const auto& [name, s] : all) {
    for (Clock clock : {Clock::stage, Clock::run}) {
      INFO("schedule " << name << " on the " << (clock == Clock::stage ? "stage" : "run") << " clock");
      require_cut_invariant(base.with_schedule(s, clock), pre, test::bn_dropout_mlp(), Time::batches(7), Time::samples(97));
    }
  }
}

TEST_CASE("a budget counts from the call and ends at a batch boundary -- a zero budget changes nothing", "[stage]") {
  const auto data = test::blobs(1000);
  const auto spec = test::spec(data, Time::epochs(2)).with_batch_size(64);
  const auto init = test::new_state();
  // 150 samples with batch 64: the first boundary at or past 150 is 3 batches (192 samples).
  auto s = ok(baton::fit(spec, init, Time::samples(150)));
  CHECK(s.time.batch == 3);
  CHECK(s.time.sample == 192);
  s = ok(baton::fit(spec, std::move(s), Time::samples(150)));
  CHECK(s.time.batch == 6);
  CHECK(s.time.sample == 384);
  // fit_end plans the same without training.
  const auto planned = baton::fit_end(spec, s, Time::samples(150));
  REQUIRE(planned);
  const auto next = ok(baton::fit(spec, s, Time::samples(150)));
  CHECK(*planned == next.time);
  // A zero budget: the state comes back as it was; not even a new stage begins.
  const auto other = spec.with_name("other");
  const auto same = ok(baton::fit(other, s, Time::batches(0)));
  require_same_bits(s, same);
  CHECK(same.stage == s.stage);
  CHECK(same.history.size() == s.history.size());
  // A stage that is done: a further fit of it returns the state unchanged.
  const auto done = ok(baton::fit(spec, s));
  CHECK(done.time.epoch == 2);
  const auto again = ok(baton::fit(spec, done, Time::epochs(1)));
  require_same_bits(done, again);
  // Negative budgets are errors that say so.
  const auto bad = baton::fit(spec, s, Time{-1, baton::TimeUnit::batch});
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().to_string(), Catch::Contains("budget"));
}

TEST_CASE("fit_end refuses the budgets fit refuses, with the same message", "[stage][errors]") {
  const auto data = test::blobs(1000);
  const auto spec = test::spec(data, Time::epochs(2)).with_batch_size(64);
  const auto s = ok(baton::fit(spec, test::new_state(), Time::batches(2)));
  const double nan = std::nan("");
  for (const Time budget : {Time{1.5, baton::TimeUnit::batch}, Time{2.5, baton::TimeUnit::sample},
                            Time{-1, baton::TimeUnit::batch}, Time{nan, baton::TimeUnit::sample}, Time{1.5, baton::TimeUnit::duration}}) {
    INFO("budget " << budget.to_string());
    const auto trained = baton::fit(spec, s, budget);
    const auto planned = baton::fit_end(spec, s, budget);
    REQUIRE_FALSE(trained);
    REQUIRE_FALSE(planned);  // not a timestamp fit would never reach
    CHECK(planned.error().code == trained.error().code);
    const auto& m = trained.error().message;
    REQUIRE(m.starts_with("fit: the budget: "));
    CHECK(planned.error().message == "fit_end: the budget: " + m.substr(std::string("fit: the budget: ").size()));
    CHECK_THAT(planned.error().to_string(), Catch::Contains("stage \"" + spec.name + "\""));
  }
}
