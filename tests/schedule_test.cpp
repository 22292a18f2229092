// Every schedule against its closed form, at many points and at its boundaries.
#include <cmath>
#include <numbers>

#include "helpers.hpp"

using baton::Schedule;
using baton::ScheduleTime;
using baton::Time;
namespace sch = baton::schedule;

namespace {
constexpr double pi = std::numbers::pi;
// 10 batches of 32 per epoch; the horizon (what 1dur is) is 100 batches.
ScheduleTime when(double batch, Time horizon = Time::batches(100)) { return ScheduleTime::at_batch(batch, 10, 32, horizon); }

template <class F>
void compare(const Schedule& s, F closed_form, double to = 120, double step = 0.5) {
  for (double b = 0; b <= to; b += step) {
    INFO(s.name << " at batch " << b);
    CHECK(s(when(b)) == Approx(closed_form(b)).margin(1e-12));
  }
}

/// Continuity: no jump larger than `tol` between b and b + 1e-6 anywhere on [0, to].
void continuous(const Schedule& s, double to = 120, double tol = 1e-4) {
  for (double b = 0; b <= to; b += 0.25) {
    INFO(s.name << " near batch " << b);
    CHECK(std::abs(s(when(b + 1e-6)) - s(when(b))) < tol);
  }
}
}  // namespace

TEST_CASE("step-like schedules match their closed forms, boundaries included", "[schedule]") {
  compare(sch::constant(0.3), [](double) { return 0.3; });
  compare(sch::step(Time::batches(20), 0.5), [](double b) { return std::pow(0.5, std::floor(b / 20)); });
  compare(sch::step(Time::epochs(2), 0.5), [](double b) { return std::pow(0.5, std::floor(b / 20)); });
  compare(sch::step(Time::samples(640), 0.5), [](double b) { return std::pow(0.5, std::floor(b * 32 / 640)); });
  compare(sch::step(Time::fraction(0.2), 0.5), [](double b) { return std::pow(0.5, std::floor(b / 20)); });
  compare(sch::multistep({Time::batches(30), Time::epochs(6)}, 0.1),
          [](double b) { return std::pow(0.1, (b >= 30) + (b >= 60)); });
  // Exactly at a boundary the new value applies.
  CHECK(sch::step(Time::batches(20), 0.5)(when(20)) == 0.5);
  CHECK(sch::step(Time::batches(20), 0.5)(when(19.999)) == 1.0);
  CHECK(sch::multistep({Time::batches(30)}, 0.1)(when(30)) == Approx(0.1));
}

TEST_CASE("continuous schedules match their closed forms and are continuous", "[schedule]") {
  const auto exp = sch::exponential(0.9, Time::batches(10));
  compare(exp, [](double b) { return std::pow(0.9, b / 10); });
  continuous(exp);
  const auto lin = sch::linear(1.0, 0.1, Time::batches(50));
  compare(lin, [](double b) { return 1.0 + (0.1 - 1.0) * std::min(1.0, b / 50); });
  continuous(lin);
  const auto poly = sch::polynomial(2.0, 1.0, 0.0, Time::fraction(1.0));
  compare(poly, [](double b) { return std::pow(1.0 - std::min(1.0, b / 100), 2.0); });
  continuous(poly);
  const auto cos = sch::cosine(Time::fraction(1.0), 0.1);
  compare(cos, [](double b) { return 0.1 + 0.9 * 0.5 * (1 + std::cos(pi * std::min(1.0, b / 100))); });
  continuous(cos);
  CHECK(cos(when(0)) == 1.0);
  CHECK(cos(when(100)) == Approx(0.1));
  CHECK(cos(when(50)) == Approx(0.55));
  const auto isq = sch::inverse_sqrt(Time::batches(10));
  compare(isq, [](double b) { return b <= 10 ? 1.0 : std::sqrt(10.0 / b); });
  continuous(isq);
  CHECK(isq(when(40)) == Approx(0.5));
}

TEST_CASE("cosine with warm restarts restarts at each period, periods growing", "[schedule]") {
  const auto sgdr = sch::cosine_warm_restarts(Time::batches(20), 2.0, 0.0);
  // Cycles: [0, 20), [20, 60), [60, 140).
  compare(sgdr, [](double b) {
    double start = 0, len = 20;
    while (b >= start + len) start += len, len *= 2;
    return 0.5 * (1 + std::cos(pi * (b - start) / len));
  }, 139);
  CHECK(sgdr(when(20)) == Approx(1.0));
  CHECK(sgdr(when(60)) == Approx(1.0));
  CHECK(sgdr(when(40)) == Approx(0.5));
  const auto fixed = sch::cosine_warm_restarts(Time::epochs(1), 1.0, 0.0);
  compare(fixed, [](double b) { return 0.5 * (1 + std::cos(pi * std::fmod(b, 10.0) / 10)); });
}

TEST_CASE("one-cycle rises to the peak then anneals to the floor", "[schedule]") {
  const auto oc = sch::one_cycle(Time::fraction(1.0), 2.0, 0.3, 25.0, 1e4);
  compare(oc, [](double b) {
    const double f = std::min(1.0, b / 100), initial = 2.0 / 25, lowest = initial / 1e4;
    auto anneal = [](double a, double z, double p) { return z + (a - z) * 0.5 * (1 + std::cos(pi * p)); };
    return f < 0.3 ? anneal(initial, 2.0, f / 0.3) : anneal(2.0, lowest, (f - 0.3) / 0.7);
  });
  continuous(oc, 120, 1e-3);
  CHECK(oc(when(0)) == Approx(0.08));
  CHECK(oc(when(30)) == Approx(2.0));
  CHECK(oc(when(100)) == Approx(0.08 / 1e4));
}

TEST_CASE("warm-up, join and scale compose schedules", "[schedule]") {
  const auto warm = sch::linear_warmup(Time::batches(10), sch::cosine(Time::fraction(1.0)));
  // The cosine runs on time shifted by the warm-up, over the 90 batches left of the horizon.
  compare(warm, [](double b) {
    return b < 10 ? b / 10 : 0.5 * (1 + std::cos(pi * std::min(1.0, (b - 10) / 90)));
  });
  continuous(warm);
  CHECK(warm.warmup == Time::batches(10));
  const auto warm_dur = sch::linear_warmup(Time::fraction(0.1), sch::constant(0.5), 0.2);
  compare(warm_dur, [](double b) { return b < 10 ? (0.2 + 0.8 * b / 10) * 0.5 : 0.5; });

  const auto joined = sch::join({sch::constant(1.0), sch::linear(1.0, 0.0, Time::batches(10)), sch::constant(0.1)},
                                {Time::batches(20), Time::epochs(3)});
  compare(joined, [](double b) { return b < 20 ? 1.0 : b < 30 ? 1.0 - (b - 20) / 10 : 0.1; });

  const auto slow = sch::scale(sch::cosine(Time::batches(100)), 2.0);
  compare(slow, [](double b) { return 0.5 * (1 + std::cos(pi * std::min(1.0, b / 200))); }, 220);
  CHECK(sch::scale(warm, 0.5).warmup == Time::batches(5));
}

TEST_CASE("schedules are built by name, with errors that list valid names and keys", "[schedule][names]") {
  auto cos = sch::from_name("cosine", {{"to", 0.1}, {"warmup", std::string("10ba")}});
  REQUIRE(cos);
  CHECK((*cos)(when(5)) == Approx(0.5));
  CHECK(cos->warmup == Time::batches(10));
  auto step = sch::from_name("step", {{"step_size", std::string("2ep")}, {"gamma", 0.5}});
  REQUIRE(step);
  CHECK((*step)(when(20)) == 0.5);
  auto ms = sch::from_name("multistep", {{"milestones", std::vector<std::string>{"30ba", "60ba"}}});
  REQUIRE(ms);
  CHECK((*ms)(when(61)) == Approx(0.01));
  for (const auto& name : sch::names()) {
    baton::Params p;
    if (name == "step") p["step_size"] = std::string("1ep");
    if (name == "multistep") p["milestones"] = std::vector<std::string>{"1ep"};
    if (name == "cosine_warm_restarts") p["period"] = std::string("1ep");
    if (name == "inverse_sqrt") p["warmup"] = std::string("10ba");
    INFO(name);
    CHECK(sch::from_name(name, p));
  }

  auto unknown = sch::from_name("cosin", {});
  REQUIRE_FALSE(unknown);
  CHECK_THAT(unknown.error().message, Catch::Contains("did you mean \"cosine\"") && Catch::Contains("one_cycle"));
  auto key = sch::from_name("cosine", {{"too", 0.1}});
  REQUIRE_FALSE(key);
  CHECK_THAT(key.error().message, Catch::Contains("unknown key \"too\"") && Catch::Contains("did you mean \"to\""));
  auto type = sch::from_name("step", {{"step_size", 3.0}});
  REQUIRE_FALSE(type);
  CHECK_THAT(type.error().message, Catch::Contains("schedule.step_size"));
  auto bad_time = sch::from_name("cosine", {{"over", std::string("3xx")}});
  REQUIRE_FALSE(bad_time);
  CHECK_THAT(bad_time.error().message, Catch::Contains("\"3xx\""));
  auto negative = sch::from_name("exponential", {{"gamma", -0.5}});
  REQUIRE_FALSE(negative);
  CHECK_THAT(negative.error().message, Catch::Contains("schedule.gamma"));
  CHECK_FALSE(sch::from_name("step", {}));  // step_size is required
}
