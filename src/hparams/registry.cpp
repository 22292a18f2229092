// The built-in names a curriculum file may use: models and dataset kinds (Registry::builtin).
// Each entry reads its TOML keys (as Params) and calls the library's C++ function.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "baton/hparams.hpp"
#include "baton/images.hpp"
#include "baton/text.hpp"
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

Expected<ModelFactory> make_gpt(const Params& p) {
  detail::ParamReader rd(p, "model");
  models::GptOptions o;
  constexpr std::int64_t big = std::int64_t{1} << 20;
  o.vocab = rd.whole("vocab", o.vocab, 1, big), o.block_size = rd.whole("block_size", o.block_size, 1, big);
  o.n_layer = rd.whole("n_layer", o.n_layer, 1, 1000), o.n_head = rd.whole("n_head", o.n_head, 1, 4096);
  o.n_embd = rd.whole("n_embd", o.n_embd, 1, big), o.dropout = rd.number("dropout", o.dropout);
  o.classes = rd.whole("classes", o.classes, 0, big), o.pad = rd.whole("pad", o.pad, -1, big);
  o.pool = rd.text("pool", o.pool);
  if (auto ok = rd.finish(); !ok) return tl::unexpected(ok.error());
  if (o.pool != "last" && o.pool != "mean")
    return fail(ErrorCode::invalid_argument, fmt::format("model.pool: \"{}\" is not \"last\" or \"mean\"", o.pool));
  if (o.n_embd % o.n_head != 0)
    return fail(ErrorCode::invalid_argument, fmt::format("model.n_embd: {} is not divisible by n_head = {}", o.n_embd, o.n_head));
  if (!(o.dropout >= 0 && o.dropout < 1))
    return fail(ErrorCode::invalid_argument, fmt::format("model.dropout: must be in [0, 1), got {}", o.dropout));
  const double c = static_cast<double>(o.n_embd);
  const double parameters = (static_cast<double>(o.vocab) + o.block_size) * c + o.n_layer * (12 * c * c + 13 * c) + 2 * c +
                            static_cast<double>(o.classes) * (c + 1);
  if (auto ok = check_size(parameters, "this gpt"); !ok) return tl::unexpected(ok.error());
  return models::gpt(o);
}

/// What a fortunes dataset's keys name: the corpus, the split and the part.
struct FortunesKeys {
  text::FortunesOptions corpus{};
  text::SplitOptions split{};
  text::Part part = text::Part::train;
};

/// Reads the keys every fortunes kind takes; then `rd.finish()` (the caller has read its own).
Expected<FortunesKeys> fortunes_keys(detail::ParamReader& rd) {
  FortunesKeys k;
  k.corpus.dir = rd.text("dir", k.corpus.dir.string());
  k.corpus.languages = rd.texts("languages", k.corpus.languages);
  k.corpus.topics = rd.texts("topics", k.corpus.topics);
  k.corpus.skip_undecodable = rd.flag("skip_undecodable", false);
  k.split.val = rd.number("val", k.split.val), k.split.test = rd.number("test", k.split.test);
  const std::string part = rd.text("part", "train");
  if (part != "train" && part != "val" && part != "test") rd.problem(fmt::format("dataset.part: \"{}\" is not one of train, val, test", part));
  k.part = part == "val" ? text::Part::val : part == "test" ? text::Part::test : text::Part::train;
  if (!(k.split.val >= 0 && k.split.test >= 0 && k.split.val + k.split.test < 1))
    rd.problem("dataset.val, dataset.test: fractions >= 0 with a sum below 1");
  if (auto ok = rd.finish(); !ok) return tl::unexpected(ok.error());
  return k;
}

Expected<Dataset> load_fortunes_lm(const Params& p) {
  detail::ParamReader rd(p, "dataset");
  text::FortunesLmOptions o;
  o.block_size = rd.whole("block_size", o.block_size, 1, std::int64_t{1} << 20);
  o.tokenizer = rd.text("tokenizer", "");
  auto keys = fortunes_keys(rd);
  if (!keys) return tl::unexpected(keys.error());
  o.corpus = keys->corpus, o.part = keys->part, o.split = keys->split;
  return text::fortunes_lm(o);
}

Expected<text::FortunesTextOptions> fortunes_text_options(const Params& p) {
  detail::ParamReader rd(p, "dataset");
  text::FortunesTextOptions o;
  o.length = rd.whole("length", o.length, 1, std::int64_t{1} << 20);
  o.min_records = rd.whole("min_records", o.min_records, 1, std::int64_t{1} << 40);
  o.label = rd.text("label", o.label);
  o.tokenizer = rd.text("tokenizer", "");
  if (o.label != "topic" && o.label != "language") rd.problem(fmt::format("dataset.label: \"{}\" is not one of topic, language", o.label));
  auto keys = fortunes_keys(rd);
  if (!keys) return tl::unexpected(keys.error());
  o.corpus = keys->corpus, o.part = keys->part, o.split = keys->split;
  o.name = "fortunes-" + o.label;
  return o;
}

Expected<Dataset> load_fortunes_text(const Params& p) {
  return fortunes_text_options(p).and_then([](const text::FortunesTextOptions& o) { return text::fortunes_text(o); });
}

/// A text kind's tokenizer (key `tokenizer`: a SentencePiece model file; none: bytes) into a card.
Expected<void> describe_tokens(const Params& p, ModelCard& card) {
  const auto it = p.find("tokenizer");
  const auto* file = it == p.end() ? nullptr : std::get_if<std::string>(&it->second);
  auto tokenizer = text::load_tokenizer(file ? *file : std::string());
  if (!tokenizer) return tl::unexpected(tokenizer.error());
  card.input = InputKind::tokens;
  card.tokenizer = tokenizer->identity();
  card.tokenizer_model = tokenizer->model();
  return {};
}

/// Inference cards of the text kinds: tokens and their tokenizer; a classifier's class names.
Expected<void> describe_fortunes_lm(const Params& p, ModelCard& card) { return describe_tokens(p, card); }

Expected<void> describe_fortunes_text(const Params& p, ModelCard& card) {
  auto classes = fortunes_text_options(p).and_then([](const text::FortunesTextOptions& o) { return text::fortunes_classes(o); });
  if (!classes) return tl::unexpected(classes.error());
  if (auto ok = describe_tokens(p, card); !ok) return ok;
  card.classes = *classes;
  return {};
}

Expected<Dataset> load_token_shards(const Params& p) {
  detail::ParamReader rd(p, "dataset");
  text::TokenShardOptions o;
  const auto dir = rd.required_text("dir", "the token shards' directory (baton pack of a language-model dataset)");
  o.block_size = rd.whole("block_size", o.block_size, 1, std::int64_t{1} << 20);
  o.verify = rd.flag("verify", true);
  if (auto ok = rd.finish(); !ok) return tl::unexpected(ok.error());
  return text::token_shards(dir, o);
}

/// A token-shard directory's card: its tokenizer (the manifest's, held beside it).
Expected<void> describe_token_shards(const Params& p, ModelCard& card) {
  const auto it = p.find("dir");
  const auto* dir = it == p.end() ? nullptr : std::get_if<std::string>(&it->second);
  Params with = p;
  if (dir && std::filesystem::exists(std::filesystem::path(*dir) / "tokenizer.model"))
    with["tokenizer"] = (std::filesystem::path(*dir) / "tokenizer.model").string();
  return describe_tokens(with, card);
}

Expected<Dataset> load_fashion_mnist(const Params& p) {
  detail::ParamReader rd(p, "dataset");
  const bool normalize = rd.flag("normalize", true);
  const std::string split = rd.text("split", "train"), dir = rd.text("dir", data::fashion_mnist_dir.string());
  if (split != "train" && split != "test") rd.problem(fmt::format("dataset.split: \"{}\" is not one of train, test", split));
  if (auto ok = rd.finish(); !ok) return tl::unexpected(ok.error());
  return data::fashion_mnist(split == "train" ? Split::train : Split::test, dir, {.normalize = normalize});
}

Expected<Dataset> load_idx(const Params& p) {
  detail::ParamReader rd(p, "dataset");
  data::ImageOptions o;
  o.normalize = rd.flag("normalize", true), o.mean = rd.number("mean", o.mean), o.std = rd.number("std", o.std);
  const auto images = rd.required_text("images", "the IDX images file"), labels = rd.required_text("labels", "the IDX labels file");
  if (auto ok = rd.finish(); !ok) return tl::unexpected(ok.error());
  return data::idx_images(images, labels, images, o);
}

Expected<Dataset> load_csv(const Params& params) {
  detail::ParamReader r(params, "dataset");
  data::CsvOptions o;
  o.path = r.required_text("path", "the CSV file");
  o.target = r.text("target", o.target);
  o.classification = r.flag("classification", true);
  r.flag("header", true);
  if (auto ok = r.finish(); !ok) return tl::unexpected(ok.error());
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
  o.root = rd.text("root"), o.list = rd.text("list");
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
  const auto dir = rd.required_text("dir", "a directory written by `baton pack`");
  if (auto ok = rd.finish(); !ok) return tl::unexpected(ok.error());
  return data::shards(dir, o);
}
}  // namespace

Registry Registry::builtin() {
  Registry r;
  r.models["mlp"] = ModelEntry{{"widths"}, make_mlp, "mlp: widths = [in, hidden..., out]"};
  r.models["small_cnn"] = ModelEntry{{"channels1", "channels2", "hidden", "classes", "in_channels", "image_size", "dropout"},
                                     make_small_cnn,
                                     "small_cnn: channels1, channels2, hidden, classes, in_channels, image_size, dropout"};
  r.models["gpt"] = ModelEntry{{"vocab", "block_size", "n_layer", "n_head", "n_embd", "dropout", "classes", "pad", "pool"}, make_gpt,
                               "gpt: vocab, block_size, n_layer, n_head, n_embd, dropout, classes (0: language model), pad, "
                               "pool = \"last\" | \"mean\" (what a classifier reads)"};
  r.datasets["fortunes_lm"] = DatasetEntry{{"dir", "languages", "topics", "part", "val", "test", "skip_undecodable", "block_size",
                                            "tokenizer"},
                                           load_fortunes_lm,
                                           "fortunes_lm: languages, topics, part = \"train\" | \"val\" | \"test\", val, test, "
                                           "block_size, tokenizer (a SentencePiece model file: baton tokenize; default: bytes)", describe_fortunes_lm};
  r.datasets["fortunes_text"] = DatasetEntry{{"dir", "languages", "topics", "part", "val", "test", "skip_undecodable", "length",
                                              "label", "min_records", "tokenizer"},
                                             load_fortunes_text,
                                             "fortunes_text: languages, topics, part, val, test, length, label = \"topic\" | "
                                             "\"language\", min_records (a class needs that many training records), tokenizer",
                                             describe_fortunes_text};
  r.datasets["token_shards"] = DatasetEntry{{"dir", "block_size", "verify"}, load_token_shards,
                                            "token_shards: dir (baton pack of a language-model dataset), block_size, verify",
                                            describe_token_shards};
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
