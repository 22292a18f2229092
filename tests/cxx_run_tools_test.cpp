// The `baton` tools on the run directory of a C++ baton::run: eval, export (plain and
// --inference) and predict rebuild the model and data from what the run recorded (tools.toml),
// and agree with the C++ API on the same state; what cannot be rebuilt is said, with the fix.
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <baton/interop.hpp>

#include "helpers.hpp"
#include "own_model.hpp"
#include "process.hpp"

namespace fs = std::filesystem;

namespace {
test::Output cxxtools_cli(const std::string& exe, const std::string& args) { return test::shell(exe + " " + args); }

/// Synthetic data from baton's loader, so the run can record where it came from: a training part
/// (a range of a set, held out from) and a test set with its labels mapped.
struct CxxToolsData {
  baton::Dataset train, test;
};

CxxToolsData cxxtools_data() {
  auto all = test::ok(baton::data::synthetic({.samples = 400, .features = 8, .classes = 4, .seed = 3}));
  auto range = test::ok(baton::data::slice(all, 0, 300));
  auto parts = test::ok(baton::data::hold_out(range, {.fraction = 0.2, .seed = 1}));
  auto test_set = test::ok(baton::data::synthetic({.samples = 200, .features = 8, .classes = 4, .seed = 3, .sample_seed = 99}));
  // Relabelled (0 and 1 swapped): `baton eval` agrees with baton::eval only if it rebuilds the map.
  return {parts.train, test::ok(baton::data::map_labels(test_set, {1, 0, 2, 3}))};
}

/// One stage with an evaluation of "test" and EMA weights, run into `dir` by baton::run.
baton::TrainState cxxtools_run(const fs::path& dir, const baton::ModelFactory& factory, const baton::Dataset& train,
                               const baton::Dataset& test_set) {
  baton::TrainingSpec spec = test::spec(train, baton::Time::epochs(2));
  spec.name = "main";
  spec.data.batch_size = 40;
  spec.optimizer = baton::optim::adam({.lr = 0.01});
  spec.algorithms = {baton::algorithms::ema({.decay = 0.9})};
  spec.evaluation = baton::EvalSchedule{.spec = {.sets = {{"test", test_set}}, .metrics = {baton::metric::accuracy()}}};
  auto initial = test::ok(baton::init_state(factory, {.seed = 2, .max_duration = baton::Time::epochs(2)}));
  auto result = test::ok(baton::run({.dir = dir, .name = "cxx", .report = false, .handle_signals = false, .progress = false},
                                    {spec}, std::move(initial)));
  return std::move(result.state);
}

/// `exe eval STATE --data test` against baton::eval on `state`: the same loss and accuracy.
void cxxtools_check_eval(const std::string& exe, const fs::path& run, const baton::TrainState& state,
                         const baton::Dataset& test_set) {
  const auto r = cxxtools_cli(exe, fmt::format("eval --state {} --data test", (run / "final.baton").string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const auto got = nlohmann::json::parse(r.out.substr(r.out.find('{'))).at("metrics");
  const auto want = test::ok(baton::eval({.sets = {{"test", test_set}}, .metrics = {baton::metric::accuracy()}}, state)).at("test");
  CHECK(got.at("accuracy").get<double>() == want.at("accuracy"));
  CHECK(got.at("loss").get<double>() == Approx(want.at("loss")).epsilon(1e-12));
}

/// `exe export --inference`, then `exe predict` on the first rows of `test_set`: the classes the
/// state's model gives them.
void cxxtools_check_predict(const std::string& exe, const fs::path& run, const baton::TrainState& state,
                            const baton::Dataset& test_set) {
  const fs::path artifact = run.parent_path() / "model.pt", csv = run.parent_path() / "rows.csv";
  auto r = cxxtools_cli(exe, fmt::format("export {} -o {} --inference", (run / "final.baton").string(), artifact.string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const auto rows = test_set.inputs.narrow(0, 0, 6);
  {
    std::ofstream out(csv);
    out << "f0,f1,f2,f3,f4,f5,f6,f7\n";
    for (std::int64_t i = 0; i < rows.size(0); ++i)
      for (std::int64_t j = 0; j < 8; ++j) out << fmt::format("{:.9g}{}", rows[i][j].item<float>(), j == 7 ? "\n" : ",");
  }
  r = cxxtools_cli(exe, fmt::format("predict {} {}", artifact.string(), csv.string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  torch::NoGradGuard no_grad;
  state.model.module->eval();
  const auto want = state.model.forward(rows).argmax(1);
  state.model.module->train();
  std::istringstream lines(r.out);
  std::string line;
  std::getline(lines, line);
  CHECK(line == "input,class,name,probability");
  for (std::int64_t i = 0; i < rows.size(0); ++i) {
    REQUIRE(std::getline(lines, line));
    const auto first = line.find(','), second = line.find(',', first + 1);
    CHECK(std::stoll(line.substr(first + 1, second - first - 1)) == want[i].item<std::int64_t>());
  }
}

/// The state_dict file `path` holds exactly `want`: names, order, bits.
void cxxtools_check_state_dict(const fs::path& path, const baton::StateDict& want) {
  const auto got = test::ok(baton::read_state_dict(path));
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].first == want[i].first);
    CHECK(torch::equal(got[i].second, want[i].second));
  }
}
}  // namespace

TEST_CASE("a C++ run of a built-in model: baton eval, export, export --inference and predict work on its directory and "
          "agree with the C++ API",
          "[cli][cxx-run]") {
  test::TempDir tmp;
  const auto data = cxxtools_data();
  const fs::path run = tmp.path / "run";
  const auto state = cxxtools_run(run, baton::models::mlp({8, 16, 4}), data.train, data.test);
  CHECK(fs::exists(run / "tools.toml"));
  cxxtools_check_eval(BATON_EXE, run, state, data.test);
  for (const std::string weights : {"", "ema"}) {
    const fs::path out = tmp.path / fmt::format("weights{}.pt", weights);
    const auto r = cxxtools_cli(BATON_EXE, fmt::format("export {} -o {}{}", (run / "final.baton").string(), out.string(),
                                                       weights.empty() ? "" : " --weights " + weights));
    INFO(r.out);
    REQUIRE(r.rc == 0);
    cxxtools_check_state_dict(out, test::ok(baton::state_dict(state, weights)));
    cxxtools_check_state_dict(out, test::ok(baton::checkpoint_state_dict(run / "final.baton", weights)));
  }
  cxxtools_check_predict(BATON_EXE, run, state, data.test);
  // The card says what the run trained on: features of 8, from the last stage's data.
  const auto card = test::ok(baton::read_model_card(tmp.path / "model.pt"));
  CHECK(card.model == "mlp");
  CHECK(card.input_shape == std::vector<std::int64_t>{8});
}

TEST_CASE("a C++ run of a user's model named for the tools: a program on baton::cli::main with its registry evaluates, "
          "exports and predicts, and plain baton says which program to use",
          "[cli][cxx-run]") {
  test::TempDir tmp;
  const auto data = cxxtools_data();
  const fs::path run = tmp.path / "run";
  const auto factory = baton::models::named("tiny_net", {{"width", 12.0}}, test::own_tiny_net(12));
  const auto state = cxxtools_run(run, factory, data.train, data.test);
  cxxtools_check_eval(BATON_OWN_MODEL_CLI, run, state, data.test);
  cxxtools_check_predict(BATON_OWN_MODEL_CLI, run, state, data.test);
  const auto plain = cxxtools_cli(BATON_EXE, fmt::format("eval --state {} --data test", (run / "final.baton").string()));
  INFO(plain.out);
  CHECK(plain.rc == 2);
  CHECK_THAT(plain.out, Catch::Contains("unknown model \"tiny_net\"") && Catch::Contains("baton::cli::main"));
}

TEST_CASE("a C++ run whose model or data the tools cannot rebuild: eval says which and what to do, plain export still works",
          "[cli][cxx-run]") {
  test::TempDir tmp;
  const auto data = cxxtools_data();
  SECTION("a model of the user's own, not named") {
    const fs::path run = tmp.path / "unnamed";
    cxxtools_run(run, test::own_tiny_net(12), data.train, data.test);
    for (const auto* cmd : {"eval --state {} --data test", "export {} -o x.pt --inference"}) {
      const auto r = cxxtools_cli(BATON_EXE, fmt::format(fmt::runtime(cmd), (run / "final.baton").string()));
      INFO(r.out);
      CHECK(r.rc == 2);
      CHECK_THAT(r.out, Catch::Contains("model is not named for the tools") &&
                            Catch::Contains("baton::models::named(\"my_net\", params, factory)") &&
                            !Catch::Contains("(baton::describe)"));
    }
    const auto w = cxxtools_cli(BATON_EXE, fmt::format("export {} -o {}", (run / "final.baton").string(), (tmp.path / "w.pt").string()));
    INFO(w.out);
    CHECK(w.rc == 0);
  }
  SECTION("data made in memory") {
    const fs::path run = tmp.path / "memory";
    const auto blobs = test::blobs(300), held = test::blobs(100, 7, "held");
    cxxtools_run(run, baton::models::mlp({8, 16, 4}), blobs, held);
    const auto r = cxxtools_cli(BATON_EXE, fmt::format("eval --state {} --data test", (run / "final.baton").string()));
    INFO(r.out);
    CHECK(r.rc == 2);
    CHECK_THAT(r.out, Catch::Contains("none of the C++ run's datasets can be rebuilt") && Catch::Contains("--config"));
  }
  SECTION("one set rebuilt, another made in memory") {
    const fs::path run = tmp.path / "mixed";
    cxxtools_run(run, baton::models::mlp({8, 16, 4}), test::blobs(300), data.test);
    auto r = cxxtools_cli(BATON_EXE, fmt::format("eval --state {} --data blobs", (run / "final.baton").string()));
    INFO(r.out);
    CHECK(r.rc == 2);
    CHECK_THAT(r.out, Catch::Contains("no dataset \"blobs\"") && Catch::Contains("tools.toml"));
    r = cxxtools_cli(BATON_EXE, fmt::format("eval --state {} --data test", (run / "final.baton").string()));
    CHECK(r.rc == 0);
  }
}
