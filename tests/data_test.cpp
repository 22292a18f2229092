#include <cmath>
#include <filesystem>
#include <fstream>

#include <zlib.h>

#include "helpers.hpp"

namespace fs = std::filesystem;

namespace {
fs::path temp_dir() {
  auto dir = fs::temp_directory_path() / ("baton-data-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

std::vector<unsigned char> idx_bytes(unsigned char type, std::vector<std::uint32_t> dims,
                                     const std::vector<unsigned char>& payload) {
  std::vector<unsigned char> b = {0, 0, type, static_cast<unsigned char>(dims.size())};
  for (auto d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(d >> s));
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

void write_file(const fs::path& p, const std::vector<unsigned char>& b) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void write_gz(const fs::path& p, const std::vector<unsigned char>& b) {
  gzFile f = gzopen(p.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, b.data(), static_cast<unsigned>(b.size())) == static_cast<int>(b.size()));
  gzclose(f);
}

std::vector<unsigned char> iota_bytes(std::size_t n) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i % 251);
  return v;
}
}  // namespace

TEST_CASE("data order is a permutation that depends only on (seed, epoch)", "[data]") {
  const auto a = baton::data::epoch_order(1000, 42, 3);
  CHECK(std::get<0>(a.sort()).equal(torch::arange(1000, torch::kLong)));
  CHECK(a.equal(baton::data::epoch_order(1000, 42, 3)));
  CHECK_FALSE(a.equal(baton::data::epoch_order(1000, 42, 4)));
  CHECK_FALSE(a.equal(baton::data::epoch_order(1000, 43, 3)));
  CHECK(baton::data::epoch_order(10, 42, 3, /*shuffle=*/false).equal(torch::arange(10, torch::kLong)));
  // Pinned: the order is part of the reproducibility contract across platforms and versions.
  const auto small = baton::data::epoch_order(8, 0, 0);
  std::vector<std::int64_t> got(small.data_ptr<std::int64_t>(), small.data_ptr<std::int64_t>() + 8);
  CHECK(baton::data::epoch_order(8, 0, 0).equal(small));
  CHECK(got != std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("IDX files are read plain and gzipped, with big-endian payloads", "[data][idx]") {
  const auto dir = temp_dir();
  write_file(dir / "u8.idx", idx_bytes(0x08, {2, 3, 4}, iota_bytes(24)));
  write_gz(dir / "u8.idx.gz", idx_bytes(0x08, {2, 3, 4}, iota_bytes(24)));
  write_file(dir / "noext", idx_bytes(0x08, {2, 3, 4}, iota_bytes(24)));
  for (const char* name : {"u8.idx", "u8.idx.gz", "noext"}) {
    auto t = baton::data::read_idx(dir / name);
    REQUIRE(t);
    CHECK(t->scalar_type() == torch::kUInt8);
    CHECK(t->sizes() == torch::IntArrayRef{2, 3, 4});
    CHECK(t->flatten().to(torch::kLong).equal(torch::arange(24, torch::kLong)));
  }
  // int32, big-endian: 0x01020304 and -2
  write_file(dir / "i32.idx", idx_bytes(0x0C, {2}, {1, 2, 3, 4, 0xff, 0xff, 0xff, 0xfe}));
  auto i32 = baton::data::read_idx(dir / "i32.idx");
  REQUIRE(i32);
  CHECK(i32->data_ptr<std::int32_t>()[0] == 0x01020304);
  CHECK(i32->data_ptr<std::int32_t>()[1] == -2);
  fs::remove_all(dir);
}

TEST_CASE("bad IDX files are clear errors naming the file and the problem", "[data][idx]") {
  const auto dir = temp_dir();
  auto expect = [&](const fs::path& p, baton::ErrorCode code, const std::string& what) {
    auto t = baton::data::read_idx(p);
    REQUIRE_FALSE(t);
    INFO(t.error().to_string());
    CHECK(t.error().code == code);
    CHECK_THAT(t.error().message, Catch::Contains(p.string()));
    CHECK_THAT(t.error().message, Catch::Contains(what));
  };
  expect(dir / "missing.idx", baton::ErrorCode::io, "no such file");
  expect(dir, baton::ErrorCode::io, "directory");
  write_file(dir / "magic.idx", {0x1f, 0x00, 0x08, 0x01, 0, 0, 0, 1, 7});
  expect(dir / "magic.idx", baton::ErrorCode::data, "wrong magic number");
  write_file(dir / "type.idx", idx_bytes(0x07, {1}, {1}));
  expect(dir / "type.idx", baton::ErrorCode::data, "unknown IDX element type");
  auto full = idx_bytes(0x08, {10, 10}, iota_bytes(100));
  write_file(dir / "short.idx", {full.begin(), full.end() - 7});
  expect(dir / "short.idx", baton::ErrorCode::data, "truncated");
  write_file(dir / "header.idx", {0, 0, 8, 3, 0, 0});
  expect(dir / "header.idx", baton::ErrorCode::data, "truncated header");
  auto longer = full;
  longer.push_back(1);
  write_file(dir / "long.idx", longer);
  expect(dir / "long.idx", baton::ErrorCode::data, "unexpected bytes");
  // A gzip file cut in the middle of its compressed stream.
  write_gz(dir / "full.gz", idx_bytes(0x08, {100, 100}, iota_bytes(10000)));
  std::ifstream in(dir / "full.gz", std::ios::binary);
  std::vector<unsigned char> gz((std::istreambuf_iterator<char>(in)), {});
  write_file(dir / "cut.gz", {gz.begin(), gz.begin() + static_cast<long>(gz.size() / 2)});
  auto cut = baton::data::read_idx(dir / "cut.gz");
  REQUIRE_FALSE(cut);
  CHECK(cut.error().code == baton::ErrorCode::data);
  CHECK_THAT(cut.error().message, Catch::Contains((dir / "cut.gz").string()));
  fs::remove_all(dir);
}

TEST_CASE("image and label files that disagree are an error naming both", "[data][idx]") {
  const auto dir = temp_dir();
  write_file(dir / "images", idx_bytes(0x08, {3, 2, 2}, iota_bytes(12)));
  write_file(dir / "labels", idx_bytes(0x08, {4}, {0, 1, 2, 3}));
  auto ds = baton::data::idx_images(dir / "images", dir / "labels", "tiny");
  REQUIRE_FALSE(ds);
  CHECK_THAT(ds.error().message, Catch::Contains("3 images") && Catch::Contains("4 labels"));
  write_file(dir / "labels", idx_bytes(0x08, {3}, {0, 1, 2}));
  auto good = baton::data::idx_images(dir / "images", dir / "labels", "tiny", {.normalize = false});
  REQUIRE(good);
  CHECK(good->inputs.sizes() == torch::IntArrayRef{3, 1, 2, 2});
  CHECK(good->targets.scalar_type() == torch::kLong);
  CHECK(good->inputs[2][0][1][1].item<float>() == Approx(11.0f / 255.0f));
  fs::remove_all(dir);
}

TEST_CASE("Fashion-MNIST loads from the Debian package", "[data][fashion]") {
  auto train = baton::data::fashion_mnist(baton::Split::train);
  auto test = baton::data::fashion_mnist(baton::Split::test);
  REQUIRE(train);
  REQUIRE(test);
  CHECK(train->size() == 60000);
  CHECK(test->size() == 10000);
  CHECK(train->inputs.sizes() == torch::IntArrayRef{60000, 1, 28, 28});
  CHECK(train->targets.min().item<std::int64_t>() == 0);
  CHECK(train->targets.max().item<std::int64_t>() == 9);
  // Normalized with the train statistics: mean ~0, std ~1.
  CHECK(train->inputs.mean().item<double>() == Approx(0.0).margin(0.01));
  CHECK(train->inputs.std().item<double>() == Approx(1.0).margin(0.01));
  auto missing = baton::data::fashion_mnist(baton::Split::train, "/nonexistent");
  REQUIRE_FALSE(missing);
  CHECK_THAT(missing.error().to_string(), Catch::Contains("dataset-fashion-mnist"));
}

TEST_CASE("datasets are validated", "[data]") {
  CHECK_FALSE(baton::make_dataset(torch::zeros({3, 2}), torch::zeros({4}), "bad"));
  CHECK_FALSE(baton::make_dataset(torch::zeros({0, 2}), torch::zeros({0}), "empty"));
  CHECK_FALSE(baton::make_dataset(torch::Tensor(), torch::zeros({4}), "none"));
  auto d = baton::make_dataset(torch::zeros({5, 2}), torch::zeros({5}), "ok");
  REQUIRE(d);
  CHECK(d->head(2).size() == 2);
  CHECK(d->head(10).size() == 5);
}

namespace {
/// A dataset whose sample i is the number i (input [i] as float, target i), so parts can be traced.
baton::Dataset numbered(std::int64_t n, const std::string& name = "numbered") {
  auto d = baton::make_dataset(torch::arange(n, torch::kFloat).unsqueeze(1), torch::arange(n, torch::kLong), name);
  REQUIRE(d);
  return *d;
}
bool increasing(const torch::Tensor& t) { return t.numel() < 2 || (t.slice(0, 1) > t.slice(0, 0, -1)).all().item<bool>(); }
}  // namespace

TEST_CASE("slice takes a range of samples and says when it is out of bounds", "[data][split]") {
  const auto d = numbered(10);
  auto mid = baton::data::slice(d, 3, 4);
  REQUIRE(mid);
  CHECK(torch::equal(mid->targets, torch::arange(3, 7, torch::kLong)));
  CHECK(mid->inputs.data_ptr<float>() == d.inputs.data_ptr<float>() + 3);  // a view, no copy
  auto tail = baton::data::slice(d, 8);  // limit 0: to the end
  REQUIRE(tail);
  CHECK(torch::equal(tail->targets, torch::tensor({8, 9}, torch::kLong)));
  auto clamped = baton::data::slice(d, 7, 100);
  REQUIRE(clamped);
  CHECK(clamped->size() == 3);
  auto past = baton::data::slice(d, 10, 1);
  REQUIRE_FALSE(past);
  CHECK_THAT(past.error().to_string(), Catch::Contains("offset 10 is past its end") && Catch::Contains("numbered"));
  CHECK_FALSE(baton::data::slice(d, -1, 2));
  CHECK_FALSE(baton::data::slice(d, 0, -2));
}

TEST_CASE("hold_out splits into disjoint parts that keep the order, chosen by (seed, size) only", "[data][split]") {
  const auto d = numbered(1000);
  auto parts = baton::data::hold_out(d, {.fraction = 0.1, .seed = 5});
  REQUIRE(parts);
  CHECK(parts->val.size() == 100);
  CHECK(parts->train.size() == 900);
  CHECK(parts->train.name == "numbered:train");
  CHECK(parts->val.name == "numbered:val");
  // Disjoint and complete: together the parts hold every sample once.
  const auto all = torch::cat({parts->train.targets, parts->val.targets});
  CHECK(torch::equal(std::get<0>(all.sort()), torch::arange(1000, torch::kLong)));
  // Inputs travel with their targets, and each part keeps the dataset's order.
  CHECK(torch::equal(parts->val.inputs.squeeze(1).to(torch::kLong), parts->val.targets));
  CHECK(increasing(parts->train.targets));
  CHECK(increasing(parts->val.targets));
  // Drawn from the whole range, not its first samples.
  CHECK(parts->val.targets.max().item<std::int64_t>() > 500);
  CHECK(parts->val.targets.min().item<std::int64_t>() < 500);

  SECTION("the same seed and size give the same split, whatever the data; another seed another split") {
    auto again = baton::data::hold_out(numbered(1000, "other"), {.fraction = 0.1, .seed = 5});
    REQUIRE(again);
    CHECK(torch::equal(again->val.targets, parts->val.targets));
    auto reseeded = baton::data::hold_out(d, {.fraction = 0.1, .seed = 6});
    REQUIRE(reseeded);
    CHECK_FALSE(torch::equal(reseeded->val.targets, parts->val.targets));
  }
  SECTION("the parts are copies: the source can change or go") {
    auto source = numbered(50);
    auto p = baton::data::hold_out(source, {.fraction = 0.2});
    REQUIRE(p);
    const auto before = p->train.targets.clone();
    source.targets.fill_(-1);
    CHECK(torch::equal(p->train.targets, before));
  }
  SECTION("fractions that leave a part empty are errors") {
    for (double f : {0.0, 1.0, -0.5, 1.5, std::nan("")}) {
      INFO(f);
      auto bad = baton::data::hold_out(d, {.fraction = f});
      REQUIRE_FALSE(bad);
      CHECK_THAT(bad.error().to_string(), Catch::Contains("outside (0, 1)"));
    }
    auto tiny = baton::data::hold_out(numbered(5), {.fraction = 0.05});
    REQUIRE_FALSE(tiny);
    CHECK_THAT(tiny.error().to_string(), Catch::Contains("leaves the held-out part empty"));
    auto most = baton::data::hold_out(numbered(5), {.fraction = 0.95});
    REQUIRE_FALSE(most);
    CHECK_THAT(most.error().to_string(), Catch::Contains("leaves the training part empty"));
  }
}

TEST_CASE("map_labels relabels classes and leaves out the classes mapped to -1, keeping the order", "[data][labels]") {
  // Ten classes, sample i of class i % 10.
  const auto x = torch::arange(100, torch::kFloat32).unsqueeze(1);
  const auto y = torch::arange(100, torch::kLong).remainder(10);
  const auto d = *baton::make_dataset(x, y, "ten");
  const std::vector<std::int64_t> coarse = {0, 1, 0, 0, 0, 2, 0, 2, 3, 2};

  auto c = baton::data::map_labels(d, coarse);
  REQUIRE(c);
  CHECK(c->size() == 100);
  CHECK(c->classes() == 4);
  CHECK(torch::equal(c->inputs, x));  // the same samples, in their order
  for (std::int64_t i = 0; i < 100; ++i) REQUIRE(c->targets[i].item<std::int64_t>() == coarse[static_cast<std::size_t>(i % 10)]);
  CHECK(torch::equal(torch::bincount(c->targets), torch::tensor({50, 10, 30, 10}, torch::kLong)));

  auto upper = baton::data::map_labels(d, {-1, -1, -1, -1, -1, 0, 1, 2, 3, 4});
  REQUIRE(upper);
  CHECK(upper->size() == 50);
  CHECK(upper->classes() == 5);
  CHECK(increasing(upper->inputs.squeeze(1).to(torch::kLong)));
  CHECK(torch::equal(upper->targets, upper->inputs.squeeze(1).to(torch::kLong).remainder(10) - 5));

  SECTION("a lazy dataset is relabelled as its batches are made; leaving classes out of one is an error") {
    const auto lazy = baton::data::transform(d, [](const torch::Tensor& t, at::Generator&) { return t * 2; }, "double");
    auto m = baton::data::map_labels(lazy, coarse);
    REQUIRE(m);
    REQUIRE(m->lazy());
    CHECK(m->classes() == 4);
    auto b = m->range(0, 100);
    REQUIRE(b);
    CHECK(torch::equal(b->targets, c->targets));
    CHECK(torch::equal(b->inputs, x * 2));
    CHECK_THAT(m->identity(), Catch::Contains("label_map [0, 1, 0, 0, 0, 2, 0, 2, 3, 2]"));
    auto dropped = baton::data::map_labels(lazy, {-1, -1, -1, -1, -1, 0, 1, 2, 3, 4});
    REQUIRE_FALSE(dropped);
    CHECK_THAT(dropped.error().to_string(), Catch::Contains("materialize it first"));
  }
  SECTION("a maker's origin carries the map when it comes first, as a curriculum applies it") {
    auto s = baton::data::synthetic({.samples = 60, .classes = 4, .seed = 1});
    REQUIRE(s);
    auto m = baton::data::map_labels(*s, {0, 0, 1, -1});
    REQUIRE(m);
    CHECK(m->origin.kind == "synthetic");
    CHECK(std::get<std::vector<double>>(m->origin.keys.at("label_map")) == std::vector<double>{0, 0, 1, -1});
    auto part = baton::data::slice(*m, 5, 10);
    REQUIRE(part);
    CHECK(part->origin.keys.count("label_map"));
    CHECK(part->origin.keys.count("limit"));
    auto late = baton::data::map_labels(*baton::data::slice(*s, 5, 10), {0, 0, 1, 1});
    REQUIRE(late);
    CHECK(late->origin.kind.empty());  // a curriculum cannot say "map after slicing"
  }
  SECTION("bad maps are errors that say what is wrong") {
    auto says = [&](const baton::Dataset& data, const std::vector<std::int64_t>& map) {
      auto r = baton::data::map_labels(data, map);
      REQUIRE_FALSE(r);
      return r.error().to_string();
    };
    CHECK_THAT(says(d, {0, 1, 2}), Catch::Contains("dataset \"ten\"") && Catch::Contains("has class 9, which the map's 3 entries do not cover"));
    CHECK_THAT(says(d, {0, 1, 0, 0, 0, 2, 0, 2, 3, -2}), Catch::Contains("class 9 maps to -2"));
    CHECK_THAT(says(d, std::vector<std::int64_t>(10, -1)), Catch::Contains("leaves every class out"));
    CHECK_THAT(says(d, {}), Catch::Contains("the map is empty"));
    const auto regression = *baton::make_dataset(x, x.squeeze(1), "reg");
    CHECK_THAT(says(regression, coarse), Catch::Contains("not class indices"));
    const auto negative = *baton::make_dataset(x, y - 1, "neg");
    CHECK_THAT(says(negative, coarse), Catch::Contains("has label -1"));
  }
}
