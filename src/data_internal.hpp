#pragma once
// What the dataset readers (data.cpp, data_loaders.cpp) share with the model card and the
// inference inputs (src/hparams/curriculum.cpp, src/inference/), so that a deployed model sees
// its inputs exactly as training did.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "baton/data.hpp"
#include "baton/error.hpp"

namespace baton {
class Source;
}

namespace baton::detail {

/// A SHA-256 (hex) of a tensor's dtype, shape and bytes: what Source::identity() and
/// Dataset::identity() say of samples held in memory.
std::string tensor_digest(const torch::Tensor& t);

/// What a source that knows its classes' names adds to Source (an image folder's class
/// directories or list names); subsets and transforms pass their base's on.
class ClassNames {
 public:
  virtual ~ClassNames() = default;
  [[nodiscard]] virtual std::vector<std::string> class_names() const = 0;
};

/// The names of the dataset's classes where its source knows them, else none.
std::vector<std::string> class_names(const std::shared_ptr<const Source>& source);

/// The samples `indices` (int64 [M], into `base`) of a lazy source, as a source of M samples.
std::shared_ptr<const Source> subset(std::shared_ptr<const Source> base, torch::Tensor indices);

/// A lazy source whose class targets are relabelled by `map` (no -1 in it), with `classes` classes.
std::shared_ptr<const Source> relabelled(std::shared_ptr<const Source> base, std::vector<std::int64_t> map, std::int64_t classes);

/// `origin` after taking the `count` samples from `offset` (its offset and limit composed); none
/// where a curriculum cannot say it (a range of a held-out part, an unknown origin).
DataOrigin sliced_origin(const DataOrigin& origin, std::int64_t offset, std::int64_t count);

/// `p` made absolute and normal: how a dataset's origin names its files, wherever it is read.
std::string absolute_path(const std::filesystem::path& p);

/// uint8 pixels as float32 in [0, 1], then `(x - mean) / std` when `normalize`: the one
/// definition of how images become inputs (the same operations in the same order, so the same
/// bits in training, `eval` and `Predictor::prepare`).
torch::Tensor scale_pixels(const torch::Tensor& pixels, bool normalize, double mean, double std);

/// The header row of a CSV file (the cells of its first line).
Expected<std::vector<std::string>> csv_header(const std::filesystem::path& path);

/// The columns `columns` (by header name, in that order; empty: every column) of a CSV file's
/// data rows as float32 [rows, columns]. Other columns are not read, so they may hold text.
/// Errors name the file, the line and the column.
Expected<torch::Tensor> csv_columns(const std::filesystem::path& path, const std::vector<std::string>& columns);

/// Why stb cannot read an image file whose header baton can read itself: a PNG whose IHDR gives
/// more pixels than stb decodes ("a 65535x65535 PNG image: more pixels than ..."); "" otherwise
/// (the caller says what it knows).
std::string image_too_large(const std::filesystem::path& file);

/// One image file decoded (stb_image, converted to `channels`) into `out`, height x width x
/// channels bytes; a file of another size is resized (stb_image_resize) when `resize`, else
/// refused. The one decoder of image folders and of `baton predict`, so that a model trained on
/// resized files predicts on the same files with the same pixels. Callers check sizes first
/// when they want their own words for a mismatch.
Expected<void> decode_image(const std::filesystem::path& file, int channels, int height, int width, bool resize,
                            unsigned char* out);

}  // namespace baton::detail
