// The exclusive section around LibTorch's global CPU generator (detail.hpp: RngStream, Hold,
// GlobalRngScope, RngYield). docs/threads.md says what it means for users.
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include "detail.hpp"

namespace baton::detail {

/// Who holds the section, and whose state is in the generator. `installed` and `outside` are
/// only touched by the thread that holds the section.
struct RngSection {
  std::mutex m;
  std::condition_variable free;
  std::thread::id owner{};
  int depth = 0;
  RngStream* installed = nullptr;  // the stream whose state is in the generator, if any
  torch::Tensor outside;           // the generator's state from before `installed` went in

  static RngSection& get() {
    static RngSection section;
    return section;
  }

  void acquire(int levels) {
    std::unique_lock lock(m);
    const auto me = std::this_thread::get_id();
    if (owner == me) {
      depth += levels;
      return;
    }
    free.wait(lock, [&] { return owner == std::thread::id{}; });
    owner = me;
    depth = levels;
  }

  /// Leaves the section entirely; the levels this thread held.
  int release_all() {
    std::lock_guard lock(m);
    if (owner != std::this_thread::get_id()) return 0;
    const int levels = depth;
    owner = {};
    depth = 0;
    free.notify_one();
    return levels;
  }

  void release() {
    std::lock_guard lock(m);
    if (--depth > 0) return;
    owner = {};
    free.notify_one();
  }

  static torch::Tensor read() {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard lock(gen.mutex());
    return gen.get_state();
  }
  static void write(const torch::Tensor& state) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard lock(gen.mutex());
    gen.set_state(state);
  }

  /// Puts `s`'s state in the generator, keeping the one it replaces (held section only).
  void install(RngStream* s) {
    if (installed == s) return;
    if (installed)
      installed->state_ = read();
    else
      outside = read();
    write(s->state_);
    installed = s;
  }

  /// Takes `s` out of the generator, restoring the state from before any stream (held section only).
  void uninstall(RngStream* s) {
    if (installed != s) return;
    s->state_ = read();
    write(outside);
    outside = torch::Tensor();
    installed = nullptr;
  }
};

namespace {
/// This thread's streams inside a Hold, innermost last.
thread_local std::vector<RngStream*> t_holding;
}  // namespace

RngStream::RngStream(torch::Tensor state) : state_(std::move(state)) {}

RngStream::~RngStream() {
  auto& section = RngSection::get();
  section.acquire(1);
  section.uninstall(this);
  if (!t_holding.empty()) section.install(t_holding.back());  // an enclosing hold of this thread
  section.release();
}

RngStream::Hold::Hold(RngStream& stream) {
  auto& section = RngSection::get();
  section.acquire(1);
  t_holding.push_back(&stream);
  try {
    section.install(&stream);
  } catch (...) {
    t_holding.pop_back();
    section.release();
    throw;
  }
}

RngStream::Hold::~Hold() {
  auto& section = RngSection::get();
  t_holding.pop_back();
  if (!t_holding.empty()) section.install(t_holding.back());
  section.release();
}

torch::Tensor RngStream::current() {
  auto& section = RngSection::get();
  section.acquire(1);
  torch::Tensor out = section.installed == this ? RngSection::read() : state_;
  section.release();
  return out;
}

RngYield::RngYield() : depth_(RngSection::get().release_all()) {}

RngYield::~RngYield() {
  if (depth_ == 0) return;
  auto& section = RngSection::get();
  section.acquire(depth_);
  if (!t_holding.empty()) section.install(t_holding.back());
}

void seed_device_generator(const c10::Device& device) {
  if (device.is_cpu()) return;
  std::uint64_t seed = 0;
  {
    auto cpu = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(cpu.mutex());
    seed = cpu.get<at::CPUGeneratorImpl>()->random64();
  }
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);  // a Philox generator restarts its offset at 0 with a new seed
}

}  // namespace baton::detail
