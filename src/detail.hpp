#pragma once
// Internals shared by baton's translation units. Not installed.

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>
#include <ATen/core/Generator.h>
#include <torch/types.h>

#include "baton/error.hpp"
#include "baton/time.hpp"

namespace baton {
struct TrainState;
}

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

/// LibTorch's one process-wide CPU generator (Dropout and any randomness in a model's forward
/// draw from it) shared by fits, evaluations and copies in several threads: each run's stream
/// of random numbers lives in an `RngStream`, and a `Hold` is the exclusive section in which
/// that stream is installed in the generator. Holds of different threads never overlap; holds
/// nest within a thread (an evaluation inside a fit's batch). A stream stays installed after its
/// hold ends until another stream needs the generator (one thread pays nothing to switch), and
/// the generator's state from before any stream is restored when the last installed one ends.
/// Code outside baton that draws from the global generator while fits run in other threads
/// changes their bits: give it a generator of its own. See docs/threads.md.
class RngStream {
 public:
  explicit RngStream(torch::Tensor state);
  RngStream(const RngStream&) = delete;
  RngStream& operator=(const RngStream&) = delete;
  ~RngStream();
  /// The exclusive section with this stream installed in the global generator.
  class Hold {
   public:
    explicit Hold(RngStream& stream);
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold();
  };
  [[nodiscard]] Hold hold() { return Hold(*this); }
  [[nodiscard]] torch::Tensor current();  // the stream's state now
 private:
  friend struct RngSection;
  torch::Tensor state_;  // valid while not installed
};

/// A one-off section: `state` installed in the global generator for the scope (a factory call,
/// an evaluation, one train_step); the generator is as before when it ends.
/// Moves the model of `s` to `device`, with the tensors its algorithms keep (algorithm_state).
void to_device(TrainState& s, const c10::Device& device);

/// Seeds `device`'s default generator (CUDA: dropout and other draws on the GPU) with a number
/// drawn from the global CPU generator, so GPU draws follow the run's stream too (call it while a
/// stream is held; on CPU, nothing).
void seed_device_generator(const c10::Device& device);

class GlobalRngScope {
 public:
  explicit GlobalRngScope(const torch::Tensor& state) : stream_(state), hold_(stream_) {}
  [[nodiscard]] torch::Tensor current() { return stream_.current(); }
 private:
  RngStream stream_;
  RngStream::Hold hold_;
};

/// While alive, this thread leaves the exclusive section it holds (if any) so that other threads
/// can take it: around a collective that waits for ranks running as threads of this process.
/// On exit it takes the section back with its innermost stream installed.
class RngYield {
 public:
  RngYield();
  RngYield(const RngYield&) = delete;
  RngYield& operator=(const RngYield&) = delete;
  ~RngYield();
 private:
  int depth_ = 0;
};

/// A fresh CPU generator state seeded with `seed` (for init_state and the run's RNG stream).
torch::Tensor seeded_rng_state(std::uint64_t seed);

/// The global L2 norm of `grads` (the norm of their norms, as torch's clip_grad_norm_); 0 for
/// none. The one computation behind clipping by norm, the non-finite check and
/// grad_norm_monitor (train/step.cpp).
double global_norm(const std::vector<torch::Tensor>& grads);
/// Scales `grads` by max_norm / (norm + 1e-6) when their global norm exceeds `max_norm`; returns
/// the norm before. The one clipping by norm: the spec's clip_grad_norm and clip_by_global_norm.
double clip_by_norm(std::vector<torch::Tensor>& grads, double max_norm);

/// SplitMix64 step: the mixing function used for all seeds derived by baton.
constexpr std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// Does the glob `pattern` match the parameter name `name` (fnmatch without flags: `*` matches dots
/// too)? One rule for freeze, optimizer groups, fresh patterns and gradient rules.
bool matches(const std::string& pattern, const std::string& name);

/// Prints runtime_note() on stderr, once per process (the first fit calls it).
void note_runtime_once();

/// Prints bf16_cpu_warning() on stderr, once per process (the first bf16 fit on the CPU calls it).
void warn_bf16_once();

/// `f(memory[key])`, the entry made for the call and removed again if `f` leaves it empty: a
/// callback or algorithm that keeps nothing leaves no entry in the state (`callback_state`,
/// `algorithm_state`), so a state compares equal to one trained without it, and to its own
/// checkpoint (which stores no empty entries).
template <class Map, class F>
decltype(auto) with_memory(Map& memory, const typename Map::key_type& key, F&& f) {
  struct DropEmpty {
    Map& m;
    const typename Map::key_type& key;
    ~DropEmpty() {
      if (auto it = m.find(key); it != m.end() && it->second.empty()) m.erase(it);
    }
  } drop{memory, key};
  return std::forward<F>(f)(memory[key]);
}

}  // namespace baton::detail

namespace baton {
/// The data order of one epoch, cached in the state (immutable, shared between copies).
struct OrderCache {
  std::uint64_t seed = 0;
  std::int64_t epoch = -1;
  std::int64_t size = -1;
  bool shuffle = true;
  torch::Tensor order;
};
}  // namespace baton
