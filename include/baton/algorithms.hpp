#pragma once
/// \file algorithms.hpp
/// Training algorithms (see events.hpp): pure transforms at event points, each a value you put
/// in `TrainingSpec::algorithms` for the stages that want it. Randomness comes from the run's
/// RNG (the state's generator, active during fit), so split and resumed runs stay bit-identical.
///
/// ```cpp
/// namespace algo = baton::algorithms;
/// auto finetune = main.with_name("finetune")
///     .with_algorithms({algo::random_crop_flip({}), algo::mixup({.alpha = 0.2}),
///                       algo::label_smoothing({.smoothing = 0.1}), algo::ema({.decay = 0.999})});
/// auto metrics = baton::eval({.sets = {{"test", test}}, .weights = "ema"}, *state);
/// ```
///
/// Soft targets: MixUp, CutMix and label smoothing turn class labels into class probabilities
/// [batch, classes]; the loss must accept them (`loss::cross_entropy` does).
///
/// Default order at one event point (used by TOML curricula unless `algorithms.order` says
/// otherwise): random_crop_flip, progressive_resizing, cutout, mixup, cutmix, label_smoothing,
/// layer_freezing, sam, ema, swa — augment the inputs, then mix, then smooth the mixed targets,
/// then gradients, then weight averages.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "baton/error.hpp"
#include "baton/events.hpp"
#include "baton/params.hpp"

namespace baton::algorithms {

struct LabelSmoothingOptions {
  double smoothing = 0.1;  ///< targets become (1 - s) * one_hot + s / classes
};
/// Replaces the targets by (1 - s) * y + s / C before the loss (C: the model's output width).
Algorithm label_smoothing(LabelSmoothingOptions o = {});

struct MixUpOptions {
  double alpha = 0.2;  ///< lambda ~ Beta(alpha, alpha), one per batch
};
/// Inputs become lambda * x + (1 - lambda) * x[perm], targets the same combination of the one-hot
/// labels, with perm a random permutation of the batch.
Algorithm mixup(MixUpOptions o = {});

struct CutMixOptions {
  double alpha = 1.0;  ///< lambda ~ Beta(alpha, alpha), one per batch
};
/// Pastes one random box of x[perm] into every image (box area about (1 - lambda) of the image,
/// clipped at the border); targets mix with the pasted area's exact fraction. Inputs [B, C, H, W].
Algorithm cutmix(CutMixOptions o = {});

struct CutOutOptions {
  std::int64_t size = 8;  ///< side of the square set to zero, in pixels (clipped at the border)
};
/// Sets one random square (centre uniform over the image) of every image to zero. Inputs [B, C, H, W].
Algorithm cutout(CutOutOptions o = {});

struct RandomCropFlipOptions {
  std::int64_t padding = 4;  ///< zero-pad each side, then crop back to the original size
  double flip = 0.5;         ///< probability of a horizontal flip, per image
};
/// The classic image augmentation: random crop of the zero-padded image and random horizontal
/// flip, per image. Inputs [B, C, H, W].
Algorithm random_crop_flip(RandomCropFlipOptions o = {});

struct ProgressiveResizingOptions {
  double initial_scale = 0.5;      ///< image side scale at the start of the stage
  double finetune_fraction = 0.2;  ///< the last part of the stage trains at full size
  std::int64_t size_increment = 4; ///< sides are rounded to multiples of this
};
/// Trains on images downscaled (bilinear) by a factor that grows linearly from `initial_scale` to
/// 1 over the first (1 - finetune_fraction) of the stage. The model must accept any image size
/// (e.g. global average pooling). Inputs [B, C, H, W].
Algorithm progressive_resizing(ProgressiveResizingOptions o = {});

struct SeqLengthWarmupOptions {
  std::int64_t min_length = 8;  ///< positions at the start of the stage
  double duration = 0.3;        ///< the fraction of the stage over which the length grows to the full one
  std::int64_t step = 8;        ///< lengths are rounded down to multiples of this (never below min_length)
};
/// Sequence-length warm-up: trains on the first L positions of each sequence (inputs [B, T] token
/// ids; targets [B, T] cut alike, class targets [B] kept), L growing linearly from `min_length`
/// to T over the first `duration` of the stage. Like every algorithm it reads only the stage's
/// progress, so a split or resumed stage sees the same lengths (tested on the GPT). Tokens cut
/// off are not trained on (the loss counts the kept ones).
Algorithm seq_length_warmup(SeqLengthWarmupOptions o = {});

struct EmaOptions {
  double decay = 0.999;  ///< after each step: ema = decay * ema + (1 - decay) * weights
};
/// Keeps an exponential moving average of the parameters (buffers are copied), in
/// `TrainState::algorithm_state["ema"]`, starting from the weights after the first step. Evaluate
/// with it: `EvalSpec{.weights = "ema"}`.
Algorithm ema(EmaOptions o = {});

struct SwaOptions {
  double start = 0.75;         ///< fraction of the stage after which averaging begins
  std::int64_t every = 1;      ///< average the weights every this many batches
  bool apply_at_end = true;    ///< at the stage's end, the model takes the averaged weights
};
/// Stochastic weight averaging: the plain mean of the weights sampled after the steps from
/// `start` on, every `every` batches (buffers: the last ones; BatchNorm statistics are not
/// recomputed). In `TrainState::algorithm_state["swa"]`; evaluate with `.weights = "swa"`.
Algorithm swa(SwaOptions o = {});

/// One rule of layer freezing: parameters matching `pattern` stop training once the stage is
/// `at` (a fraction in [0, 1]) done.
struct FreezeRule {
  std::string pattern{};
  double at = 0.5;
};
/// Freezes layers progressively over the stage (their gradients are dropped after backward, so
/// neither the weights nor their optimizer moments move).
Algorithm layer_freezing(std::vector<FreezeRule> rules);

struct SamOptions {
  double rho = 0.05;      ///< radius of the step up the gradient
  bool adaptive = false;  ///< ASAM: the step scaled by |w| per weight (scale-invariant sharpness)
};
/// Sharpness-aware minimization (Foret et al. 2021; adaptive: Kwon et al. 2021): each step takes the
/// gradient g at the weights w, moves to w + e with e = rho g / ||g|| (adaptive: e = rho w^2 g /
/// ||w g||, norms over all trainable parameters), takes the gradient there, goes back to w
/// (exactly: a copy) and lets the optimizer apply that second gradient. Two forward and backward
/// passes per step (data-parallel: two all-reduces, the first gradient is the global batch's);
/// the step's loss is the first pass's. Takes over the gradient (`Algorithm::gradient`).
Algorithm sam(SamOptions o = {});

/// The algorithm named `name` with options from `params` (the TOML keys of docs/config.md).
/// Unknown names or keys are errors listing the known ones.
Expected<Algorithm> from_name(const std::string& name, const Params& params);
/// Every algorithm's name, in the default order.
const std::vector<std::string>& default_order();

}  // namespace baton::algorithms
