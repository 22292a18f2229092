#pragma once
/// \file spec.hpp
/// TrainingSpec: an immutable description of one stage of training. Build variants with the
/// copy-returning `with_*` functions; check one with `validate()`.
///
/// ```cpp
/// const baton::TrainingSpec warmup{
///     .name = "warmup",
///     .data = {.train = *train, .batch_size = 128},
///     .loss = baton::loss::cross_entropy(),
///     .optimizer = baton::optim::sgd({.lr = 0.05, .momentum = 0.9}),
///     .duration = "1ep"_t,
/// };
/// const auto main = warmup.with_name("main").with_duration("3ep"_t);
/// ```

#include <cstdint>
#include <optional>
#include <string>

#include <c10/core/Device.h>

#include "baton/data.hpp"
#include "baton/error.hpp"
#include "baton/loss.hpp"
#include "baton/optim.hpp"
#include "baton/time.hpp"

namespace baton {

/// Training data and how it is batched.
struct DataSpec {
  Dataset train{};
  std::int64_t batch_size = 64;
  bool shuffle = true;     ///< order from (seed, epoch); false: dataset order
  bool drop_last = false;  ///< drop the last incomplete batch of each epoch
};

/// One stage of training. What carries over from the state (weights always; optimizer moments
/// per `optimizer_carry`; the timestamp, data order and RNG always) is written here.
struct TrainingSpec {
  std::string name = "fit";                       ///< names the stage in errors and history
  DataSpec data{};
  Loss loss = baton::loss::cross_entropy();
  Optimizer optimizer = baton::optim::sgd();
  Carry optimizer_carry = Carry::keep;            ///< keep the state's moments, or start fresh
  Time duration = Time::epochs(1);                ///< how much to train, from the state's time
  c10::Device device = c10::Device(c10::kCPU);    ///< CPU; CUDA when LibTorch has it
  std::optional<std::uint64_t> data_seed{};         ///< data order seed; default: the run's seed

  [[nodiscard]] TrainingSpec with_name(std::string v) const;
  [[nodiscard]] TrainingSpec with_data(DataSpec v) const;
  [[nodiscard]] TrainingSpec with_train_data(Dataset v) const;
  [[nodiscard]] TrainingSpec with_batch_size(std::int64_t v) const;
  [[nodiscard]] TrainingSpec with_loss(Loss v) const;
  /// A new optimizer, saying explicitly what happens to the state's moments.
  [[nodiscard]] TrainingSpec with_optimizer(Optimizer v, Carry carry) const;
  [[nodiscard]] TrainingSpec with_optimizer_carry(Carry v) const;
  [[nodiscard]] TrainingSpec with_lr(double lr) const;
  [[nodiscard]] TrainingSpec with_duration(Time v) const;
  [[nodiscard]] TrainingSpec with_device(c10::Device v) const;
  [[nodiscard]] TrainingSpec with_data_seed(std::uint64_t v) const;

  /// Every problem of the spec at once, in one error (code invalid_spec), each line naming the
  /// field, e.g. `data.batch_size: must be positive, got 0`.
  [[nodiscard]] Expected<void> validate() const;
};

}  // namespace baton
