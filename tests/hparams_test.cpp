// TOML curricula: builders, inheritance, overrides, and equality with the same curriculum in C++.
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "helpers.hpp"
#include <baton/checkpoint.hpp>
#include <baton/hparams.hpp>

using baton::Time;
using test::ok;

namespace {
const char* kTwoStages = R"(
[run]
name = "two"
seed = 5
max_duration = "3ep"

[model]
name = "mlp"
widths = [8, 16, 4]

[datasets.train]
kind = "synthetic"
samples = 600
seed = 2

[defaults]
batch_size = 32
optimizer = { name = "sgd", lr = 0.05, momentum = 0.9 }

[[stages]]
name = "warmup"
duration = "1ep"
schedule = { name = "linear", from = 0.2, to = 1.0, over = "1dur" }
clock = "stage"

[[stages]]
name = "main"
duration = "2ep"
optimizer = { lr = 0.02 }
schedule = { name = "cosine", to = 0.1 }
clock = "run"
)";

baton::Curriculum parse(const std::string& text, const std::vector<std::string>& sets = {}) {
  auto cur = baton::parse_curriculum(text, "test.toml", sets);
  if (!cur) FAIL(cur.error().to_string());
  return *cur;
}

baton::TrainState run_all(const baton::Curriculum& cur) {
  auto state = ok(cur.init());
  for (const auto& stage : cur.stages()) {
    auto spec = stage.build();
    if (!spec) FAIL(spec.error().to_string());
    state = ok(baton::fit(*spec, std::move(state)));
  }
  return state;
}
}  // namespace

TEST_CASE("a TOML curriculum and the same curriculum in C++ give the same bits", "[hparams]") {
  const auto cur = parse(kTwoStages);
  const auto from_toml = run_all(cur);

  auto train = cur.dataset("train");
  REQUIRE(train);
  const baton::TrainingSpec warmup{
      .name = "warmup",
      .data = {.train = *train, .batch_size = 32},
      .optimizer = baton::optim::sgd({.lr = 0.05, .momentum = 0.9}),
      .schedule = baton::schedule::linear(0.2, 1.0, Time::fraction(1.0)),
      .schedule_clock = baton::Clock::stage,
      .duration = Time::epochs(1),
  };
  const auto main_stage = warmup.with_name("main")
                              .with_lr(0.02)
                              .with_schedule(baton::schedule::cosine(Time::fraction(1.0), 0.1), baton::Clock::run)
                              .with_duration(Time::epochs(2));
  auto init = baton::init_state(baton::models::mlp({8, 16, 4}), {.seed = 5, .max_duration = Time::epochs(3)});
  REQUIRE(init);
  const auto in_cpp = ok(baton::fit(warmup, std::move(*init)).and_then(baton::stage(main_stage)));
  REQUIRE(baton::bitwise_equal(from_toml, in_cpp));
  CHECK(baton::params_sha256(from_toml) == baton::params_sha256(in_cpp));
  CHECK(from_toml.history.size() == 2);
}

TEST_CASE("stages inherit from defaults and earlier stages -- optimizer tables merge by name", "[hparams]") {
  const auto cur = parse(std::string(kTwoStages) + R"(
[[stages]]
name = "inherits"
duration = "1ba"

[[stages]]
name = "new-optimizer"
duration = "1ba"
optimizer = { name = "adam", lr = 1e-3 }
)", {"run.max_duration=10ep"});
  REQUIRE(cur.stages().size() == 4);
  auto main_stage = *cur.stages()[1].build();
  const auto& sgd = main_stage.optimizer.rule;
  CHECK(sgd.name == "sgd");
  CHECK(sgd.lr == 0.02);                                           // the stage's own value
  CHECK_THAT(sgd.identity, Catch::Contains("momentum=0.9,"));       // merged from [defaults]: same optimizer name
  auto inherits = *cur.stages()[2].build();
  CHECK(inherits.optimizer.lr() == 0.02);  // from the previous stage
  CHECK(inherits.schedule_clock == baton::Clock::run);
  CHECK(inherits.data.batch_size == 32);
  CHECK(inherits.optimizer_carry == baton::Carry::keep);  // per stage, not inherited
  auto adam = *cur.stages()[3].build();
  CHECK(adam.optimizer.kind() == "adam");  // another optimizer: sgd's momentum does not carry over
  CHECK(adam.optimizer.lr() == 1e-3);
}

TEST_CASE("overrides (--set) use the file's paths and the file's types", "[hparams]") {
  const auto cur = parse(kTwoStages, {"stage.main.optimizer.lr=1e-3", "defaults.batch_size=16", "run.seed=9",
                                      "stage.warmup.duration=2ba", "datasets.train.samples=100"});
  CHECK(cur.run().seed == 9);
  auto warm = *cur.stages()[0].build();
  CHECK(warm.duration == Time::batches(2));
  CHECK(warm.data.batch_size == 16);
  CHECK(warm.data.train.size() == 100);
  CHECK(cur.stages()[1].build()->optimizer.lr() == 1e-3);
  auto bad = baton::parse_curriculum(kTwoStages, "test.toml", {"stage.mian.optimizer.lr=1", "nonsense", "weird.path=1"});
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Catch::Contains("no stage \"mian\" (did you mean \"main\"?)") &&
                                      Catch::Contains("expected path=value") && Catch::Contains("paths start with"));
  auto typed = baton::parse_curriculum(kTwoStages, "test.toml", {"defaults.batch_size=big"});
  REQUIRE(typed);
  auto built = typed->stages()[0].build();
  REQUIRE_FALSE(built);
  CHECK_THAT(built.error().message, Catch::Contains("batch_size: expected an integer, got a string"));
}

TEST_CASE("builders are partially applied: every change returns a new builder", "[hparams]") {
  const auto cur = parse(kTwoStages);
  const auto& original = cur.stages()[1];
  const auto changed = original.set("optimizer.lr", 0.5).set("batch_size", 8);
  INFO(changed.to_toml());
  REQUIRE(changed.build());
  CHECK(original.build()->optimizer.lr() == 0.02);
  CHECK(changed.build()->optimizer.lr() == 0.5);
  CHECK(changed.build()->data.batch_size == 8);
  // Literals as a user writes them: an int, a string literal, 0 (an int, not a null pointer).
  const auto literal = original.set("duration", "3ba").set("optimizer.momentum", 0);
  INFO(literal.to_toml());
  REQUIRE(literal.build());
  CHECK(literal.build()->duration == baton::Time::batches(3));
  // The resolved configuration parses back to the same curriculum.
  auto again = baton::parse_curriculum(cur.resolved_toml(), "resolved.toml");
  INFO(cur.resolved_toml());
  REQUIRE(again);
  CHECK(again->fingerprint() == cur.fingerprint());
  auto mine = *baton::make_dataset(torch::randn({50, 8}), torch::zeros({50}, torch::kLong), "mine");
  const auto bound = original.with_dataset("train", mine).with([](baton::TrainingSpec s) { return s.with_name("renamed"); });
  CHECK(bound.build()->data.train.size() == 50);
  CHECK(bound.build()->name == "renamed");
  CHECK(original.build()->data.train.size() == 600);
  // A user's own model instead of the file's.
  const auto own = cur.with_model(baton::models::mlp({8, 3, 4}));
  CHECK(own.init()->named_parameters().front().second.size(0) == 3);
  CHECK(cur.init()->named_parameters().front().second.size(0) == 16);
}

TEST_CASE("registries: a model of your own, and CSV tables", "[hparams]") {
  auto registry = baton::Registry::builtin();
  registry.models["linear"] = baton::ModelEntry{{"out"}, [](const baton::Params& p) -> baton::Expected<baton::ModelFactory> {
    const auto out = static_cast<std::int64_t>(std::get<double>(p.at("out")));
    return baton::model_factory([out] { return torch::nn::Linear(3, out); });
  }, "linear: out"};
  const auto dir = std::filesystem::temp_directory_path() / ("baton-csv-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream csv(dir / "t.csv");
    csv << "a,b,c,label\n";
    for (int i = 0; i < 40; ++i) csv << i % 3 << "," << i % 5 << "," << (i % 7) * 0.5 << "," << i % 2 << "\n";
  }
  const std::string text = fmt::format(R"(
[run]
max_duration = "2ep"
[model]
name = "linear"
out = 2
[datasets.train]
kind = "csv"
path = "{}"
target = "label"
[[stages]]
name = "only"
duration = "2ep"
batch_size = 8
)", (dir / "t.csv").string());
  auto cur = baton::parse_curriculum(text, "csv.toml", {}, registry);
  REQUIRE(cur);
  REQUIRE(cur->validate());
  auto spec = cur->stages()[0].build();
  REQUIRE(spec);
  CHECK(spec->data.train.inputs.sizes() == torch::IntArrayRef{40, 3});
  CHECK(spec->data.train.targets.scalar_type() == torch::kLong);
  auto trained = baton::fit(*spec, *cur->init());
  REQUIRE(trained);
  CHECK(trained->time.batch == 10);
  {
    std::ofstream bad(dir / "t.csv", std::ios::app);
    bad << "1,x,2,0\n";
  }
  auto broken = baton::parse_curriculum(text, "csv.toml", {}, registry);
  REQUIRE(broken);
  auto v = broken->validate();
  REQUIRE_FALSE(v);
  CHECK_THAT(v.error().message, Catch::Contains("t.csv:42") && Catch::Contains("\"x\" is not a number"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a relative data path in a curriculum file starts at the file's directory, not the working directory",
          "[hparams][files]") {
  test::TempDir tmp;
  std::filesystem::create_directories(tmp.path / "exp" / "data");
  std::ofstream(tmp.path / "exp" / "data" / "d.csv") << "a,b,y\n1,2,0\n3,4,1\n5,6,0\n";
  std::ofstream(tmp.path / "exp" / "c.toml") << R"([run]
max_duration = "1ep"
[model]
name = "mlp"
widths = [2, 4, 2]
[datasets.train]
kind = "csv"
path = "data/d.csv"
[defaults]
data = "train"
batch_size = 2
optimizer = { name = "sgd", lr = 0.1 }
[[stages]]
name = "only"
duration = "1ep"
)";
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(tmp.path);  // elsewhere than the file: exp/ is below
  auto cur = baton::load_curriculum(tmp.path / "exp" / "c.toml");
  std::filesystem::current_path(cwd);
  if (!cur) FAIL(cur.error().to_string());
  const auto ds = cur->dataset("train");
  INFO((ds ? std::string() : ds.error().to_string()));
  REQUIRE(ds);
  CHECK(ds->size() == 3);
  // The resolved configuration keeps the path as written (the fingerprint does not depend on
  // where the file lies).
  CHECK_THAT(cur->resolved_toml(), Catch::Contains("path = 'data/d.csv'") || Catch::Contains("path = \"data/d.csv\""));

  // The same data with CRLF line ends (a file saved on Windows) reads the same.
  std::ofstream(tmp.path / "exp" / "data" / "crlf.csv", std::ios::binary) << "a,b,y\r\n1,2,0\r\n3,4,1\r\n5,6,0\r\n";
  const auto crlf = baton::data::csv({.path = tmp.path / "exp" / "data" / "crlf.csv", .target = ""});
  INFO((crlf ? std::string() : crlf.error().to_string()));
  REQUIRE(crlf);
  CHECK(crlf->inputs.equal(ds->inputs));
  CHECK(crlf->targets.equal(ds->targets));
}

TEST_CASE("the resolved configuration prints floats as written, not with 17 digits", "[hparams]") {
  auto cur = baton::parse_curriculum(R"([run]
max_duration = "1ep"
[model]
name = "mlp"
widths = [2, 4, 2]
[datasets.train]
kind = "synthetic"
features = 2
classes = 2
[defaults]
data = "train"
batch_size = 2
optimizer = { name = "sgd", lr = 0.05, momentum = 0.9, weight_decay = 0.0002 }
[[stages]]
name = "only"
duration = "1ep"
)", "floats.toml");
  if (!cur) FAIL(cur.error().to_string());
  const auto text = cur->resolved_toml();
  INFO(text);
  CHECK_THAT(text, Catch::Contains("lr = 0.05") && Catch::Contains("weight_decay = 2e-04"));  // shortest round trip
  CHECK_THAT(text, !Catch::Contains("0000000"));
}

TEST_CASE("every dataset kind takes offset, limit and a held-out part, equal to the C++ functions", "[hparams][split]") {
  const std::string head = R"(
[run]
name = "split"
max_duration = "1ep"
[model]
name = "mlp"
widths = [8, 4]
[datasets.all]
kind = "synthetic"
samples = 300
seed = 3
)";
  const std::string parts = R"(
[datasets.train]
kind = "synthetic"
samples = 300
seed = 3
offset = 20
limit = 200
holdout = { fraction = 0.25, seed = 9, part = "train" }
[datasets.val]
kind = "synthetic"
samples = 300
seed = 3
offset = 20
limit = 200
holdout = { fraction = 0.25, seed = 9, part = "val" }
)";
  const std::string stage = R"(
[[stages]]
name = "a"
duration = "1ep"
data = "train"
eval = { sets = ["val"] }
)";
  const auto value = [](auto r) {
    if (!r) FAIL(r.error().to_string());
    return *r;
  };
  const auto cur = parse(head + parts + stage);
  const auto all = value(cur.dataset("all"));
  const auto expected = value(baton::data::hold_out(value(baton::data::slice(all, 20, 200)), {.fraction = 0.25, .seed = 9}));
  const auto train = value(cur.dataset("train"));
  const auto val = value(cur.dataset("val"));
  CHECK(train.size() == 150);
  CHECK(val.size() == 50);
  CHECK(torch::equal(train.inputs, expected.train.inputs));
  CHECK(torch::equal(train.targets, expected.train.targets));
  CHECK(torch::equal(val.inputs, expected.val.inputs));
  CHECK(torch::equal(val.targets, expected.val.targets));
  CHECK(cur.validate());

  auto problems = [&](const std::string& datasets) {
    auto bad = baton::parse_curriculum(head + datasets + stage, "bad.toml");
    REQUIRE_FALSE(bad);
    return bad.error().to_string();
  };
  SECTION("a train and a val part over different ranges could share samples: an error before any training") {
    std::string other = parts;
    other.replace(other.rfind("limit = 200"), 11, "limit = 100");
    CHECK_THAT(problems(other), Catch::Contains("datasets.val (holdout part \"val\") and datasets.train (part \"train\") "
                                                "split different ranges of the same data ([20, 120) and [20, 220))"));
  }
  SECTION("bad keys and values name the key and where it is") {
    const auto text = problems(R"(
[datasets.train]
kind = "synthetic"
offset = -3
holdout = { fraction = 1.5, part = "test", sed = 1 }
[datasets.val]
kind = "synthetic"
holdout = 0.1
)");
    CHECK_THAT(text, Catch::Contains("bad.toml:") && Catch::Contains("datasets.train.offset: must be >= 0, got -3"));
    CHECK_THAT(text, Catch::Contains("datasets.train.holdout.fraction: must be in (0, 1), got 1.5"));
    CHECK_THAT(text, Catch::Contains("datasets.train.holdout.part: \"test\" is not one of train, val"));
    CHECK_THAT(text, Catch::Contains("unknown key \"sed\" (did you mean \"seed\"?)"));
    CHECK_THAT(text, Catch::Contains("datasets.val.holdout: expected a table"));
  }
  SECTION("a missing part, and an offset past the data's end when it loads") {
    CHECK_THAT(problems("[datasets.train]\nkind = \"synthetic\"\nholdout = { fraction = 0.5 }\n"),
               Catch::Contains("datasets.train.holdout.part: required"));
    auto far = parse(head + "[datasets.train]\nkind = \"synthetic\"\nsamples = 300\noffset = 300\n[datasets.val]\n"
                            "kind = \"synthetic\"\n" + stage);
    auto loaded = far.dataset("train");
    REQUIRE_FALSE(loaded);
    CHECK_THAT(loaded.error().to_string(), Catch::Contains("dataset \"train\"") && Catch::Contains("offset 300 is past its end"));
    CHECK_FALSE(far.validate());
  }
}

TEST_CASE("TOML takes a part of an epoch for stage durations, intervals and schedules, and the max duration stays whole",
          "[hparams][time][fraction]") {
  const auto cur = parse(kTwoStages, {"stage.warmup.duration=0.5ep", "stage.warmup.schedule.over=0.25ep",
                                      "stage.main.eval={ sets = [\"train\"], interval = \"0.75ep\" }",
                                      "run.checkpoint_every=1.5ep"});
  const auto warm = *cur.stages()[0].build();
  CHECK(warm.duration == Time{0.5, baton::TimeUnit::epoch});
  const auto main = *cur.stages()[1].build();
  REQUIRE(main.evaluation);
  CHECK(main.evaluation->every == Time{0.75, baton::TimeUnit::epoch});
  REQUIRE(cur.run().checkpoint_every);
  CHECK(*cur.run().checkpoint_every == Time{1.5, baton::TimeUnit::epoch});
  // 600 samples in batches of 32 (19 an epoch, the last of 24): half an epoch is 300 samples, the
  // end of batch 10 (320).
  auto state = ok(cur.init());
  state = ok(baton::fit(warm, std::move(state)));
  CHECK(state.time.batch == 10);
  CHECK(state.time.sample_in_epoch == 320);

  auto bad = baton::parse_curriculum(kTwoStages, "test.toml", {"run.max_duration=2.5ep"});
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Catch::Contains("run.max_duration: \"2.5ep\": the run's max duration counts whole epochs"));
}

TEST_CASE("label_map on a dataset table relabels before offset, limit and holdout, as data::map_labels", "[hparams][labels]") {
  const std::string head = R"(
[run]
name = "labels"
max_duration = "1ep"
[model]
name = "mlp"
widths = [8, 4]
[datasets.all]
kind = "synthetic"
samples = 300
classes = 4
seed = 3
)";
  const std::string parts = R"(
[datasets.train]
kind = "synthetic"
samples = 300
classes = 4
seed = 3
label_map = [0, -1, 1, 1]
limit = 200
holdout = { fraction = 0.25, seed = 9, part = "train" }
[datasets.val]
kind = "synthetic"
samples = 300
classes = 4
seed = 3
label_map = [0, -1, 1, 1]
limit = 200
holdout = { fraction = 0.25, seed = 9, part = "val" }
)";
  const std::string stage = R"(
[[stages]]
name = "a"
duration = "1ep"
data = "train"
eval = { sets = ["val"] }
)";
  const auto value = [](auto r) {
    if (!r) FAIL(r.error().to_string());
    return *r;
  };
  const auto cur = parse(head + parts + stage);
  const auto all = value(cur.dataset("all"));
  const auto mapped = value(baton::data::map_labels(all, {0, -1, 1, 1}));
  const auto expected = value(baton::data::hold_out(value(baton::data::slice(mapped, 0, 200)), {.fraction = 0.25, .seed = 9}));
  const auto train = value(cur.dataset("train"));
  const auto val = value(cur.dataset("val"));
  CHECK(train.size() == 150);
  CHECK(train.classes() == 2);
  CHECK(torch::equal(train.inputs, expected.train.inputs));
  CHECK(torch::equal(train.targets, expected.train.targets));
  CHECK(torch::equal(val.targets, expected.val.targets));
  CHECK(cur.validate());

  auto problems = [&](const std::string& datasets) {
    auto bad = baton::parse_curriculum(head + datasets + stage, "bad.toml");
    REQUIRE_FALSE(bad);
    return bad.error().to_string();
  };
  SECTION("a train and a val part with different label maps could share samples") {
    std::string other = parts;
    other.replace(other.rfind("label_map = [0, -1, 1, 1]"), 25, "label_map = [0, 1, 1, 1]");
    CHECK_THAT(problems(other), Catch::Contains("datasets.val (holdout part \"val\") and datasets.train (part \"train\") "
                                                "split the same data with different label maps"));
  }
  SECTION("a map that is not a list of whole numbers >= -1 names the key and the line") {
    for (const std::string bad : {"label_map = [0, \"a\"]", "label_map = [0, 1.5]", "label_map = [0, -2]", "label_map = []",
                                  "label_map = 3"}) {
      INFO(bad);
      CHECK_THAT(problems("[datasets.train]\nkind = \"synthetic\"\n" + bad + "\n[datasets.val]\nkind = \"synthetic\"\n"),
                 Catch::Contains("bad.toml:") && Catch::Contains("datasets.train.label_map: expected a list of whole numbers"));
    }
  }
  SECTION("a map too short for the data is an error when it loads, naming the dataset") {
    auto short_map = parse(head + "[datasets.train]\nkind = \"synthetic\"\nclasses = 4\nlabel_map = [0, 1]\n[datasets.val]\n"
                                  "kind = \"synthetic\"\n" + stage);
    auto loaded = short_map.dataset("train");
    REQUIRE_FALSE(loaded);
    CHECK_THAT(loaded.error().to_string(), Catch::Contains("dataset \"train\"") && Catch::Contains("has class 3, which the map's 2 entries do not cover"));
  }
}
