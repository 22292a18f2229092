#pragma once
/// \file summary.hpp
/// A model summary: modules, output shapes for the data's input shape, parameters (trainable and
/// frozen per stage), size and estimated FLOPs per sample. `baton run` prints it at the start.
///
/// ```cpp
/// auto s = baton::summarize(state, {1, 28, 28}, specs);
/// if (s) fmt::print("{}", s->to_string());
/// ```

#include <cstdint>
#include <optional>

#include <c10/core/ScalarType.h>
#include <string>
#include <vector>

#include "baton/error.hpp"
#include "baton/spec.hpp"
#include "baton/state.hpp"

namespace baton {

struct ModelSummary {
  /// A module: for a `torch::nn::Sequential` model each entry in order, with the shape of its
  /// output; for another model each direct child (its output shape is not known: empty).
  struct Row {
    std::string name{};                  ///< its name in the module tree ("0", "encoder")
    std::string type{};                  ///< "Conv2d", "Linear", ... (the C++ class, less "Impl")
    std::vector<std::int64_t> output{};  ///< per sample (no batch dimension); empty when unknown
    std::int64_t params = 0;             ///< parameter elements in it and its children
    std::optional<double> flops{};       ///< per sample; nullopt when not known for its type
  };
  /// Trainable and frozen parameter elements of a stage (its `freeze` patterns).
  struct Stage {
    std::string name{};
    std::int64_t trainable = 0, frozen = 0;
  };
  std::vector<Row> rows{};
  std::vector<std::int64_t> input{}, output{};  ///< per sample
  std::int64_t params = 0;                  ///< parameter elements
  std::int64_t buffer_elements = 0;         ///< buffers (batch-norm statistics, ...)
  double megabytes = 0;                     ///< parameters and buffers, 10^6 bytes
  /// Floating-point operations of one sample's forward pass (a multiply-add counts 2): convolutions,
  /// linear layers and batch norms; nullopt when a module with parameters is of a type whose count
  /// is not known, or the model is not a Sequential (unknown input shapes inside).
  std::optional<double> flops{};
  std::vector<Stage> stages{};

  /// A table: one line per row, totals, and one line per stage.
  [[nodiscard]] std::string to_string() const;
};

/// The summary of `state`'s model for samples of shape `sample` (no batch dimension, e.g. {1, 28,
/// 28}), with trainable/frozen counts for each of `stages` (of the model each stage trains: from a
/// stage with a model of its own, `ModelCarry` with a factory, that one). Runs one forward pass of a batch of
/// one zero sample on a copy of the state (in eval mode, without gradients): `state` is not
/// changed. The sample's `dtype` is that of the model's parameters unless given (int64 for a
/// language model's token ids). Errors: a forward pass that fails on that shape (shape_mismatch,
/// naming the module).
Expected<ModelSummary> summarize(const TrainState& state, const std::vector<std::int64_t>& sample,
                                 const std::vector<TrainingSpec>& stages = {}, std::optional<c10::ScalarType> dtype = std::nullopt);

}  // namespace baton
