// The testing kit with Catch2, headers in the order a user may write them: compiled twice, with
// KIT_CATCH_FIRST set (catch.hpp first) and unset (baton first). Debian's LibTorch brings glog,
// whose CHECK aborts the process: with testing_catch.hpp, CHECK must be Catch2's in any order, so
// the deliberately failing check below is reported with baton's message and the binary exits with
// a failure count, not SIGABRT (check.cmake runs both).
#define CATCH_CONFIG_MAIN
#if KIT_CATCH_FIRST
#include <catch2/catch.hpp>
#include <baton/baton.hpp>
#include <baton/testing_catch.hpp>
#else
#include <baton/baton.hpp>
#include <baton/testing_catch.hpp>
#include <catch2/catch.hpp>
#endif

TEST_CASE("a deliberately failing check reports baton's message") {
  const baton::testing::Check failing{false, "deliberately failing check: the loss went from 0.69 to 0.70"};
  CHECK(failing);
  CHECK_THAT(failing, baton::testing::Passes());
  CHECK(baton::testing::Check{true, "a passing check"});
}
