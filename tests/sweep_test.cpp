// Sweeps that share their prefix (sweep.hpp): every point equals an independent run of it, the
// shared stages train once, a rerun trains nothing, and `baton sweep` prints the ranked table.
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "helpers.hpp"

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
  CHECK_THAT(out, Catch::Contains("sweep of 2 points over 2 stages") && Catch::Contains("val/accuracy") &&
                      Catch::Contains("3 stage runs for 4 points x stages (1 shared)"));
  const auto summary = nlohmann::json::parse(std::ifstream(tmp.path / "s/sweep.json"));
  const auto best = summary.at("best").get<std::size_t>();
  const auto& row = summary.at("points").at(best);
  // The best row is marked with '*' and carries its point.
  CHECK_THAT(out, Catch::Contains("* " + fmt::format("{:.4f}", row.at("score").get<double>())));
}
