#pragma once
/// \file testing.hpp
/// Checks for unit tests of your own training code: the model, the loss, the stage, its resume.
/// Each takes the spec and state you train with, works on copies (yours are never changed), and
/// returns a `Check` that says what was checked and, when it fails, what went wrong and the
/// likely causes. No test framework is needed (the target is `baton::testing`);
/// `baton/testing_catch.hpp` makes Catch2 print the message. docs/testing.md has a whole
/// example test file.
///
/// ```cpp
/// namespace bt = baton::testing;
/// const auto batch = bt::first_batch(spec);
/// CHECK(bt::gradients_flow(spec, state, batch));        // every trainable parameter learns
/// CHECK(bt::overfits_one_batch(spec, state, batch));     // the loss can go to ~0
/// CHECK(bt::resume_invariant(spec, state, "3ba"_t));     // a checkpoint resumes to the same bits
/// ```

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "baton/data.hpp"
#include "baton/spec.hpp"
#include "baton/state.hpp"
#include "baton/time.hpp"

namespace baton::testing {

/// What a check found: whether it passed, and a message saying what was checked and, on failure,
/// what went wrong (naming parameters, steps, tensors) and the likely causes.
struct Check {
  bool passed = false;
  std::string message{};
  explicit operator bool() const { return passed; }
};
std::ostream& operator<<(std::ostream& out, const Check& check);

/// The first `size` samples of the spec's training data (default: `spec.data.batch_size`), in
/// stored order: a fixed batch for the one-batch checks.
Batch first_batch(const TrainingSpec& spec, std::int64_t size = 0);

struct OverfitOptions {
  std::int64_t steps = 200;  ///< at most this many `train_step`s on the batch
  double below = 0.05;       ///< pass once the batch's loss is under this
};

/// Trains on one batch (train_step, repeatedly) until its loss falls below `options.below`, at
/// most `options.steps` steps: a model and loss that can learn at all can memorise one batch. It
/// catches a loss that does not match the outputs, a detached graph, a frozen model, a learning
/// rate of 0. The copy's max duration is set to the batch where the steps end when it is in
/// another unit or too short (a schedule that reads the max duration sees that one).
Check overfits_one_batch(const TrainingSpec& spec, const TrainState& state, const Batch& batch,
                         OverfitOptions options = {});

/// One forward and backward pass of the spec's loss on `batch` (no optimizer step, no algorithms):
/// every parameter the spec trains (not matched by `spec.freeze`) must get a gradient that is
/// defined, finite and not all zero. Names each that does not, and why that happens (a detached
/// branch, a layer the forward skips, `requires_grad` turned off in the model, a NaN).
Check gradients_flow(const TrainingSpec& spec, const TrainState& state, const Batch& batch);

/// Two fits of the spec (for `budget`, or the whole stage) from copies of the same state give the
/// same bits (`bitwise_equal`), naming what differs first. Fails on randomness outside the
/// state's RNG (a generator of the model's own, a clock, a counter) and on kernels that are not
/// deterministic.
Check deterministic(const TrainingSpec& spec, const TrainState& state, std::optional<Time> budget = {});

/// The stage trained in pieces (`fit(spec, s, cut)` for each cut in turn, then `fit(spec, s)` for
/// the rest) equals the stage trained in one fit, bit for bit.
Check split_invariant(const TrainingSpec& spec, const TrainState& state, const std::vector<Time>& cuts);

/// The stage stopped after `at`, saved to a checkpoint file, loaded back (with the state's model
/// factory) and finished equals the stage trained in one fit, bit for bit. Fails on training
/// state kept outside the TrainState (a model member that is neither parameter nor buffer, a
/// static in a loss or algorithm).
Check resume_invariant(const TrainingSpec& spec, const TrainState& state, Time at);

/// No sample of `held_out` is an exact duplicate (the same input bytes) of a training sample.
Check no_leak(const Dataset& train, const Dataset& held_out);
/// `no_leak` of the spec's training data against each of its evaluation sets.
Check no_leak(const TrainingSpec& spec);

struct LossAtInitOptions {
  double tolerance = 0.25;  ///< allowed |loss - ln(classes)| as a fraction of ln(classes)
};

/// For classification (int64 class targets, [B, C] outputs; or a language model's tokens, targets
/// [B, T] and outputs [B, T, V], C = V): the state's loss on `batch`, in
/// evaluation mode, is within the tolerance of ln(C), what a model that has learnt nothing yet
/// should score. Far above it: an initialisation that is too confident (logits too large, a
/// softmax applied twice, a wrong output scale).
Check loss_at_init(const TrainingSpec& spec, const TrainState& state, const Batch& batch, LossAtInitOptions options = {});

}  // namespace baton::testing
