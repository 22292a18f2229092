#pragma once
/// \file distributed.hpp
/// Data-parallel training on LibTorch's own distributed engine (c10d): a process group (Gloo on
/// CPU) joined from the variables torchrun and cluster launchers set, and the few collectives
/// baton's loop needs. Put the group on a spec (`TrainingSpec::distributed`) and `fit` trains
/// data-parallel: every rank takes its shard of each global batch, gradients are averaged after
/// backward, rank 0 writes the checkpoints. A null group (the default) is one process, at no cost.
///
/// ```cpp
/// auto group = baton::Distributed::join_from_env();   // RANK, WORLD_SIZE, MASTER_ADDR, ...
/// if (!group) { fmt::print(stderr, "{}\n", group.error()); return 2; }
/// auto spec = main_stage.with_distributed(*group);     // data.batch_size stays the global batch
/// ```
///
/// The c10d and Gloo headers stay in src/distributed.cpp: including baton does not need them.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "baton/error.hpp"

namespace baton {

/// Where and how one rank joins its process group.
struct DistOptions {
  int rank = 0;                         ///< this process, in [0, world_size)
  int world_size = 1;                   ///< number of processes
  int local_rank = 0;                   ///< this process on its machine (for the device: cuda:<local_rank>)
  std::string master_addr = "127.0.0.1";  ///< the host of rank 0's TCPStore (rendezvous)
  int master_port = 29500;              ///< its port
  /// A FileStore rendezvous on this path instead of TCP (ranks on one machine or a shared file
  /// system; the file must not exist before the first rank joins).
  std::filesystem::path store_file{};
  /// How long rendezvous and every collective may wait for the other ranks; a rank that died or
  /// hangs makes the others fail with an error within this time instead of waiting forever.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

/// The options from the environment: RANK, WORLD_SIZE, LOCAL_RANK (default RANK), MASTER_ADDR
/// (default 127.0.0.1), MASTER_PORT (default 29500), and BATON_DIST_TIMEOUT in seconds
/// (default 300). An error names the variable that is missing or malformed.
Expected<DistOptions> dist_options_from_env();

/// Is this process one rank of a group a launcher started (WORLD_SIZE is set)?
bool launched_distributed();

/// What the collectives cost so far (for benchmarks and logs).
struct DistStats {
  std::int64_t allreduce_calls = 0;   ///< all-reduce operations (one per bucket)
  std::int64_t allreduce_bytes = 0;   ///< bytes of this rank's buffers all-reduced
  double allreduce_seconds = 0;       ///< wall time from the first launch to the last wait
  /// Of that, the time spent blocked waiting (for all_reduce: all of it; for start/finish: only
  /// finish_all_reduces, so what overlapped with other work is not counted).
  double allreduce_wait_seconds = 0;
  std::int64_t broadcast_calls = 0;
  double broadcast_seconds = 0;
};

/// One rank's membership of a c10d process group (Gloo; NCCL only in CUDA builds of LibTorch,
/// not in this one). Immutable once joined; its collectives must be called in the same order on
/// every rank (the loop does that). Not for concurrent use from several threads.
class Distributed {
 public:
  /// Joins the group: a TCPStore rendezvous at master_addr:master_port (rank 0 serves it) or a
  /// FileStore, then a Gloo group over TCP. Fails (no hang) after `options.timeout`.
  static Expected<std::shared_ptr<const Distributed>> join(const DistOptions& options);
  /// `join(dist_options_from_env())`.
  static Expected<std::shared_ptr<const Distributed>> join_from_env();

  ~Distributed();
  Distributed(const Distributed&) = delete;
  Distributed& operator=(const Distributed&) = delete;

  [[nodiscard]] int rank() const;
  [[nodiscard]] int world_size() const;
  [[nodiscard]] int local_rank() const;
  [[nodiscard]] std::chrono::milliseconds timeout() const;
  [[nodiscard]] std::string backend() const;  ///< "gloo"

  /// The contiguous part of `count` items (samples of one global batch) this rank takes:
  /// {offset, size}. The first `count % world_size` ranks take one more; a rank may take none.
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> shard(std::int64_t count) const;

  enum class Op { sum, max };
  /// Reduces each tensor (contiguous, CPU) in place across ranks, every rank getting the result.
  /// The tensors' all-reduces are launched together and then waited for. `what` names the
  /// operation in errors ("gradients at batch 12").
  [[nodiscard]] Expected<void> all_reduce(const std::vector<at::Tensor>& tensors, Op op, const std::string& what) const;
  /// Launches the all-reduce of `tensor` (contiguous, CPU) and returns at once, so that other
  /// work (the rest of backward) overlaps it; `finish_all_reduces` waits for every one started.
  /// Do not read or write the tensor in between. As every collective, the calls must come in
  /// the same order on every rank.
  [[nodiscard]] Expected<void> start_all_reduce(const at::Tensor& tensor, Op op, const std::string& what) const;
  /// Launches the broadcast of rank `root`'s `tensor` (contiguous, CPU) into every rank's and
  /// returns at once, as start_all_reduce; `finish_all_reduces` waits for it too.
  [[nodiscard]] Expected<void> start_broadcast(const at::Tensor& tensor, int root, const std::string& what) const;
  /// Waits for the all-reduces and broadcasts started since the last call (nothing when none was).
  [[nodiscard]] Expected<void> finish_all_reduces(const std::string& what) const;
  /// Overwrites each tensor (contiguous) with rank `root`'s.
  [[nodiscard]] Expected<void> broadcast(const std::vector<at::Tensor>& tensors, int root, const std::string& what) const;
  /// Waits until every rank has arrived.
  [[nodiscard]] Expected<void> barrier(const std::string& what) const;

  [[nodiscard]] DistStats stats() const;

  struct Impl;  // the c10d objects (src/distributed.cpp)
  explicit Distributed(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace baton
