#include <fmt/format.h>

#include "helpers.hpp"

using baton::Time;
using baton::TimeUnit;

TEST_CASE("durations parse with their unit", "[time]") {
  CHECK(*Time::parse("3ep") == Time{3, TimeUnit::epoch});
  CHECK(*Time::parse("500ba") == Time{500, TimeUnit::batch});
  CHECK(*Time::parse("12000sp") == Time{12000, TimeUnit::sample});
  CHECK(*Time::parse("0.25dur") == Time{0.25, TimeUnit::duration});
  CHECK(*Time::parse("1dur") == Time{1, TimeUnit::duration});
  CHECK(Time::parse("0.1dur")->value == 0.1);  // same double as the C library's strtod
  CHECK(*Time::parse("0.5ep") == Time{0.5, TimeUnit::epoch});  // a part of an epoch: on the batch grid
  CHECK(Time::parse("1.1ep")->value == 1.1);
  CHECK(Time::parse("0.1234567890123456ep").error().message.find("at most 15 decimals") != std::string::npos);
}

TEST_CASE("duration text round-trips", "[time]") {
  for (const char* text : {"3ep", "500ba", "12000sp", "0.25dur", "0.1dur", "0ep", "0.5ep", "2.75ep", "0.001ep",
                           "0.00001dur", "0.123456789012345dur"}) {
    auto t = Time::parse(text);
    REQUIRE(t);
    CHECK(t->to_string() == text);
    CHECK(*Time::parse(t->to_string()) == *t);
  }
}

TEST_CASE("malformed durations are errors that quote the input and list the units", "[time]") {
  for (const char* text : {"10xx", "-1ep", "", "1.5ba", "1.5sp", "0.1234567890123456ep", "2dur", "ep", "3", "3 ep", "1..2dur", "3ep ", "+1ep"}) {
    INFO("input: \"" << text << "\"");
    auto t = Time::parse(text);
    REQUIRE_FALSE(t);
    CHECK(t.error().code == baton::ErrorCode::invalid_time);
    const std::string msg = t.error().message;
    CHECK_THAT(msg, Catch::Contains(fmt::format("\"{}\"", text)));
    for (const char* unit : {"ep", "ba", "sp", "dur"}) CHECK_THAT(msg, Catch::Contains(unit));
  }
  CHECK_THAT(Time::parse("10xx").error().message, Catch::Contains("unknown unit \"xx\""));
  CHECK_THAT(Time::parse("1.5ba").error().message, Catch::Contains("whole batches") && Catch::Contains("\"0.5ep\""));
  CHECK_THAT(Time::parse("-1ep").error().message, Catch::Contains("non-negative"));
}

TEST_CASE("time literals are checked at compile time", "[time]") {
  using namespace baton::literals;
  static_assert("3ep"_t == Time{3, TimeUnit::epoch});
  static_assert("0.5dur"_t == Time{0.5, TimeUnit::duration});
  constexpr Time t = "700ba"_t;
  CHECK(t.count() == 700);
}

TEST_CASE("errors carry a context chain", "[time][error]") {
  auto e = Time::parse("x").error().with_context("data.train").with_context("stage \"finetune\"");
  CHECK(e.to_string().rfind("stage \"finetune\" > data.train: [invalid_time] ", 0) == 0);
}

namespace {
/// Records the run batch of every evaluation and checkpoint event.
baton::Callback time_test_event_batches(std::shared_ptr<std::vector<std::pair<std::string, std::int64_t>>> seen) {
  return {"event_batches", [seen](const baton::EventView& v) -> std::optional<std::string> {
            if (v.event == baton::Event::eval_end) seen->emplace_back("eval", v.state.time.batch);
            if (v.event == baton::Event::checkpoint) seen->emplace_back("checkpoint", v.state.time.batch);
            return std::nullopt;
          },
          /*observer=*/true};
}
}  // namespace

TEST_CASE("a part of an epoch as an interval, a budget and a stage's duration: on the batch grid, the same in any split",
          "[time][fraction]") {
  test::TempDir tmp;
  const auto data = test::blobs(300);  // batches of 32: 10 an epoch, 150 samples end with batch 5
  auto seen = std::make_shared<std::vector<std::pair<std::string, std::int64_t>>>();
  const auto spec = test::spec(data, Time{2.5, TimeUnit::epoch})
                        .with_callbacks({time_test_event_batches(seen)})
                        .with_evaluation(baton::EvalSchedule{.spec = {.sets = {{"blobs", data.head(64)}}},
                                                             .every = Time{0.5, TimeUnit::epoch}})
                        .with_checkpoints({.dir = tmp.path / "whole", .every = Time{0.75, TimeUnit::epoch}, .keep = 0});
  const auto whole = test::ok(baton::fit(spec, test::new_state(1, Time::epochs(4))));
  // 2.5 epochs: 750 samples of the order, the end of batch 25 (batch 5 of epoch 2, at 160 samples).
  CHECK(whole.time.batch == 25);
  CHECK(whole.time.epoch == 2);
  CHECK(whole.time.sample_in_epoch == 160);
  // Evaluations each 150 samples of data position (at batch ends 5, 10, 15, 20, 25 and the stage's
  // end), checkpoints each 225 (batch ends at or past 225, 450, 675: 8, 15, 23) and at the end.
  const std::vector<std::pair<std::string, std::int64_t>> expected = {
      {"eval", 5}, {"checkpoint", 8}, {"eval", 10}, {"eval", 15}, {"checkpoint", 15}, {"eval", 20}, {"checkpoint", 23},
      {"eval", 25}, {"checkpoint", 25}};
  const auto in_whole = *seen;
  CHECK(in_whole == expected);

  // In pieces of a part of an epoch each (budgets): the same events and the same bits.
  seen->clear();
  const auto pieces_spec = spec.with_checkpoints({.dir = tmp.path / "pieces", .every = Time{0.75, TimeUnit::epoch}, .keep = 0});
  auto s = test::new_state(1, Time::epochs(4));
  std::vector<std::int64_t> ends;
  for (int i = 0; i < 20 && s.time.batch < whole.time.batch; ++i) {
    auto next = baton::fit(pieces_spec, std::move(s), Time{0.3, TimeUnit::epoch});
    REQUIRE(next);
    s = std::move(*next);
    ends.push_back(s.time.batch);
  }
  // Each budget of 90 samples of data position ends at the first batch end at or past it (the
  // epoch's last batch holds 12 samples).
  CHECK(ends == std::vector<std::int64_t>{3, 6, 9, 13, 16, 19, 23, 25});
  test::require_same_bits(whole, s);
  CHECK(*seen == in_whole);
  // fit_end plans the same point the fit reaches.
  const auto planned = baton::fit_end(spec, test::new_state(1, Time::epochs(4)), Time{0.3, TimeUnit::epoch});
  REQUIRE(planned);
  CHECK(planned->batch == 3);
}

namespace {
/// Records the run batch of every scalar a logger gets, by key.
struct TimeTestKeyBatches final : baton::Logger {
  std::map<std::string, std::vector<std::int64_t>> batches;
  std::map<std::string, std::vector<double>> values;
  void log(const std::string&, const baton::Timestamp& t, const std::map<std::string, double>& scalars) override {
    for (const auto& [k, v] : scalars) batches[k].push_back(t.batch), values[k].push_back(v);
  }
};
}  // namespace

TEST_CASE("a monitor's every is an interval like evaluation's: parts of an epoch, from the stage's start, in any split",
          "[time][fraction][callbacks]") {
  namespace cb = baton::callbacks;
  const auto data = test::blobs(300);  // batches of 32: 10 an epoch, the last one of 12 samples
  auto seen = std::make_shared<std::vector<std::pair<std::string, std::int64_t>>>();
  auto logged = std::make_shared<TimeTestKeyBatches>();
  const auto half = Time{0.5, TimeUnit::epoch};
  const auto first = test::spec(data, Time::epochs(2))
                         .with_callbacks({time_test_event_batches(seen), cb::lr_monitor({.every = half})})
                         .with_loggers({logged})
                         .with_evaluation(baton::EvalSchedule{.spec = {.sets = {{"blobs", data.head(64)}}}, .every = half});
  auto second = first.with_callbacks({cb::lr_monitor({.every = 7})}).with_loggers({logged});
  second.name = "second";
  second.duration = Time::batches(16);
  second.evaluation.reset();

  // Whole: each 150 samples of data position is due at the batch end at or past it, the batches
  // evaluation uses; the second stage (from batch 20) counts 7 batches from its own start.
  auto s = test::ok(baton::fit(first, test::new_state(1, Time::epochs(4))));
  s = test::ok(baton::fit(second, std::move(s)));
  std::vector<std::int64_t> evals;
  for (const auto& [what, batch] : *seen) if (what == "eval") evals.push_back(batch);
  CHECK(evals == std::vector<std::int64_t>{5, 10, 15, 20});
  const auto whole = logged->batches["train/lr"];
  CHECK(whole == std::vector<std::int64_t>{5, 10, 15, 20, 27, 34});

  // In pieces of 3 batches: the same batches are due.
  logged->batches.clear();
  auto p = test::new_state(1, Time::epochs(4));
  for (int i = 0; i < 20 && !(p.history.size() == 1 && p.time.batch == 20); ++i)
    p = test::ok(baton::fit(first, std::move(p), Time::batches(3)));
  for (int i = 0; i < 20 && p.time.batch < 36; ++i) p = test::ok(baton::fit(second, std::move(p), Time::batches(3)));
  CHECK(p.time.batch == 36);
  CHECK(logged->batches["train/lr"] == whole);
}

TEST_CASE("the grad norm monitor logs the norm of the batch it logs at", "[callbacks]") {
  namespace cb = baton::callbacks;
  const auto data = test::blobs(300);
  auto run = [&](std::int64_t every) {
    auto logged = std::make_shared<TimeTestKeyBatches>();
    test::ok(baton::fit(test::spec(data, Time::batches(9)).with_callbacks({cb::grad_norm_monitor({.every = every})}).with_loggers({logged}),
                        test::new_state()));
    return std::pair{logged->batches["train/grad_norm"], logged->values["train/grad_norm"]};
  };
  const auto [each_batches, each] = run(1);
  const auto [third_batches, third] = run(3);
  REQUIRE(each_batches == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  REQUIRE(third_batches == std::vector<std::int64_t>{3, 6, 9});
  CHECK(third == std::vector<double>{each[2], each[5], each[8]});
  // The monitor's norm is the step's own (the one clipping reads), bit for bit.
  auto logged = std::make_shared<TimeTestKeyBatches>();
  const auto clipped = test::ok(baton::fit(test::spec(data, Time::batches(4))
                                               .with_clip_grad_norm(1e9)
                                               .with_callbacks({cb::grad_norm_monitor({.every = 1})})
                                               .with_loggers({logged}),
                                           test::new_state()));
  REQUIRE(logged->values["train/grad_norm"].size() == 4);
  CHECK(logged->values["train/grad_norm"].back() == clipped.history.back().last_grad_norm);
}

TEST_CASE("a monitor's every that is not more than zero, or not a count, fails the fit before it trains", "[callbacks]") {
  namespace cb = baton::callbacks;
  const auto data = test::blobs(64);
  for (const auto& [every, says] : std::vector<std::pair<cb::Every, std::string>>{
           {cb::Every{0}, "every: must be more than zero, got \"0ba\""},
           {cb::Every{Time{1.5, TimeUnit::batch}}, "1.5ba"},
           {cb::Every{Time{-0.5, TimeUnit::epoch}}, "-0.5ep"}}) {
    INFO(says);
    const auto r = baton::fit(test::spec(data, Time::batches(2)).with_callbacks({cb::throughput({.every = every})}), test::new_state());
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().message, Catch::Contains("callbacks[0] (throughput): every: ") && Catch::Contains(says));
  }
}
