#pragma once
// Internals shared by baton's translation units. Not installed.

#include <exception>
#include <string>
#include <utility>

#include <c10/util/Exception.h>
#include <ATen/core/Generator.h>
#include <torch/types.h>

#include "baton/error.hpp"
#include "baton/time.hpp"

namespace baton::detail {

/// Carries a baton::Error through internal code (e.g. out of a std::function loss); converted
/// back to an Error value at the API boundary by `guard`.
struct BatonException : std::exception {
  Error error;
  explicit BatonException(Error e) : error(std::move(e)) {}
  const char* what() const noexcept override { return error.message.c_str(); }
};

[[noreturn]] inline void raise(ErrorCode code, std::string message) {
  throw BatonException(Error{code, std::move(message), {}});
}

/// First line of a LibTorch message, without its C++ stack trace.
std::string torch_message(const c10::Error& e);

/// The one boundary where exceptions become Error values: nothing throws across the public API.
template <class F>
auto guard(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const BatonException& e) {
    return tl::unexpected<Error>(e.error);
  } catch (const c10::Error& e) {
    return tl::unexpected<Error>(Error{ErrorCode::torch, torch_message(e), {}});
  } catch (const std::bad_alloc&) {
    return tl::unexpected<Error>(Error{ErrorCode::runtime, "out of memory", {}});
  } catch (const std::exception& e) {
    return tl::unexpected<Error>(Error{ErrorCode::torch, e.what(), {}});
  }
}

/// "[128, 10]"
std::string shape_string(const torch::Tensor& t);

/// Installs a generator state into LibTorch's default CPU generator for the scope (so dropout
/// and any user randomness in forward draw from the run's RNG), and restores the caller's
/// generator state on exit. `saved()` reads the run's RNG back before the scope ends.
class GlobalRngScope {
 public:
  explicit GlobalRngScope(const torch::Tensor& state);
  GlobalRngScope(const GlobalRngScope&) = delete;
  GlobalRngScope& operator=(const GlobalRngScope&) = delete;
  ~GlobalRngScope();
  [[nodiscard]] torch::Tensor current() const;  // the run's generator state now
 private:
  at::Generator gen_;
  torch::Tensor caller_state_;
};

/// A fresh CPU generator state seeded with `seed` (for init_state and the run's RNG stream).
torch::Tensor seeded_rng_state(std::uint64_t seed);

/// SplitMix64 step: the mixing function used for all seeds derived by baton.
constexpr std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// The data order of one epoch, cached in the state (immutable, shared between copies).
struct OrderCache {
  std::uint64_t seed = 0;
  std::int64_t epoch = -1;
  std::int64_t size = -1;
  bool shuffle = true;
  torch::Tensor order;
};

}  // namespace baton::detail
