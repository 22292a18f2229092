#pragma once
// Data-parallel training on c10d, behind one object that does nothing without a process group:
// the loop calls it at four points (start, batch, before the last backward, after it) and pays nothing more.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "baton/distributed.hpp"
#include "baton/state.hpp"
#include "train/carry.hpp"

namespace baton::detail {

/// Tensors flattened into one tensor per dtype (one collective each), and copied back.
struct Packed {
  Packed() = default;
  explicit Packed(const std::vector<torch::Tensor>& tensors);
  /// Copies `flats` back into the tensors they were made from.
  void unpack() const;
  std::vector<std::vector<torch::Tensor>> groups;  // the tensors, by dtype
  std::vector<torch::Tensor> flats;                // one per group
};

class DataParallel {
 public:
  explicit DataParallel(const Distributed* group) : group_(group) {}
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

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

  /// This rank's (offset, size) of a global batch of `take` samples, without starting a step.
  [[nodiscard]] std::pair<std::int64_t, std::int64_t> shard(std::int64_t take) const {
    return group_ ? group_->shard(take) : std::pair<std::int64_t, std::int64_t>{0, take};
  }

  /// This rank's share of the step's global batch: its loss is scaled by it (1 without a group).
  [[nodiscard]] double weight() const { return weight_; }

  /// The sum over the ranks of `local` (without a group: `local`): the global batch's loss terms
  /// when the loss counts its own (Loss::units). One small all-reduce, a sync point.
  [[nodiscard]] double sum(double local) const;

  /// Before the backward of a step's last microbatch, with this rank's weighted loss of the
  /// step: the loss and the stop flag go out at once, and each bucket of gradients is
  /// all-reduced as soon as backward has produced all of its gradients (autograd hooks),
  /// overlapping the rest of backward, as PyTorch DDP does. `reduce` then waits and installs
  /// the sums.
  void arm(std::vector<Slot>& slots, double weighted_loss);

  /// Sums the ranks' weighted gradients (the gradient of the global batch's mean loss) in
  /// buckets, with the loss and the non-finite and stop flags. Returns the global loss and
  /// whether some rank's loss was not finite. Without a group: the arguments unchanged.
  std::pair<double, bool> reduce(std::vector<Slot>& slots, double weighted_loss, bool non_finite);

  /// Some rank was asked to stop (agreed in the last step's all-reduce).
  [[nodiscard]] bool stop_agreed() const { return stop_agreed_; }


 private:
  /// Largest bucket of one all-reduce. DDP's default is 25 MiB with a first bucket of 1 MiB; small
  /// models (small_cnn's gradients are 1.7 MB) need small buckets to overlap at all.
  static constexpr std::int64_t kBucketBytes = 1LL << 20;
  /// Largest bucket of the model's first parameters: backward produces their gradients last, so
  /// their all-reduce is the one nothing hides. (small_cnn: its first convolution and BatchNorm,
  /// 1.4 KB, not the second convolution's 74 KB with them.)
  static constexpr std::int64_t kLastBucketBytes = 16LL << 10;
  struct Bucket {
    c10::ScalarType type;
    std::vector<std::size_t> members{};  // slot indices, in the order backward produces them
    std::int64_t bytes = 0;
    std::size_t ready = 0;
    bool launched = false;
    torch::Tensor flat{};
  };
  void plan_buckets(const std::vector<Slot>& slots);
  void on_gradient(std::size_t k, const torch::Tensor& g);
  void launch(std::size_t bucket);
  /// Starts a step's all-reduces on `slots`: plans the buckets if needed, clears what the last
  /// step held and launches the loss and flags (the first collective of every step).
  void begin(std::vector<Slot>& slots, double weighted_loss, bool non_finite);
  void disarm();

  const Distributed* group_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::vector<Slot>* slots_ = nullptr;  // armed for this step
  std::vector<torch::Tensor> grads_;    // per slot: its gradient as backward produced it
  static constexpr unsigned kNoHook = ~0u;
  std::vector<unsigned> hooks_;            // per slot: its hook, or kNoHook
  std::size_t next_ = 0;                // the next bucket to launch
  torch::Tensor meta_{};                // the step's loss, non-finite and stop flags, once launched
  std::optional<Error> failed_;
  std::vector<torch::Tensor> buffers_;
  Packed sent_buffers_;  // rank 0's buffers, broadcast in flight with the step's all-reduces
  double weight_ = 1.0;
  bool stop_requested_ = false, stop_agreed_ = false;
  std::string what_;
};

}  // namespace baton::detail
