#pragma once
/// \file testing_catch.hpp
/// Catch2 (v2) support for baton::testing: `CHECK(check)` and `REQUIRE(check)` print the check's
/// message (what failed and why) instead of `{?}`, and `CHECK_THAT(check, Passes())` reads as it
/// says. Include after <catch2/catch.hpp>.

#include <catch2/catch.hpp>

#include "baton/testing.hpp"

namespace Catch {
template <>
struct StringMaker<baton::testing::Check> {
  static std::string convert(const baton::testing::Check& check) {
    return (check.passed ? "passed: " : "FAILED: ") + check.message;
  }
};
}  // namespace Catch

namespace baton::testing {

/// Matches a Check that passed; a failure shows its message.
class PassesMatcher : public Catch::MatcherBase<Check> {
 public:
  bool match(const Check& check) const override { return check.passed; }
  std::string describe() const override { return "passes"; }
};
inline PassesMatcher Passes() { return {}; }

}  // namespace baton::testing
