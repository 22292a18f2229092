#pragma once
/// \file testing_catch.hpp
/// Catch2 (v2) support for baton::testing: `CHECK(check)` and `REQUIRE(check)` print the check's
/// message (what failed and why) instead of `{?}`, and `CHECK_THAT(check, Passes())` reads as it
/// says. Safe in any include order: LibTorch built with glog (Debian's) defines a `CHECK` macro
/// of glog's, which aborts the process on failure; whichever of <catch2/catch.hpp>, baton's and
/// LibTorch's headers came first, after this header `CHECK` is Catch2's again.

// LibTorch's logging first: with glog it defines glog's CHECK (once: the header is guarded).
#include <c10/util/Logging.h>

#if !defined(TWOBLUECUBES_SINGLE_INCLUDE_CATCH_HPP_INCLUDED) && defined(CHECK)
#undef CHECK  // glog's; catch.hpp defines Catch2's below
#endif
#include <catch2/catch.hpp>

#include "baton/testing.hpp"

// catch.hpp came before LibTorch's headers: glog's CHECK replaced Catch2's; put Catch2's back.
#if !defined(CATCH_CONFIG_PREFIX_ALL) && defined(CHECK_EQ)
#undef CHECK
#if defined(CATCH_CONFIG_DISABLE)
#define CHECK(...) (void)(0)
#else
#define CHECK(...) INTERNAL_CATCH_TEST("CHECK", Catch::ResultDisposition::ContinueOnFailure, __VA_ARGS__)
#endif
#endif

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
