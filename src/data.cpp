// Datasets, the IDX reader and the data order.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <torch/torch.h>
#include <zlib.h>

#include "baton/data.hpp"
#include "data_internal.hpp"
#include "detail.hpp"
#include "io.hpp"

namespace baton {

Expected<void> Dataset::validate() const {
  if (source) {
    if (source->size() <= 0) return fail(ErrorCode::data, fmt::format("dataset \"{}\" is empty", name));
    return {};
  }
  if (!inputs.defined() || !targets.defined())
    return fail(ErrorCode::data, fmt::format("dataset \"{}\" has no {} tensor", name,
                                             inputs.defined() ? "targets" : "inputs"));
  if (inputs.dim() == 0 || targets.dim() == 0)
    return fail(ErrorCode::data, fmt::format("dataset \"{}\": inputs and targets need a sample "
                                             "dimension first; got inputs {} and targets {}",
                                             name, detail::shape_string(inputs),
                                             detail::shape_string(targets)));
  if (inputs.size(0) != targets.size(0))
    return fail(ErrorCode::data,
                fmt::format("dataset \"{}\": {} inputs but {} targets (shapes {} and {})", name,
                            inputs.size(0), targets.size(0), detail::shape_string(inputs),
                            detail::shape_string(targets)));
  if (inputs.size(0) == 0) return fail(ErrorCode::data, fmt::format("dataset \"{}\" is empty", name));
  return {};
}

Dataset Dataset::head(std::int64_t n) const {
  if (n >= size()) return *this;
  const auto part = fmt::format("{}[:{}]", name, n);
  auto out = source ? make_dataset(detail::subset(source, torch::arange(n, torch::kLong)), part)
                    : Dataset{inputs.narrow(0, 0, n), targets.narrow(0, 0, n), part};
  out.origin = detail::sliced_origin(origin, 0, n);
  return out;
}

namespace {
/// `t` with row-major strides. is_contiguous() ignores the strides of size-1 dimensions, LibTorch's
/// kernels do not: a [N, 1, H, W] view of NHWC pixels is "contiguous" yet read as channels_last,
/// which trains other bits than the same values laid out as an in-memory dataset's.
torch::Tensor row_major(torch::Tensor t) {
  if (!t.defined()) return t;
  std::int64_t stride = 1;
  for (std::int64_t d = t.dim() - 1; d >= 0; --d) {
    if (t.stride(d) != stride) return t.clone(at::MemoryFormat::Contiguous);
    stride *= t.size(d);
  }
  return t;
}
}  // namespace

Expected<Batch> Dataset::gather(const torch::Tensor& indices, const SampleContext& context) const {
  if (!source) return Batch{inputs.index_select(0, indices), targets.index_select(0, indices)};
  try {
    auto b = source->batch(indices, context);
    if (!b) return tl::unexpected(b.error().with_context(fmt::format("dataset \"{}\"", name)));
    b->inputs = row_major(std::move(b->inputs)), b->targets = row_major(std::move(b->targets));
    return b;
  } catch (const c10::Error& e) {
    return fail(ErrorCode::data, fmt::format("dataset \"{}\": {}", name, detail::torch_message(e)));
  } catch (const std::exception& e) {
    return fail(ErrorCode::data, fmt::format("dataset \"{}\": {}", name, e.what()));
  }
}

Expected<Batch> Dataset::range(std::int64_t start, std::int64_t count, const SampleContext& context) const {
  if (!source) return Batch{inputs.narrow(0, start, count), targets.narrow(0, start, count)};
  return gather(torch::arange(start, start + count, torch::kLong), context);
}

std::vector<std::int64_t> Dataset::input_shape() const {
  if (source) return source->input_shape();
  if (!inputs.defined() || inputs.dim() < 1) return {};
  return {inputs.sizes().begin() + 1, inputs.sizes().end()};
}

bool Dataset::class_targets() const {
  if (source) return source->classes() > 0;
  return targets.defined() && targets.scalar_type() == torch::kLong && targets.dim() == 1;
}

std::string detail::tensor_digest(const torch::Tensor& tensor) {
  if (!tensor.defined()) return "undefined";
  const auto t = tensor.to(torch::kCPU).contiguous();
  detail::Sha256 sha;
  sha.update(fmt::format("{} {}\n", c10::toString(t.scalar_type()), fmt::join(t.sizes(), "x")));
  sha.update(t.data_ptr(), static_cast<std::size_t>(t.numel()) * t.element_size());
  return detail::hex(sha.finish());
}

std::string Dataset::identity() const {
  if (source) {
    auto id = source->identity();
    return id.empty() ? id : fmt::format("{}: {} samples, {}", name, size(), id);
  }
  return fmt::format("{}: {} samples, sha256 {} {}", name, size(), detail::tensor_digest(inputs).substr(0, 16),
                     detail::tensor_digest(targets).substr(0, 16));
}

std::int64_t Dataset::classes() const {
  if (source) return source->classes();
  if (!class_targets() || targets.numel() == 0) return 0;
  return targets.max().item<std::int64_t>() + 1;
}

Expected<Dataset> make_dataset(torch::Tensor inputs, torch::Tensor targets, std::string name) {
  Dataset d{std::move(inputs), std::move(targets), std::move(name)};
  if (auto ok = d.validate(); !ok) return tl::unexpected(ok.error());
  return d;
}

Dataset make_dataset(std::shared_ptr<const Source> source, std::string name) {
  return Dataset{{}, {}, std::move(name), std::move(source)};
}

namespace data {
namespace {

/// Reads a whole file, gunzipping it if it is gzip (zlib reads plain files unchanged).
Expected<std::vector<unsigned char>> read_all(const std::filesystem::path& path) {
  if (auto ok = detail::check_regular_file(path, "data file"); !ok) return tl::unexpected(ok.error());
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return fail(ErrorCode::io, fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
  std::vector<unsigned char> out;
  std::array<unsigned char, 1 << 16> buf{};
  for (;;) {
    const int n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) {
      int errnum = 0;
      std::string msg = gzerror(f, &errnum);
      gzclose(f);
      return fail(ErrorCode::data, fmt::format("{}: corrupt compressed data: {}", path.string(), msg));
    }
    if (n == 0) break;
    out.insert(out.end(), buf.begin(), buf.begin() + n);
  }
  int errnum = 0;
  const char* msg = gzerror(f, &errnum);
  if (errnum != Z_OK && errnum != Z_BUF_ERROR) {
    std::string m = msg;
    gzclose(f);
    return fail(ErrorCode::data, fmt::format("{}: corrupt compressed data: {}", path.string(), m));
  }
  // A gzip stream cut short reads as EOF with Z_BUF_ERROR; gzclose_r reports it.
  const int rc = gzclose(f);
  if (rc == Z_BUF_ERROR || errnum == Z_BUF_ERROR)
    return fail(ErrorCode::data, fmt::format("{}: truncated gzip stream (the file is cut short)", path.string()));
  if (rc != Z_OK) return fail(ErrorCode::io, fmt::format("{}: read error", path.string()));
  return out;
}

std::uint32_t be32(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

Expected<torch::Tensor> read_idx(const std::filesystem::path& path) {
  auto bytes = read_all(path);
  if (!bytes) return tl::unexpected(bytes.error());
  const auto& b = *bytes;
  const std::string where = path.string();
  if (b.size() < 4)
    return fail(ErrorCode::data, fmt::format("{}: {} bytes is too short for an IDX header (4-byte magic number)", where, b.size()));
  if (b[0] != 0 || b[1] != 0)
    return fail(ErrorCode::data, fmt::format("{}: wrong magic number 0x{:02x}{:02x}{:02x}{:02x}: not an IDX "
                                             "file (expected 0x0000 then type and rank bytes)",
                                             where, b[0], b[1], b[2], b[3]));
  torch::ScalarType type{};
  std::size_t elem = 1;
  switch (b[2]) {
    case 0x08: type = torch::kUInt8; elem = 1; break;
    case 0x09: type = torch::kInt8; elem = 1; break;
    case 0x0B: type = torch::kInt16; elem = 2; break;
    case 0x0C: type = torch::kInt32; elem = 4; break;
    case 0x0D: type = torch::kFloat32; elem = 4; break;
    case 0x0E: type = torch::kFloat64; elem = 8; break;
    default:
      return fail(ErrorCode::data, fmt::format("{}: unknown IDX element type 0x{:02x} (valid: 0x08 "
                                               "uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64)",
                                               where, b[2]));
  }
  const std::size_t rank = b[3];
  if (rank == 0) return fail(ErrorCode::data, fmt::format("{}: IDX rank 0 (no dimensions)", where));
  if (b.size() < 4 + 4 * rank)
    return fail(ErrorCode::data, fmt::format("{}: truncated header: {} dimensions need {} bytes, the file has {}",
                                             where, rank, 4 + 4 * rank, b.size()));
  std::vector<std::int64_t> dims;
  std::uint64_t count = 1;
  for (std::size_t i = 0; i < rank; ++i) {
    const std::uint32_t d = be32(&b[4 + 4 * i]);
    dims.push_back(d);
    // Checked before multiplying: count * d could wrap around 2^64 and pass the size checks below.
    if (d != 0 && count > (std::uint64_t{1} << 40) / d)
      return fail(ErrorCode::data, fmt::format("{}: header claims more than 2^40 elements", where));
    count *= d;
  }
  const std::size_t header = 4 + 4 * rank;
  const std::uint64_t need = count * elem;
  const std::uint64_t have = b.size() - header;
  if (have < need)
    return fail(ErrorCode::data, fmt::format("{}: truncated: dims {} need {} payload bytes, the file has {}",
                                             where, fmt::join(dims, "x"), need, have));
  if (have > need)
    return fail(ErrorCode::data, fmt::format("{}: {} unexpected bytes after the payload of dims {}",
                                             where, have - need, fmt::join(dims, "x")));
  auto t = torch::empty(dims, torch::TensorOptions().dtype(type));
  auto* dst = static_cast<unsigned char*>(t.data_ptr());
  const unsigned char* src = b.data() + header;
  if (need == 0) {
    // an empty tensor may have no storage at all: memcpy to its null pointer is undefined
  } else if (elem == 1) {
    std::memcpy(dst, src, need);
  } else {  // IDX is big-endian
    for (std::uint64_t i = 0; i < count; ++i)
      for (std::size_t k = 0; k < elem; ++k) dst[i * elem + k] = src[i * elem + (elem - 1 - k)];
  }
  return t;
}

Expected<Dataset> idx_images(const std::filesystem::path& images, const std::filesystem::path& labels,
                             std::string name, const ImageOptions& options) {
  return detail::guard([&]() -> Expected<Dataset> {
    auto x = read_idx(images);
    if (!x) return tl::unexpected(x.error().with_context("dataset \"" + name + "\""));
    auto y = read_idx(labels);
    if (!y) return tl::unexpected(y.error().with_context("dataset \"" + name + "\""));
    if (x->dim() != 3 || x->scalar_type() != torch::kUInt8)
      return fail(ErrorCode::data, fmt::format("{}: expected uint8 images [N, H, W], got {} of {}",
                                               images.string(), c10::toString(x->scalar_type()),
                                               detail::shape_string(*x)));
    if (y->dim() != 1)
      return fail(ErrorCode::data, fmt::format("{}: expected labels [N], got {}", labels.string(),
                                               detail::shape_string(*y)));
    if (x->size(0) != y->size(0))
      return fail(ErrorCode::data, fmt::format("{} has {} images but {} has {} labels", images.string(),
                                               x->size(0), labels.string(), y->size(0)));
    auto inputs = detail::scale_pixels(x->unsqueeze(1), options.normalize, options.mean, options.std);
    auto ds = make_dataset(std::move(inputs), y->to(torch::kLong), std::move(name));
    if (ds)
      ds->origin = {"idx", {{"images", detail::absolute_path(images)}, {"labels", detail::absolute_path(labels)},
                            {"normalize", options.normalize}, {"mean", options.mean}, {"std", options.std}}};
    return ds;
  });
}

const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                  "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

Expected<Dataset> fashion_mnist(Split split, const std::filesystem::path& dir, const ImageOptions& options) {
  const bool train = split == Split::train;
  const std::string prefix = train ? "train" : "t10k";
  auto ds = idx_images(dir / (prefix + "-images-idx3-ubyte.gz"), dir / (prefix + "-labels-idx1-ubyte.gz"),
                       train ? "fashion-mnist/train" : "fashion-mnist/test", options);
  if (!ds && ds.error().code == ErrorCode::io)
    return tl::unexpected(ds.error().with_context(
        "fashion-mnist (install the Debian package dataset-fashion-mnist, or pass its directory)"));
  // The kind "fashion-mnist" takes no mean and std: other values stay an "idx" origin.
  const ImageOptions defaults;
  if (ds && options.mean == defaults.mean && options.std == defaults.std)
    ds->origin = {"fashion-mnist", {{"split", std::string(train ? "train" : "test")},
                                    {"dir", detail::absolute_path(dir)}, {"normalize", options.normalize}}};
  return ds;
}

torch::Tensor epoch_order(std::int64_t size, std::uint64_t seed, std::int64_t epoch, bool shuffle) {
  auto order = torch::empty({size}, torch::kLong);
  auto* p = order.data_ptr<std::int64_t>();
  std::iota(p, p + size, std::int64_t{0});
  if (!shuffle) return order;
  std::uint64_t x = seed ^ 0x6261746F6E2D6461ULL;  // "baton-da"
  const std::uint64_t mixed = detail::splitmix64(x) ^ static_cast<std::uint64_t>(epoch);
  std::uint64_t s = mixed;
  for (std::int64_t i = size - 1; i > 0; --i) {
    // Multiply-shift maps 64 random bits onto [0, i]; bias below 2^-40 for any dataset size.
    const auto r = static_cast<std::uint64_t>(
        (static_cast<unsigned __int128>(detail::splitmix64(s)) * static_cast<std::uint64_t>(i + 1)) >> 64);
    std::swap(p[i], p[r]);
  }
  return order;
}

Expected<Dataset> slice(const Dataset& dataset, std::int64_t offset, std::int64_t limit) {
  if (auto ok = dataset.validate(); !ok) return tl::unexpected(ok.error());
  const std::int64_t n = dataset.size();
  if (offset < 0 || limit < 0)
    return fail(ErrorCode::invalid_argument, fmt::format("dataset \"{}\": offset ({}) and limit ({}) must be >= 0",
                                                         dataset.name, offset, limit));
  if (offset >= n)
    return fail(ErrorCode::data, fmt::format("dataset \"{}\": offset {} is past its end: it has {} samples (0 to {})",
                                             dataset.name, offset, n, n - 1));
  if (offset == 0 && (limit == 0 || limit >= n)) return dataset;
  const std::int64_t count = limit == 0 ? n - offset : std::min(limit, n - offset);
  const auto part = fmt::format("{}[{}:{}]", dataset.name, offset, offset + count);
  auto out = dataset.lazy() ? make_dataset(detail::subset(dataset.source, torch::arange(offset, offset + count, torch::kLong)), part)
                            : Dataset{dataset.inputs.narrow(0, offset, count), dataset.targets.narrow(0, offset, count), part};
  out.origin = detail::sliced_origin(dataset.origin, offset, count);
  return out;
}

Expected<Dataset> map_labels(const Dataset& dataset, const std::vector<std::int64_t>& map) {
  if (auto ok = dataset.validate(); !ok) return tl::unexpected(ok.error());
  const auto where = [&] { return fmt::format("dataset \"{}\": label_map [{}]", dataset.name, fmt::join(map, ", ")); };
  if (!dataset.class_targets())
    return fail(ErrorCode::invalid_argument, fmt::format("{}: its targets are not class indices (int64 [N])", where()));
  if (map.empty()) return fail(ErrorCode::invalid_argument, fmt::format("{}: the map is empty", where()));
  for (std::size_t c = 0; c < map.size(); ++c)
    if (map[c] < -1)
      return fail(ErrorCode::invalid_argument,
                  fmt::format("{}: class {} maps to {}; a new class is >= 0, or -1 to leave the class out", where(), c, map[c]));
  if (!dataset.lazy() && dataset.targets.min().item<std::int64_t>() < 0)
    return fail(ErrorCode::invalid_argument, fmt::format("{}: the data has label {}; class labels start at 0", where(),
                                                         dataset.targets.min().item<std::int64_t>()));
  const std::int64_t classes = dataset.classes();
  if (classes > static_cast<std::int64_t>(map.size()))
    return fail(ErrorCode::invalid_argument,
                fmt::format("{}: the data has class {}, which the map's {} entries do not cover; give one entry per "
                            "class (-1 leaves a class out)", where(), classes - 1, map.size()));
  const std::int64_t new_classes = *std::max_element(map.begin(), map.end()) + 1;
  if (new_classes == 0) return fail(ErrorCode::invalid_argument, fmt::format("{}: leaves every class out", where()));
  const bool drops = std::any_of(map.begin(), map.begin() + classes, [](std::int64_t m) { return m < 0; });
  // A curriculum maps labels first, before offset, limit and holdout: only then can the origin say it.
  auto origin = [&]() -> DataOrigin {
    const auto& o = dataset.origin;
    if (o.kind.empty() || o.holdout_fraction > 0 || o.keys.count("offset") || o.keys.count("limit") || o.keys.count("label_map"))
      return {};
    DataOrigin out = o;
    out.keys["label_map"] = std::vector<double>(map.begin(), map.end());
    return out;
  };
  const std::string name = fmt::format("{}:labels", dataset.name);
  if (dataset.lazy()) {
    if (drops)
      return fail(ErrorCode::invalid_argument,
                  fmt::format("{}: leaving classes out of a lazy dataset needs every sample's label; materialize it "
                              "first (data::materialize), or map every class", where()));
    auto out = make_dataset(detail::relabelled(dataset.source, map, new_classes), name);
    out.origin = origin();
    return out;
  }
  const auto table = torch::tensor(map, torch::kLong);
  auto targets = table.index_select(0, dataset.targets);
  Dataset out{dataset.inputs, targets, name};
  if (drops) {
    const auto keep = targets.ge(0).nonzero().squeeze(1);
    if (keep.numel() == 0) return fail(ErrorCode::invalid_argument, fmt::format("{}: leaves no sample", where()));
    out = Dataset{dataset.inputs.index_select(0, keep), targets.index_select(0, keep), name};
  }
  out.origin = origin();
  return out;
}

Expected<HeldOut> hold_out(const Dataset& dataset, const HoldOutOptions& options) {
  if (auto ok = dataset.validate(); !ok) return tl::unexpected(ok.error());
  const std::int64_t n = dataset.size();
  if (!(options.fraction > 0.0 && options.fraction < 1.0))
    return fail(ErrorCode::invalid_argument,
                fmt::format("dataset \"{}\": hold-out fraction {} is outside (0, 1)", dataset.name, options.fraction));
  const auto held = static_cast<std::int64_t>(std::llround(options.fraction * static_cast<double>(n)));
  if (held < 1 || held > n - 1)
    return fail(ErrorCode::invalid_argument,
                fmt::format("dataset \"{}\": holding out {} of its {} samples leaves {} part empty; use a "
                            "fraction between {:.3g} and {:.3g}, or more data",
                            dataset.name, options.fraction, n, held < 1 ? "the held-out" : "the training",
                            0.5 / static_cast<double>(n), 1.0 - 0.5 / static_cast<double>(n)));
  // A permutation of its own (the data order's salt mixed with a constant of the split's, so the
  // split never coincides with an epoch's order); its first `held` entries are held out.
  const auto order = epoch_order(n, options.seed ^ 0x686F6C646F7574ULL /* "holdout" */, 0);
  auto mask = torch::zeros({n}, torch::kBool);
  mask.index_fill_(0, order.narrow(0, 0, held), true);
  const auto val_idx = mask.nonzero().squeeze(1);
  const auto train_idx = mask.logical_not().nonzero().squeeze(1);
  auto part = [&](const torch::Tensor& idx, const char* which) {
    auto out = dataset.lazy() ? make_dataset(detail::subset(dataset.source, idx), fmt::format("{}:{}", dataset.name, which))
                              : Dataset{dataset.inputs.index_select(0, idx), dataset.targets.index_select(0, idx),
                                        fmt::format("{}:{}", dataset.name, which)};
    // A curriculum holds out once, after its offset and limit: a part of a part has no origin.
    if (!dataset.origin.kind.empty() && dataset.origin.holdout_fraction == 0) {
      out.origin = dataset.origin;
      out.origin.holdout_fraction = options.fraction, out.origin.holdout_seed = options.seed;
      out.origin.holdout_val = std::string_view(which) == "val";
    }
    return out;
  };
  return HeldOut{part(train_idx, "train"), part(val_idx, "val")};
}

}  // namespace data

DataOrigin detail::sliced_origin(const DataOrigin& origin, std::int64_t offset, std::int64_t count) {
  // A curriculum takes offset and limit before holding out: a range of a held-out part has none.
  if (origin.kind.empty() || origin.holdout_fraction > 0) return {};
  DataOrigin out = origin;
  const auto at = out.keys.find("offset");
  const double before = at == out.keys.end() ? 0.0 : std::get<double>(at->second);
  out.keys["offset"] = before + static_cast<double>(offset);
  out.keys["limit"] = static_cast<double>(count);
  return out;
}

std::string detail::absolute_path(const std::filesystem::path& p) {
  std::error_code ec;
  const auto abs = std::filesystem::absolute(p, ec);
  return (ec ? p : abs).lexically_normal().string();
}

torch::Tensor detail::scale_pixels(const torch::Tensor& pixels, bool normalize, double mean, double std) {
  auto inputs = pixels.to(torch::kFloat32).div_(255.0);
  if (normalize) inputs.sub_(mean).div_(std);
  return inputs;
}

}  // namespace baton
