// KeepBest (spec.hpp): the best evaluation's weights kept in the state, restored at the stage's
// end, the same bits however the fit is split, per stage or per run; TOML keys and their errors;
// the run directory's best-<stage>.baton.
#include <fstream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "helpers.hpp"

namespace fs = std::filesystem;

namespace {
struct Seen {
  std::int64_t batch;
  double value;
  std::string hash;
};

/// Every evaluation a fit makes: its batch, the metric and the weights' hash then.
baton::Callback recorder(std::shared_ptr<std::vector<Seen>> seen, std::string metric) {
  return {"recorder", [seen, metric](const baton::EventView& v) -> std::optional<std::string> {
            if (v.event != baton::Event::eval_end) return std::nullopt;
            const auto slash = metric.find('/');
            seen->push_back({v.state.time.batch, v.metrics->at(metric.substr(0, slash)).at(metric.substr(slash + 1)),
                             baton::params_sha256(v.state)});
            return std::nullopt;
          }};
}

/// A stage on blobs, evaluated on a validation set every 10 batches, keeping by `keep`.
baton::TrainingSpec kept_spec(baton::KeepBest keep, std::int64_t epochs = 3) {
  auto spec = test::spec(test::blobs(320, 7), baton::Time::epochs(epochs));
  spec.evaluation = baton::EvalSchedule{.spec = {.sets = {{"val", test::blobs(200, 11, "val")}}}, .every = baton::Time::batches(10)};
  spec.keep_best = keep;
  return spec;
}

/// The first evaluation with the best value (ties keep the earlier).
Seen best_of(const std::vector<Seen>& seen, bool maximize) {
  Seen best = seen.front();
  for (const auto& e : seen)
    if (maximize ? e.value > best.value : e.value < best.value) best = e;
  return best;
}
}  // namespace

TEST_CASE("keep_best with restore ends the stage with the best evaluation's weights and buffers", "[keep_best]") {
  // A direction whose best is not the last evaluation, found by a first fit: a restore for sure.
  auto seen = std::make_shared<std::vector<Seen>>();
  auto spec = kept_spec({.metric = "val/loss", .maximize = true, .restore = true});
  spec.callbacks.push_back(recorder(seen, "val/loss"));
  const auto state = test::new_state(1, baton::Time::epochs(3));
  (void)test::ok(baton::fit(spec, state));
  REQUIRE(seen->size() >= 3);
  spec.keep_best->maximize = best_of(*seen, true).batch != seen->back().batch;
  seen->clear();
  const auto out = test::ok(baton::fit(spec, state));
  const auto best = best_of(*seen, spec.keep_best->maximize);
  REQUIRE(best.batch != out.time.batch);
  CHECK(baton::params_sha256(out) == best.hash);
  CHECK_THAT(out.history.back().restored_best, Catch::Contains("restored the best weights: val/loss = ") &&
                                                   Catch::Contains(fmt::format("batch {}", best.batch)));
  // Buffers too: evaluating the result gives the kept value exactly.
  const auto m = baton::eval(spec.evaluation->spec, out);
  REQUIRE(m);
  CHECK(m->at("val").at("loss") == best.value);
  // The clock and the optimizer went on: only the weights are the best's.
  CHECK(out.time.batch == 30);

  SECTION("without restore the stage ends with its last weights and the best is kept in the state") {
    auto keep_only = spec;
    keep_only.keep_best->restore = false;
    seen->clear();
    const auto last = test::ok(baton::fit(keep_only, state));
    CHECK(baton::params_sha256(last) == seen->back().hash);
    CHECK(last.history.back().restored_best.empty());
    REQUIRE(last.algorithm_state.count("keep_best"));
    auto weights = keep_only.evaluation->spec;
    weights.weights = "keep_best";  // the kept weights as eval reads EMA's
    CHECK(baton::eval(weights, last)->at("val").at("loss") == best.value);
  }
  SECTION("a fit split in three, through a checkpoint, gives the same bits, the kept best with them") {
    test::TempDir tmp;
    auto a = test::ok(baton::fit(spec, state, baton::Time::batches(7)));
    auto b = test::ok(baton::fit(spec, a, baton::Time::batches(13)));
    REQUIRE(baton::save_checkpoint(b, tmp.path / "b.baton"));
    auto loaded = test::ok(baton::load_checkpoint(tmp.path / "b.baton", test::bn_dropout_mlp()));
    const auto whole = test::ok(baton::fit(spec, loaded));
    test::require_same_bits(whole, out);
    CHECK(whole.history.back().restored_best == out.history.back().restored_best);
  }
}

TEST_CASE("keep_best scope: a stage is judged on its own evaluations unless the scope is the run", "[keep_best]") {
  const auto state = test::new_state(1, baton::Time::epochs(6));
  auto first_seen = std::make_shared<std::vector<Seen>>();
  auto first = kept_spec({.metric = "val/loss", .maximize = true, .restore = true});
  first.name = "first";
  first.callbacks.push_back(recorder(first_seen, "val/loss"));
  const auto after_first = test::ok(baton::fit(first, state));
  const auto first_best = best_of(*first_seen, true);

  auto second_seen = std::make_shared<std::vector<Seen>>();
  auto second = kept_spec({.metric = "val/loss", .maximize = true, .restore = true});
  second.name = "second";
  second.callbacks.push_back(recorder(second_seen, "val/loss"));
  SECTION("stage scope: the second stage ends with its own best") {
    const auto out = test::ok(baton::fit(second, after_first));
    const auto best = best_of(*second_seen, true);
    CHECK(baton::params_sha256(out) == best.hash);
  }
  SECTION("run scope: a better evaluation of the first stage wins") {
    second.keep_best->scope = baton::KeepBest::Scope::run;
    const auto out = test::ok(baton::fit(second, after_first));
    const auto best = best_of(*second_seen, true);
    if (first_best.value > best.value) {
      CHECK(baton::params_sha256(out) == first_best.hash);
      CHECK_THAT(out.history.back().restored_best, Catch::Contains(fmt::format("batch {}", first_best.batch)));
    } else {
      CHECK(baton::params_sha256(out) == best.hash);
    }
  }
}

TEST_CASE("keep_best errors: no evaluation, a set not evaluated", "[keep_best]") {
  auto spec = test::spec(test::blobs(64), baton::Time::epochs(1));
  spec.keep_best = baton::KeepBest{.metric = "val/accuracy", .maximize = true};
  auto r = baton::fit(spec, test::new_state());
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().to_string(), Catch::Contains("keep_best") && Catch::Contains("no evaluation"));
  auto other = kept_spec({.metric = "test/accuracy", .maximize = true});
  r = baton::fit(other, test::new_state());
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().to_string(), Catch::Contains("keep_best.metric: \"test/accuracy\""));
}

namespace {
const std::string kDefaultKeep = "keep_best = { metric = \"val/loss\", mode = \"max\" }";
const char* kToml = R"(
[run]
name = "kb"
seed = 3
max_duration = "4ep"
[model]
name = "mlp"
widths = [8, 16, 4]
[datasets.all]
kind = "synthetic"
samples = 400
holdout = { fraction = 0.25, part = "train" }
[datasets.val]
kind = "synthetic"
samples = 400
holdout = { fraction = 0.25, part = "val" }
[defaults]
data = "all"
batch_size = 20
optimizer = { name = "sgd", lr = 0.5 }
eval = { sets = ["val"], interval = "5ba" }
keep_best = { metric = "val/loss", mode = "max" }
[[stages]]
name = "pre"
duration = "2ep"
restore_best = true
[[stages]]
name = "tune"
duration = "2ep"
)";
}  // namespace

TEST_CASE("keep_best and restore_best in TOML: read, inherited, checked with did-you-mean, and the run's best file", "[keep_best][hparams]") {
  test::TempDir tmp;
  std::ofstream(tmp.path / "c.toml") << kToml;
  auto cur = baton::load_curriculum(tmp.path / "c.toml");
  if (!cur) FAIL(cur.error().to_string());
  auto specs = cur->specs();
  if (!specs) FAIL(specs.error().to_string());
  REQUIRE((*specs)[0].keep_best);
  CHECK((*specs)[0].keep_best->metric == "val/loss");
  CHECK((*specs)[0].keep_best->maximize);
  CHECK((*specs)[0].keep_best->restore);
  REQUIRE((*specs)[1].keep_best);  // from [defaults]
  CHECK((*specs)[1].keep_best->restore);  // from the stage before, as every inheritable key

  auto options = cur->run_options();
  options.dir = tmp.path / "run";
  options.progress = false;
  const auto result = baton::run(options, *specs, test::ok(cur->init()));
  if (!result) FAIL(result.error().to_string());
  // The best of each stage beside the last states; the first stage restored its own.
  for (const char* stage : {"pre", "tune"}) {
    INFO(stage);
    auto best = baton::load_checkpoint(options.dir / fmt::format("best-{}.baton", stage), cur->model().value());
    REQUIRE(best);
    CHECK(best->stage == stage);
  }
  const auto pre_best = test::ok(baton::load_checkpoint(options.dir / "best-pre.baton", cur->model().value()));
  CHECK_THAT(result->state.history.at(0).restored_best, Catch::Contains(fmt::format("batch {}", pre_best.time.batch)));
  std::ifstream lines(options.dir / "metrics.jsonl");
  bool recorded = false;
  for (std::string line; std::getline(lines, line);)
    if (const auto j = nlohmann::json::parse(line); j.value("event", "") == "stage_end" && j.value("stage", "") == "pre")
      recorded = j.contains("restored_best");
  CHECK(recorded);

  SECTION("mistakes are errors with file:line and a suggestion") {
    std::string text = kToml;
    text.replace(text.find(kDefaultKeep), kDefaultKeep.size(), "keep_best = { metric = \"val/los\", scope = \"al\" }");
    std::ofstream(tmp.path / "bad.toml") << text;
    auto bad = baton::load_curriculum(tmp.path / "bad.toml");
    REQUIRE(bad);
    auto s = bad->specs();
    REQUIRE_FALSE(s);
    const auto msg = s.error().to_string();
    CHECK_THAT(msg, Catch::Contains("keep_best.mode: required") && Catch::Contains("did you mean \"val/loss\"") &&
                        Catch::Contains("keep_best.scope: \"al\" is not one of stage, run") && Catch::Contains("bad.toml:"));
  }
  SECTION("restore_best without keep_best is an error") {
    std::string text = kToml;
    text.replace(text.find(kDefaultKeep), kDefaultKeep.size(), "");
    std::ofstream(tmp.path / "bad.toml") << text;
    auto s = baton::load_curriculum(tmp.path / "bad.toml")->specs();
    REQUIRE_FALSE(s);
    CHECK_THAT(s.error().to_string(), Catch::Contains("restore_best: needs keep_best"));
  }
}

TEST_CASE("a stage name that is not a file name is refused before anything trains -- nothing is written outside the run directory",
          "[keep_best][run]") {
  test::TempDir tmp;
  // best-<stage>.baton of "../../../esc" in tmp/r, with tmp/r/best-.. a directory, is tmp/esc.baton:
  // a user's file outside the run directory.
  fs::create_directories(tmp.path / "r" / "best-..");
  std::ofstream(tmp.path / "esc.baton") << "the user's own file";
  auto first = kept_spec({.metric = "val/accuracy", .maximize = true}, 1);
  first.name = "first";
  const std::vector<std::string> bad_names = {"../../../esc", "x/y", "..", "a\\b", std::string("nul\0here", 8), std::string(101, 'n')};
  for (const auto& name : bad_names) {
    INFO(name);
    auto bad = kept_spec({.metric = "val/accuracy", .maximize = true}, 1).with_name(name);
    const auto valid = bad.validate();
    REQUIRE_FALSE(valid);
    CHECK_THAT(valid.error().message, Catch::Contains(": name: \"") && Catch::Contains("a name may hold any text but '/'"));
    // A run checks every stage's name before the first trains.
    const auto r = baton::run({.dir = tmp.path / "r", .progress = false}, {first, bad}, test::new_state(1, baton::Time::epochs(2)));
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().to_string(), Catch::Contains("stages[1].name"));
    CHECK_FALSE(fs::exists(tmp.path / "r" / "checkpoints"));
    CHECK_FALSE(fs::exists(tmp.path / "r" / "metrics.jsonl"));
  }
  std::ifstream user(tmp.path / "esc.baton");
  CHECK(std::string(std::istreambuf_iterator<char>(user), {}) == "the user's own file");
  CHECK_THAT(kept_spec({.metric = "val/accuracy", .maximize = true}).with_name("x/y").validate().error().message,
             Catch::Contains("\"x/y\" contains '/'") && Catch::Contains("best-<stage>.baton"));
  // Names that are file names stay valid: spaces, dots inside, other scripts.
  for (const char* good : {"fine tune", "stage.2", "...", "étape-1", ".hidden"})
    CHECK(kept_spec({.metric = "val/accuracy", .maximize = true}).with_name(good).validate());
}
