#pragma once
/// \file data.hpp
/// Datasets in memory and lazy ones (samples made on demand: packed shards, transforms, your own
/// `Source`), MNIST-format IDX files (plain or .gz), Fashion-MNIST from the Debian package
/// dataset-fashion-mnist, CSV tables, synthetic blobs, and the data order: a pure function of
/// (seed, epoch). docs/data.md.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "baton/error.hpp"
#include "baton/params.hpp"

namespace baton {

/// One batch as the model sees it.
struct Batch {
  torch::Tensor inputs{};
  torch::Tensor targets{};
};

/// What a lazy dataset's batch may depend on besides the sample indices: the fit's data seed and
/// the epoch (evaluation passes seed 0 and epoch -1).
struct SampleContext {
  std::uint64_t seed = 0;
  std::int64_t epoch = -1;
};

/// Where the samples of a lazy dataset come from (packed shards, a transform, your own reader).
/// `batch` is called from worker threads at once (`DataSpec::workers`), so it must not change
/// shared state, and it must be a pure function of (indices, context): then any number of workers,
/// any split of a run into fits and any resume give the same bits.
class Source {
 public:
  virtual ~Source() = default;
  /// Number of samples.
  [[nodiscard]] virtual std::int64_t size() const = 0;
  /// The samples `indices` (int64 [B], each in [0, size())) as one batch on the CPU: inputs
  /// [B, input_shape()...] floating point, targets [B] int64 or [B, ...] floating. An error should
  /// name the sample (and its file) that failed.
  [[nodiscard]] virtual Expected<Batch> batch(const torch::Tensor& indices, const SampleContext& context) const = 0;
  /// One sample's input shape, known without reading samples (checks, model summary and card).
  [[nodiscard]] virtual std::vector<std::int64_t> input_shape() const = 0;
  /// The number of classes for int64 class targets; 0 for floating (regression) targets.
  [[nodiscard]] virtual std::int64_t classes() const = 0;
  /// What samples it gives, as text that changes when they do (its files, their sizes and
  /// times, its options): a run directory's fingerprint holds it, so a resume on other data is
  /// refused. The built-in sources give one. Empty (the default): baton cannot describe the
  /// data, and `baton::run` refuses to resume until it can or `RunOptions::accept_undescribed`
  /// is set.
  [[nodiscard]] virtual std::string identity() const { return {}; }
};

/// How a baton loader made a dataset, as a curriculum's `[datasets.<name>]` table would say it:
/// the `kind` and its keys (input paths absolute), then the selection every kind takes (`offset`
/// and `limit`, then `holdout`). A C++ run records it (run.hpp: tools.toml), so that `baton eval`
/// and `baton export --inference` rebuild the dataset by name. The loaders set it, `slice`,
/// `head`, `hold_out` and `materialize` carry it; any other dataset has none (`kind` empty).
struct DataOrigin {
  std::string kind{};  ///< "fashion-mnist", "idx", "csv", "synthetic", "image_folder", "shards"; "": unknown
  Params keys{};       ///< the kind's keys, and `offset` / `limit` when a part was taken
  double holdout_fraction = 0;      ///< > 0: a part of `data::hold_out` of the samples above
  std::uint64_t holdout_seed = 0;
  bool holdout_val = false;         ///< which part: the held-out one, or the rest
};

/// A dataset: in memory (`inputs[i]` and `targets[i]` form sample i), or lazy (`source` makes
/// samples on demand; `inputs` and `targets` are then undefined). Tensors and sources are shared,
/// never written by baton: copying a Dataset is cheap and safe. The loop, `eval` and every
/// function here take both kinds; read samples through `gather`/`range`, not the tensors, to
/// support both.
struct Dataset {
  torch::Tensor inputs{};                ///< [N, ...] floating point (in memory)
  torch::Tensor targets{};               ///< [N] int64 class indices, or [N, ...] floating for regression
  std::string name{};                    ///< used in messages, e.g. "fashion-mnist/train"
  std::shared_ptr<const Source> source{};  ///< set: a lazy dataset
  DataOrigin origin{};                   ///< which loader made it, when a baton loader did

  [[nodiscard]] bool lazy() const { return source != nullptr; }
  [[nodiscard]] std::int64_t size() const {
    return source ? source->size() : inputs.defined() ? inputs.size(0) : 0;
  }

  /// Checks that both tensors are defined, non-empty and have the same first dimension (in
  /// memory), or that the source has samples (lazy).
  [[nodiscard]] Expected<void> validate() const;

  /// The first `n` samples (all of them if `n >= size()`), sharing memory (or the source).
  [[nodiscard]] Dataset head(std::int64_t n) const;

  /// The samples `indices` (int64 [B]) as a batch: `index_select` in memory, the source's
  /// `batch` when lazy (errors then name the dataset).
  [[nodiscard]] Expected<Batch> gather(const torch::Tensor& indices, const SampleContext& context = {}) const;
  /// The samples [start, start + count) as a batch (views of the tensors in memory).
  [[nodiscard]] Expected<Batch> range(std::int64_t start, std::int64_t count, const SampleContext& context = {}) const;
  /// One sample's input shape (empty for a dataset without samples).
  [[nodiscard]] std::vector<std::int64_t> input_shape() const;
  /// True when targets are int64 class indices.
  [[nodiscard]] bool class_targets() const;
  /// max label + 1 for class targets (in memory: computed; lazy: the source's), else 0.
  [[nodiscard]] std::int64_t classes() const;
  /// What samples it holds, as text that changes when they do: in memory, the name, the size
  /// and a SHA-256 of both tensors (dtype, shape, bytes; reads every byte once); lazy, the
  /// name and the source's `Source::identity()`, or "" when the source gives none. A run
  /// directory's fingerprint holds it (run.hpp).
  [[nodiscard]] std::string identity() const;
};

/// Builds a dataset from tensors, checking that they agree (see `Dataset::validate`).
Expected<Dataset> make_dataset(torch::Tensor inputs, torch::Tensor targets, std::string name);

/// A lazy dataset over `source`, named `name`.
Dataset make_dataset(std::shared_ptr<const Source> source, std::string name);

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
  std::filesystem::path path{};
  std::string target{};        ///< the target column's name; "" for the last column
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
  std::optional<std::uint64_t> sample_seed{};  ///< fixes the samples drawn (default: seed + 1)
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

/// The dataset with each sample of class `c` relabelled `map[c]`, and the samples of a class
/// mapped to -1 left out (the others keep their order). One call makes a coarser task, a task on
/// some of the classes, or both:
///
/// ```cpp
/// auto train = baton::data::fashion_mnist(baton::Split::train);
/// // tops (T-shirt, pullover, dress, coat, shirt), trouser, footwear (sandal, sneaker, ankle boot), bag
/// auto coarse = baton::data::map_labels(*train, {0, 1, 0, 0, 0, 2, 0, 2, 3, 2});
/// // classes 5-9 only, as a 5-way task
/// auto upper = baton::data::map_labels(*train, {-1, -1, -1, -1, -1, 0, 1, 2, 3, 4});
/// ```
///
/// In a curriculum: `label_map = [...]` on any dataset table, applied before `offset`, `limit`
/// and `holdout`. Errors: targets that are not class indices, a class the map does not cover (its
/// label and the map's length), a value below -1, a map that leaves no sample. A lazy dataset is
/// relabelled as its batches are made; leaving classes out of one needs every sample's label,
/// so it is an error there (`materialize` it first).
Expected<Dataset> map_labels(const Dataset& dataset, const std::vector<std::int64_t>& map);

/// Options of `data::hold_out` (in a curriculum: `holdout = { fraction, seed, part }` on any dataset).
struct HoldOutOptions {
  double fraction = 0.1;   ///< share of the samples in the held-out part, in (0, 1)
  std::uint64_t seed = 0;  ///< which samples: the split is a pure function of (seed, size)
};

/// The two parts of a held-out split.
struct HeldOut {
  Dataset train{};  ///< the samples not held out, in their original order; named "<name>:train"
  Dataset val{};  ///< the held-out samples (round(fraction * size) of them), in their original order; "<name>:val"
};

/// Splits `dataset` into a training part and a held-out validation part that are disjoint and
/// together hold every sample once. Which samples are held out is a pure function of
/// (options.seed, dataset.size()), the same on every platform; it does not depend on the data
/// order's seed, so a run's seed can change without moving samples between the parts. Both parts
/// keep the dataset's order and are copies (the source can be freed; of a lazy dataset, lazy views
/// of its source). Errors: a fraction outside
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

/// A per-sample transform (decode, crop, flip, normalise, ...): one sample's input -> the new
/// input. Randomness must come from `gen` only: it is seeded from (context seed, epoch, index),
/// so a sample's result does not depend on which worker made it, or when.
using SampleTransform = std::function<torch::Tensor(const torch::Tensor& input, at::Generator& gen)>;

/// A lazy dataset whose samples are `dataset`'s with `transform` applied, one sample at a time,
/// when a batch is made (in the loop's workers). `index` in the generator's seed is the sample's
/// index in `dataset`. The transformed inputs of one batch must share a shape.
///
/// ```cpp
/// auto flipped = baton::data::transform(*train, [](const torch::Tensor& x, at::Generator& g) {
///   return torch::rand({1}, g).item<double>() < 0.5 ? x.flip({-1}) : x;
/// }, "hflip");
/// ```
Dataset transform(const Dataset& dataset, SampleTransform transform, const std::string& what);

/// A lazy dataset's samples, read once, as an in-memory dataset (an in-memory one as it is).
Expected<Dataset> materialize(const Dataset& dataset);

/// Options of `data::pack`.
struct PackOptions {
  std::int64_t records_per_shard = 65536;  ///< samples per shard file (the last holds the rest)
  /// Store inputs as 8-bit pixels, reproduced exactly on reading with `scale_pixels`' formula
  /// (x / 255, then (x - mean) / std when normalize): 4x smaller than float32. Packing fails
  /// when some input is not such a pixel value.
  std::optional<ImageOptions> pixels{};
};

/// What `data::pack` wrote.
struct PackSummary {
  std::int64_t samples = 0;
  std::int64_t shards = 0;
  std::int64_t bytes = 0;  ///< all files together
};

/// Writes `dataset` (in memory or lazy, in its order) to directory `dir` as packed shards
/// (docs/data.md): a manifest `shards.json` and files `shard-NNNNN.bin` of fixed-size records, each
/// with a CRC-32 of its payload. Written to a temporary directory and renamed, so `dir` is either
/// complete or absent; an existing `dir` is an error.
Expected<PackSummary> pack(const Dataset& dataset, const std::filesystem::path& dir, const PackOptions& options = {});

/// Options of `data::shards`.
struct ShardOptions {
  bool verify = true;  ///< check every shard's CRC-32 when opening (one streaming read)
};

/// A lazy dataset over the packed shards in `dir`: the files stay open and each batch reads its
/// records with positional reads, so resident memory stays bounded by the batches in flight,
/// whatever the data's size; no file is opened per sample. A missing manifest, a truncated shard
/// or a wrong checksum is an error naming the file.
Expected<Dataset> shards(const std::filesystem::path& dir, const ShardOptions& options = {});

}  // namespace data
}  // namespace baton
