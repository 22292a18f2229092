// The built-in names a curriculum file may use: models and dataset kinds (Registry::builtin).
// Each entry reads its TOML keys (as Params) and calls the library's C++ function.
#include <algorithm>
#include <cmath>
#include <string_view>

#include <fmt/format.h>

#include "baton/hparams.hpp"
#include "baton/images.hpp"
#include "params_reader.hpp"

namespace baton {
namespace {

std::vector<std::int64_t> int_list(const Params& params, const std::string& key) {
  std::vector<std::int64_t> out;
  if (auto it = params.find(key); it != params.end())
    if (const auto* v = std::get_if<std::vector<double>>(&it->second))
      for (double d : *v)  // a fraction or an out-of-range width reads as 0, which the caller rejects
        out.push_back(d == std::floor(d) && std::abs(d) <= 9.0e15 ? static_cast<std::int64_t>(d) : 0);
  return out;
}

/// Bounds on what a curriculum file may ask for, so that a typo fails at validate with a message
/// instead of crashing or exhausting memory after the run began: autograd frees a graph by
/// recursion, and a million-layer MLP overflows the stack doing so.
constexpr std::size_t kMaxLayers = 10000;
constexpr double kMaxParameters = 2147483648.0;  // 2^31 float32 weights: 8 GiB before optimizer moments

Expected<void> check_size(double parameters, std::string_view what) {
  if (parameters <= kMaxParameters) return {};
  return fail(ErrorCode::invalid_argument,
              fmt::format("model: {} would have {:.3g} parameters ({:.3g} GiB of float32 weights), more than the "
                          "limit of {:.3g}; check the sizes",
                          what, parameters, parameters * 4 / 1073741824.0, kMaxParameters));
}

Expected<ModelFactory> make_mlp(const Params& p) {
  const auto widths = int_list(p, "widths");
  if (widths.size() < 2 || std::any_of(widths.begin(), widths.end(), [](auto w) { return w < 1; }))
    return fail(ErrorCode::invalid_argument, "model.widths: needs at least two positive integers, e.g. [784, 256, 10]");
  if (widths.size() - 1 > kMaxLayers)
    return fail(ErrorCode::invalid_argument,
                fmt::format("model.widths: {} layers is more than {} (each Linear is one; autograd frees a graph "
                            "by recursion, and a deeper one overflows the stack)",
                            widths.size() - 1, kMaxLayers));
  double parameters = 0;
  for (std::size_t i = 0; i + 1 < widths.size(); ++i)
    parameters += static_cast<double>(widths[i]) * static_cast<double>(widths[i + 1]) + static_cast<double>(widths[i + 1]);
  if (auto ok = check_size(parameters, "this mlp"); !ok) return tl::unexpected(ok.error());
  return models::mlp(widths);
}

Expected<ModelFactory> make_small_cnn(const Params& p) {
  detail::ParamReader rd(p, "model");
  models::SmallCnnOptions o;
  constexpr std::int64_t big = std::int64_t{1} << 20;
  o.channels1 = rd.whole("channels1", 32, 1, big);
  o.channels2 = rd.whole("channels2", 64, 1, big);
  o.hidden = rd.whole("hidden", 128, 1, big);
  o.classes = rd.whole("classes", 10, 1, big);
  o.in_channels = rd.whole("in_channels", 1, 1, big);
  o.image_size = rd.whole("image_size", 28, 4, big);
  o.dropout = rd.number("dropout", 0.0);
  if (auto ok = rd.finish(); !ok) return tl::unexpected(ok.error());
  if (o.image_size % 4 != 0 || o.channels1 < 1 || o.channels2 < 1 || o.hidden < 1 || o.classes < 1)
    return fail(ErrorCode::invalid_argument, "model: small_cnn needs positive sizes and image_size divisible by 4");
  if (!(o.dropout >= 0 && o.dropout < 1))
    return fail(ErrorCode::invalid_argument, fmt::format("model.dropout: must be in [0, 1), got {}", o.dropout));
  const double c1 = o.channels1, c2 = o.channels2, side = o.image_size / 4;
  const double parameters = o.in_channels * c1 * 9 + 2 * c1 + c1 * c2 * 9 + 2 * c2 + c2 * side * side * o.hidden +
                            o.hidden + static_cast<double>(o.hidden) * o.classes + o.classes;
  if (auto ok = check_size(parameters, "this small_cnn"); !ok) return tl::unexpected(ok.error());
  return models::small_cnn(o);
}

Expected<Dataset> load_fashion_mnist(const Params& p) {
  detail::ParamReader rd(p, "dataset");
  const bool normalize = rd.flag("normalize", true);
  std::string split = "train", dir = data::fashion_mnist_dir.string();
  if (auto it = p.find("split"); it != p.end() && std::holds_alternative<std::string>(it->second)) split = std::get<std::string>(it->second);
  if (auto it = p.find("dir"); it != p.end() && std::holds_alternative<std::string>(it->second)) dir = std::get<std::string>(it->second);
  if (split != "train" && split != "test")
    return fail(ErrorCode::invalid_argument, fmt::format("dataset.split: \"{}\" is not one of train, test", split));
  return data::fashion_mnist(split == "train" ? Split::train : Split::test, dir, {.normalize = normalize});
}

Expected<Dataset> load_idx(const Params& p) {
  detail::ParamReader rd(p, "dataset");
  data::ImageOptions o;
  o.normalize = rd.flag("normalize", true), o.mean = rd.number("mean", o.mean), o.std = rd.number("std", o.std);
  auto images = p.find("images"), labels = p.find("labels");
  if (images == p.end() || labels == p.end() || !std::holds_alternative<std::string>(images->second) ||
      !std::holds_alternative<std::string>(labels->second))
    return fail(ErrorCode::invalid_argument, "dataset: idx needs images = \"path\" and labels = \"path\"");
  return data::idx_images(std::get<std::string>(images->second), std::get<std::string>(labels->second),
                          std::get<std::string>(images->second), o);
}

Expected<Dataset> load_csv(const Params& params) {
  detail::ParamReader r(params, "dataset");
  const auto path_it = params.find("path");
  if (path_it == params.end() || !std::holds_alternative<std::string>(path_it->second))
    return fail(ErrorCode::invalid_argument, "dataset.path: required (the CSV file)");
  data::CsvOptions o;
  o.path = std::get<std::string>(path_it->second);
  if (const auto it = params.find("target"); it != params.end() && std::holds_alternative<std::string>(it->second))
    o.target = std::get<std::string>(it->second);
  o.classification = r.flag("classification", true);
  r.flag("header", true);
  return data::csv(o);
}

Expected<Dataset> load_synthetic(const Params& params) {
  detail::ParamReader r(params, "dataset");
  data::SyntheticOptions o;
  // Sizes are capped so that samples x features stays a tensor that fits in memory (2^31 floats).
  o.samples = r.whole("samples", 1000, 1, std::int64_t{1} << 31);
  o.features = r.whole("features", 8, 1, std::int64_t{1} << 20);
  o.classes = r.whole("classes", 4, 2, std::int64_t{1} << 20);
  o.seed = static_cast<std::uint64_t>(r.whole("seed", 0, 0));
  o.sample_seed = static_cast<std::uint64_t>(r.whole("sample_seed", static_cast<std::int64_t>(o.seed) + 1, 0));
  if (o.samples * o.features > (std::int64_t{1} << 31) || o.classes * o.features > (std::int64_t{1} << 31))
    r.problem(fmt::format("dataset: synthetic data of {} samples x {} features ({} classes) is too large",
                          o.samples, o.features, o.classes));
  if (auto ok = r.finish(); !ok) return tl::unexpected(ok.error());
  return data::synthetic(o);
}

Expected<Dataset> load_image_folder(const Params& p) {
  detail::ParamReader rd(p, "dataset");
  data::ImageFolderOptions o;
  auto path = [&](const char* key) {
    const auto it = p.find(key);
    return it != p.end() && std::holds_alternative<std::string>(it->second) ? std::get<std::string>(it->second) : std::string();
  };
  o.root = path("root"), o.list = path("list");
  rd.seen("root"), rd.seen("list");
  o.height = rd.whole("height", 0, 0, 65536), o.width = rd.whole("width", 0, 0, 65536);
  o.channels = rd.whole("channels", 1, 1, 4);
  o.scale.normalize = rd.flag("normalize", o.scale.normalize), o.scale.mean = rd.number("mean", o.scale.mean), o.scale.std = rd.number("std", o.scale.std);
  o.skip_corrupt = rd.flag("skip_corrupt", false);
  if (auto ok = rd.finish(); !ok) return tl::unexpected(ok.error());
  auto folder = data::image_folder(o);
  if (!folder) return tl::unexpected(folder.error());
  if (!folder->skipped.empty())  // counted, and said: the user asked for it, but should know
    fmt::print(stderr, "baton: image folder {}: skipped {} file(s) that are not images stb can read (first: {})\n",
               (o.root.empty() ? o.list : o.root).string(), folder->skipped.size(), folder->skipped.front().string());
  return folder->dataset;
}

Expected<Dataset> load_shards(const Params& p) {
  detail::ParamReader rd(p, "dataset");
  data::ShardOptions o;
  o.verify = rd.flag("verify", true);
  const auto dir = p.find("dir");
  if (dir == p.end() || !std::holds_alternative<std::string>(dir->second))
    return fail(ErrorCode::invalid_argument, "dataset.dir: required (a directory written by `baton pack`)");
  return data::shards(std::get<std::string>(dir->second), o);
}
}  // namespace

Registry Registry::builtin() {
  Registry r;
  r.models["mlp"] = ModelEntry{{"widths"}, make_mlp, "mlp: widths = [in, hidden..., out]"};
  r.models["small_cnn"] = ModelEntry{{"channels1", "channels2", "hidden", "classes", "in_channels", "image_size", "dropout"},
                                     make_small_cnn,
                                     "small_cnn: channels1, channels2, hidden, classes, in_channels, image_size, dropout"};
  r.datasets["fashion-mnist"] = DatasetEntry{{"split", "dir", "normalize"}, load_fashion_mnist,
                                             "fashion-mnist: split = \"train\" | \"test\", dir"};
  r.datasets["idx"] = DatasetEntry{{"images", "labels", "normalize", "mean", "std"}, load_idx,
                                   "idx: images, labels (MNIST-format files, plain or .gz)"};
  r.datasets["csv"] = DatasetEntry{{"path", "target", "header", "classification"}, load_csv,
                                   "csv: path, target (column name; default: the last), classification"};
  r.datasets["image_folder"] = DatasetEntry{{"root", "list", "height", "width", "channels", "normalize", "mean", "std", "skip_corrupt"},
                                            load_image_folder,
                                            "image_folder: root (root/<class>/<image>) or list (path,label lines), height, width, "
                                            "channels, normalize, mean, std, skip_corrupt"};
  r.datasets["shards"] = DatasetEntry{{"dir", "verify"}, load_shards,
                                      "shards: dir (packed shards written by `baton pack`), verify (checksums on opening)"};
  r.datasets["synthetic"] = DatasetEntry{{"samples", "features", "classes", "seed", "sample_seed"}, load_synthetic,
                                         "synthetic: samples, features, classes, seed (the task), sample_seed (Gaussian blobs)"};
  return r;
}

}  // namespace baton
