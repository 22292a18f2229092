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
}

TEST_CASE("duration text round-trips", "[time]") {
  for (const char* text : {"3ep", "500ba", "12000sp", "0.25dur", "0.1dur", "0ep",
                           "0.00001dur", "0.123456789012345dur"}) {
    auto t = Time::parse(text);
    REQUIRE(t);
    CHECK(t->to_string() == text);
    CHECK(*Time::parse(t->to_string()) == *t);
  }
}

TEST_CASE("malformed durations are errors that quote the input and list the units", "[time]") {
  for (const char* text : {"10xx", "-1ep", "", "1.5ba", "1.5ep", "2dur", "ep", "3", "3 ep", "1..2dur", "3ep ", "+1ep"}) {
    INFO("input: \"" << text << "\"");
    auto t = Time::parse(text);
    REQUIRE_FALSE(t);
    CHECK(t.error().code == baton::ErrorCode::invalid_time);
    const std::string msg = t.error().message;
    CHECK_THAT(msg, Catch::Contains(fmt::format("\"{}\"", text)));
    for (const char* unit : {"ep", "ba", "sp", "dur"}) CHECK_THAT(msg, Catch::Contains(unit));
  }
  CHECK_THAT(Time::parse("10xx").error().message, Catch::Contains("unknown unit \"xx\""));
  CHECK_THAT(Time::parse("1.5ba").error().message, Catch::Contains("whole batches"));
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
