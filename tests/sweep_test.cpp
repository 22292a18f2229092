// Sweeps that share their prefix (sweep.hpp): every point equals an independent run of it, the
// shared stages train once, a rerun trains nothing, and `baton sweep` prints the ranked table.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "helpers.hpp"
#include "process.hpp"

namespace fs = std::filesystem;

namespace {
const char* kCurriculum = R"(
[run]
name = "sweep"
seed = 3
max_duration = "3ep"
[model]
name = "mlp"
widths = [8, 16, 4]
[datasets.all]
kind = "synthetic"
samples = 500
holdout = { fraction = 0.2, part = "train" }
[datasets.val]
kind = "synthetic"
samples = 500
holdout = { fraction = 0.2, part = "val" }
[defaults]
data = "all"
batch_size = 25
optimizer = { name = "adam", lr = 0.01 }
eval = { sets = ["val"] }
[[stages]]
name = "pre"
duration = "2ep"
[[stages]]
name = "tune"
duration = "1ep"
optimizer = { lr = 0.001 }
)";

/// The curriculum with a [sweep] table (the grid's keys in the order written, not toml++'s).
const char* kTable = R"(
[sweep]
grid = { "stage.tune.optimizer.lr" = [0.003, 3e-4], "stage.tune.batch_size" = [20] }
metric = "val/accuracy"
mode = "max"
)";

/// Runs a command line; its output (stdout and stderr) and exit status.
std::pair<std::string, int> shell(const std::string& cmd) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = ::pclose(p);
  return {out, WIFEXITED(st) ? WEXITSTATUS(st) : -1};
}

std::string test_fingerprint(const fs::path& file) {
  auto cur = baton::load_curriculum(file);
  if (!cur) FAIL(cur.error().to_string());
  return cur->fingerprint();
}

/// params_sha256 of every point of a finished sweep directory, in the points' order.
std::vector<std::string> hashes(const fs::path& dir) {
  std::vector<std::string> out;
  const auto summary = nlohmann::json::parse(std::ifstream(dir / "sweep.json"));  // kept: the loop reads into it
  for (const auto& p : summary.at("points")) out.push_back(p.at("params_sha256").get<std::string>());
  return out;
}

template <class T>
T value(baton::Expected<T> r) {
  if (!r) FAIL(r.error().to_string());
  return std::move(*r);
}

/// Rows of the grid, as the independent runs spell them.
std::vector<baton::SweepPoint> lr_points() {
  auto points = baton::sweep_grid({"stage.tune.optimizer.lr=[0.003, 0.0003]", "stage.tune.batch_size=[20, 50]"});
  REQUIRE(points);
  return *points;
}
}  // namespace

TEST_CASE("sweep_grid: the product of the axes, the last fastest, and bad axes name themselves", "[sweep]") {
  const auto points = lr_points();
  REQUIRE(points.size() == 4);
  CHECK(points[0] == baton::SweepPoint{"stage.tune.optimizer.lr=0.003", "stage.tune.batch_size=20"});
  CHECK(points[1] == baton::SweepPoint{"stage.tune.optimizer.lr=0.003", "stage.tune.batch_size=50"});
  CHECK(points[3] == baton::SweepPoint{"stage.tune.optimizer.lr=0.0003", "stage.tune.batch_size=50"});
  for (const char* bad : {"stage.tune.optimizer.lr", "=[1]", "x=[]", "x=[1, 2", "x=3"}) {
    auto r = baton::sweep_grid({bad});
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().to_string(), Catch::Contains(fmt::format("sweep axis \"{}\"", bad)));
  }
}

TEST_CASE("a sweep trains the shared stage once, and every point equals an independent run of it", "[sweep]") {
  test::TempDir tmp;
  std::ofstream(tmp.path / "c.toml") << kCurriculum;
  const fs::path file = tmp.path / "c.toml";
  const auto points = lr_points();
  const baton::SweepOptions options{.dir = tmp.path / "sweep", .points = points, .progress = false};
  const auto r = baton::sweep(file, options);
  if (!r) FAIL(r.error().to_string());
  REQUIRE(r->points.size() == 4);
  CHECK(r->stages_total == 8);
  CHECK(r->stages_trained == 5);  // "pre" once, "tune" per point
  CHECK(r->metric == "val/accuracy");
  for (std::size_t i = 0; i < points.size(); ++i) {
    INFO("point " << i);
    const auto& p = r->points[i];
    CHECK(p.shared_stages == 1);
    auto cur = baton::load_curriculum(file, points[i]);
    REQUIRE(cur);
    auto options_i = cur->run_options();
    options_i.dir = tmp.path / fmt::format("independent-{}", i);
    options_i.progress = false;
    auto alone = baton::run(options_i, value(cur->specs()), test::ok(cur->init()));
    REQUIRE(alone);
    CHECK(p.params_sha256 == baton::params_sha256(alone->state));
    CHECK(p.score == alone->final_metrics.at("val").at("accuracy"));
    CHECK(r->points[r->best].score >= p.score);
  }
  // The points differ from each other (the swept values reach the training).
  CHECK(r->points[0].params_sha256 != r->points[1].params_sha256);
  CHECK(r->points[0].params_sha256 != r->points[2].params_sha256);
  CHECK_THAT(r->table(), Catch::Contains("* ") && Catch::Contains("stage.tune.optimizer.lr=0.003") &&
                             Catch::Contains("5 stage runs for 8 points x stages (3 shared)"));
  const auto summary = nlohmann::json::parse(std::ifstream(options.dir / "sweep.json"));
  CHECK(summary.at("points").size() == 4);
  CHECK(summary.at("best") == r->best);
  CHECK(fs::exists(options.dir / "report.html"));
  CHECK(r->report_file == options.dir / "report.html");
  CHECK(r->summary_file == options.dir / "sweep.json");

  SECTION("run again, it trains nothing and gives the same results") {
    const auto again = baton::sweep(file, options);
    REQUIRE(again);
    for (std::size_t i = 0; i < points.size(); ++i) CHECK(again->points[i].params_sha256 == r->points[i].params_sha256);
  }
  SECTION("a point that changes the first stage shares nothing") {
    auto grid = baton::sweep_grid({"stage.pre.optimizer.lr=[0.01, 0.02]"});
    REQUIRE(grid);
    auto apart = baton::sweep(file, {.dir = tmp.path / "apart", .points = *grid, .progress = false});
    REQUIRE(apart);
    CHECK(apart->stages_trained == 4);
    CHECK(apart->points[0].shared_stages == 0);
  }
  SECTION("a bad point is an error before any training, naming the point") {
    auto bad = baton::sweep(file, {.dir = tmp.path / "bad", .points = {{"stage.tune.optimizer.lr=-1"}}, .progress = false});
    REQUIRE_FALSE(bad);
    CHECK_THAT(bad.error().to_string(), Catch::Contains("sweep point stage.tune.optimizer.lr=-1"));
    CHECK_FALSE(fs::exists(tmp.path / "bad"));
  }
}

TEST_CASE("baton sweep: the ranked table, the best marked, the same bits as baton::sweep", "[sweep][cli]") {
  test::TempDir tmp;
  std::ofstream(tmp.path / "c.toml") << kCurriculum;
  const std::string cmd = fmt::format("{} sweep {} --grid 'stage.tune.optimizer.lr=[0.003, 0.0003]' --dir {} 2>&1",
                                      BATON_EXE, (tmp.path / "c.toml").string(), (tmp.path / "s").string());
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  INFO(out);
  REQUIRE(::pclose(p) == 0);
  CHECK_THAT(out, Catch::Contains("sweep of 2 points, directory") && Catch::Contains("val/accuracy") &&
                      Catch::Contains("3 stage runs for 4 points x stages (1 shared)"));
  const auto summary = nlohmann::json::parse(std::ifstream(tmp.path / "s/sweep.json"));
  const auto best = summary.at("best").get<std::size_t>();
  const auto& row = summary.at("points").at(best);
  // The best row is marked with '*' and carries its point.
  CHECK_THAT(out, Catch::Contains("* " + fmt::format("{:.4f}", row.at("score").get<double>())));
}

TEST_CASE("a [sweep] table: its points in the order and spelling written, its settings, and file:line errors", "[sweep]") {
  test::TempDir tmp;
  const fs::path file = tmp.path / "c.toml";
  std::ofstream(file) << kCurriculum << kTable << "jobs = 2\ndir = \"" << (tmp.path / "s").string() << "\"\n";
  const auto o = value(baton::sweep_options(file));
  REQUIRE(o.points.size() == 2);
  CHECK(o.points[0] == baton::SweepPoint{"stage.tune.optimizer.lr=0.003", "stage.tune.batch_size=20"});
  CHECK(o.points[1] == baton::SweepPoint{"stage.tune.optimizer.lr=3e-4", "stage.tune.batch_size=20"});
  CHECK(o.metric == "val/accuracy");
  CHECK(o.maximize);
  CHECK(o.jobs == 2);
  CHECK(o.dir == tmp.path / "s");
  // The table changes nothing a run trains: the fingerprint is that of the file without it.
  std::ofstream(tmp.path / "plain.toml") << kCurriculum;
  CHECK(test_fingerprint(file) == test_fingerprint(tmp.path / "plain.toml"));

  SECTION("listed points come after the grid's, and the default directory is the run's + -sweep") {
    std::ofstream(file) << kCurriculum << "[sweep]\npoints = [{ \"stage.tune.optimizer.lr\" = 1e-3, \"stage.pre.duration\" = \"1ep\" }]\n"
                        << "mode = \"min\"\n";
    const auto listed = value(baton::sweep_options(file));
    REQUIRE(listed.points.size() == 1);
    CHECK(listed.points[0] == baton::SweepPoint{"stage.tune.optimizer.lr=1e-3", "stage.pre.duration=\"1ep\""});
    CHECK_FALSE(listed.maximize);
    CHECK(listed.jobs == 1);
    CHECK(listed.dir == fs::path("runs/sweep-sweep"));
  }
  SECTION("mistakes are errors with file:line, found by load_curriculum too") {
    std::ofstream(file) << kCurriculum << "[sweep]\ngird = { a = [1] }\ngrid = { \"stage.tune.optimizer.lr\" = [] }\n"
                        << "metric = \"accuracy\"\nmode = \"up\"\njobs = 0\n";
    const auto bad = baton::load_curriculum(file);
    REQUIRE_FALSE(bad);
    const auto text = bad.error().to_string();
    for (const char* part : {"sweep: unknown key \"gird\"", "grid", "non-empty array", "sweep.metric: \"accuracy\" is not set/metric",
                             "sweep.mode: \"up\" is not one of max, min", "sweep.jobs"})
      CHECK_THAT(text, Catch::Contains(part));
    CHECK_THAT(text, Catch::Contains("c.toml:"));
    CHECK_FALSE(baton::sweep_options(file));
  }
}

TEST_CASE("baton sweep --jobs 2 trains branches in processes and gives the bits of --jobs 1 with the same threads per branch", "[sweep][cli]") {
  test::TempDir tmp;
  const fs::path file = tmp.path / "c.toml";
  std::ofstream(file) << kCurriculum << kTable;
  const auto [one, rc1] = shell(fmt::format("{} sweep {} --set run.threads=1 --jobs 1 --run-dir {}", BATON_EXE, file.string(), (tmp.path / "one").string()));
  INFO(one);
  REQUIRE(rc1 == 0);
  const auto [two, rc2] = shell(fmt::format("{} sweep {} --set run.threads=2 --jobs 2 --dir {}", BATON_EXE, file.string(), (tmp.path / "two").string()));
  INFO(two);
  REQUIRE(rc2 == 0);
  CHECK_THAT(two, Catch::Contains("2 jobs at once") && Catch::Contains("(process ") && Catch::Contains("1 thread)") &&
                      Catch::Contains("3 stage runs for 4 points x stages (1 shared)"));
  const auto h1 = hashes(tmp.path / "one"), h2 = hashes(tmp.path / "two");
  REQUIRE(h1.size() == 2);
  CHECK(h1 == h2);
  CHECK(h1[0] != h1[1]);
  // Each branch records the node it went on from.
  for (const auto& e : fs::directory_iterator(tmp.path / "two"))
    if (e.path().filename().string().rfind("1-tune-", 0) == 0) {
      const auto node = nlohmann::json::parse(std::ifstream(e.path() / "sweep-node.json"));
      CHECK(node.at("parent").get<std::string>().rfind("0-pre-", 0) == 0);
    }
  SECTION("a SIGTERM stops every branch with a checkpoint, exit 3, and the same command goes on to the same bits") {
    const std::vector<std::string> args = {"sweep", file.string(), "--set", "run.threads=2", "--set", "run.checkpoint_every=\"3ba\"",
                                           "--set", "stage.pre.duration=\"6ep\"", "--set", "run.max_duration=\"7ep\"", "--jobs", "2", "--dir", (tmp.path / "t").string()};
    auto c = test::spawn(BATON_EXE, args);
    std::string log;
    REQUIRE(test::read_until(c, "(process ", log));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(c.pid, SIGTERM);
    const int rc = test::finish(c, log);
    INFO(log);
    if (rc == 3) CHECK_THAT(log, Catch::Contains(fmt::format("Go on with: {} sweep", BATON_EXE)));  // the program as started
    else CHECK(rc == 0);  // it had finished before the signal came
    auto again = test::spawn(BATON_EXE, args);
    std::string log2;
    REQUIRE(test::finish(again, log2) == 0);
    auto ref = test::spawn(BATON_EXE, {"sweep", file.string(), "--set", "run.threads=1", "--set", "stage.pre.duration=\"6ep\"", "--set", "run.max_duration=\"7ep\"", "--jobs", "1",
                                      "--dir", (tmp.path / "r").string()});
    std::string log3;
    REQUIRE(test::finish(ref, log3) == 0);
    CHECK(hashes(tmp.path / "t") == hashes(tmp.path / "r"));
  }
}

TEST_CASE("a sweep killed (kill -9) at random moments and run again gives the bits of one uninterrupted sweep", "[sweep][cli]") {
  test::TempDir tmp;
  const fs::path file = tmp.path / "c.toml";
  std::ofstream(file) << kCurriculum << kTable;
  const std::vector<std::string> longer = {"--set", "stage.pre.duration=\"6ep\"", "--set", "run.max_duration=\"7ep\"",
                                           "--set", "run.checkpoint_every=\"3ba\"", "--set", "datasets.all.samples=1500",
                                           "--set", "datasets.val.samples=1500"};
  auto args_for = [&](int jobs, const std::string& dir) {
    std::vector<std::string> a = {"sweep", file.string(), "--set", fmt::format("run.threads={}", jobs), "--jobs",
                                  std::to_string(jobs), "--dir", (tmp.path / dir).string()};
    a.insert(a.end(), longer.begin(), longer.end());
    return a;
  };
  const auto started = std::chrono::steady_clock::now();
  auto reference = test::spawn(BATON_EXE, args_for(1, "ref"));
  std::string ref_log;
  REQUIRE(test::finish(reference, ref_log) == 0);
  // Kills land anywhere in a sweep's life: from start-up to about its length (--jobs 2 runs the
  // shared stage on half the threads, so longer).
  const auto ref_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
  const auto want = hashes(tmp.path / "ref");
  std::mt19937 rng(std::random_device{}());
  for (int jobs : {1, 2}) {
    const std::string dir = fmt::format("killed-{}", jobs);
    int kills = 0;
    for (; kills < 4; ++kills) {
      const int ms = std::uniform_int_distribution<int>(100, static_cast<int>(ref_ms * (jobs == 1 ? 1.0 : 1.8)))(rng);
      INFO("jobs " << jobs << ", kill " << kills << " after " << ms << " ms");
      auto c = test::spawn(BATON_EXE, args_for(jobs, dir));
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      ::kill(c.pid, SIGKILL);
      std::string log;
      const int rc = test::finish(c, log);  // reads until the nodes it started have gone too
      if (rc == 0) break;                   // it had finished
      INFO(log);
      REQUIRE(rc == 128 + SIGKILL);
    }
    auto last = test::spawn(BATON_EXE, args_for(jobs, dir));
    std::string log;
    const int rc = test::finish(last, log);
    INFO("jobs " << jobs << " after " << kills << " kills: " << log);
    REQUIRE(rc == 0);
    CHECK(hashes(tmp.path / dir) == want);
  }
}

TEST_CASE("the shipped curriculum's [sweep] table: four fine-tune learning rates, ranked on the validation set", "[sweep]") {
  const auto o = value(baton::sweep_options(fs::path(BATON_SOURCE_DIR) / "examples/fashion_mnist.toml"));
  REQUIRE(o.points.size() == 4);
  CHECK(o.points[1] == baton::SweepPoint{"stage.finetune.optimizer.lr=2e-4"});
  CHECK(o.metric == "val/accuracy");
  CHECK(o.dir == fs::path("runs/fashion-mnist-sweep"));
}

TEST_CASE("a sweep ranked by a metric the last stage does not give is refused before anything trains, with a suggestion",
          "[sweep][cli]") {
  test::TempDir tmp;
  const fs::path file = tmp.path / "c.toml";
  std::ofstream(file) << kCurriculum;
  // baton::sweep with SweepOptions::metric (what --metric sets).
  auto r = baton::sweep(file, {.dir = tmp.path / "s", .points = lr_points(), .metric = "val/acuracy", .progress = false});
  REQUIRE_FALSE(r);
  CHECK(r.error().code == baton::ErrorCode::invalid_argument);
  CHECK_THAT(r.error().to_string(), Catch::Contains("\"val/acuracy\" (did you mean \"val/accuracy\"?) is not a metric the last "
                                                    "stage \"tune\" evaluates") &&
                                        Catch::Contains("it gives val/loss, val/accuracy"));
  CHECK_FALSE(fs::exists(tmp.path / "s"));
  // A metric of another set, and the default (val/accuracy) on a last stage that evaluates nothing.
  r = baton::sweep(file, {.dir = tmp.path / "s", .points = lr_points(), .metric = "train/accuracy", .progress = false});
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().to_string(), Catch::Contains("\"train/accuracy\"") && Catch::Contains("is not a metric the last stage"));
  r = baton::sweep(file, {.dir = tmp.path / "s", .sets = {"stage.tune.eval.sets=[]"}, .points = lr_points(), .progress = false});
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().to_string(), Catch::Contains("the last stage \"tune\" evaluates nothing"));
  CHECK_FALSE(fs::exists(tmp.path / "s"));

  // The command line: --metric, exit 2, nothing trained.
  auto [out, rc] = shell(fmt::format("{} sweep {} --grid 'stage.tune.optimizer.lr=[0.003, 0.0003]' --metric val/acuracy --dir {}",
                                     BATON_EXE, file.string(), (tmp.path / "cli").string()));
  INFO(out);
  CHECK(rc == 2);
  CHECK_THAT(out, Catch::Contains("did you mean \"val/accuracy\""));
  CHECK_FALSE(fs::exists(tmp.path / "cli"));

  // [sweep] metric in the file: validate (library and `baton validate`) refuses it with file:line.
  std::string text = std::string(kCurriculum) + kTable;
  text.replace(text.find("metric = \"val/accuracy\""), 23, "metric = \"val/acuracy\"");
  std::ofstream(tmp.path / "t.toml") << text;
  const auto cur = baton::load_curriculum(tmp.path / "t.toml");
  REQUIRE(cur);
  const auto valid = cur->validate();
  REQUIRE_FALSE(valid);
  CHECK_THAT(valid.error().to_string(), Catch::Contains("t.toml:") && Catch::Contains("sweep.metric: \"val/acuracy\" (did you mean "
                                                                                      "\"val/accuracy\"?)"));
  std::tie(out, rc) = shell(fmt::format("{} validate {}", BATON_EXE, (tmp.path / "t.toml").string()));
  CHECK(rc == 2);
  CHECK_THAT(out, Catch::Contains("sweep.metric: \"val/acuracy\""));
  std::tie(out, rc) = shell(fmt::format("{} sweep {} --dir {}", BATON_EXE, (tmp.path / "t.toml").string(), (tmp.path / "t").string()));
  CHECK(rc == 2);
  CHECK_FALSE(fs::exists(tmp.path / "t"));
}
