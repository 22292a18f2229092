// read_inputs: what `baton predict` and load_for_inference's users feed a model, read from IDX
// files, image files (stb_image: PNG, JPEG, BMP, GIF, PGM/PPM), directories of images and CSV.
#include <algorithm>
#include <array>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <stb/stb_image.h>
#include <torch/torch.h>

#include "baton/data.hpp"
#include "baton/inference.hpp"
#include "data_internal.hpp"
#include "detail.hpp"
#include "inference/internal.hpp"
#include "io.hpp"

namespace baton {
namespace {
namespace fs = std::filesystem;

enum class Format { idx, image, csv };

/// The image format a file's first bytes announce, or "" for none.
std::string image_signature(const std::array<unsigned char, 4>& b, std::streamsize got) {
  if (got == 4 && b == std::array<unsigned char, 4>{0x89, 'P', 'N', 'G'}) return "PNG";
  if (got >= 2 && b[0] == 0xff && b[1] == 0xd8) return "JPEG";
  if (got >= 2 && b[0] == 'B' && b[1] == 'M') return "BMP";
  if (got >= 3 && b[0] == 'G' && b[1] == 'I' && b[2] == 'F') return "GIF";
  if (got >= 2 && b[0] == 'P' && b[1] >= '1' && b[1] <= '6') return "PGM/PPM";
  return "";
}

std::string image_signature(const fs::path& path) {
  std::array<unsigned char, 4> b{};
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(b.data()), b.size());
  return image_signature(b, in.gcount());
}

bool image_extension(const fs::path& path) {
  auto ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".bmp" || ext == ".gif" || ext == ".pgm" || ext == ".ppm";
}

Format sniff(const fs::path& path) {
  std::array<unsigned char, 4> b{};
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(b.data()), b.size());
  const auto got = in.gcount();
  if (got >= 2 && b[0] == 0x1f && b[1] == 0x8b) return Format::idx;                     // gzip: Fashion-MNIST's .gz
  if (got == 4 && b[0] == 0 && b[1] == 0 && b[2] >= 0x08 && b[2] <= 0x0e) return Format::idx;  // IDX magic
  if (!image_signature(b, got).empty()) return Format::image;
  return Format::csv;
}

std::string size_text(const std::vector<std::int64_t>& chw) {
  return fmt::format("{}x{} with {} channel{}", chw[2], chw[1], chw[0], chw[0] == 1 ? "" : "s");
}

/// One image file as uint8 [C, H, W] with the card's channels (stb converts grey and colour).
Expected<torch::Tensor> read_image(const fs::path& path, const ModelCard& card) {
  const int channels = static_cast<int>(card.input_shape[0]);
  if (channels < 1 || channels > 4)
    return fail(ErrorCode::invalid_argument, fmt::format("{}: the model takes {} channels; image files have 1 to 4", path.string(), channels));
  // The header first: a size the model cannot take is said without decoding (a 20000x20000
  // image would take gigabytes), and stb's reason when it fails is for whichever decoder it
  // tried last ("no SOI" of a damaged PNG), so the message names the format the file announces.
  const auto format = image_signature(path);
  int w = 0, h = 0, n = 0;
  if (!stbi_info(path.c_str(), &w, &h, &n)) {
    if (auto big = detail::image_too_large(path); !big.empty())
      return fail(ErrorCode::shape_mismatch, fmt::format("{}: {}; the model takes {}", path.string(), big, size_text(card.input_shape)));
    return fail(ErrorCode::data, fmt::format("{}: the header of this {} file cannot be read (damaged, cut, or beyond what "
                                             "stb reads)", path.string(), format.empty() ? "image" : format));
  }
  const int H = static_cast<int>(card.input_shape[1]), W = static_cast<int>(card.input_shape[2]);
  if ((h != H || w != W) && !card.resize)
    return fail(ErrorCode::shape_mismatch, fmt::format("{}: a {}x{} image; the model takes {} and was not trained on "
                                                       "resized images (resize it first)", path.string(), w, h,
                                                       size_text(card.input_shape)));
  // The image folder's decoder: resized as training resized (card.resize), the same pixels.
  auto hwc = torch::empty({H, W, channels}, torch::kUInt8);
  if (!detail::decode_image(path, channels, H, W, card.resize, hwc.data_ptr<unsigned char>()))
    return fail(ErrorCode::data, fmt::format("{}: a {}x{} {} image whose pixels cannot be decoded (the file is damaged or cut)",
                                             path.string(), w, h, format.empty() ? "" : format));
  return hwc.permute({2, 0, 1}).clone(at::MemoryFormat::Contiguous);
}

Expected<InputBatch> images(const std::vector<fs::path>& files, const ModelCard& card) {
  InputBatch out;
  std::vector<torch::Tensor> all;
  for (const auto& f : files) {
    auto t = read_image(f, card);
    if (!t) return tl::unexpected(t.error());
    all.push_back(*t);
    out.ids.push_back(f.filename().string());
  }
  out.inputs = torch::stack(all);
  return out;
}

Expected<InputBatch> idx(const fs::path& path, const ModelCard& card) {
  auto t = data::read_idx(path);
  if (!t) return tl::unexpected(t.error());
  torch::Tensor x = *t;
  const auto& shape = card.input_shape;
  if (card.input == InputKind::image) {
    if (x.scalar_type() != torch::kUInt8)
      return fail(ErrorCode::data, fmt::format("{}: {} values; images are uint8 pixels", path.string(), c10::toString(x.scalar_type())));
    if (x.dim() == 3 && shape[0] == 1) x = x.unsqueeze(1);
    if (x.dim() != 4 || x.sizes().slice(1).vec() != shape)
      return fail(ErrorCode::shape_mismatch, fmt::format("{}: images {}; the model takes [N, {}] ({})", path.string(),
                                                         detail::shape_string(*t), fmt::join(shape, ", "), size_text(shape)));
  } else {
    x = x.to(torch::kFloat32);
    if (x.dim() != static_cast<std::int64_t>(shape.size()) + 1 || x.sizes().slice(1).vec() != shape)
      return fail(ErrorCode::shape_mismatch, fmt::format("{}: values {}; the model takes [N, {}]", path.string(),
                                                         detail::shape_string(*t), fmt::join(shape, ", ")));
  }
  InputBatch out;
  for (std::int64_t i = 0; i < x.size(0); ++i) out.ids.push_back(std::to_string(i));
  out.inputs = x;
  return out;
}

Expected<InputBatch> csv(const fs::path& path, const ModelCard& card) {
  if (card.input == InputKind::image)
    return fail(ErrorCode::invalid_argument, fmt::format("{}: a CSV table, but the model takes images (IDX or image files)", path.string()));
  auto x = detail::csv_columns(path, card.columns);
  if (!x) return tl::unexpected(x.error());
  if (card.input_shape.size() != 1 || x->size(1) != card.input_shape[0])
    return fail(ErrorCode::shape_mismatch, fmt::format("{}: {} columns; the model takes [N, {}]", path.string(), x->size(1),
                                                       fmt::join(card.input_shape, ", ")));
  InputBatch out;
  for (std::int64_t i = 0; i < x->size(0); ++i) out.ids.push_back(std::to_string(i));
  out.inputs = *x;
  return out;
}
}  // namespace

Expected<InputBatch> read_inputs(const std::filesystem::path& path, const ModelCard& card) {
  return detail::guard([&]() -> Expected<InputBatch> {
    std::error_code ec;
    if (card.input == InputKind::tokens && !fs::is_directory(path, ec)) {
      if (auto ok = detail::check_regular_file(path, "input file"); !ok) return tl::unexpected(ok.error());
      return detail::text_inputs(path, card);
    }
    if (fs::is_directory(path, ec)) {
      // The images of the directory, or of its sub-directories: the layout an image folder is
      // trained from (root/<class>/<image>), read in sorted order.
      std::vector<fs::path> files;
      auto add_files = [&](const fs::path& dir) {
        for (const auto& e : fs::directory_iterator(dir))
          if (e.is_regular_file() && e.path().filename().string().front() != '.') files.push_back(e.path());
      };
      add_files(path);
      if (files.empty())
        for (const auto& e : fs::directory_iterator(path))
          if (e.is_directory() && e.path().filename().string().front() != '.') add_files(e.path());
      std::sort(files.begin(), files.end());
      if (files.empty()) return fail(ErrorCode::data, fmt::format("{}: no image files in the directory", path.string()));
      if (card.input != InputKind::image)
        return fail(ErrorCode::invalid_argument, fmt::format("{}: a directory of images, but the model takes feature columns (CSV)", path.string()));
      for (const auto& f : files)
        if (sniff(f) != Format::image)
          return fail(ErrorCode::data, fmt::format("{}: not an image file (PNG, JPEG, BMP, GIF, PGM/PPM)", f.string()));
      auto out = images(files, card);
      if (out)  // ids relative to the directory: "coat/0001.png" where classes have folders
        for (std::size_t i = 0; i < files.size() && i < out->ids.size(); ++i)
          out->ids[i] = files[i].lexically_relative(path).string();
      return out;
    }
    if (auto ok = detail::check_regular_file(path, "input file"); !ok) return tl::unexpected(ok.error());
    switch (sniff(path)) {
      case Format::idx: return idx(path, card);
      case Format::image:
        if (card.input != InputKind::image)
          return fail(ErrorCode::invalid_argument, fmt::format("{}: an image, but the model takes feature columns (CSV)", path.string()));
        return images({path}, card);
      case Format::csv: break;
    }
    if (image_extension(path))  // named as an image, but no image format's signature (text, empty, ...)
      return fail(ErrorCode::data, fmt::format("{}: not an image: its first bytes are no PNG, JPEG, BMP, GIF or PGM/PPM "
                                               "signature ({} bytes long)", path.string(), fs::file_size(path, ec)));
    return csv(path, card);
  });
}

}  // namespace baton
