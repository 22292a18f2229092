// TrainState and Time as values: what bitwise_equal compares, save/load round trips, invalid
// times refused where they enter, and what the optimizer carry says when it cannot apply.
#include "helpers.hpp"

using baton::Carry;
using baton::Time;
using baton::TimeUnit;

namespace {
baton::Callback quiet_callback() {
  return {"quiet", [](const baton::EventView&) -> std::optional<std::string> { return std::nullopt; }};
}

std::string error_of(const baton::Expected<baton::TrainState>& r) { return r ? "(no error)" : r.error().to_string(); }
}  // namespace

TEST_CASE("bitwise_equal compares the RNG, history, seed and callback state -- a save/load round trip is always equal",
          "[state][value]") {
  test::TempDir tmp;
  const auto spec = test::spec(test::blobs(100), Time::batches(3)).with_callbacks({quiet_callback()});
  const auto s = test::ok(baton::fit(spec, test::new_state()));
  REQUIRE(s.callback_state.count("quiet") == 0);  // a callback that keeps nothing has no entry
  REQUIRE(baton::save_checkpoint(s, tmp.path / "s.baton"));
  const auto loaded = test::ok(baton::load_checkpoint(tmp.path / "s.baton", test::bn_dropout_mlp()));
  CHECK(baton::bitwise_equal(s, loaded));
  CHECK(baton::bitwise_equal(s, baton::TrainState(s)));

  auto other_rng = s;
  other_rng.rng = test::new_state(99).rng;
  CHECK_FALSE(baton::bitwise_equal(s, other_rng));
  auto other_history = s;
  other_history.history.back().last_loss += 1;
  CHECK_FALSE(baton::bitwise_equal(s, other_history));
  auto other_seed = s;
  other_seed.seed += 1;
  CHECK_FALSE(baton::bitwise_equal(s, other_seed));
  auto other_callback = s;
  other_callback.callback_state["quiet"]["x"] = 1;
  CHECK_FALSE(baton::bitwise_equal(s, other_callback));
  // A NaN loss (a stage that took no step) equals itself after a round trip, whatever its bits.
  auto nan_loss = s;
  nan_loss.history.back().last_loss = -std::numeric_limits<double>::quiet_NaN();
  REQUIRE(baton::save_checkpoint(nan_loss, tmp.path / "nan.baton"));
  CHECK(baton::bitwise_equal(nan_loss, test::ok(baton::load_checkpoint(tmp.path / "nan.baton", test::bn_dropout_mlp()))));
}

TEST_CASE("a Time no text parses to is refused where it enters, and prints as it is", "[time][value]") {
  CHECK(Time{1.5, TimeUnit::batch}.to_string() == "1.5ba");
  CHECK(Time{0.5, TimeUnit::epoch}.to_string() == "0.5ep");
  CHECK_THAT((Time{1.5, TimeUnit::batch}.check()).error().message, Catch::Contains("batches are counted in whole numbers"));
  CHECK_THAT((Time{-2, TimeUnit::sample}.check()).error().message, Catch::Contains("negative"));
  CHECK_THAT((Time{std::nan(""), TimeUnit::epoch}.check()).error().message, Catch::Contains("not a finite number"));
  CHECK_THAT((Time{2, TimeUnit::duration}.check()).error().message, Catch::Contains("at most 1"));
  CHECK(Time::batches(3).check());
  CHECK(Time::fraction(0.25).check());

  const auto spec = test::spec(test::blobs(100), Time::batches(3));
  const auto s = test::new_state();
  CHECK_THAT(error_of(baton::fit(spec, s, Time{1.5, TimeUnit::batch})), Catch::Contains("batches are counted in whole numbers"));
  CHECK_THAT(error_of(baton::fit(spec.with_duration(Time{-0.5, TimeUnit::epoch}), s)),
             Catch::Contains("duration: time \"-0.5ep\": negative"));
  auto bad = baton::init_state(test::bn_dropout_mlp(), {.seed = 1, .max_duration = Time{2.5, TimeUnit::epoch}});
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Catch::Contains("max_duration \"2.5ep\": the run's max duration counts whole epochs"));
}

TEST_CASE("optimizer carry: the error says whether the fit begins or continues the stage, and which carry it had",
          "[carry][value]") {
  const auto data = test::blobs(200);
  const auto a = test::spec(data, Time::batches(6)).with_name("a");  // SGD with momentum
  const auto adam = baton::optim::adam({.lr = 1e-3});
  const auto after_a = test::ok(baton::fit(a, test::new_state()));

  // A new stage keeping SGD moments for Adam.
  const auto b_keep = a.with_name("b").with_optimizer(adam, Carry::keep);
  CHECK_THAT(error_of(baton::fit(b_keep, after_a)),
             Catch::Contains("stage \"b\" begins with Carry::keep") && Catch::Contains("with_optimizer(opt, Carry::fresh)"));
  CHECK(baton::fit(a.with_name("b").with_optimizer(adam, Carry::fresh), after_a));

  // The same stage, continued by a fit whose optimizer changed: no carry can apply midway.
  const auto half = test::ok(baton::fit(a, test::new_state(), Time::batches(3)));
  const auto a_adam = a.with_optimizer(adam, Carry::fresh);
  CHECK_THAT(error_of(baton::fit(a_adam, half)),
             Catch::Contains("this fit continues stage \"a\" (begun by an earlier fit)") &&
                 Catch::Contains("whatever the carry"));

  // Carry::fresh in a fit that continues its stage (same optimizer): the moments continue, as
  // they must for a stage split into several fits to equal one fit (docs/stages.md).
  const auto a_fresh = a.with_optimizer(a.optimizer, Carry::fresh);
  const auto one = test::ok(baton::fit(a_fresh, test::new_state()));
  const auto split = test::ok(baton::fit(a_fresh, test::ok(baton::fit(a_fresh, test::new_state(), Time::batches(3)))));
  test::require_same_bits(one, split);
}

TEST_CASE("freezing every parameter is a spec error that says so, not an autograd error", "[carry][freeze]") {
  const auto spec = test::spec(test::blobs(100), Time::batches(2)).with_freeze({"*"});
  const auto r = baton::fit(spec, test::new_state());
  REQUIRE_FALSE(r);
  CHECK(r.error().code == baton::ErrorCode::invalid_spec);
  CHECK_THAT(r.error().message, Catch::Contains("freeze every parameter, so nothing would train"));
}

