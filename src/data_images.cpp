// Image folders (images.hpp): the files are listed and their headers checked when opening;
// batches decode them (stb_image), resize (stb_image_resize) and scale them.
#include <algorithm>
#include <array>
#include <cstring>
#include <cctype>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>
#include <torch/torch.h>

#include "baton/images.hpp"
#include "data_internal.hpp"
#include "detail.hpp"
#include "io.hpp"

namespace baton::detail {
Expected<void> decode_image(const std::filesystem::path& file, int channels, int height, int width, bool resize,
                            unsigned char* out) {
  int w = 0, h = 0, n = 0;
  unsigned char* px = stbi_load(file.c_str(), &w, &h, &n, channels);
  if (!px) return fail(ErrorCode::data, fmt::format("{}: cannot decode the image: {}", file.string(), stbi_failure_reason()));
  bool ok = true;
  if (w == width && h == height) std::memcpy(out, px, static_cast<std::size_t>(w) * h * channels);
  else if (resize) ok = stbir_resize_uint8(px, w, h, 0, out, width, height, 0, channels) == 1;
  else ok = false;
  stbi_image_free(px);
  if (!ok)
    return fail(ErrorCode::data, fmt::format("{}: a {}x{} image, not {}x{}{}", file.string(), w, h, width, height,
                                             resize ? " (resizing failed)" : ""));
  return {};
}

std::string image_too_large(const std::filesystem::path& file) {
  // PNG: the 8-byte signature, then the IHDR chunk (length, "IHDR", width and height big-endian).
  std::array<unsigned char, 26> b{};
  std::ifstream in(file, std::ios::binary);
  in.read(reinterpret_cast<char*>(b.data()), b.size());
  if (in.gcount() != 26 || b[0] != 0x89 || b[1] != 'P' || b[2] != 'N' || b[3] != 'G' || b[12] != 'I' || b[13] != 'H' ||
      b[14] != 'D' || b[15] != 'R')
    return "";
  auto be32 = [&](int at) {
    return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) | (std::uint32_t{b[at + 2]} << 8) | b[at + 3];
  };
  const std::uint64_t w = be32(16), h = be32(20);
  // stb decodes at most 2^30 bytes of pixels (and 2^24 pixels a side); bytes per pixel by colour
  // type: grey 1, RGB 3, palette 4 (expanded), grey + alpha 2, RGBA 4.
  const std::uint64_t n = b[25] == 0 ? 1 : b[25] == 2 ? 3 : b[25] == 4 ? 2 : 4;
  if (w == 0 || h == 0 || (w * h * n <= (std::uint64_t{1} << 30) && w <= (1u << 24) && h <= (1u << 24))) return "";
  return fmt::format("a {}x{} PNG image: more pixels than stb, baton's image reader, decodes (2^30 bytes); make it "
                     "smaller first",
                     w, h);
}
}  // namespace baton::detail

namespace baton::data {
namespace {
namespace fs = std::filesystem;

struct Item {
  fs::path file;
  std::int64_t label;
};

bool image_name(const fs::path& p) {
  auto ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::set<std::string> known = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".pgm", ".ppm", ".pnm"};
  return known.count(ext) > 0;
}

/// `e`, a directory entry in the folder, as the folder's layout reads it: a directory (`dir`
/// true) or a regular file; anything else (a FIFO, a device, a link that cannot be followed)
/// is an error naming it, never skipped without a word.
Expected<bool> entry_kind(const fs::directory_entry& e, bool class_level) {
  std::error_code ec;
  const auto st = e.status(ec);
  if (ec)
    return fail(ErrorCode::io, fmt::format("{}: cannot be followed ({}: a symbolic link loop, or a link whose target "
                                           "is gone); remove it or point it at a {}",
                                           e.path().string(), ec.message(), class_level ? "class directory" : "file"));
  if (fs::is_directory(st)) return true;
  if (fs::is_regular_file(st)) return false;
  return fail(ErrorCode::io, fmt::format("{}: is {}, not {} of an image folder (root/<class>/<image>); move it away",
                                         e.path().string(),
                                         fs::is_fifo(st) ? "a FIFO" : fs::is_socket(st) ? "a socket" : "a device",
                                         class_level ? "a class directory" : "an image file"));
}

Expected<std::vector<Item>> from_root(const fs::path& root, std::vector<std::string>& classes) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return fail(ErrorCode::io, fmt::format("{}: not a directory (the image folder's root)", root.string()));
  for (const auto& e : fs::directory_iterator(root, ec)) {
    auto dir = entry_kind(e, true);
    if (!dir) return tl::unexpected(dir.error());
    if (*dir) classes.push_back(e.path().filename().string());
  }
  std::sort(classes.begin(), classes.end());
  std::vector<Item> items;
  for (std::size_t c = 0; c < classes.size() && !ec; ++c) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(root / classes[c], ec)) {
      auto dir = entry_kind(e, false);
      if (!dir) return tl::unexpected(dir.error());
      if (*dir)
        return fail(ErrorCode::data, fmt::format("{}: a directory inside the class directory \"{}\"; an image folder is "
                                                 "root/<class>/<image>, one level: move it out, or use a list file",
                                                 e.path().string(), classes[c]));
      if (image_name(e.path())) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (auto& f : files) items.push_back({std::move(f), static_cast<std::int64_t>(c)});
  }
  if (ec) return fail(ErrorCode::io, fmt::format("{}: cannot list: {}", root.string(), ec.message()));
  return items;
}

Expected<std::vector<Item>> from_list(const fs::path& list, std::vector<std::string>& classes) {
  if (auto ok = detail::check_regular_file(list, "image list"); !ok) return tl::unexpected(ok.error());
  std::ifstream in(list);
  std::vector<std::pair<fs::path, std::string>> rows;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const auto cut = line.find_last_of(",\t");
    if (cut == std::string::npos || cut == 0 || cut + 1 == line.size())
      return fail(ErrorCode::data, fmt::format("{}:{}: expected path,label, got \"{}\"", list.string(), n, line));
    const auto path = line.substr(0, cut), label = line.substr(cut + 1);
    if (n == 1 && label == "label") continue;  // the header
    rows.emplace_back(list.parent_path() / path, label);
  }
  if (rows.empty()) return fail(ErrorCode::data, fmt::format("{}: no images listed", list.string()));
  // A label that reads as a negative number is a mistake, not a class name.
  for (const auto& [path, label] : rows)
    if (label.size() > 1 && label[0] == '-' && std::all_of(label.begin() + 1, label.end(), [](unsigned char c) { return std::isdigit(c); }))
      return fail(ErrorCode::data, fmt::format("{}: {}: label {} is negative; labels are class indices 0, 1, ... or "
                                               "class names", list.string(), path.filename().string(), label));
  const bool numeric = std::all_of(rows.begin(), rows.end(), [](const auto& r) {
    return r.second.size() < 10 && std::all_of(r.second.begin(), r.second.end(), [](unsigned char c) { return std::isdigit(c); });
  });
  std::map<std::string, std::int64_t> index;
  if (numeric) {
    std::int64_t top = 0;
    for (const auto& r : rows) top = std::max<std::int64_t>(top, std::stoll(r.second));
    for (std::int64_t k = 0; k <= top; ++k) classes.push_back(std::to_string(k));
  } else {
    for (const auto& r : rows) index[r.second] = 0;
    for (auto& [name, k] : index) k = static_cast<std::int64_t>(classes.size()), classes.push_back(name);
  }
  std::vector<Item> items;
  for (auto& [path, label] : rows) items.push_back({std::move(path), numeric ? std::stoll(label) : index[label]});
  return items;
}

class ImageSource final : public Source, public detail::ClassNames {
 public:
  ImageSource(std::vector<Item> items, std::vector<std::string> names, const ImageFolderOptions& o, int h, int w)
      : items_(std::move(items)), classes_(static_cast<std::int64_t>(names.size())), names_(std::move(names)), o_(o), h_(h), w_(w) {}
  std::vector<std::string> class_names() const override { return names_; }
  std::int64_t size() const override { return static_cast<std::int64_t>(items_.size()); }
  std::vector<std::int64_t> input_shape() const override { return {o_.channels, h_, w_}; }
  std::int64_t classes() const override { return classes_; }
  /// The files (path, size, modification time) with their labels, and how they become inputs.
  std::string identity() const override {
    detail::Sha256 sha;
    for (const auto& it : items_) {
      std::error_code ec;
      const auto size = fs::file_size(it.file, ec);
      const auto time = fs::last_write_time(it.file, ec).time_since_epoch().count();
      sha.update(fmt::format("{}\t{}\t{}\t{}\n", it.file.string(), it.label, ec ? 0 : size, ec ? 0 : time));
    }
    return fmt::format("image files sha256 {}, {}x{}x{}, normalize={} mean={} std={}", detail::hex(sha.finish()).substr(0, 16),
                       o_.channels, h_, w_, o_.scale.normalize, o_.scale.mean, o_.scale.std);
  }

  Expected<Batch> batch(const torch::Tensor& indices, const SampleContext&) const override {
    const auto idx = indices.to(torch::kLong).contiguous();
    const std::int64_t n = idx.size(0);
    const int c = static_cast<int>(o_.channels);
    auto hwc = torch::empty({n, h_, w_, c}, torch::kUInt8);
    auto y = torch::empty({n}, torch::kLong);
    const auto* ip = idx.data_ptr<std::int64_t>();
    auto* yp = y.data_ptr<std::int64_t>();
    auto* xp = hwc.data_ptr<unsigned char>();
    const std::size_t bytes = static_cast<std::size_t>(h_) * w_ * c;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = ip[i];
      if (k < 0 || k >= size()) return fail(ErrorCode::data, fmt::format("sample {} is out of range (0 to {})", k, size() - 1));
      const Item& it = items_[static_cast<std::size_t>(k)];
      if (auto ok = decode(it.file, xp + static_cast<std::size_t>(i) * bytes); !ok)
        return tl::unexpected(ok.error().with_context(fmt::format("sample {}", k)));
      yp[i] = it.label;
    }
    // clone: with one channel the permuted view counts as contiguous but keeps NHWC strides, which
    // LibTorch's convolutions then take for channels_last (other kernels, other bits).
    auto chw = hwc.permute({0, 3, 1, 2}).clone(at::MemoryFormat::Contiguous);
    return Batch{detail::scale_pixels(chw, o_.scale.normalize, o_.scale.mean, o_.scale.std), std::move(y)};
  }

 private:
  /// One file into `out` (h x w x channels bytes).
  Expected<void> decode(const fs::path& file, unsigned char* out) const {
    auto ok = detail::decode_image(file, static_cast<int>(o_.channels), h_, w_, o_.height > 0, out);
    if (!ok && o_.height == 0)  // the folder's images had one size when it was opened; this one changed since
      return fail(ErrorCode::data, ok.error().message + " (the folder's size); set height and width to resize");
    return ok;
  }

  std::vector<Item> items_;
  std::int64_t classes_;
  std::vector<std::string> names_;
  ImageFolderOptions o_;
  int h_, w_;
};
}  // namespace

Expected<ImageFolder> image_folder(const ImageFolderOptions& o) {
  if (o.root.empty() == o.list.empty())
    return fail(ErrorCode::invalid_argument, "image_folder: give either root (root/<class>/<image>) or list (path,label lines)");
  if (o.channels != 1 && o.channels != 3 && o.channels != 4)
    return fail(ErrorCode::invalid_argument, fmt::format("image_folder: channels must be 1, 3 or 4, got {}", o.channels));
  if ((o.height > 0) != (o.width > 0) || o.height < 0 || o.width < 0 || o.height > 65536 || o.width > 65536)
    return fail(ErrorCode::invalid_argument, fmt::format("image_folder: height and width ({} x {}) must both be in [1, 65536], or both 0",
                                                         o.height, o.width));
  if (o.scale.normalize && !(o.scale.std > 0))
    return fail(ErrorCode::invalid_argument, fmt::format("image_folder: std must be > 0, got {}", o.scale.std));
  ImageFolder out;
  auto items = o.root.empty() ? from_list(o.list, out.classes) : from_root(o.root, out.classes);
  if (!items) return tl::unexpected(items.error());
  const auto where = o.root.empty() ? o.list : o.root;
  std::vector<Item> kept;
  int h = static_cast<int>(o.height), w = static_cast<int>(o.width);
  for (auto& it : *items) {
    int iw = 0, ih = 0, n = 0;
    if (!stbi_info(it.file.c_str(), &iw, &ih, &n)) {
      if (o.skip_corrupt) {
        out.skipped.push_back(it.file);
        continue;
      }
      if (auto big = detail::image_too_large(it.file); !big.empty())
        return fail(ErrorCode::data, fmt::format("{}: {}, or remove it (or set skip_corrupt)", it.file.string(), big));
      return fail(ErrorCode::data, fmt::format("{}: not an image stb can read ({}); fix or remove it, or set skip_corrupt",
                                               it.file.string(), stbi_failure_reason()));
    }
    if (h == 0) h = ih, w = iw;
    else if (o.height == 0 && (ih != h || iw != w))
      return fail(ErrorCode::data, fmt::format("{}: a {}x{} image where the first is {}x{}; set height and width to resize",
                                               it.file.string(), iw, ih, w, h));
    kept.push_back(std::move(it));
  }
  if (kept.empty()) return fail(ErrorCode::data, fmt::format("{}: no images{}", where.string(), out.skipped.empty() ? "" : " that stb can read"));
  out.dataset = make_dataset(std::make_shared<ImageSource>(std::move(kept), out.classes, o, h, w), where.filename().string());
  Params keys = {{"height", static_cast<double>(o.height)}, {"width", static_cast<double>(o.width)},
                 {"channels", static_cast<double>(o.channels)}, {"normalize", o.scale.normalize},
                 {"mean", o.scale.mean}, {"std", o.scale.std}, {"skip_corrupt", o.skip_corrupt}};
  keys[o.root.empty() ? "list" : "root"] = detail::absolute_path(where);
  out.dataset.origin = {"image_folder", std::move(keys)};
  return out;
}

}  // namespace baton::data
