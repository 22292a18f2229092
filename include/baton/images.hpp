#pragma once
/// \file images.hpp
/// Image folders as lazy datasets: `root/<class>/<image>` or a list of (path, label), decoded
/// (PNG, JPEG, BMP, GIF, PGM/PPM through stb_image) and resized when batches are made, in the
/// loop's workers. docs/data.md.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "baton/data.hpp"
#include "baton/error.hpp"

namespace baton::data {

/// Options of `image_folder`.
struct ImageFolderOptions {
  /// `root/<class>/<image>`: one sub-directory per class; classes are the directory names in
  /// sorted order (label = position), images sorted by name within a class.
  std::filesystem::path root{};
  /// Or a CSV/TSV file of `path,label` lines (an optional header `path,label`): paths relative to
  /// the file's directory, labels class indices (0, 1, ...) or names (then sorted: label = position).
  std::filesystem::path list{};
  /// Every image resized (stb_image_resize) to height x width; 0 and 0: no resizing, and every
  /// image must have the first one's size (checked when opening, from the files' headers).
  std::int64_t height = 0, width = 0;
  std::int64_t channels = 1;  ///< 1 (grey), 3 (RGB) or 4; stb converts files with other channels
  /// Pixels / 255 (inputs in [0, 1]), then (x - mean) / std when `normalize` (data::ImageOptions).
  /// Off by default, in C++ as in TOML: ImageOptions' mean and std are Fashion-MNIST's, not yours.
  ImageOptions scale{.normalize = false};
  /// A file whose header stb cannot read is skipped (and counted) instead of failing the open. A
  /// file that fails later, when decoded, fails its batch with an error naming it.
  bool skip_corrupt = false;
};

/// An image folder: the lazy dataset, its class names, and the files skipped.
struct ImageFolder {
  Dataset dataset{};
  std::vector<std::string> classes{};
  std::vector<std::filesystem::path> skipped{};
};

/// Lists and checks the images (headers only; nothing is decoded until a batch needs it).
/// Errors: no such directory or list, no images, an unreadable header (without skip_corrupt), an
/// image of another size without resizing, a bad list line (naming the file and the line).
Expected<ImageFolder> image_folder(const ImageFolderOptions& options);

}  // namespace baton::data
