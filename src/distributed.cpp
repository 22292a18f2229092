// The process group: c10d's TCPStore/FileStore rendezvous and ProcessGroupGloo. The only
// translation unit that sees the c10d and Gloo headers (USE_C10D_GLOO comes from the Torch target).
#include "baton/distributed.hpp"

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <exception>
#include <stdexcept>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "detail.hpp"

namespace baton {
namespace {

using Ms = std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

Error dist_error(std::string message) { return Error{ErrorCode::runtime, std::move(message), {}}; }

/// The first line of an exception's message (c10 errors carry a C++ stack trace after it).
std::string first_line(const std::exception& e) {
  std::string m = e.what();
  if (auto nl = m.find('\n'); nl != std::string::npos) m.resize(nl);
  return m;
}

std::string seconds_text(Ms t) { return fmt::format("{:g} s", static_cast<double>(t.count()) / 1000.0); }

Expected<long> env_integer(const char* name, std::optional<long> fallback, long lo, long hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    if (fallback) return *fallback;
    return tl::unexpected(Error{ErrorCode::invalid_argument,
                                fmt::format("distributed: the environment variable {} is not set; a launcher (baton "
                                            "launch, torchrun, a cluster scheduler) sets RANK, WORLD_SIZE, MASTER_ADDR "
                                            "and MASTER_PORT for every process",
                                            name),
                                {}});
  }
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi)
    return tl::unexpected(Error{ErrorCode::invalid_argument,
                                fmt::format("distributed: {}=\"{}\" is not an integer in [{}, {}]", name, v, lo, hi), {}});
  return x;
}

bool is_loopback(const std::string& addr) { return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1"; }

}  // namespace

struct Distributed::Impl {
  DistOptions options;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  mutable DistStats stats;
  std::vector<c10::intrusive_ptr<c10d::Work>> in_flight;  // start_all_reduce's, until finished
  std::optional<SteadyClock::time_point> first_start;

  /// Waits for every work; the first failure becomes an Error that says which rank, what and
  /// what usually causes it.
  Expected<void> wait_all(std::vector<c10::intrusive_ptr<c10d::Work>>& works, const std::string& kind,
                          const std::string& what) const {
    std::string failure;
    for (auto& w : works) {
      try {
        const detail::RngYield others_may_draw;  // ranks may be threads of this process
        w->wait(options.timeout);
      } catch (const std::exception& e) {
        if (failure.empty()) failure = first_line(e);
      }
    }
    if (failure.empty()) return {};
    return tl::unexpected(dist_error(fmt::format(
        "distributed: rank {} of {}: the {} of {} failed: {}. Another rank has died, hangs or was stopped (a "
        "collective waits at most the timeout, {}); see that rank's error. Re-running resumes from the last "
        "checkpoint",
        options.rank, options.world_size, kind, what, failure, seconds_text(options.timeout))));
  }
};

Distributed::Distributed(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Distributed::~Distributed() = default;

int Distributed::rank() const { return impl_->options.rank; }
int Distributed::world_size() const { return impl_->options.world_size; }
int Distributed::local_rank() const { return impl_->options.local_rank; }
std::chrono::milliseconds Distributed::timeout() const { return impl_->options.timeout; }
std::string Distributed::backend() const { return "gloo"; }
DistStats Distributed::stats() const { return impl_->stats; }

std::pair<std::int64_t, std::int64_t> Distributed::shard(std::int64_t count) const {
  const std::int64_t w = world_size(), r = rank();
  const std::int64_t base = count / w, extra = count % w;
  return {r * base + std::min(r, extra), base + (r < extra ? 1 : 0)};
}

Expected<void> Distributed::all_reduce(const std::vector<at::Tensor>& tensors, Op op, const std::string& what) const {
  const auto t0 = SteadyClock::now();
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  works.reserve(tensors.size());
  c10d::AllreduceOptions o;
  o.reduceOp = op == Op::sum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
  o.timeout = impl_->options.timeout;
  try {
    for (const auto& t : tensors) {
      std::vector<at::Tensor> one{t};
      works.push_back(impl_->group->allreduce(one, o));
      impl_->stats.allreduce_bytes += static_cast<std::int64_t>(t.numel() * t.element_size());
    }
  } catch (const std::exception& e) {
    return tl::unexpected(dist_error(fmt::format("distributed: rank {}: the all-reduce of {} could not start: {}",
                                                 rank(), what, first_line(e))));
  }
  auto ok = impl_->wait_all(works, "all-reduce", what);
  impl_->stats.allreduce_calls += static_cast<std::int64_t>(tensors.size());
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  impl_->stats.allreduce_seconds += seconds;
  impl_->stats.allreduce_wait_seconds += seconds;
  return ok;
}

Expected<void> Distributed::start_all_reduce(const at::Tensor& tensor, Op op, const std::string& what) const {
  if (!impl_->first_start) impl_->first_start = SteadyClock::now();
  c10d::AllreduceOptions o;
  o.reduceOp = op == Op::sum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
  o.timeout = impl_->options.timeout;
  try {
    std::vector<at::Tensor> one{tensor};
    impl_->in_flight.push_back(impl_->group->allreduce(one, o));
  } catch (const std::exception& e) {
    return tl::unexpected(dist_error(fmt::format("distributed: rank {}: the all-reduce of {} could not start: {}",
                                                 rank(), what, first_line(e))));
  }
  impl_->stats.allreduce_bytes += static_cast<std::int64_t>(tensor.numel() * tensor.element_size());
  impl_->stats.allreduce_calls += 1;
  return {};
}

Expected<void> Distributed::start_broadcast(const at::Tensor& tensor, int root, const std::string& what) const {
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = impl_->options.timeout;
  try {
    std::vector<at::Tensor> one{tensor};
    impl_->in_flight.push_back(impl_->group->broadcast(one, o));
  } catch (const std::exception& e) {
    return tl::unexpected(dist_error(fmt::format("distributed: rank {}: the broadcast of {} could not start: {}",
                                                 rank(), what, first_line(e))));
  }
  impl_->stats.broadcast_calls += 1;
  return {};
}

Expected<void> Distributed::finish_all_reduces(const std::string& what) const {
  if (impl_->in_flight.empty()) return {};
  const auto t0 = SteadyClock::now();
  auto works = std::move(impl_->in_flight);
  impl_->in_flight.clear();
  auto ok = impl_->wait_all(works, "all-reduce", what);
  const auto t1 = SteadyClock::now();
  impl_->stats.allreduce_wait_seconds += std::chrono::duration<double>(t1 - t0).count();
  if (impl_->first_start)
    impl_->stats.allreduce_seconds += std::chrono::duration<double>(t1 - *impl_->first_start).count();
  impl_->first_start.reset();
  return ok;
}

Expected<void> Distributed::broadcast(const std::vector<at::Tensor>& tensors, int root, const std::string& what) const {
  const auto t0 = SteadyClock::now();
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = impl_->options.timeout;
  try {
    for (const auto& t : tensors) {
      std::vector<at::Tensor> one{t};
      works.push_back(impl_->group->broadcast(one, o));
    }
  } catch (const std::exception& e) {
    return tl::unexpected(dist_error(fmt::format("distributed: rank {}: the broadcast of {} could not start: {}",
                                                 rank(), what, first_line(e))));
  }
  auto ok = impl_->wait_all(works, "broadcast", what);
  impl_->stats.broadcast_calls += static_cast<std::int64_t>(tensors.size());
  impl_->stats.broadcast_seconds += std::chrono::duration<double>(SteadyClock::now() - t0).count();
  return ok;
}

Expected<void> Distributed::barrier(const std::string& what) const {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  try {
    c10d::BarrierOptions o;
    o.timeout = impl_->options.timeout;
    works.push_back(impl_->group->barrier(o));
  } catch (const std::exception& e) {
    return tl::unexpected(dist_error(fmt::format("distributed: rank {}: the barrier ({}) could not start: {}", rank(),
                                                 what, first_line(e))));
  }
  return impl_->wait_all(works, "barrier", what);
}

Expected<std::shared_ptr<const Distributed>> Distributed::join(const DistOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    return tl::unexpected(Error{ErrorCode::invalid_argument,
                                fmt::format("distributed: rank {} of world size {}: the rank must be in [0, world size)",
                                            o.rank, o.world_size),
                                {}});
  if (o.store_file.empty() && (o.master_port < 1 || o.master_port > 65535))
    return tl::unexpected(Error{ErrorCode::invalid_argument,
                                fmt::format("distributed: master port {} is not in [1, 65535]", o.master_port), {}});
  if (o.timeout.count() <= 0)
    return tl::unexpected(Error{ErrorCode::invalid_argument,
                                fmt::format("distributed: the timeout must be positive, got {} ms", o.timeout.count()), {}});
  auto impl = std::make_unique<Impl>();
  impl->options = o;
  const std::string where = o.store_file.empty() ? fmt::format("TCPStore {}:{}", o.master_addr, o.master_port)
                                                 : fmt::format("FileStore {}", o.store_file.string());
  try {
    if (o.store_file.empty()) {
      c10d::TCPStoreOptions so;
      so.port = static_cast<std::uint16_t>(o.master_port);
      so.isServer = o.rank == 0;
      so.numWorkers = static_cast<std::size_t>(o.world_size);
      so.waitWorkers = true;
      so.timeout = o.timeout;
      impl->store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, so);
    } else {
      impl->store = c10::make_intrusive<c10d::FileStore>(o.store_file.string(), o.world_size);
      impl->store->setTimeout(o.timeout);
    }
    auto go = c10d::ProcessGroupGloo::Options::create(o.timeout);
    // Gloo's own connections: GLOO_SOCKET_IFNAME names the interface (as in PyTorch); a loopback
    // master means one machine; otherwise the address this host's name resolves to.
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0')
      go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else if (is_loopback(o.master_addr) || !o.store_file.empty())
      go->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else
      go->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, o.rank, o.world_size, go);
  } catch (const std::exception& e) {
    return tl::unexpected(dist_error(fmt::format(
        "distributed: rank {} of {} could not join the process group ({}) within {}: {}. Check that every rank "
        "was started with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, that rank 0 runs and the port is free "
        "and reachable",
        o.rank, o.world_size, where, seconds_text(o.timeout), first_line(e))));
  }
  return std::shared_ptr<const Distributed>(std::make_shared<Distributed>(std::move(impl)));
}

Expected<DistOptions> dist_options_from_env() {
  DistOptions o;
  auto world = env_integer("WORLD_SIZE", std::nullopt, 1, 1 << 20);
  if (!world) return tl::unexpected(world.error());
  auto rank = env_integer("RANK", std::nullopt, 0, *world - 1);
  if (!rank) return tl::unexpected(rank.error());
  auto local = env_integer("LOCAL_RANK", *rank, 0, 1 << 20);
  if (!local) return tl::unexpected(local.error());
  auto port = env_integer("MASTER_PORT", 29500, 1, 65535);
  if (!port) return tl::unexpected(port.error());
  auto timeout = env_integer("BATON_DIST_TIMEOUT", 300, 1, 7 * 24 * 3600);
  if (!timeout) return tl::unexpected(timeout.error());
  o.world_size = static_cast<int>(*world);
  o.rank = static_cast<int>(*rank);
  o.local_rank = static_cast<int>(*local);
  o.master_port = static_cast<int>(*port);
  o.timeout = std::chrono::seconds(*timeout);
  if (const char* a = std::getenv("MASTER_ADDR"); a != nullptr && *a != '\0') o.master_addr = a;
  return o;
}

bool launched_distributed() {
  const char* w = std::getenv("WORLD_SIZE");
  return w != nullptr && *w != '\0';
}

Expected<std::shared_ptr<const Distributed>> Distributed::join_from_env() {
  auto o = dist_options_from_env();
  if (!o) return tl::unexpected(o.error());
  return join(*o);
}

}  // namespace baton
