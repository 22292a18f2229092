#pragma once
/// \file metrics.hpp
/// Metrics as values: a name, the statistics of one batch, and how the sums of those statistics
/// over a whole set become values. Evaluation sums the statistics in sample order (or joins them
/// with the metric's `merge`), so a metric's result is the same for any eval batch size (bit for
/// bit) and across ranks (up to the order of the ranks' join). Write your own
/// in a few lines and add it to `Registry::metrics` to name it in TOML (docs/metrics.md).

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <torch/types.h>

#include "baton/error.hpp"

namespace baton {

/// What a metric needs of a set's targets.
enum class MetricTargets {
  classes,  ///< int64 class indices [B], model output logits [B, C]
  values,   ///< floating targets of the output's shape (regression)
  any,
};

struct Metric {
  /// How floating statistics join: `into` (earlier samples) takes in `later`; see `merge`.
  using Merge = std::function<void(std::span<double> into, std::span<const double> later)>;
  std::string name{};  ///< "f1": reported as "<set>/f1", details as "<set>/f1/<detail>"
  MetricTargets targets = MetricTargets::any;
  /// The statistics of one batch from the model's output (float32; under bf16/fp16 autocast too)
  /// and the targets. An integral tensor (counts, any shape up to 3 dims, the same for every
  /// batch) is summed over batches exactly. A floating tensor must be [batch, k], one row per
  /// sample; rows are added (or joined with `merge`) in sample order in float64, so the result
  /// does not depend on how the set was cut into batches.
  std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)> batch{};
  /// The values from the statistics summed over the whole set (and all ranks), as float64, and
  /// the number of samples: key "" is the metric's value, other keys are details (per class:
  /// "3"; cells: "3/5"), reported as "<name>/<key>".
  std::function<std::map<std::string, double>(const torch::Tensor& sums, std::int64_t samples)> finish{};
  /// False for a metric that gives details only (the confusion matrix): it has no value of its
  /// own to watch with early stopping or keep_best.
  bool scalar = true;
  /// Optional, for floating statistics that a plain sum would round away (R2's spread of targets
  /// far from zero): joins the statistics of later samples (`later`, k values) into those of
  /// the samples before them (`into`, k values, updated in place). Evaluation starts from the
  /// first sample's row and joins every later row in sample order, then each rank's result in
  /// rank order, so the result is the same bits for any batch size; `finish` gets the result.
  /// Empty: rows are added.
  Merge merge{};
};

/// True for a detail value's name ("f1/3", "confusion_matrix/2/7"), false for a metric's own
/// ("f1", "loss"). Consoles, summaries and plots show only a metric's own values.
inline bool is_detail(const std::string& metric) { return metric.find('/') != std::string::npos; }

namespace metric {
/// Fraction of samples whose largest logit is the target class.
Metric accuracy();
/// Fraction of samples whose target is among the `k` largest logits ("top<k>_accuracy"); with
/// `k` at least the number of classes, 1.
Metric top_k_accuracy(std::int64_t k);
/// Per class and macro-averaged ("precision", details "precision/<class>"). The macro mean is
/// over the classes that occur in the targets or predictions; 0/0 counts as 0 (as scikit-learn).
Metric precision();
Metric recall();
Metric f1();
/// Mean recall over the classes that occur in the targets.
Metric balanced_accuracy();
/// Counts of (target, prediction) pairs: details "confusion_matrix/<target>/<predicted>".
Metric confusion_matrix();
/// Regression, over every element of the targets: mean absolute error, mean squared error and its
/// root; R2 per output element (the coefficient of determination, 1 - SSres/SStot; a constant
/// target gives 1 when predicted exactly, else 0), averaged over output elements (as scikit-learn).
Metric mae();
Metric mse();
Metric rmse();
Metric r2();

/// Language models, over the real tokens of logits [B, T, V] and targets [B, T] (-100, the
/// padding of token_cross_entropy, not counted): exp of the mean cross-entropy; the mean in bits
/// (with text::ByteTokenizer a token is a byte: bits per byte); the fraction of tokens whose
/// largest logit is the target.
Metric perplexity();
Metric bits_per_token();
Metric token_accuracy();
/// Bits per byte of text: the real tokens' cross-entropy in bits over the bytes they stand for,
/// `byte_lengths[id]` each (text::Tokenizer::byte_lengths()). Unlike bits per token, it compares
/// across tokenizers. A curriculum's `metrics = ["bits_per_byte"]` takes its eval sets' tokenizer.
Metric bits_per_byte(const std::vector<double>& byte_lengths);

/// The metrics an evaluation gives when none are listed: accuracy and top-5 accuracy for class
/// targets, none for others (the loss is always given).
std::vector<Metric> defaults(MetricTargets targets);

/// A built-in metric by name: "accuracy", "top<k>_accuracy", "precision", "recall", "f1",
/// "balanced_accuracy", "confusion_matrix", "mae", "mse", "rmse", "r2", "perplexity", "bits_per_token", "token_accuracy".
Expected<Metric> builtin(const std::string& name);
/// The built-in metrics' names (with "top5_accuracy" standing for top<k>_accuracy).
std::vector<std::string> builtin_names();
}  // namespace metric

}  // namespace baton
