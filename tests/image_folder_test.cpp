// Image folders (#18 item 3): root/<class>/<image> and path,label lists, decoded in the loop's
// workers, checked against the tensors they were written from.
#include <sys/stat.h>
#include <fstream>

#include <baton/images.hpp>
#include <fmt/format.h>
#include <stb/stb_image_write.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "helpers.hpp"
#include "process.hpp"

namespace fs = std::filesystem;

namespace {

/// The first `n` Fashion-MNIST test images written as PNG files root/c<label>/<index>.png, and
/// the samples in the folder's order (by class directory, then by name).
baton::Dataset write_folder(const fs::path& root, std::int64_t n) {
  auto raw = baton::data::read_idx(baton::data::fashion_mnist_dir / "t10k-images-idx3-ubyte.gz");
  auto labels = baton::data::fashion_mnist(baton::Split::test);
  REQUIRE(raw.has_value());
  REQUIRE(labels.has_value());
  const auto pixels = raw->narrow(0, 0, n).contiguous();
  const auto y = labels->targets.narrow(0, 0, n);
  std::vector<std::int64_t> order;
  for (std::int64_t c = 0; c < 10; ++c)
    for (std::int64_t i = 0; i < n; ++i) {
      if (y[i].item<std::int64_t>() != c) continue;
      fs::create_directories(root / fmt::format("c{}", c));
      REQUIRE(stbi_write_png((root / fmt::format("c{}", c) / fmt::format("{:05d}.png", i)).c_str(), 28, 28, 1,
                             pixels[i].data_ptr<unsigned char>(), 28) != 0);
      order.push_back(i);
    }
  const auto idx = torch::tensor(order, torch::kLong);
  return *baton::make_dataset(labels->inputs.narrow(0, 0, n).index_select(0, idx), y.index_select(0, idx), "expected");
}

baton::data::ImageFolderOptions fashion_like(const fs::path& root) {
  baton::data::ImageFolderOptions o;
  o.root = root;
  o.scale = baton::data::ImageOptions{};  // Fashion-MNIST's normalization, as data::fashion_mnist
  return o;
}

}  // namespace

TEST_CASE("an image folder generated from Fashion-MNIST round-trips to the same tensors", "[image_folder]") {
  test::TempDir dir;
  const auto expected = write_folder(dir.path / "root", 400);
  auto folder = baton::data::image_folder(fashion_like(dir.path / "root"));
  if (!folder) FAIL(folder.error().to_string());
  REQUIRE(folder->classes.size() == 10);
  REQUIRE(folder->classes.front() == "c0");
  REQUIRE(folder->dataset.lazy());
  REQUIRE(folder->dataset.size() == 400);
  REQUIRE(folder->dataset.input_shape() == std::vector<std::int64_t>{1, 28, 28});
  auto back = baton::data::materialize(folder->dataset);
  REQUIRE(back.has_value());
  REQUIRE(torch::equal(back->inputs, expected.inputs));
  REQUIRE(torch::equal(back->targets, expected.targets));
  // The default scaling, in C++ as in TOML (kind = "image_folder"): pixels / 255, nothing more.
  baton::data::ImageFolderOptions plain;
  plain.root = dir.path / "root";
  const auto unscaled = baton::data::materialize(test::ok(baton::data::image_folder(plain)).dataset);
  REQUIRE(unscaled.has_value());
  CHECK(unscaled->inputs.min().item<float>() >= 0.0f);
  CHECK(unscaled->inputs.max().item<float>() == 1.0f);  // Fashion-MNIST has white pixels

  // Trained with 2 workers decoding: the bits of the in-memory tensors.
  auto spec = test::spec(expected, baton::Time::epochs(1));
  auto state = [] {
    return *baton::init_state(baton::models::small_cnn({.channels1 = 4, .channels2 = 8, .hidden = 16}),
                              {.seed = 5, .max_duration = baton::Time::epochs(1)});
  };
  const auto a = test::ok(baton::fit(spec, state()));
  auto d = spec.data;
  d.train = folder->dataset;
  test::require_same_bits(a, test::ok(baton::fit(spec.with_data(d), state())));
  d.workers = 2;
  test::require_same_bits(a, test::ok(baton::fit(spec.with_data(d), state())));
}

TEST_CASE("an image list of path,label lines, and resizing to a fixed size", "[image_folder]") {
  test::TempDir dir;
  const auto expected = write_folder(dir.path / "root", 60);
  {
    std::ofstream list(dir.path / "list.csv");
    list << "path,label\n";
    for (const auto& c : fs::directory_iterator(dir.path / "root"))
      for (const auto& f : fs::directory_iterator(c.path()))
        list << "root/" << c.path().filename().string() << "/" << f.path().filename().string() << ","
             << c.path().filename().string() << "\n";
  }
  baton::data::ImageFolderOptions o = fashion_like({});
  o.list = dir.path / "list.csv";
  auto folder = baton::data::image_folder(o);
  if (!folder) FAIL(folder.error().to_string());
  REQUIRE(folder->dataset.size() == 60);
  REQUIRE(folder->classes.front() == "c0");
  auto rows = baton::data::materialize(folder->dataset);
  // the same samples (the list's order is the directory listing's): compare as sorted sums per class
  for (std::int64_t c = 0; c < 10; ++c) {
    const auto a = rows->inputs.index_select(0, rows->targets.eq(c).nonzero().squeeze(1)).sum();
    const auto b = expected.inputs.index_select(0, expected.targets.eq(c).nonzero().squeeze(1)).sum();
    REQUIRE(a.item<double>() == Approx(b.item<double>()).epsilon(1e-6));
  }
  o.height = 14, o.width = 20;
  auto small = baton::data::image_folder(o);
  REQUIRE(small.has_value());
  REQUIRE(small->dataset.input_shape() == std::vector<std::int64_t>{1, 14, 20});
  REQUIRE(small->dataset.range(0, 5)->inputs.sizes() == torch::IntArrayRef({5, 1, 14, 20}));
}

TEST_CASE("what an image folder cannot hold is named: a FIFO, a nested directory, a link loop, a negative list label",
          "[image_folder]") {
  test::TempDir dir;
  write_folder(dir.path / "root", 20);
  const auto root = dir.path / "root";
  auto error_of = [&](const baton::data::ImageFolderOptions& o) {
    auto r = baton::data::image_folder(o);
    REQUIRE_FALSE(r.has_value());
    return r.error().message;
  };
  REQUIRE(::mkfifo((root / "c1" / "pipe.png").c_str(), 0600) == 0);
  CHECK_THAT(error_of(fashion_like(root)), Catch::Contains("pipe.png: is a FIFO, not an image file"));
  fs::remove(root / "c1" / "pipe.png");
  fs::create_directories(root / "c2" / "more");
  CHECK_THAT(error_of(fashion_like(root)), Catch::Contains("more: a directory inside the class directory \"c2\""));
  fs::remove(root / "c2" / "more");
  fs::create_directory_symlink(root / "c9" / "loop", root / "c9" / "loop");
  fs::create_directory_symlink("zz", root / "zz");  // a class directory that is a link to itself
  CHECK_THAT(error_of(fashion_like(root)), Catch::Contains("zz: cannot be followed") && !Catch::Contains("[torch]"));
  fs::remove(root / "zz");
  fs::remove(root / "c9" / "loop");
  std::ofstream(dir.path / "list.csv") << "root/c0/" << fs::directory_iterator(root / "c0")->path().filename().string()
                                        << ",-3\n";
  auto o = fashion_like({});
  o.list = dir.path / "list.csv";
  CHECK_THAT(error_of(o), Catch::Contains("label -3 is negative"));
}

TEST_CASE("a corrupt image is a clear error, or skipped and counted when asked", "[image_folder]") {
  test::TempDir dir;
  write_folder(dir.path / "root", 40);
  std::ofstream(dir.path / "root" / "c3" / "broken.png") << "this is not a PNG file";
  auto r = baton::data::image_folder(fashion_like(dir.path / "root"));
  REQUIRE_FALSE(r.has_value());
  INFO(r.error().message);
  REQUIRE(r.error().message.find("broken.png: not an image stb can read") != std::string::npos);
  {
    // A PNG whose header declares 65535x65535: stb refuses it ("unknown image type"); baton reads
    // the header itself and says what the file is.
    const auto good = *fs::directory_iterator(dir.path / "root" / "c1");
    std::ifstream png(good.path(), std::ios::binary);
    std::string head = std::string(std::istreambuf_iterator<char>(png), {}).substr(0, 33);
    for (const int at : {16, 20}) head.replace(static_cast<std::size_t>(at), 4, std::string("\x00\x00\xff\xff", 4));
    std::ofstream(dir.path / "root" / "c1" / "huge.png", std::ios::binary) << head;
    fs::remove(dir.path / "root" / "c3" / "broken.png");
    auto huge = baton::data::image_folder(fashion_like(dir.path / "root"));
    REQUIRE_FALSE(huge.has_value());
    INFO(huge.error().message);
    CHECK(huge.error().message.find("huge.png: a 65535x65535 PNG image: more pixels than stb") != std::string::npos);
    CHECK(huge.error().message.find("unknown image type") == std::string::npos);
    fs::rename(dir.path / "root" / "c1" / "huge.png", dir.path / "root" / "c3" / "broken.png");
  }
  auto o = fashion_like(dir.path / "root");
  o.skip_corrupt = true;
  auto skipped = baton::data::image_folder(o);
  REQUIRE(skipped.has_value());
  REQUIRE(skipped->dataset.size() == 40);
  REQUIRE(skipped->skipped.size() == 1);
  // A file whose header reads but whose data is cut: its batch fails, naming the file and the sample.
  const auto victim = *fs::directory_iterator(dir.path / "root" / "c0");
  fs::resize_file(victim.path(), 60);
  fs::remove(dir.path / "root" / "c3" / "broken.png");
  auto folder = baton::data::image_folder(fashion_like(dir.path / "root"));
  REQUIRE(folder.has_value());
  auto spec = test::spec(folder->dataset, baton::Time::epochs(1));
  auto d = spec.data;
  d.workers = 2;
  auto fit = baton::fit(spec.with_data(d), *baton::init_state(baton::models::small_cnn(), {.seed = 5, .max_duration = baton::Time::epochs(1)}));
  REQUIRE_FALSE(fit.has_value());
  const auto msg = fit.error().to_string();
  INFO(msg);
  REQUIRE(msg.find(victim.path().filename().string() + ": cannot decode the image") != std::string::npos);
  REQUIRE(msg.find("sample ") != std::string::npos);
  // And images of different sizes need height and width.
  std::vector<unsigned char> big(30 * 30, 7);
  REQUIRE(stbi_write_png((dir.path / "root" / "c1" / "zz-big.png").c_str(), 30, 30, 1, big.data(), 30) != 0);
  auto mixed = baton::data::image_folder(fashion_like(dir.path / "root"));
  REQUIRE_FALSE(mixed.has_value());
  REQUIRE(mixed.error().message.find("zz-big.png: a 30x30 image where the first is 28x28; set height and width") !=
          std::string::npos);
}

TEST_CASE("an image folder's class names reach the model card that export --inference writes", "[image_folder]") {
  test::TempDir dir;
  write_folder(dir.path / "root", 40);
  const auto toml = fmt::format(R"([run]
max_duration = "1ep"
[model]
name = "mlp"
widths = [784, 10]
[datasets.train]
kind = "image_folder"
root = "{}"
[[stages]]
name = "s"
duration = "1ep"
data = "train"
)",
                                (dir.path / "root").string());
  const auto cur = baton::parse_curriculum(toml, "c.toml");
  REQUIRE(cur.has_value());
  const auto card = cur->model_card("train");
  if (!card) FAIL(card.error().to_string());
  REQUIRE(card->classes.size() == 10);
  CHECK(card->classes.front() == "c0");
  CHECK(card->classes.back() == "c9");
  CHECK_FALSE(card->normalize);  // the image folder's default, in C++ and TOML alike
}

TEST_CASE("a model trained on resized image-folder files predicts on the same raw files through baton predict",
          "[image_folder][inference][cli]") {
  // 28x28 files, trained at 20x20 (the folder resizes): `baton predict` on the raw files must
  // resize them as training did (one decoder), so its answers are `baton eval`'s, class by class.
  test::TempDir dir;
  write_folder(dir.path / "root", 200);
  std::ofstream(dir.path / "c.toml") << fmt::format(R"([run]
seed = 3
max_duration = "2ep"
[model]
name = "mlp"
widths = [400, 32, 10]
[datasets.train]
kind = "image_folder"
root = "{}"
height = 20
width = 20
[[stages]]
name = "s"
duration = "2ep"
data = "train"
batch_size = 20
optimizer = {{ name = "adam", lr = 0.01 }}
)",
                                                    (dir.path / "root").string());
  auto r = test::baton_cli(fmt::format("run {} --run-dir {}", (dir.path / "c.toml").string(), (dir.path / "run").string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const auto state = dir.path / "run/final.baton", artifact = dir.path / "model.pt";
  r = test::baton_cli(fmt::format("export {} -o {} --inference", state.string(), artifact.string()));
  REQUIRE(r.rc == 0);
  r = test::baton_cli(fmt::format("eval --state {} --data train --metric accuracy", state.string()));
  REQUIRE(r.rc == 0);
  const double eval_accuracy = nlohmann::json::parse(r.out.substr(r.out.find('{'))).at("metrics").at("accuracy");
  std::int64_t right = 0, total = 0;
  for (std::int64_t c = 0; c < 10; ++c) {
    const auto cls = dir.path / "root" / fmt::format("c{}", c);
    if (!fs::exists(cls)) continue;
    r = test::baton_cli(fmt::format("predict {} {}", artifact.string(), cls.string()));
    INFO(r.out);
    REQUIRE(r.rc == 0);
    for (const auto& [input, row] : test::read_predictions(r.out)) {
      ++total;
      right += row.cls == c;
    }
  }
  CHECK(total == 200);
  INFO("predict: " << right << " of " << total << "; eval: " << eval_accuracy);
  CHECK(static_cast<double>(right) / static_cast<double>(total) == Approx(eval_accuracy).epsilon(1e-9));
  CHECK(eval_accuracy > 0.5);  // it learned something, so agreeing is not agreeing on noise
}
