// The testing kit with Catch2, headers in the order a user may write them (catch_first). Debian's
// LibTorch brings glog, whose CHECK aborts the process: with testing_catch.hpp, CHECK must be
// Catch2's in any order, so the deliberately failing check below is reported with baton's message
// and the binary exits with a failure count, not SIGABRT (check.cmake runs it).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#include <baton/baton.hpp>
#include <baton/testing_catch.hpp>

TEST_CASE("a deliberately failing check reports baton's message") {
  const baton::testing::Check failing{false, "deliberately failing check: the loss went from 0.69 to 0.70"};
  CHECK(failing);
  CHECK_THAT(failing, baton::testing::Passes());
  CHECK(baton::testing::Check{true, "a passing check"});
}
