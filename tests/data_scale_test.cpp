// Data that does not fit in memory (#18): lazy datasets, transforms, worker threads and
// prefetch, packed shards and `baton pack`, all giving the bits of the in-memory loop.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "helpers.hpp"
#include "process.hpp"

namespace fs = std::filesystem;

namespace {

baton::TrainingSpec with_workers(baton::TrainingSpec s, int workers, int prefetch = 2) {
  auto d = s.data;
  d.workers = workers, d.prefetch = prefetch;
  return s.with_data(d);
}

/// A lazy dataset computed from the index alone (no memory held), with a failure at `bad`.
class IndexSource final : public baton::Source {
 public:
  IndexSource(std::int64_t n, std::int64_t features, std::int64_t bad = -1) : n_(n), f_(features), bad_(bad) {}
  std::int64_t size() const override { return n_; }
  std::vector<std::int64_t> input_shape() const override { return {f_}; }
  std::int64_t classes() const override { return 4; }
  baton::Expected<baton::Batch> batch(const torch::Tensor& idx, const baton::SampleContext&) const override {
    const auto i = idx.to(torch::kLong);
    if (bad_ >= 0 && i.eq(bad_).any().item<bool>())
      return baton::fail(baton::ErrorCode::data, "sample " + std::to_string(bad_) + " cannot be read");
    const auto y = i.remainder(4);
    const auto cols = torch::arange(f_, torch::kFloat32);
    const auto x = torch::sin(i.to(torch::kFloat32).unsqueeze(1) * 0.37 + cols * 0.11) + y.to(torch::kFloat32).unsqueeze(1) * 0.5;
    return baton::Batch{x, y};
  }

 private:
  std::int64_t n_, f_, bad_;
};

fs::path packed(const test::TempDir& dir, const baton::Dataset& d, const std::string& name, baton::data::PackOptions o = {}) {
  const auto out = dir.path / name;
  auto sum = baton::data::pack(d, out, o);
  if (!sum) FAIL(sum.error().to_string());
  REQUIRE(sum->samples == d.size());
  return out;
}

/// The params_sha256 of a run directory's final state (`baton inspect`).
std::string final_sha(const fs::path& run_dir) {
  auto r = test::shell(fmt::format("{} inspect {}", BATON_EXE, (run_dir / "final.baton").string()));
  REQUIRE(r.rc == 0);
  return nlohmann::json::parse(r.out).at("params_sha256").get<std::string>();
}

baton::Dataset open(const fs::path& dir) {
  auto d = baton::data::shards(dir);
  if (!d) FAIL(d.error().to_string());
  return *d;
}

}  // namespace

TEST_CASE("a packed dataset reads back the same samples and trains the same bits as in memory", "[data_scale]") {
  test::TempDir dir;
  const auto data = test::blobs(1000);
  const auto shards = open(packed(dir, data, "blobs", {.records_per_shard = 300, .pixels = {}}));
  REQUIRE(shards.lazy());
  REQUIRE(shards.size() == 1000);
  REQUIRE(shards.input_shape() == std::vector<std::int64_t>{8});
  REQUIRE(shards.classes() == data.classes());
  auto all = baton::data::materialize(shards);
  REQUIRE(all.has_value());
  REQUIRE(torch::equal(all->inputs, data.inputs));
  REQUIRE(torch::equal(all->targets, data.targets));

  const auto spec = test::spec(data, baton::Time::epochs(2));
  const auto a = test::ok(baton::fit(spec, test::new_state()));
  const auto b = test::ok(baton::fit(spec.with_train_data(shards), test::new_state()));
  test::require_same_bits(a, b);
  // eval reads lazy sets too, with the same results.
  const baton::EvalSpec es{.sets = {{"d", data}}};
  baton::EvalSpec es_lazy{.sets = {{"d", shards}}};
  REQUIRE(baton::eval(es, a)->at("d").at("loss") == baton::eval(es_lazy, a)->at("d").at("loss"));
}

TEST_CASE("any number of workers and any prefetch depth give the same bits", "[data_scale]") {
  test::TempDir dir;
  const auto data = test::blobs(1000);
  const auto shards = open(packed(dir, data, "blobs"));
  const auto spec = test::spec(shards, baton::Time::epochs(2));
  const auto ref = test::ok(baton::fit(spec, test::new_state()));
  for (const auto& [workers, prefetch] : std::vector<std::pair<int, int>>{{1, 1}, {2, 2}, {3, 4}}) {
    INFO(workers << " workers, prefetch " << prefetch);
    test::require_same_bits(ref, test::ok(baton::fit(with_workers(spec, workers, prefetch), test::new_state())));
  }
  // In-memory data through workers too.
  test::require_same_bits(ref, test::ok(baton::fit(with_workers(test::spec(data, baton::Time::epochs(2)), 2), test::new_state())));
}

TEST_CASE("a run split into fits mid-epoch, with workers and prefetch, gives the bits of one fit", "[data_scale]") {
  test::TempDir dir;
  const auto shards = open(packed(dir, test::blobs(1000), "blobs"));
  const auto spec = with_workers(test::spec(shards, baton::Time::epochs(2)), 2, 3);
  const auto whole = test::ok(baton::fit(spec, test::new_state()));
  auto s = test::new_state();
  for (const auto budget : {baton::Time::batches(7), baton::Time::batches(30), baton::Time::samples(100)})
    s = test::ok(baton::fit(spec, std::move(s), budget));
  // and through a checkpoint on disk, resumed by a fit with other workers
  const auto file = dir.path / "mid.baton";
  REQUIRE(baton::save_checkpoint(s, file).has_value());
  auto loaded = baton::load_checkpoint(file, test::bn_dropout_mlp());
  if (!loaded) FAIL(loaded.error().to_string());
  const auto rest = test::ok(baton::fit(with_workers(spec, 1, 1), std::move(*loaded)));
  test::require_same_bits(whole, rest);
}

TEST_CASE("a lazy source of your own trains the bits of its samples held in memory", "[data_scale]") {
  const auto lazy = baton::make_dataset(std::make_shared<IndexSource>(700, 8), "index");
  auto in_memory = baton::data::materialize(lazy);
  REQUIRE(in_memory.has_value());
  REQUIRE_FALSE(in_memory->lazy());
  const auto a = test::ok(baton::fit(test::spec(*in_memory, baton::Time::epochs(2)), test::new_state()));
  const auto b = test::ok(baton::fit(with_workers(test::spec(lazy, baton::Time::epochs(2)), 2), test::new_state()));
  test::require_same_bits(a, b);
  // slices and held-out parts of a lazy dataset stay lazy and hold the same samples
  auto part = baton::data::slice(lazy, 100, 50);
  REQUIRE(part.has_value());
  REQUIRE(part->lazy());
  REQUIRE(torch::equal(baton::data::materialize(*part)->inputs, in_memory->inputs.narrow(0, 100, 50)));
  auto held = baton::data::hold_out(lazy, {.fraction = 0.2, .seed = 3});
  auto held_mem = baton::data::hold_out(*in_memory, {.fraction = 0.2, .seed = 3});
  REQUIRE(held.has_value());
  REQUIRE(torch::equal(baton::data::materialize(held->val)->inputs, held_mem->val.inputs));
  REQUIRE(torch::equal(baton::data::materialize(held->train)->targets, held_mem->train.targets));
}

TEST_CASE("a dataset's error in a worker stops the fit with an error naming the sample", "[data_scale]") {
  const auto lazy = baton::make_dataset(std::make_shared<IndexSource>(700, 8, 613), "broken");
  for (const int workers : {0, 2}) {
    INFO(workers << " workers");
    auto r = baton::fit(with_workers(test::spec(lazy, baton::Time::epochs(1)), workers), test::new_state());
    REQUIRE_FALSE(r.has_value());
    const auto msg = r.error().to_string();
    INFO(msg);
    REQUIRE(r.error().code == baton::ErrorCode::data);
    REQUIRE(msg.find("sample 613 cannot be read") != std::string::npos);
    REQUIRE(msg.find("dataset \"broken\"") != std::string::npos);
    REQUIRE(msg.find("the batch at epoch 0, sample ") != std::string::npos);
  }
}

TEST_CASE("per-sample transforms draw from (seed, epoch, index): the same bits with any workers", "[data_scale]") {
  const auto data = test::images(300);
  const auto flipped = baton::data::transform(
      data,
      [](const torch::Tensor& x, at::Generator& g) {
        const bool flip = torch::rand({1}, g).item<double>() < 0.5;
        return (flip ? x.flip({-1}) : x) + torch::randn(x.sizes(), g) * 0.01;
      },
      "flip-noise");
  REQUIRE(flipped.lazy());
  REQUIRE(flipped.input_shape() == std::vector<std::int64_t>{1, 8, 8});
  // a sample's result depends on the epoch, not on the batch it comes in
  const auto idx = torch::tensor({5, 9}, torch::kLong);
  const auto e0 = flipped.gather(idx, {1, 0}), e0_alone = flipped.gather(torch::tensor({9}, torch::kLong), {1, 0});
  const auto e1 = flipped.gather(idx, {1, 1});
  REQUIRE(torch::equal(e0->inputs[1], e0_alone->inputs[0]));
  REQUIRE_FALSE(torch::equal(e0->inputs, e1->inputs));
  auto spec = test::spec(flipped, baton::Time::epochs(2));
  auto new_cnn = [] { return *baton::init_state(test::tiny_cnn(), {.seed = 2, .max_duration = baton::Time::epochs(2)}); };
  const auto a = test::ok(baton::fit(spec, new_cnn()));
  const auto b = test::ok(baton::fit(with_workers(spec, 3), new_cnn()));
  test::require_same_bits(a, b);
  // and the transform changed training (it is applied)
  const auto plain = test::ok(baton::fit(spec.with_train_data(data), new_cnn()));
  REQUIRE_FALSE(baton::bitwise_equal(a, plain));
}

TEST_CASE("Fashion-MNIST packed as 8-bit pixels reads back the IDX loader's exact inputs", "[data_scale]") {
  test::TempDir dir;
  auto test_set = baton::data::fashion_mnist(baton::Split::test);
  REQUIRE(test_set.has_value());
  const auto out = packed(dir, *test_set, "fm", {.records_per_shard = 4096, .pixels = baton::data::ImageOptions{}});
  std::int64_t bytes = 0;
  for (const auto& e : fs::directory_iterator(out)) bytes += static_cast<std::int64_t>(e.file_size());
  REQUIRE(bytes < 10000 * (784 + 8) + 4096);  // pixels as bytes: a quarter of float32
  const auto shards = open(out);
  auto back = baton::data::materialize(shards);
  REQUIRE(torch::equal(back->inputs, test_set->inputs));
  REQUIRE(torch::equal(back->targets, test_set->targets));
  REQUIRE(shards.classes() == 10);
  // Inputs that are not such pixels cannot be packed as pixels: the error names the sample.
  auto r = baton::data::pack(test::blobs(50), dir.path / "not-pixels", {.pixels = baton::data::ImageOptions{}});
  REQUIRE_FALSE(r.has_value());
  REQUIRE(r.error().message.find("sample 0 is not 8-bit pixels") != std::string::npos);
  REQUIRE_FALSE(fs::exists(dir.path / "not-pixels"));
}

TEST_CASE("damaged shards are clear errors naming the file", "[data_scale]") {
  test::TempDir dir;
  const auto src = packed(dir, test::blobs(500), "blobs", {.records_per_shard = 200, .pixels = {}});
  auto copy = [&](const std::string& name) {
    const auto d = dir.path / name;
    fs::copy(src, d);
    return d;
  };
  SECTION("a truncated shard") {
    const auto d = copy("truncated");
    fs::resize_file(d / "shard-00001.bin", fs::file_size(d / "shard-00001.bin") - 10);
    auto r = baton::data::shards(d);
    REQUIRE_FALSE(r.has_value());
    INFO(r.error().message);
    REQUIRE(r.error().message.find("shard-00001.bin") != std::string::npos);
    REQUIRE(r.error().message.find("truncated") != std::string::npos);
  }
  SECTION("a flipped byte: wrong checksum") {
    const auto d = copy("flipped");
    {
      std::fstream f(d / "shard-00002.bin", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(100);
      f.put('\x5a');
    }
    auto r = baton::data::shards(d);
    REQUIRE_FALSE(r.has_value());
    INFO(r.error().message);
    REQUIRE(r.error().message.find("shard-00002.bin: wrong checksum") != std::string::npos);
    // Without verification the damage goes unseen: which is why it is on by default.
    REQUIRE(baton::data::shards(d, {.verify = false}).has_value());
  }
  SECTION("a shard cut while it is open: said so, not a stale errno") {
    const auto d = copy("cut");
    auto opened = baton::data::shards(d);
    REQUIRE(opened.has_value());
    fs::resize_file(d / "shard-00000.bin", 16);
    const auto b = opened->gather(torch::zeros({1}, torch::kLong));
    REQUIRE_FALSE(b.has_value());
    CHECK_THAT(b.error().message, Catch::Contains("the file was cut after it was opened") &&
                                      !Catch::Contains("No such file"));
  }
  SECTION("a missing shard, a broken manifest, an existing output") {
    const auto d = copy("missing");
    fs::remove(d / "shard-00000.bin");
    auto r = baton::data::shards(d);
    REQUIRE_FALSE(r.has_value());
    REQUIRE(r.error().message.find("shard-00000.bin") != std::string::npos);
    std::ofstream(d / "shards.json") << "{\"format\": \"baton-shards\", \"version\": 1, \"samples\": -3}";
    r = baton::data::shards(d);
    REQUIRE_FALSE(r.has_value());
    REQUIRE(r.error().message.find("shards.json: not a valid shard manifest") != std::string::npos);
    // Not JSON at all: where, in baton's words, not the JSON library's.
    std::ofstream(d / "shards.json", std::ios::trunc) << "{\"format\": \"baton-shards\",";
    r = baton::data::shards(d);
    REQUIRE_FALSE(r.has_value());
    CHECK_THAT(r.error().message, Catch::Contains("not a valid shard manifest: not JSON (a syntax error at byte") &&
                                      !Catch::Contains("json.exception"));
    auto again = baton::data::pack(test::blobs(10), src);
    REQUIRE_FALSE(again.has_value());
    REQUIRE(again.error().message.find("already exists") != std::string::npos);
  }
}

TEST_CASE("baton pack writes a curriculum's dataset and a run trains from the shards", "[data_scale][cli]") {
  test::TempDir dir;
  std::ofstream(dir.path / "c.toml") << R"(
[run]
name = "packed"
seed = 4
max_duration = "2ep"
[model]
name = "mlp"
widths = [8, 16, 4]
[datasets.train]
kind = "synthetic"
samples = 500
[datasets.packed]
kind = "shards"
dir = "train.shards"
[defaults]
batch_size = 25
workers = 2
optimizer = { name = "adam", lr = 0.01 }
[[stages]]
name = "main"
duration = "2ep"
data = "packed"
)";
  auto p = test::shell(fmt::format("cd {} && {} pack c.toml train -o train.shards --records-per-shard 128", dir.path.string(), BATON_EXE));
  INFO(p.out);
  REQUIRE(p.rc == 0);
  REQUIRE(p.out.find("500 samples") != std::string::npos);
  REQUIRE(fs::exists(dir.path / "train.shards" / "shard-00003.bin"));
  auto packed_run = test::shell(fmt::format("{} run {} --set run.run_dir={}", BATON_EXE, (dir.path / "c.toml").string(),
                                            (dir.path / "a").string()));
  INFO(packed_run.out);
  REQUIRE(packed_run.rc == 0);
  auto memory_run = test::shell(fmt::format("{} run {} --set run.run_dir={} --set stage.main.data=train --set defaults.workers=0",
                                            BATON_EXE, (dir.path / "c.toml").string(), (dir.path / "b").string()));
  INFO(memory_run.out);
  REQUIRE(memory_run.rc == 0);
  auto sha = [&](const char* run) { return final_sha(dir.path / run); };
  REQUIRE(sha("a") == sha("b"));
}

TEST_CASE("one epoch on packed data four times the memory it may use keeps resident memory below that", "[data_scale][memory]") {
  // 1.5 GiB of float32 features in shards; the training process (LibTorch's code and the model
  // alone take ~180 MiB) must stay under 384 MiB resident. Measured: 211 MiB.
  constexpr std::int64_t kFeatures = 1024, kSamples = 393216;
  constexpr long kCapKiB = 384 * 1024;
  test::TempDir dir;
  const auto lazy = baton::make_dataset(std::make_shared<IndexSource>(kSamples, kFeatures), "big");
  const auto out = packed(dir, lazy, "big");
  std::ofstream(dir.path / "big.toml") << fmt::format(R"(
[run]
name = "big"
seed = 1
max_duration = "1ep"
run_dir = "{}"
[model]
name = "mlp"
widths = [{}, 16, 4]
[datasets.big]
kind = "shards"
dir = "{}"
[[stages]]
name = "one"
duration = "1ep"
data = "big"
batch_size = 512
workers = 2
optimizer = {{ name = "sgd", lr = 0.01 }}
)", (dir.path / "run").string(), kFeatures, out.string());
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::execl(BATON_EXE, BATON_EXE, "run", (dir.path / "big.toml").c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  struct rusage ru {};
  REQUIRE(::wait4(pid, &status, 0, &ru) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  INFO("peak resident memory " << ru.ru_maxrss / 1024 << " MiB for " << (kSamples * (kFeatures * 4 + 8)) / (1 << 20)
                               << " MiB of data");
  CHECK(ru.ru_maxrss < kCapKiB);
  REQUIRE(kSamples * kFeatures * 4 >= 4 * kCapKiB * 1024);
}

TEST_CASE("Ctrl-C while workers prefetch from shards checkpoints, and the resumed run gives the same bits", "[data_scale][cli][resume]") {
  test::TempDir dir;
  std::ofstream(dir.path / "long.toml") << R"(
[run]
name = "long"
seed = 11
max_duration = "4ep"
checkpoint_every = "40ba"
[model]
name = "mlp"
widths = [32, 256, 256, 4]
[datasets.source]
kind = "synthetic"
samples = 4000
features = 32
[datasets.train]
kind = "shards"
dir = "train.shards"
[defaults]
batch_size = 25
workers = 2
prefetch = 4
optimizer = { name = "adam", lr = 0.002 }
[[stages]]
name = "first"
duration = "4ep"
)";
  const auto file = (dir.path / "long.toml").string();
  REQUIRE(test::shell(fmt::format("{} pack {} source -o {}", BATON_EXE, file, (dir.path / "train.shards").string())).rc == 0);
  const auto whole = test::shell(fmt::format("{} run {} --run-dir {}", BATON_EXE, file, (dir.path / "whole").string()));
  REQUIRE(whole.rc == 0);
  auto child = test::spawn(BATON_EXE, {"run", file, "--run-dir", (dir.path / "cut").string()});
  std::string log;
  REQUIRE(test::read_until(child, "[first] epoch 1 batch", log));
  ::kill(child.pid, SIGINT);
  const int rc = test::finish(child, log);
  INFO(log);
  CHECK(rc == 3);
  const auto resumed = test::shell(fmt::format("{} run {} --run-dir {}", BATON_EXE, file, (dir.path / "cut").string()));
  INFO(resumed.out);
  REQUIRE(resumed.rc == 0);
  CHECK_THAT(resumed.out, Catch::Contains("resuming from"));
  auto sha = [&](const char* run) { return final_sha(dir.path / run); };
  CHECK(sha("cut") == sha("whole"));
}
