// Precision (bf16 autocast), memory format, dynamic loss scaling and deterministic mode: each
// trains, and keeps the promises of split and resumed runs bit for bit.
#include <thread>

#include <baton/hparams.hpp>
#include <baton/testing_catch.hpp>

#include "helpers.hpp"

using baton::MemoryFormat;
using baton::Precision;
using baton::Time;
using test::ok;

namespace {
const baton::Dataset& images() {
  static const auto d = test::images(192);
  return d;
}
/// Conv, BatchNorm, Dropout, and a linear layer that sees where the band is.
baton::ModelFactory cnn() {
  return baton::model_factory([] {
    namespace nn = torch::nn;
    return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 8, 3).padding(1)), nn::BatchNorm2d(8), nn::ReLU(),
                          nn::Flatten(), nn::Dropout(0.1), nn::Linear(8 * 8 * 8, 3));
  });
}
baton::TrainState cnn_state(std::uint64_t seed = 1) {
  auto s = baton::init_state(cnn(), {.seed = seed, .max_duration = Time::epochs(4)});
  REQUIRE(s.has_value());
  return std::move(*s);
}
/// Adam: the moments then depend on the layout of every gradient too.
baton::TrainingSpec cnn_spec(Precision p, MemoryFormat f) {
  return baton::TrainingSpec{.name = "cnn",
                             .data = {.train = images(), .batch_size = 32},
                             .optimizer = baton::optim::adam({.lr = 0.01}),
                             .duration = Time::epochs(2),
                             .precision = p,
                             .memory_format = f};
}
/// In the default layout: contiguous, and with the strides LibTorch reads as NCHW (a conv weight
/// over one channel is contiguous with NHWC strides too, and would run its conv in NHWC).
bool weights_contiguous(const baton::TrainState& s) {
  for (const auto& [name, t] : s.named_parameters())
    if (!t.is_contiguous() || t.suggest_memory_format() != at::MemoryFormat::Contiguous) return false;
  return true;
}
double loss_of(const baton::TrainState& s) { return s.history.back().last_loss; }
}  // namespace

TEST_CASE("channels_last and bf16 fits train, and return weights in the default layout", "[precision]") {
  const auto fp32 = ok(baton::fit(cnn_spec(Precision::fp32, MemoryFormat::contiguous), cnn_state()));
  for (auto [p, f] : {std::pair{Precision::fp32, MemoryFormat::channels_last}, std::pair{Precision::bf16, MemoryFormat::contiguous},
                      std::pair{Precision::bf16, MemoryFormat::channels_last}}) {
    const auto s = ok(baton::fit(cnn_spec(p, f), cnn_state()));
    CHECK(weights_contiguous(s));
    CHECK(loss_of(s) < 0.5 * std::log(3.0));  // it learnt (3 classes: ln 3 at chance)
    if (p == Precision::bf16) CHECK_FALSE(baton::bitwise_equal(s, fp32));  // autocast was on: other roundings
  }
  // automatic is channels_last for image batches on the CPU (measured faster for conv models):
  // the same bits, and not those of NCHW (the layouts' kernels round differently).
  const auto automatic = ok(baton::fit(cnn_spec(Precision::fp32, MemoryFormat::automatic), cnn_state()));
  CHECK(baton::bitwise_equal(automatic, ok(baton::fit(cnn_spec(Precision::fp32, MemoryFormat::channels_last), cnn_state()))));
  CHECK_FALSE(baton::bitwise_equal(automatic, fp32));
}

namespace {
/// A conv over 3-channel images that records the layouts it is given (with one channel, NCHW and
/// NHWC are the same strides and nothing could be told apart).
struct LayoutProbeImpl : torch::nn::Module {
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc{nullptr};
  std::shared_ptr<std::vector<bool>> seen = std::make_shared<std::vector<bool>>();  // per forward: input and weight NHWC
  LayoutProbeImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)));
    fc = register_module("fc", torch::nn::Linear(4 * 8 * 8, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    seen->push_back(x.is_contiguous(at::MemoryFormat::ChannelsLast) && !x.is_contiguous() &&
                    conv->weight.is_contiguous(at::MemoryFormat::ChannelsLast) && !conv->weight.is_contiguous());
    return fc->forward(torch::relu(conv->forward(x)).flatten(1));
  }
};
TORCH_MODULE(LayoutProbe);
}  // namespace

TEST_CASE("channels_last puts the batch and the conv weights in NHWC during the fit", "[precision]") {
  auto gen = at::detail::createCPUGenerator(5);
  const auto data = *baton::make_dataset(torch::rand({64, 3, 8, 8}, gen), torch::randint(0, 3, {64}, gen, torch::kLong), "rgb");
  for (auto f : {MemoryFormat::channels_last, MemoryFormat::contiguous, MemoryFormat::automatic}) {
    LayoutProbe probe;
    const auto seen = probe->seen;
    auto s = baton::init_state(baton::model_factory([probe] { return probe; }), {.seed = 1, .max_duration = Time::epochs(1)});
    REQUIRE(s);
    auto spec = test::spec(data, Time::epochs(1)).with_memory_format(f);
    const auto out = ok(baton::fit(spec, std::move(*s)));
    REQUIRE(seen->size() == 2);  // 64 samples, batch 32
    for (bool nhwc : *seen) CHECK(nhwc == (f != MemoryFormat::contiguous));  // automatic: NHWC on the CPU
    CHECK(out.named_parameters()[0].second.is_contiguous());  // and back in the default layout after
  }
}

namespace {
/// Two convs over one-channel images; records whether the first conv's output came out NHWC.
struct OneChannelProbeImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc{nullptr};
  std::shared_ptr<std::vector<bool>> seen = std::make_shared<std::vector<bool>>();
  OneChannelProbeImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 4, 3).padding(1)));
    fc = register_module("fc", torch::nn::Linear(4 * 8 * 8, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto y = torch::relu(conv1->forward(x));
    seen->push_back(y.suggest_memory_format() == at::MemoryFormat::ChannelsLast && !y.is_contiguous());
    return fc->forward(torch::relu(conv2->forward(y)).flatten(1));
  }
};
TORCH_MODULE(OneChannelProbe);
}  // namespace

TEST_CASE("channels_last runs the first conv over one-channel images in NHWC too, and hands back NCHW strides",
          "[precision]") {
  // An [N, 1, H, W] batch and a [C, 1, k, k] weight are contiguous in both layouts: the strides
  // decide, and a first conv left with NCHW strides fed NCHW activations to an NHWC network
  // (mixed layouts in every backward kernel: small_cnn at 0.95x of NCHW instead of 1.5x).
  auto gen = at::detail::createCPUGenerator(6);
  const auto data = *baton::make_dataset(torch::rand({64, 1, 8, 8}, gen), torch::randint(0, 3, {64}, gen, torch::kLong), "gray");
  for (auto f : {MemoryFormat::channels_last, MemoryFormat::contiguous}) {
    OneChannelProbe probe;
    const auto seen = probe->seen;
    auto s = baton::init_state(baton::model_factory([probe] { return probe; }), {.seed = 1, .max_duration = Time::epochs(1)});
    REQUIRE(s);
    const auto out = ok(baton::fit(test::spec(data, Time::epochs(1)).with_memory_format(f), std::move(*s)));
    REQUIRE(seen->size() == 2);
    for (bool nhwc : *seen) CHECK(nhwc == (f == MemoryFormat::channels_last));
    CHECK(weights_contiguous(out));  // NCHW strides again: a later NCHW fit runs NCHW kernels
  }
}

TEST_CASE("bf16 and channels_last split and resumed runs give the same bits", "[precision][property]") {
  for (auto [p, f] : {std::pair{Precision::fp32, MemoryFormat::channels_last}, std::pair{Precision::bf16, MemoryFormat::contiguous},
                      std::pair{Precision::bf16, MemoryFormat::channels_last}}) {
    const auto spec = cnn_spec(p, f);
    CHECK(baton::testing::split_invariant(spec, cnn_state(), {Time::batches(3), Time::batches(5)}));
    CHECK(baton::testing::resume_invariant(spec, cnn_state(), Time::batches(7)));
  }
}

TEST_CASE("autocast stays inside the fit and its thread", "[precision][threads]") {
  const auto spec = cnn_spec(Precision::fp32, MemoryFormat::contiguous);
  const auto before = ok(baton::fit(spec, cnn_state()));
  std::optional<baton::TrainState> other;
  std::thread t([&] { other = *baton::fit(cnn_spec(Precision::bf16, MemoryFormat::channels_last), cnn_state()); });
  const auto during = ok(baton::fit(spec, cnn_state()));  // while a bf16 fit runs in another thread
  t.join();
  CHECK(baton::bitwise_equal(before, during));
  CHECK(baton::bitwise_equal(before, ok(baton::fit(spec, cnn_state()))));  // and after it
}

TEST_CASE("dynamic loss scaling", "[precision][loss_scaling]") {
  const auto& data = test::blobs(640);
  auto spec = test::spec(data, Time::epochs(1));  // 20 batches
  SECTION("a power-of-two scale changes no bit of the weights, and grows every interval") {
    const auto plain = ok(baton::fit(spec, test::new_state()));
    auto scaled = ok(baton::fit(spec.with_loss_scaling(baton::LossScaling{.init = 1024, .interval = 4}), test::new_state()));
    REQUIRE(scaled.loss_scale.has_value());
    CHECK(scaled.loss_scale->scale == 1024.0 * 32);  // 20 good steps: 5 growths
    CHECK(scaled.loss_scale->growth_tracker == 0);
    CHECK(scaled.loss_scale->skipped == 0);
    CHECK_FALSE(baton::bitwise_equal(plain, scaled));  // the scale is part of the state
    scaled.loss_scale.reset();
    CHECK(baton::bitwise_equal(plain, scaled));
  }
  SECTION("an overflow skips the batch and backs the scale off") {
    const auto start = test::new_state();
    // 1e39 is inf as a float: every gradient overflows, until the scale has backed off twice.
    const auto ls = baton::LossScaling{.init = 1e39, .backoff = 0.5, .interval = 1000};
    auto s = ok(baton::fit(spec.with_loss_scaling(ls), start, Time::batches(1)));
    REQUIRE(s.loss_scale.has_value());
    CHECK(s.loss_scale->skipped == 1);
    CHECK(s.loss_scale->scale == 5e38);
    CHECK(s.time.batch == 1);  // the batch was consumed
    for (std::size_t i = 0; i < s.named_parameters().size(); ++i)
      CHECK(s.named_parameters()[i].second.equal(start.named_parameters()[i].second));  // without an update
    s = ok(baton::fit(spec.with_loss_scaling(ls), std::move(s)));
    CHECK(s.loss_scale->scale <= 2.5e38);
    CHECK(s.loss_scale->skipped >= 2);
    CHECK(s.history.back().last_loss < std::log(4.0));  // training went on once the scale fit
  }
  SECTION("split and resumed runs keep the scale and its counters, bit for bit") {
    const auto scaled = spec.with_loss_scaling(baton::LossScaling{.init = 1e37, .interval = 3});
    CHECK(baton::testing::split_invariant(scaled, test::new_state(), {Time::batches(2), Time::batches(3)}));
    CHECK(baton::testing::resume_invariant(scaled, test::new_state(), Time::batches(5)));
  }
  SECTION("the scale round-trips through a checkpoint, which is version 3 only then") {
    test::TempDir dir;
    auto s = test::new_state();
    REQUIRE(baton::save_checkpoint(s, dir.path / "plain.ckpt"));
    CHECK(baton::read_checkpoint_info(dir.path / "plain.ckpt")->format_version == 2);
    s.loss_scale = baton::LossScaleState{.scale = 3072.0, .growth_tracker = 17, .skipped = 5};
    REQUIRE(baton::save_checkpoint(s, dir.path / "scaled.ckpt"));
    CHECK(baton::read_checkpoint_info(dir.path / "scaled.ckpt")->format_version == 3);
    const auto back = baton::load_checkpoint(dir.path / "scaled.ckpt", test::bn_dropout_mlp());
    REQUIRE(back.has_value());
    REQUIRE(back->loss_scale.has_value());
    CHECK(*back->loss_scale == *s.loss_scale);
    CHECK(baton::bitwise_equal(*back, s));
  }
  SECTION("bad settings are named") {
    const auto bad = spec.with_loss_scaling(baton::LossScaling{.init = 0, .growth = 1, .backoff = 1.5, .interval = 0}).validate();
    REQUIRE_FALSE(bad);
    for (const char* field : {"loss_scaling.init", "loss_scaling.growth", "loss_scaling.backoff", "loss_scaling.interval"})
      CHECK_THAT(bad.error().message, Catch::Contains(field));
    const auto fp16 = spec.with_precision(Precision::fp16).validate();
    REQUIRE_FALSE(fp16);
    CHECK_THAT(fp16.error().message, Catch::Contains("fp16 needs a CUDA device"));
  }
}

namespace {
/// A model whose forward uses put_ (no deterministic implementation in LibTorch).
struct PutNetImpl : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  PutNetImpl() { fc = register_module("fc", torch::nn::Linear(8, 4)); }
  torch::Tensor forward(torch::Tensor x) {
    auto y = fc->forward(x);
    auto mask = torch::zeros_like(y);
    mask.put_(torch::tensor({0}), torch::tensor({1.0f}));
    return y + mask;
  }
};
TORCH_MODULE(PutNet);
}  // namespace

TEST_CASE("deterministic mode names an op without a deterministic implementation, and ends with the fit",
          "[precision][deterministic]") {
  const auto& data = test::blobs(128);
  auto s = baton::init_state(baton::model_factory([] { return PutNet(); }), {.seed = 1, .max_duration = Time::epochs(1)});
  REQUIRE(s);
  const auto spec = test::spec(data, Time::epochs(1));
  const auto failed = baton::fit(spec.with_deterministic(true), *s);
  REQUIRE_FALSE(failed);
  CHECK(failed.error().code == baton::ErrorCode::invalid_spec);
  CHECK_THAT(failed.error().message, Catch::Contains("deterministic = true, but put_ has no deterministic implementation"));
  CHECK(ok(baton::fit(spec, *s)).time.epoch == 1);  // the process setting went back when that fit ended
  // A model without such ops trains the same bits with the setting on.
  CHECK(baton::bitwise_equal(ok(baton::fit(test::spec(data, Time::epochs(1)).with_deterministic(true), test::new_state())),
                             ok(baton::fit(test::spec(data, Time::epochs(1)), test::new_state()))));
}

namespace {
const char* kPrecisionCurriculum = R"(
[run]
name = "p"
seed = 5
max_duration = "3ep"

[model]
name = "mlp"
widths = [8, 16, 4]

[datasets.train]
kind = "synthetic"
samples = 200
seed = 2

[defaults]
batch_size = 32
precision = "bf16"
memory_format = "channels_last"
deterministic = true

[[stages]]
name = "a"
duration = "1ep"
loss_scaling = { init = 1024.0, interval = 10 }

[[stages]]
name = "b"
duration = "1ep"
precision = "fp32"
loss_scaling = true

[[stages]]
name = "c"
duration = "1ep"
memory_format = "auto"
deterministic = false
)";
}  // namespace

TEST_CASE("precision, memory format, determinism and loss scaling are stage keys", "[precision][hparams]") {
  auto cur = baton::parse_curriculum(kPrecisionCurriculum, "p.toml");
  REQUIRE(cur);
  const auto a = cur->stages()[0].build(), b = cur->stages()[1].build(), c = cur->stages()[2].build();
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  CHECK(a->precision == Precision::bf16);
  CHECK(a->memory_format == MemoryFormat::channels_last);
  CHECK(a->deterministic);
  REQUIRE(a->loss_scaling);
  CHECK(a->loss_scaling->init == 1024.0);
  CHECK(a->loss_scaling->interval == 10);
  CHECK(a->loss_scaling->growth == 2.0);  // the rest keep their defaults
  CHECK(b->precision == Precision::fp32);
  REQUIRE(b->loss_scaling);
  CHECK(b->loss_scaling->init == 65536.0);
  CHECK(c->precision == Precision::fp32);  // as every inheritable key: from the stage before
  CHECK(c->memory_format == MemoryFormat::automatic);
  CHECK_FALSE(c->deterministic);
  CHECK(c->loss_scaling);
  // and the whole curriculum trains
  auto s = ok(cur->init());
  for (const auto& spec : {*a, *b, *c}) s = ok(baton::fit(spec, std::move(s)));
  CHECK(s.finished());
  REQUIRE(s.loss_scale);  // kept from stage b, which scaled
}

TEST_CASE("bad precision settings in TOML say what and where", "[precision][hparams]") {
  auto build = [](const std::vector<std::string>& sets) {
    auto cur = baton::parse_curriculum(kPrecisionCurriculum, "p.toml", sets);
    REQUIRE(cur);
    return cur->stages()[0].build();
  };
  const auto fp8 = build({"defaults.precision=fp8"});
  REQUIRE_FALSE(fp8);
  CHECK_THAT(fp8.error().message, Catch::Contains("precision: \"fp8\" is not one of fp32, bf16, fp16"));
  const auto fp16 = build({"defaults.precision=fp16"});
  REQUIRE_FALSE(fp16);
  CHECK_THAT(fp16.error().message, Catch::Contains("p.toml (from --set") && Catch::Contains("fp16 needs a CUDA device"));
  const auto key = build({"stage.a.loss_scaling.intervall=3"});
  REQUIRE_FALSE(key);
  CHECK_THAT(key.error().message, Catch::Contains("loss_scaling") && Catch::Contains("intervall"));
  const auto value = build({"stage.a.loss_scaling.backoff=2.0"});
  REQUIRE_FALSE(value);
  CHECK_THAT(value.error().message, Catch::Contains("loss_scaling.backoff: must be in (0, 1), got 2"));
}
