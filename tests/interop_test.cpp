// Weights to and from PyTorch (interop.hpp), checked against Debian's PyTorch for Python
// (/usr/bin/python3 with python3-torch, which scripts/common.sh installs): Python loads what baton
// exports and gets baton's accuracy; baton loads what Python's torch.save wrote and gives Python's
// outputs; names are remapped; damaged and unfitting files are errors that say what.
#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <baton/interop.hpp>

#include "helpers.hpp"
#include "process.hpp"

namespace fs = std::filesystem;

namespace {
using test::Output;
using test::shell;

using test::python;

fs::path interop_dir(const std::string& name) { return test::temp_dir("interop-" + name); }

using test::ok;

baton::ModelFactory cnn() { return baton::models::small_cnn({.channels1 = 4, .channels2 = 8, .hidden = 16, .classes = 3, .image_size = 8}); }

// The same network in Python: nn.Sequential gives the same names ("0.weight", "1.running_mean", ...).
const char* kPythonCnn = R"(
import sys, torch, torch.nn as nn
def cnn():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(8 * 2 * 2, 16), nn.ReLU(), nn.Linear(16, 3))
)";
}  // namespace

TEST_CASE("exported weights load into the same torch.nn model in Python and give baton's accuracy", "[interop]") {
  const auto dir = interop_dir("export");
  const auto data = test::images(400, 3);
  auto spec = test::spec(data, baton::Time::epochs(2));
  spec.data.batch_size = 20;
  auto state = test::ok(baton::fit(spec, ok(baton::init_state(cnn(), {.seed = 5, .max_duration = baton::Time::epochs(2)}))));
  const auto test_set = test::images(300, 77, "test");
  const auto m = ok(baton::eval({.sets = {{"test", test_set}}}, state));

  const auto tensors = ok(baton::state_dict(state));
  CHECK(tensors.front().first == "0.weight");
  REQUIRE(baton::save_state_dict(tensors, dir / "weights.pt"));
  REQUIRE(baton::save_state_dict({{"inputs", test_set.inputs}, {"targets", test_set.targets}}, dir / "data.pt"));
  const auto r = python(dir, std::string(kPythonCnn) + R"(
net = cnn()
net.load_state_dict(torch.load("weights.pt"))  # strict: every name and shape
net.eval()
data = torch.load("data.pt")
with torch.no_grad():
    out = net(data["inputs"])
print(repr((out.argmax(1) == data["targets"]).double().mean().item()))
print(net[1].num_batches_tracked.item())
)");
  INFO(r.out);
  REQUIRE(r.rc == 0);
  double accuracy = 0;
  std::int64_t batches = 0;
  std::istringstream(r.out) >> accuracy >> batches;
  CHECK(accuracy == Approx(m.at("test").at("accuracy")).margin(1e-6));
  CHECK(accuracy > 0.5);
  CHECK(batches == 40);  // BatchNorm's buffers came along: 2 epochs of 20 batches
  // Reading our own file back gives the same tensors.
  const auto back = ok(baton::read_state_dict(dir / "weights.pt"));
  REQUIRE(back.size() == tensors.size());
  for (std::size_t i = 0; i < back.size(); ++i) {
    CHECK(back[i].first == tensors[i].first);
    CHECK(back[i].second.equal(tensors[i].second));
  }
  fs::remove_all(dir);
}

TEST_CASE("a state_dict saved by torch.save in Python loads into baton and gives Python's outputs", "[interop]") {
  const auto dir = interop_dir("import");
  const auto r = python(dir, std::string(kPythonCnn) + R"(
torch.manual_seed(0)
net = cnn()
net.train()
for _ in range(3):  # running statistics that are not the initial ones
    net(torch.rand(16, 1, 8, 8))
net.eval()
x = torch.rand(10, 1, 8, 8)
with torch.no_grad():
    y = net(x)
torch.save(net.state_dict(), "py.pt")  # an OrderedDict, as everyone saves
torch.save({"inputs": x, "outputs": y}, "io.pt")
prefixed = type(net.state_dict())(("module." + k, v) for k, v in net.state_dict().items())
torch.save(prefixed, "prefixed.pt")
torch.save({"weight": torch.zeros(2, 2), "epoch": 3}, "not_weights.pt")
print("ok")
)");
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const auto io = ok(baton::read_state_dict(dir / "io.pt"));
  REQUIRE(io.size() == 2);
  const auto& x = io[0].second;
  const auto& y = io[1].second;

  auto check_outputs = [&](const baton::TrainState& s) {
    s.model.module->eval();
    torch::NoGradGuard g;
    const auto out = s.model.forward(x);
    s.model.module->train();
    CHECK(out.sub(y).abs().max().item<double>() < 1e-6);
  };
  const auto fresh = ok(baton::init_state(cnn(), {.seed = 1, .max_duration = baton::Time::epochs(1)}));
  {
    const auto [loaded, report] = ok(baton::load_weights(fresh, ok(baton::read_state_dict(dir / "py.pt"))));
    CHECK(report.copied.size() == 16);  // 2 conv, 2 x 5 batch norm tensors, 2 x 2 linear
    CHECK(report.skipped.empty());
    CHECK(report.initialized.empty());
    check_outputs(loaded);
  }
  // The same through ModelCarry::transfer at a stage's start.
  {
    auto source = std::make_shared<baton::TrainState>(ok(baton::imported_state(ok(baton::read_state_dict(dir / "py.pt")), cnn())));
    auto spec = test::spec(test::images(20), baton::Time::batches(0)).with_model(baton::ModelCarry::transfer(cnn(), source));
    spec.name = "finetune";
    spec.duration = baton::Time::batches(1);
    auto run = ok(baton::init_state(cnn(), {.seed = 1, .max_duration = baton::Time::epochs(1)}));
    auto after = test::ok(baton::fit(spec, run));
    REQUIRE(after.history.back().transfer.has_value());
    CHECK(after.history.back().transfer->copied.size() == 16);
  }
  // Names remapped by pattern.
  {
    const auto prefixed = ok(baton::read_state_dict(dir / "prefixed.pt"));
    auto strict = baton::load_weights(fresh, prefixed);
    REQUIRE_FALSE(strict);
    CHECK_THAT(strict.error().message, Catch::Contains("not in the file: 0.weight") &&
                                           Catch::Contains("module.0.weight (not in the new model)") &&
                                           Catch::Contains("rename"));
    // The hint is written in the syntax init_from reads: a list of [pattern, replacement] pairs.
    CHECK_THAT(strict.error().message, Catch::Contains("rename = [[\"^old\\\\.\", \"new.\"]]"));
    const auto [loaded, report] = ok(baton::load_weights(fresh, prefixed, {.rename = {{"^module\\.", ""}}}));
    CHECK(report.copied.size() == 16);
    check_outputs(loaded);
  }
  // A new head: strict with the head listed as fresh, or a shape mismatch named with both shapes.
  {
    auto sd = ok(baton::read_state_dict(dir / "py.pt"));
    for (auto& [name, t] : sd)
      if (name == "11.weight") t = torch::zeros({5, 16});
    auto mismatch = baton::load_weights(fresh, sd);
    REQUIRE_FALSE(mismatch);
    CHECK_THAT(mismatch.error().message, Catch::Contains("11.weight (shape [5, 16] in the source, [3, 16] here)"));
    const auto [loaded, report] = ok(baton::load_weights(fresh, sd, {.fresh = {"11.*"}}));
    CHECK(report.copied.size() == 14);
    CHECK(report.initialized == std::vector<std::string>{"11.weight", "11.bias"});
    const auto [lenient, r2] = ok(baton::load_weights(fresh, sd, {.strict = false}));
    CHECK(r2.copied.size() == 15);
  }
  // Files that are not weights, damaged ones, and ones that are not there.
  auto bad = baton::read_state_dict(dir / "not_weights.pt");
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Catch::Contains("\"epoch\" is not a tensor by name"));
  std::string bytes;
  {
    std::ifstream in(dir / "py.pt", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (const std::size_t keep : {std::size_t{0}, std::size_t{100}, bytes.size() / 2, bytes.size() - 30}) {
    INFO("cut to " << keep << " bytes");
    std::ofstream(dir / "cut.pt", std::ios::binary) << bytes.substr(0, keep);
    auto cut = baton::read_state_dict(dir / "cut.pt");
    REQUIRE_FALSE(cut);
    CHECK_THAT(cut.error().to_string(), Catch::Contains("cut.pt"));
  }
  CHECK_THAT(baton::read_state_dict(dir / "absent.pt").error().message, Catch::Contains("absent.pt: no such file"));
  fs::remove_all(dir);
}

TEST_CASE("baton export writes what Python loads, and [model] init_from starts a run from a .pt", "[interop][cli]") {
  const auto dir = interop_dir("cli");
  std::ofstream(dir / "c.toml") << R"(
[run]
name = "interop"
seed = 3
max_duration = "2ep"
[model]
name = "mlp"
widths = [8, 16, 4]
[datasets.train]
kind = "synthetic"
samples = 300
[datasets.test]
kind = "synthetic"
samples = 200
sample_seed = 9
[[stages]]
name = "only"
duration = "2ep"
batch_size = 25
optimizer = { name = "adam", lr = 0.01 }
algorithms = { ema = { decay = 0.9 } }
)";
  const std::string exe = BATON_EXE;
  auto r = shell(fmt::format("{} run {} --run-dir {}", exe, (dir / "c.toml").string(), (dir / "run").string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  r = shell(fmt::format("{} export {} -o {}", exe, (dir / "run/final.baton").string(), (dir / "w.pt").string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("4 tensors") && Catch::Contains("load_state_dict"));
  r = shell(fmt::format("{} export {} -o {} --weights ema", exe, (dir / "run/final.baton").string(), (dir / "ema.pt").string()));
  REQUIRE(r.rc == 0);
  r = shell(fmt::format("{} eval --state {} --data test", exe, (dir / "run/final.baton").string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const double baton_accuracy = nlohmann::json::parse(r.out.substr(r.out.find('{'))).at("metrics").at("accuracy");

  auto cur = ok(baton::load_curriculum(dir / "c.toml"));
  const auto test_set = ok(cur.dataset("test"));
  REQUIRE(baton::save_state_dict({{"inputs", test_set.inputs}, {"targets", test_set.targets}}, dir / "data.pt"));
  const auto py = python(dir, R"(
import torch, torch.nn as nn
data = torch.load("data.pt")
for f in ["w.pt", "ema.pt"]:
    net = nn.Sequential(nn.Flatten(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    net.load_state_dict(torch.load(f))
    with torch.no_grad():
        print(repr((net(data["inputs"]).argmax(1) == data["targets"]).double().mean().item()))
    torch.save(net.state_dict(), "back-" + f)
)");
  INFO(py.out);
  REQUIRE(py.rc == 0);
  double python_accuracy = 0, ema_accuracy = 0;
  std::istringstream(py.out) >> python_accuracy >> ema_accuracy;
  CHECK(python_accuracy == Approx(baton_accuracy).margin(1e-6));
  CHECK(ema_accuracy > 0.3);

  // The weights Python saved back start a new run: [model] init_from, checked by validate.
  std::string text;
  {
    std::ifstream in(dir / "c.toml");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto with_init = [&](const std::string& value) {
    std::string t = text;
    t.replace(t.find("widths = [8, 16, 4]"), 19, "widths = [8, 16, 4]\ninit_from = " + value);
    return t;
  };
  auto from = ok(baton::parse_curriculum(with_init("\"" + (dir / "back-w.pt").string() + "\""), "i.toml"));
  REQUIRE(from.validate());
  baton::TransferReport report;
  const auto init = ok(from.init(&report));
  CHECK(report.copied.size() == 4);
  const auto trained = ok(baton::load_checkpoint(dir / "run/final.baton", ok(cur.model())));
  const auto a = ok(baton::state_dict(init)), b = ok(baton::state_dict(trained));
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].second.equal(b[i].second));
  // Validation reads the file: a missing one, and one that does not fit, are found before training.
  auto missing = ok(baton::parse_curriculum(with_init("\"nowhere.pt\""), "i.toml")).validate();
  REQUIRE_FALSE(missing);
  CHECK_THAT(missing.error().to_string(), Catch::Contains("model.init_from") && Catch::Contains("nowhere.pt: no such file"));
  auto other = with_init("{ path = \"" + (dir / "back-w.pt").string() + "\", rename = [[\"^1\\\\.\", \"9.\"]] }");
  auto unfit = ok(baton::parse_curriculum(other, "i.toml")).validate();
  REQUIRE_FALSE(unfit);
  CHECK_THAT(unfit.error().to_string(), Catch::Contains("not in the file: 1.weight"));
  auto unknown = ok(baton::parse_curriculum(with_init("{ path = \"x.pt\", strikt = false }"), "i.toml")).validate();
  REQUIRE_FALSE(unknown);
  CHECK_THAT(unknown.error().to_string(), Catch::Contains("strikt"));
  fs::remove_all(dir);
}

TEST_CASE("save_for_inference checks its card, and a model of your own loads with its factory", "[interop][inference]") {
  const auto dir = interop_dir("artifact");
  const auto data = test::images(200, 3);
  auto spec = test::spec(data, baton::Time::epochs(1));
  spec.data.batch_size = 20;
  const auto state = test::ok(baton::fit(spec, ok(baton::init_state(cnn(), {.seed = 2, .max_duration = baton::Time::epochs(1)}))));
  // Inputs already prepared (floats): a features card of the sample shape.
  const baton::ModelCard card{.input = baton::InputKind::features, .input_shape = {1, 8, 8}, .classes = {"x", "y", "z"}};
  REQUIRE(baton::save_for_inference(state, card, dir / "m.pt"));

  // The card names no model: load_for_inference needs the factory, and then answers as eval does.
  const auto unnamed = baton::load_for_inference(dir / "m.pt");
  REQUIRE_FALSE(unnamed);
  CHECK_THAT(unnamed.error().to_string(), Catch::Contains("pass its factory"));
  const auto predictor = ok(baton::load_for_inference(dir / "m.pt", cnn()));
  const auto logits = ok(predictor.logits(data.inputs));
  const auto out = ok(predictor.predict(data.inputs));
  const auto m = ok(baton::eval({.sets = {{"d", data}}, .metrics = {baton::metric::accuracy()}}, state));
  CHECK(out.classes.eq(data.targets).to(torch::kDouble).mean().item<double>() == *baton::metric_value(m, "d/accuracy"));
  CHECK(out.classes.equal(logits.argmax(1)));

  // A card that does not fit the model: nothing is written.
  auto bad = card;
  bad.classes = {"x", "y"};
  auto r = baton::save_for_inference(state, bad, dir / "bad.pt");
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().to_string(), Catch::Contains("2 class names for a model of 3 outputs"));
  bad = card;
  bad.input_shape = {3, 5};
  r = baton::save_for_inference(state, bad, dir / "bad.pt");
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().to_string(), Catch::Contains("input_shape [3, 5] does not fit the model"));
  bad = card;
  bad.input = baton::InputKind::image;
  bad.std = 0;
  r = baton::save_for_inference(state, bad, dir / "bad.pt");
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().to_string(), Catch::Contains("cannot normalize"));
  CHECK_FALSE(fs::exists(dir / "bad.pt"));
  fs::remove_all(dir);
}

namespace {
/// Flips one bit in the middle of `t`'s data where `file` holds it (found by its bytes, as a
/// tensor record of a .pt holds them raw): a damaged tensor record, which `unzip -t` reports as a
/// bad CRC. Returns the offset of the flipped byte.
std::size_t flip_inside(const fs::path& file, const torch::Tensor& t) {
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto c = t.contiguous();
  const std::string data(static_cast<const char*>(c.data_ptr()), c.nbytes());
  const auto at = bytes.find(data);
  REQUIRE(at != std::string::npos);
  REQUIRE(bytes.find(data, at + 1) == std::string::npos);
  const std::size_t flipped = at + data.size() / 2;
  bytes[flipped] = static_cast<char>(bytes[flipped] ^ 0x40);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  return flipped;
}

const char* kCsvCurriculum = R"(
[run]
name = "damaged"
seed = 3
max_duration = "1ep"
[model]
name = "mlp"
widths = [3, 16, 3]
[datasets.train]
kind = "csv"
path = "train.csv"
target = "label"
[[stages]]
name = "only"
duration = "1ep"
batch_size = 10
optimizer = { name = "adam", lr = 0.01 }
)";
}  // namespace

TEST_CASE("a .pt with one byte flipped in a tensor record is refused by read_state_dict, init_from, load_for_inference and predict",
          "[interop][inference][cli]") {
  const auto dir = interop_dir("damaged");
  {
    std::ofstream csv(dir / "train.csv");
    csv << "f0,f1,f2,label\n";
    for (int i = 0; i < 60; ++i) csv << 0.1 * (i % 7) << ',' << 0.2 * (i % 5) << ',' << 0.3 * (i % 4) << ',' << i % 3 << '\n';
  }
  std::ofstream(dir / "c.toml") << kCsvCurriculum;
  auto cur = ok(baton::load_curriculum(dir / "c.toml"));
  const auto state = ok(cur.init());
  const auto tensors = ok(baton::state_dict(state));
  REQUIRE(baton::save_state_dict(tensors, dir / "w.pt"));
  REQUIRE(baton::save_for_inference(state, ok(cur.model_card("train")), dir / "m.pt"));
  const std::string exe = BATON_EXE;
  const auto predict = fmt::format("{} predict {} {}", exe, (dir / "m.pt").string(), (dir / "train.csv").string());
  // Undamaged, every path takes them.
  REQUIRE(baton::read_state_dict(dir / "w.pt"));
  REQUIRE(baton::load_for_inference(dir / "m.pt"));
  REQUIRE(shell(predict).rc == 0);
  std::string text = kCsvCurriculum;
  text.replace(text.find("widths = [3, 16, 3]"), 19, "widths = [3, 16, 3]\ninit_from = \"w.pt\"");
  std::ofstream(dir / "init.toml") << text;
  REQUIRE(ok(baton::load_curriculum(dir / "init.toml")).validate());

  // The largest tensor (the first layer's weights), one bit flipped in each file.
  const auto largest = std::max_element(tensors.begin(), tensors.end(),
                                        [](const auto& a, const auto& b) { return a.second.numel() < b.second.numel(); });
  flip_inside(dir / "w.pt", largest->second);
  flip_inside(dir / "m.pt", largest->second);
  // The message names the file and the record (Catch's combined matchers cannot be returned: checked here).
  const auto damaged = [](const std::string& text, const std::string& file) {
    INFO(text);
    CHECK(text.find(file + ": record '") != std::string::npos);
    CHECK(text.find("/data/") != std::string::npos);
    CHECK(text.find("fails its CRC-32 check: the file is damaged") != std::string::npos);
  };
  // The C++ API: read_state_dict, whose result load_weights takes, refuses the file.
  const auto read = baton::read_state_dict(dir / "w.pt");
  REQUIRE_FALSE(read);
  CHECK(read.error().code == baton::ErrorCode::data);
  damaged(read.error().to_string(), "w.pt");
  // [model] init_from: refused at validate, before anything trains.
  const auto init = ok(baton::load_curriculum(dir / "init.toml")).validate();
  REQUIRE_FALSE(init);
  CHECK_THAT(init.error().to_string(), Catch::Contains("model.init_from"));
  damaged(init.error().to_string(), "w.pt");
  const auto validated = shell(fmt::format("{} validate {}", exe, (dir / "init.toml").string()));
  CHECK(validated.rc == 2);
  damaged(validated.out, "w.pt");
  // An inference artifact: load_for_inference and baton predict.
  const auto loaded = baton::load_for_inference(dir / "m.pt");
  REQUIRE_FALSE(loaded);
  damaged(loaded.error().to_string(), "m.pt");
  const auto predicted = shell(predict);
  CHECK(predicted.rc == 2);
  damaged(predicted.out, "m.pt");
  CHECK(predicted.out.find("input,class") == std::string::npos);  // no predictions
  fs::remove_all(dir);
}
