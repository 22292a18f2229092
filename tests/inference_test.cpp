// Deployment (include/baton/inference.hpp): `baton export --inference` writes an artifact,
// `baton predict` and load_for_inference classify with it. This file includes no training header:
// it trains through the `baton` program and uses only what a deployed program would.
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <stb/stb_image_write.h>

#include <baton/data.hpp>
#include <baton/hparams.hpp>  // Registry: the models an artifact's card may name
#include <baton/inference.hpp>

#include "process.hpp"

namespace fs = std::filesystem;

namespace {
template <class T>
T unwrap(baton::Expected<T> r) {
  if (!r) FAIL(r.error().to_string());
  return std::move(*r);
}

const fs::path kImages = baton::data::fashion_mnist_dir / "t10k-images-idx3-ubyte.gz";
const fs::path kLabels = baton::data::fashion_mnist_dir / "t10k-labels-idx1-ubyte.gz";

using test::baton_cli;
using test::read_predictions;

/// A small CNN trained for an epoch on 1,000 Fashion-MNIST images by `baton run`, exported as an
/// inference artifact, and its test accuracy by `baton eval` (once per process).
struct Trained {
  fs::path dir, artifact, state;
  double eval_accuracy = 0;
  ~Trained() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

const Trained& trained() {
  static Trained t;
  if (!t.dir.empty()) return t;
  {
    t.dir = test::temp_dir("inference");
    std::ofstream(t.dir / "c.toml") << R"(
[run]
name = "predict"
seed = 5
max_duration = "1ep"
[model]
name = "small_cnn"
channels1 = 4
channels2 = 8
hidden = 16
[datasets.train]
kind = "fashion-mnist"
split = "train"
limit = 1000
[datasets.test]
kind = "fashion-mnist"
split = "test"
[[stages]]
name = "only"
duration = "1ep"
batch_size = 50
optimizer = { name = "adam", lr = 0.01 }
)";
    auto r = baton_cli(fmt::format("run {} --run-dir {}", (t.dir / "c.toml").string(), (t.dir / "run").string()));
    INFO(r.out);
    REQUIRE(r.rc == 0);
    t.state = t.dir / "run/final.baton";
    t.artifact = t.dir / "model.pt";
    r = baton_cli(fmt::format("export {} -o {} --inference", t.state.string(), t.artifact.string()));
    INFO(r.out);
    REQUIRE(r.rc == 0);
    CHECK_THAT(r.out, Catch::Contains("inference artifact") && Catch::Contains("baton predict"));
    REQUIRE(fs::exists(t.artifact));  // the message announced it
    r = baton_cli(fmt::format("eval --state {} --data test --metric accuracy", t.state.string()));
    INFO(r.out);
    REQUIRE(r.rc == 0);
    t.eval_accuracy = nlohmann::json::parse(r.out.substr(r.out.find('{'))).at("metrics").at("accuracy");
  }
  return t;
}

}  // namespace

TEST_CASE("baton predict on the test set reproduces baton eval's accuracy exactly", "[inference][cli]") {
  const auto& t = trained();
  const auto out = t.dir / "predictions.csv";
  const auto r = baton_cli(fmt::format("predict {} {} -o {}", t.artifact.string(), kImages.string(), out.string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("10000 predictions"));
  std::ifstream in(out);
  const auto rows = read_predictions(std::string(std::istreambuf_iterator<char>(in), {}));
  const auto labels = unwrap(baton::data::read_idx(kLabels)).to(torch::kLong);
  REQUIRE(rows.size() == 10000);
  std::int64_t correct = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    CHECK(rows[i].first == std::to_string(i));
    correct += rows[i].second.cls == labels[static_cast<std::int64_t>(i)].item<std::int64_t>();
    CHECK(rows[i].second.name == baton::data::fashion_mnist_classes().at(static_cast<std::size_t>(rows[i].second.cls)));
  }
  const double accuracy = static_cast<double>(correct) / 10000.0;
  CHECK(accuracy == t.eval_accuracy);
  CHECK(accuracy > 0.5);  // trained: far above a tenth

  // The same through the library, from two threads at once: the same classes, the same bits.
  const auto predictor = unwrap(baton::load_for_inference(t.artifact));
  const auto inputs = unwrap(baton::read_inputs(kImages, predictor.card()));
  CHECK(inputs.inputs.sizes() == torch::IntArrayRef({10000, 1, 28, 28}));
  baton::Predictions a, b;
  std::thread other([&] { b = unwrap(predictor.predict(inputs.inputs)); });
  a = unwrap(predictor.predict(inputs.inputs));
  other.join();
  CHECK(a.probabilities.equal(b.probabilities));
  for (std::int64_t i = 0; i < 10000; i += 997) CHECK(a.classes[i].item<std::int64_t>() == rows[static_cast<std::size_t>(i)].second.cls);
  CHECK(a.probabilities.sum(1).sub(1).abs().max().item<float>() < 1e-5);
}

TEST_CASE("an inference artifact carries its model card and is a state_dict for Python", "[inference]") {
  const auto& t = trained();
  const auto card = unwrap(baton::read_model_card(t.artifact));
  CHECK(card.model == "small_cnn");
  CHECK(std::get<double>(card.options.at("channels1")) == 4);
  CHECK(card.input == baton::InputKind::image);
  CHECK(card.input_shape == std::vector<std::int64_t>{1, 28, 28});
  CHECK(card.normalize);
  CHECK(card.mean == baton::data::ImageOptions{}.mean);
  CHECK(card.classes == baton::data::fashion_mnist_classes());
  CHECK_THAT(card.origin, Catch::Contains("final.baton") && Catch::Contains("stage \"only\"") && Catch::Contains("params_sha256"));
  // Python's torch.load reads the artifact as the state_dict of the same torch.nn network (strict).
  const auto py = test::python(t.dir, R"(
import torch, torch.nn as nn
net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                    nn.Conv2d(4, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                    nn.Flatten(), nn.Linear(8 * 7 * 7, 16), nn.ReLU(), nn.Linear(16, 10))
print(net.load_state_dict(torch.load("model.pt")))
)");
  INFO(py.out);
  REQUIRE(py.rc == 0);
  CHECK_THAT(py.out, Catch::Contains("All keys matched successfully"));
}

TEST_CASE("baton predict classifies image files and directories as the IDX rows they came from", "[inference][cli]") {
  const auto& t = trained();
  const auto dir = t.dir / "images";
  fs::create_directories(dir);
  const auto pixels = unwrap(baton::data::read_idx(kImages)).narrow(0, 0, 4).contiguous();
  for (int i = 0; i < 4; ++i) {
    const auto* p = pixels[i].data_ptr<std::uint8_t>();
    if (i % 2 == 0) {  // PNG through stb_image_write; PGM by hand
      REQUIRE(stbi_write_png((dir / fmt::format("img{}.png", i)).c_str(), 28, 28, 1, p, 28) != 0);
    } else {
      std::ofstream pgm(dir / fmt::format("img{}.pgm", i), std::ios::binary);
      pgm << "P5\n28 28\n255\n";
      pgm.write(reinterpret_cast<const char*>(p), 28 * 28);
    }
  }
  auto r = baton_cli(fmt::format("predict {} {}", t.artifact.string(), dir.string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const auto rows = read_predictions(r.out);
  const auto predictor = unwrap(baton::load_for_inference(t.artifact));
  const auto expected = unwrap(predictor.predict(pixels)).classes;
  REQUIRE(rows.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(rows[static_cast<std::size_t>(i)].first == fmt::format("img{}.{}", i, i % 2 == 0 ? "png" : "pgm"));
    CHECK(rows[static_cast<std::size_t>(i)].second.cls == expected[i].item<std::int64_t>());
  }
  // The layout image folders are trained from: root/<class>/<image>, ids relative to the root.
  const auto by_class = t.dir / "by-class";
  fs::create_directories(by_class / "a");
  fs::create_directories(by_class / "b");
  fs::copy_file(dir / "img0.png", by_class / "a" / "img0.png", fs::copy_options::overwrite_existing);
  fs::copy_file(dir / "img1.pgm", by_class / "b" / "img1.pgm", fs::copy_options::overwrite_existing);
  r = baton_cli(fmt::format("predict {} {}", t.artifact.string(), by_class.string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const auto grouped = read_predictions(r.out);
  REQUIRE(grouped.size() == 2);
  CHECK(grouped[0].first == "a/img0.png");
  CHECK(grouped[0].second.cls == expected[0].item<std::int64_t>());
  CHECK(grouped[1].first == "b/img1.pgm");
  CHECK(grouped[1].second.cls == expected[1].item<std::int64_t>());
  // Files that are not what their names say, damaged ones, and a huge one: named, in plain words.
  const auto odd = t.dir / "odd";
  fs::create_directories(odd);
  std::ofstream(odd / "empty.png");
  std::ofstream(odd / "text.png") << "a,b\n1,2\n";
  {
    std::ifstream png(dir / "img0.png", std::ios::binary);
    const std::string bytes(std::istreambuf_iterator<char>(png), {});
    std::ofstream(odd / "cut.png", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    // A PNG whose header says 20000x20000 (only the signature and IHDR chunk are read).
    std::string huge = bytes.substr(0, 33);
    for (const int at : {16, 20}) huge.replace(static_cast<std::size_t>(at), 4, std::string("\x00\x00\x4e\x20", 4));
    std::ofstream(odd / "huge.png", std::ios::binary) << huge;
    // The largest size a PNG header can hold in 16 bits per side (stb's limit is far above it).
    std::string most = bytes.substr(0, 33);
    for (const int at : {16, 20}) most.replace(static_cast<std::size_t>(at), 4, std::string("\x00\x00\xff\xff", 4));
    std::ofstream(odd / "max.png", std::ios::binary) << most;
    // A folder of good images with one huge one in the middle: the error names that file.
    const auto mixed = t.dir / "mixed";
    fs::create_directories(mixed);
    for (const char* name : {"a.png", "c.png"}) fs::copy_file(dir / "img0.png", mixed / name, fs::copy_options::overwrite_existing);
    std::ofstream(mixed / "b.png", std::ios::binary) << huge;
  }
  r = baton_cli(fmt::format("predict {} {}", t.artifact.string(), (t.dir / "mixed").string()));
  INFO(r.out);
  CHECK(r.rc == 2);
  CHECK_THAT(r.out, Catch::Contains("b.png: a 20000x20000 image") && !Catch::Contains("a.png") && !Catch::Contains("c.png"));
  for (const auto& [file, says] : std::vector<std::pair<std::string, std::string>>{
           {"empty.png", "empty.png: not an image: its first bytes are no PNG"},
           {"text.png", "text.png: not an image: its first bytes are no PNG"},
           {"cut.png", "cut.png: a 28x28 PNG image whose pixels cannot be decoded"},
           {"huge.png", "huge.png: a 20000x20000 image; the model takes 28x28"},
           {"max.png", "max.png: a 65535x65535 PNG image: more pixels than stb"}}) {
    r = baton_cli(fmt::format("predict {} {}", t.artifact.string(), (odd / file).string()));
    INFO(r.out);
    CHECK(r.rc == 2);
    CHECK_THAT(r.out, Catch::Contains(says) && !Catch::Contains("no SOI") && !Catch::Contains("CSV"));
  }
  // One file; then an image of another size, which baton does not resize.
  r = baton_cli(fmt::format("predict {} {}", t.artifact.string(), (dir / "img1.pgm").string()));
  REQUIRE(r.rc == 0);
  CHECK(read_predictions(r.out).at(0).second.cls == expected[1].item<std::int64_t>());
  std::ofstream(dir / "big.pgm", std::ios::binary) << "P5\n32 30\n255\n" << std::string(32 * 30, '\x40');
  r = baton_cli(fmt::format("predict {} {}", t.artifact.string(), (dir / "big.pgm").string()));
  CHECK(r.rc == 2);
  CHECK_THAT(r.out, Catch::Contains("big.pgm: a 32x30 image; the model takes 28x28") && Catch::Contains("resize"));
  r = baton_cli(fmt::format("predict {} {}", t.artifact.string(), dir.string()));
  CHECK(r.rc == 2);
  CHECK_THAT(r.out, Catch::Contains("big.pgm"));
}

TEST_CASE("baton predict takes a CSV model's columns by name", "[inference][cli]") {
  const auto dir = test::temp_dir("inference-csv");
  // Three features, three classes: the class is which feature is largest (plus noise-free offsets).
  std::ofstream train(dir / "train.csv");
  train << "f0,f1,f2,label\n";
  for (int i = 0; i < 300; ++i) {
    const int k = i % 3;
    const double v[3] = {0.1 * (i % 7), 0.1 * (i % 5), 0.1 * (i % 4)};
    train << v[0] + (k == 0 ? 2 : 0) << ',' << v[1] + (k == 1 ? 2 : 0) << ',' << v[2] + (k == 2 ? 2 : 0) << ',' << k << '\n';
  }
  train.close();
  // A relative path: the run directory's copy of this file, which `baton export` reads, makes it
  // absolute.
  std::ofstream(dir / "c.toml") << R"(
[run]
name = "csv"
seed = 1
max_duration = "5ep"
[model]
name = "mlp"
widths = [3, 16, 3]
[datasets.train]
kind = "csv"
path = "train.csv"
target = "label"
[[stages]]
name = "only"
duration = "5ep"
batch_size = 30
optimizer = { name = "adam", lr = 0.05 }
)";
  auto r = baton_cli(fmt::format("run {} --run-dir {}", (dir / "c.toml").string(), (dir / "run").string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  r = baton_cli(fmt::format("export {} -o {} --inference --classes a,b,c", (dir / "run/final.baton").string(),
                            (dir / "m.pt").string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const auto card = unwrap(baton::read_model_card(dir / "m.pt"));
  CHECK(card.input == baton::InputKind::features);
  CHECK(card.columns == std::vector<std::string>{"f0", "f1", "f2"});
  CHECK(card.classes == std::vector<std::string>{"a", "b", "c"});
  // The same rows with the columns in another order, an id column of text and no label.
  std::ofstream other(dir / "other.csv");
  other << "id,f2,f0,f1\n";
  std::ifstream in(dir / "train.csv");
  std::string line;
  std::getline(in, line);
  for (int i = 0; std::getline(in, line); ++i) {
    std::vector<std::string> c;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, ',');) c.push_back(x);
    other << "row" << i << ',' << c[2] << ',' << c[0] << ',' << c[1] << '\n';
  }
  other.close();
  const auto a = baton_cli(fmt::format("predict {} {}", (dir / "m.pt").string(), (dir / "train.csv").string()));
  const auto b = baton_cli(fmt::format("predict {} {}", (dir / "m.pt").string(), (dir / "other.csv").string()));
  REQUIRE(a.rc == 0);
  REQUIRE(b.rc == 0);
  const auto ra = read_predictions(a.out), rb = read_predictions(b.out);
  REQUIRE(ra.size() == 300);
  REQUIRE(rb.size() == 300);
  int right = 0;
  for (std::size_t i = 0; i < 300; ++i) {
    CHECK(ra[i].second.cls == rb[i].second.cls);
    CHECK(ra[i].second.probability == rb[i].second.probability);
    CHECK(ra[i].second.name == std::string(1, static_cast<char>('a' + ra[i].second.cls)));
    right += ra[i].second.cls == static_cast<std::int64_t>(i % 3);
  }
  CHECK(right > 250);  // it learned the task
  std::ofstream(dir / "short.csv") << "f0,f2\n1,2\n";
  r = baton_cli(fmt::format("predict {} {}", (dir / "m.pt").string(), (dir / "short.csv").string()));
  CHECK(r.rc == 2);
  CHECK_THAT(r.out, Catch::Contains("short.csv: no column \"f1\""));
  // A model of feature columns is given images.
  r = baton_cli(fmt::format("predict {} {}", (dir / "m.pt").string(), kImages.string()));
  CHECK(r.rc == 2);
  CHECK_THAT(r.out, Catch::Contains("the model takes [N, 3]"));
  fs::remove_all(dir);
}

TEST_CASE("a state_dict without a card, and a missing artifact, are errors that say what to do", "[inference][cli]") {
  const auto& t = trained();
  const auto plain = t.dir / "plain.pt";
  auto r = baton_cli(fmt::format("export {} -o {}", t.state.string(), plain.string()));
  REQUIRE(r.rc == 0);
  r = baton_cli(fmt::format("predict {} {}", plain.string(), kImages.string()));
  CHECK(r.rc == 2);
  CHECK_THAT(r.out, Catch::Contains("without a model card") && Catch::Contains("--inference"));
  const auto missing = baton::load_for_inference(t.dir / "nowhere.pt");
  REQUIRE_FALSE(missing);
  CHECK_THAT(missing.error().to_string(), Catch::Contains("nowhere.pt: no such file"));
  r = baton_cli(fmt::format("export {} -o {} --classes a,b", t.state.string(), plain.string()));
  CHECK(r.rc == 2);
  CHECK_THAT(r.out, Catch::Contains("add --inference"));
  r = baton_cli(fmt::format("export {} -o {} --inference --classes a,b", t.state.string(), (t.dir / "x.pt").string()));
  CHECK(r.rc == 2);
  CHECK_THAT(r.out, Catch::Contains("2 class names for a model of 10 outputs"));
  CHECK_FALSE(fs::exists(t.dir / "x.pt"));
  const auto predictor = unwrap(baton::load_for_inference(t.artifact));
  const auto wrong = predictor.predict(torch::zeros({2, 3, 28, 28}, torch::kUInt8));
  REQUIRE_FALSE(wrong);
  CHECK_THAT(wrong.error().to_string(), Catch::Contains("[2, 3, 28, 28]") && Catch::Contains("[N, 1, 28, 28]"));
}

TEST_CASE("load_for_inference builds the card's model from a registry, and names what one lacks", "[inference]") {
  const auto& t = trained();
  // A program's own registry: here the built-in small_cnn under the card's name, counted.
  int built = 0;
  baton::Registry mine;
  mine.models["small_cnn"] = baton::Registry::builtin().models.at("small_cnn");
  const auto make = mine.models["small_cnn"].make;
  mine.models["small_cnn"].make = [&built, make](const baton::Params& p) {
    ++built;
    return make(p);
  };
  const auto predictor = unwrap(baton::load_for_inference(t.artifact, mine));
  CHECK(built == 1);
  const auto images = unwrap(baton::read_inputs(kImages, predictor.card()));
  const auto first = images.inputs.narrow(0, 0, 64);
  const auto builtin = unwrap(baton::load_for_inference(t.artifact));
  CHECK(unwrap(predictor.logits(unwrap(predictor.prepare(first)))).equal(unwrap(builtin.logits(unwrap(builtin.prepare(first))))));

  baton::Registry other;
  other.models["mlp"] = baton::Registry::builtin().models.at("mlp");
  const auto missing = baton::load_for_inference(t.artifact, other);
  REQUIRE_FALSE(missing);
  CHECK_THAT(missing.error().to_string(), Catch::Contains("model \"small_cnn\" is not in the registry (it has: mlp)") &&
                                              Catch::Contains("load_for_inference(path, factory)"));
}
