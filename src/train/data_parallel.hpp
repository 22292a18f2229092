#pragma once
// Data-parallel training on c10d, behind one object that does nothing without a process group:
// the loop calls it at four points (start, batch, after backward, end) and pays nothing more.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "baton/distributed.hpp"
#include "baton/state.hpp"
#include "train/carry.hpp"

namespace baton::detail {

class DataParallel {
 public:
  explicit DataParallel(const Distributed* group) : group_(group) {}

  [[nodiscard]] bool active() const { return group_ != nullptr; }
  [[nodiscard]] int rank() const { return group_ ? group_->rank() : 0; }
  /// The rank that writes (checkpoints, logs): rank 0, or the only process.
  [[nodiscard]] bool lead() const { return rank() == 0; }

  /// Every rank must start from the same point of the same run; then rank 0's weights and
  /// buffers win (a model built from the same seed is equal anyway; this covers a user's init).
  void start(TrainState& s, std::int64_t n, std::int64_t batch_size, std::uint64_t data_seed);

  /// This rank's contiguous part (offset, size) of a global batch of `take` samples; it becomes
  /// the step in progress. `stop_requested`: this rank was asked to stop (all ranks will).
  std::pair<std::int64_t, std::int64_t> begin_step(std::int64_t take, std::int64_t batch, bool stop_requested);

  /// This rank's share of the step's global batch: its loss is scaled by it (1 without a group).
  [[nodiscard]] double weight() const { return weight_; }

  /// Sums the ranks' weighted gradients (the gradient of the global batch's mean loss) in
  /// buckets, with the loss and the non-finite and stop flags. Returns the global loss and
  /// whether some rank's loss was not finite. Without a group: the arguments unchanged.
  std::pair<double, bool> reduce(std::vector<Slot>& slots, double weighted_loss, bool non_finite);

  /// Some rank was asked to stop (agreed in the last step's all-reduce).
  [[nodiscard]] bool stop_agreed() const { return stop_agreed_; }

  /// Each rank's last forward updated its own buffers: rank 0's become the state's.
  void finish();

 private:
  const Distributed* group_;
  std::vector<torch::Tensor> buffers_;
  double weight_ = 1.0;
  bool stop_requested_ = false, stop_agreed_ = false;
  std::string what_;
};

}  // namespace baton::detail
