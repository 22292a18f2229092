#pragma once
/// \file data.hpp
/// In-memory datasets, MNIST-format IDX files (plain or .gz), Fashion-MNIST from the Debian
/// package dataset-fashion-mnist, CSV tables, synthetic blobs, and the data order: a pure function
/// of (seed, epoch).

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "baton/error.hpp"

namespace baton {

/// A dataset held in memory: `inputs[i]` and `targets[i]` form sample i. Tensors are shared,
/// never written by baton: copying a Dataset is cheap and safe.
struct Dataset {
  torch::Tensor inputs;   ///< [N, ...] floating point
  torch::Tensor targets;  ///< [N] int64 class indices, or [N, ...] floating for regression
  std::string name;       ///< used in messages, e.g. "fashion-mnist/train"

  [[nodiscard]] std::int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }

  /// Checks that both tensors are defined, non-empty and have the same first dimension.
  [[nodiscard]] Expected<void> validate() const;

  /// The first `n` samples (all of them if `n >= size()`), sharing memory with this dataset.
  [[nodiscard]] Dataset head(std::int64_t n) const;
};

/// Builds a dataset from tensors, checking that they agree (see `Dataset::validate`).
Expected<Dataset> make_dataset(torch::Tensor inputs, torch::Tensor targets, std::string name);

/// One batch as the model sees it.
struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
};

/// Which part of a dataset with a fixed train/test split.
enum class Split { train, test };

namespace data {

/// Reads an IDX file (the MNIST format: magic, dims, big-endian sizes, payload), plain or
/// gzip-compressed (detected from the content, not the name). Returns the payload as a tensor of
/// the file's element type and shape. Missing, truncated or malformed files are errors naming
/// the file and what is wrong.
Expected<torch::Tensor> read_idx(const std::filesystem::path& path);

/// Options for MNIST-format image/label pairs.
struct ImageOptions {
  bool normalize = true;  ///< scale to [0,1] then standardize with `mean` and `std`
  double mean = 0.2860;   ///< Fashion-MNIST train mean (of pixels in [0,1])
  double std = 0.3530;    ///< Fashion-MNIST train standard deviation
};

/// An image dataset from an IDX image file ([N, H, W] uint8) and an IDX label file ([N] uint8):
/// inputs are float32 [N, 1, H, W], targets int64 [N].
Expected<Dataset> idx_images(const std::filesystem::path& images, const std::filesystem::path& labels,
                             std::string name, const ImageOptions& options = {});

/// Where dataset-fashion-mnist installs its files.
inline const std::filesystem::path fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

/// Fashion-MNIST's class names by label (0 "T-shirt/top" ... 9 "Ankle boot").
const std::vector<std::string>& fashion_mnist_classes();

/// Fashion-MNIST (60,000 train / 10,000 test 28x28 grey images, 10 classes) from `dir`.
Expected<Dataset> fashion_mnist(Split split, const std::filesystem::path& dir = fashion_mnist_dir,
                                const ImageOptions& options = {});

/// Options for a CSV table: a header row of column names, then one sample per row, every cell a
/// number.
struct CsvOptions {
  std::filesystem::path path;
  std::string target;          ///< the target column's name; "" for the last column
  bool classification = true;  ///< int64 class targets [N] (integers >= 0); false: float32 regression targets [N, 1]
};

/// A dataset from a CSV file (the `csv` kind of a curriculum): inputs float32 [N, columns - 1],
/// the other columns in file order. Empty lines are skipped. A missing file, a row with the wrong
/// number of cells, a cell that is not a finite number (or, for a feature, not a finite 32-bit
/// float) and, for classification, a target that is not a class index are errors naming the file,
/// the line and the column.
///
/// ```cpp
/// auto iris = baton::data::csv({.path = "iris.csv", .target = "species"});
/// ```
Expected<Dataset> csv(const CsvOptions& options);

/// Options for synthetic data: Gaussian blobs, one per class.
struct SyntheticOptions {
  std::int64_t samples = 1000;
  std::int64_t features = 8;
  std::int64_t classes = 4;
  std::uint64_t seed = 0;                    ///< fixes the task (the class centers)
  std::optional<std::uint64_t> sample_seed;  ///< fixes the samples drawn (default: seed + 1)
};

/// A classification task for tests and examples (the `synthetic` kind of a curriculum): class
/// centers drawn from N(0, 2^2) per feature with `seed`, samples from N(center, 1) with
/// `sample_seed`, so a train and a test set of one task differ only in their sample_seed. Inputs
/// float32 [samples, features], targets int64 [samples]. Needs samples >= 1, features >= 1,
/// classes >= 2, and at most 2^31 floats of inputs (and of centers).
///
/// ```cpp
/// auto train = baton::data::synthetic({.samples = 2000, .classes = 3, .seed = 7});
/// auto test  = baton::data::synthetic({.samples = 500, .classes = 3, .seed = 7, .sample_seed = 99});
/// ```
Expected<Dataset> synthetic(const SyntheticOptions& options);

/// The samples [offset, offset + limit) of `dataset` (to its end when `limit` is 0), sharing its
/// memory. An offset at or past the end, or a negative offset or limit, is an error naming the
/// dataset and its size.
Expected<Dataset> slice(const Dataset& dataset, std::int64_t offset, std::int64_t limit = 0);

/// Options of `data::hold_out` (in a curriculum: `holdout = { fraction, seed, part }` on any dataset).
struct HoldOutOptions {
  double fraction = 0.1;   ///< share of the samples in the held-out part, in (0, 1)
  std::uint64_t seed = 0;  ///< which samples: the split is a pure function of (seed, size)
};

/// The two parts of a held-out split.
struct HeldOut {
  Dataset train;  ///< the samples not held out, in their original order; named "<name>:train"
  Dataset val;    ///< the held-out samples (round(fraction * size) of them), in their original order; "<name>:val"
};

/// Splits `dataset` into a training part and a held-out validation part that are disjoint and
/// together hold every sample once. Which samples are held out is a pure function of
/// (options.seed, dataset.size()), the same on every platform; it does not depend on the data
/// order's seed, so a run's seed can change without moving samples between the parts. Both parts
/// keep the dataset's order and are copies (the source can be freed). Errors: a fraction outside
/// (0, 1), or one that leaves a part empty.
///
/// ```cpp
/// auto full = baton::data::fashion_mnist(baton::Split::train);
/// auto parts = baton::data::hold_out(*full, {.fraction = 0.1});   // 54,000 train, 6,000 val
/// ```
Expected<HeldOut> hold_out(const Dataset& dataset, const HoldOutOptions& options = {});

/// The order in which epoch `epoch` visits a dataset of `size` samples: a permutation of
/// [0, size) that depends only on (seed, epoch, size), identical on every platform and LibTorch
/// version (its own SplitMix64 + Fisher-Yates, not torch::randperm). With `shuffle == false`, the
/// identity. int64 tensor of shape [size].
torch::Tensor epoch_order(std::int64_t size, std::uint64_t seed, std::int64_t epoch, bool shuffle = true);

}  // namespace data
}  // namespace baton
