#include <ATen/Parallel.h>

#include "helpers.hpp"

TEST_CASE("LibTorch uses OpenBLAS, not the reference BLAS", "[runtime]") {
  const auto r = baton::inspect_runtime();
  INFO("sgemm_ resolves to " << r.blas_library);
  CHECK(r.openblas);
  CHECK_THAT(r.blas_library, Catch::Contains("openblas"));
}

TEST_CASE("configure_runtime sets threads from the real core count and reports it", "[runtime]") {
  const int before = at::get_num_threads();
  auto r = baton::configure_runtime({.threads = 0, .blas_threads = 1});
  REQUIRE(r);
  CHECK(r->threads == baton::available_cores());
  CHECK(at::get_num_threads() == baton::available_cores());
  CHECK(r->blas_threads == 1);
#if defined(__SANITIZE_ADDRESS__)
  // ASan's allocator replaces glibc's: its mallopt refuses every option, and configure_runtime
  // reports the glibc defaults instead of claiming a tuning that did not happen.
  CHECK_FALSE(r->malloc_tuned);
#else
  CHECK(r->malloc_tuned);
#endif
  CHECK_THAT(r->to_string(), Catch::Contains("OpenBLAS"));
  auto one = baton::configure_runtime({.threads = 1});
  REQUIRE(one);
  CHECK(at::get_num_threads() == 1);
  at::set_num_threads(before);
}

TEST_CASE("configure_runtime gives OpenBLAS as many threads as LibTorch unless told otherwise", "[runtime]") {
  // One BLAS thread left a GPT's and an MLP's matrix products on one core (benchmarks/README.md).
  const int before = at::get_num_threads();
  auto two = baton::configure_runtime({.threads = 2});
  REQUIRE(two);
  CHECK(two->blas_threads == 2);
  CHECK_THAT(two->to_string(), Catch::Contains("2 threads, ") && Catch::Contains(baton::blas_wait_policy()));
  auto one = baton::configure_runtime({.threads = 1});
  REQUIRE(one);
  CHECK(one->blas_threads == 1);
  auto told = baton::configure_runtime({.threads = 2, .blas_threads = 1});
  REQUIRE(told);
  CHECK(told->blas_threads == 1);
  CHECK(at::get_num_threads() == 2);
  at::set_num_threads(before);
  REQUIRE(baton::configure_runtime({.threads = before, .blas_threads = 1}));
}

TEST_CASE("after configure_runtime, whatever its thread count, fit has no runtime note to print", "[runtime]") {
  // (The note itself, in a process that never configures: tests/consumer/check.cmake.)
  const int before = at::get_num_threads();
  REQUIRE(baton::configure_runtime({.threads = 1}));
  CHECK(at::get_num_threads() == 1);
  CHECK_FALSE(baton::runtime_note().has_value());
  at::set_num_threads(before);
}
