// `baton report` and the report `baton run` writes: run as a user runs them (separate processes),
// and the page opened in a real browser (headless Chromium).
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <nlohmann/json.hpp>

#include "process.hpp"

namespace fs = std::filesystem;

namespace {
/// Runs a shell command; its standard output (standard error too unless `cmd` redirects it).
test::Output stdout_of(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

/// `baton ARGS`: exit status, standard output and error.
test::Output baton_cli(const std::string& args) { return test::shell(std::string(BATON_EXE) + " " + args); }

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

fs::path report_dir(const std::string& name) { return test::temp_dir("report-" + name); }

// Two stages that differ in what they carry over, with interval evaluations: ~2 s of training.
const char* kReportStages = R"(
[run]
name = "report-small"
seed = 4
max_duration = "3ep"
[model]
name = "mlp"
widths = [8, 16, 4]
[datasets.train]
kind = "synthetic"
samples = 500
[datasets.test]
kind = "synthetic"
samples = 200
sample_seed = 99
[defaults]
batch_size = 25
optimizer = { name = "adam", lr = 0.01 }
eval = { sets = ["test"], interval = "10ba", metrics = ["accuracy", "f1", "confusion_matrix"] }
[[stages]]
name = "warmup"
duration = "1ep"
schedule = { name = "linear", from = 0.1, to = 1.0, over = "1dur" }
clock = "stage"
[[stages]]
name = "main"
duration = "2ep"
batch_size = 50
optimizer_carry = "fresh"
schedule = { name = "cosine" }
clock = "stage"
)";

/// What metrics.jsonl says each plot must show: series name -> number of points, and the stages.
struct Expected {
  std::map<std::string, int> points;
  std::vector<std::string> stages;
  std::map<std::string, int> train_lines_per_stage;
};

Expected expected_from(const fs::path& run_dir, const std::string& prefix = "") {
  Expected e;
  std::ifstream in(run_dir / "metrics.jsonl");
  int train = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    const std::string event = j.at("event");
    if (event == "stage_start") e.stages.push_back(j.at("stage"));
    if (event == "train") {
      ++train;
      ++e.train_lines_per_stage[j.at("stage").get<std::string>()];
    }
    if (event == "eval")
      for (const auto& [k, v] : j.items())
        if (v.is_number() && k != "epoch" && k != "batch" && k != "sample" && k.find('/') == std::string::npos)
          ++e.points[prefix + j.at("set").get<std::string>() + "/" + k];  // details ("f1/3") are in tables
  }
  for (const char* s : {"loss", "loss (smoothed)", "learning rate", "samples/s"}) e.points[prefix + s] = train;
  return e;
}

/// Every <polyline data-series=...> in a page: series name -> attributes.
std::map<std::string, std::map<std::string, std::string>> series_in(const std::string& html) {
  std::map<std::string, std::map<std::string, std::string>> out;
  static const std::regex tag("<polyline ([^>]*)>"), attr("([a-z-]+)=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), tag); it != std::sregex_iterator(); ++it) {
    std::map<std::string, std::string> attrs;
    const std::string inner = (*it)[1];
    for (auto a = std::sregex_iterator(inner.begin(), inner.end(), attr); a != std::sregex_iterator(); ++a)
      attrs[(*a)[1]] = (*a)[2];
    if (attrs.count("data-series")) out[attrs["data-series"]] = attrs;
  }
  return out;
}

/// The text of the table that starts with `start` (found with find: std::regex recurses per
/// character and overflows the stack on a page this size under ASan).
std::string table_in(const std::string& html, const std::string& start) {
  const auto at = html.find(start);
  REQUIRE(at != std::string::npos);
  const auto end = html.find("</table>", at);
  REQUIRE(end != std::string::npos);
  return html.substr(at + start.size(), end - at - start.size());
}

/// Nothing in the page is fetched from elsewhere: no src/href/url() to http(s) or protocol-relative.
void check_offline(const std::string& html) {
  static const std::regex remote(R"((src|href)\s*=\s*["']?\s*(https?:|//)|url\(\s*["']?\s*(https?:|//)|@import)",
                                 std::regex::icase);
  CHECK_FALSE(std::regex_search(html, remote));
  CHECK(html.find("<link") == std::string::npos);
}

fs::path train_small(const fs::path& dir, const std::string& name, const std::string& sets = "") {
  std::ofstream(dir / "c.toml") << kReportStages;
  const auto r = baton_cli("run " + (dir / "c.toml").string() + " --run-dir " + (dir / name).string() + " " + sets);
  INFO(r.out);
  REQUIRE(r.rc == 0);
  return dir / name;
}
}  // namespace

TEST_CASE("baton run writes report.html: every series with its points, stages named, tables, config", "[report]") {
  const auto dir = report_dir("run");
  std::ofstream(dir / "c.toml") << kReportStages;
  const auto r = baton_cli("run " + (dir / "c.toml").string() + " --run-dir " + (dir / "run").string());
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const fs::path page = dir / "run/report.html";
  CHECK_THAT(r.out, Catch::Contains("report: " + page.string()));
  REQUIRE(fs::exists(page));
  const auto html = slurp(page);
  const auto e = expected_from(dir / "run");
  CHECK(e.stages == std::vector<std::string>{"warmup", "main"});

  const auto series = series_in(html);
  CHECK(series.size() == e.points.size());
  for (const auto& [name, n] : e.points) {
    INFO("series " << name);
    REQUIRE(series.count(name) == 1);
    CHECK(std::stoi(series.at(name).at("data-points")) == n);
    // The polyline really has that many x,y pairs.
    const auto& pts = series.at(name).at("points");
    CHECK(std::count(pts.begin(), pts.end(), ',') == n);
  }
  CHECK(e.points.count("test/accuracy") == 1);
  CHECK(e.points.at("loss") == 40);  // 20 + 20 batches, one log line each in runs this short

  // Each plot marks and names both stage boundaries; the per-stage table says what carried over.
  const int plots = static_cast<int>(e.points.size()) - 1;  // raw and smoothed loss share a plot
  for (const char* stage : {"warmup", "main"}) {
    INFO(stage);
    const std::string mark = fmt::format("<g class=\"stage\" data-stage=\"{}\">", stage);
    std::size_t count = 0;
    for (auto at = html.find(mark); at != std::string::npos; at = html.find(mark, at + 1)) ++count;
    CHECK(count == static_cast<std::size_t>(plots));
  }
  std::smatch row;
  REQUIRE(std::regex_search(html, row, std::regex("<tr data-stage=\"main\">(.*?)</tr>")));
  CHECK_THAT(row[1].str(), Catch::Contains("moments fresh") && Catch::Contains("clock stage") &&
                               Catch::Contains("50, adam") && Catch::Contains("test/accuracy"));
  REQUIRE(std::regex_search(html, row, std::regex("<tr data-stage=\"warmup\">(.*?)</tr>")));
  CHECK_THAT(row[1].str(), Catch::Contains("25, adam") && Catch::Contains("0 → 500"));
  // The last evaluation's confusion matrix: 4 x 4 cells counting the 200 test samples, and F1 per class.
  const std::string cells = table_in(html, "<table class=\"confusion\" data-set=\"test\" data-classes=\"4\">");
  static const std::regex count("data-count=\"([0-9]+)\"");
  int n = 0, total = 0;
  for (auto it = std::sregex_iterator(cells.begin(), cells.end(), count); it != std::sregex_iterator(); ++it)
    ++n, total += std::stoi((*it)[1]);
  CHECK(n == 16);
  CHECK(total == 200);
  CHECK_THAT(html, Catch::Contains("<table class=\"classes\" data-set=\"test\"><thead><tr><th>class</th><th>f1</th>"));
  CHECK(series.count("test/f1") == 1);
  CHECK(series.count("test/f1/0") == 0);
  // The resolved config, escaped.
  CHECK_THAT(html, Catch::Contains("optimizer_carry = 'fresh'"));
  CHECK_THAT(html, Catch::Contains("<h1>baton report: report-small</h1>"));
  check_offline(html);
  fs::remove_all(dir);
}

TEST_CASE("the run summary shows a loss sparkline per stage", "[report][cli]") {
  const auto dir = report_dir("spark");
  std::ofstream(dir / "c.toml") << kReportStages;
  const auto r = baton_cli("run " + (dir / "c.toml").string() + " --run-dir " + (dir / "run").string());
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const auto e = expected_from(dir / "run");
  const std::set<std::string> bars = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  for (const auto& stage : e.stages) {
    INFO(stage);
    std::smatch m;
    REQUIRE(std::regex_search(r.out, m, std::regex("\n" + stage + " +[0-9]+ -> [0-9]+ +[0-9]+ +[0-9.]+  (\\S+)")));
    const std::string spark = m[1];
    // One bar per log point, at most 16; each a block element (3 bytes in UTF-8); the lowest and
    // the highest bucket are drawn with the lowest and highest bar.
    REQUIRE(spark.size() % 3 == 0);
    CHECK(spark.size() / 3 == static_cast<std::size_t>(std::min(16, e.train_lines_per_stage.at(stage))));
    for (std::size_t i = 0; i < spark.size(); i += 3) CHECK(bars.count(spark.substr(i, 3)) == 1);
    CHECK_THAT(spark, Catch::Contains("▁") && Catch::Contains("█"));
  }
  fs::remove_all(dir);
}

TEST_CASE("baton report overlays run directories in the same plots, written to -o FILE", "[report]") {
  const auto dir = report_dir("overlay");
  const auto a = train_small(dir, "fast");
  const auto b = train_small(dir, "slow", "--set stage.main.optimizer.lr=0.003");
  const fs::path out = dir / "compare.html";
  const auto r = baton_cli("report " + a.string() + " " + b.string() + " -o " + out.string());
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("report: " + out.string()));
  const auto html = slurp(out);
  auto want = expected_from(a, "fast: ");
  for (const auto& [k, v] : expected_from(b, "slow: ").points) want.points[k] = v;
  const auto series = series_in(html);
  CHECK(series.size() == want.points.size());
  for (const auto& [name, n] : want.points) {
    INFO("series " << name);
    REQUIRE(series.count(name) == 1);
    CHECK(std::stoi(series.at(name).at("data-points")) == n);
  }
  // The two runs share their stage boundaries: drawn once per plot, not once per run.
  CHECK(html.find("data-stage=\"main (fast)\"") == std::string::npos);
  CHECK_THAT(html, Catch::Contains("data-stage=\"main\""));
  // Both tables, each with its own main-stage learning rate.
  CHECK_THAT(html, Catch::Contains("50, adam lr 0.003") && Catch::Contains("50, adam lr 0.01"));
  check_offline(html);
  fs::remove_all(dir);
}

TEST_CASE("baton report: missing, empty and malformed run directories are clear errors (exit 2), no file left",
          "[report]") {
  const auto dir = report_dir("errors");
  const fs::path out = dir / "r.html";
  auto missing = baton_cli("report " + (dir / "nope").string() + " -o " + out.string());
  CHECK(missing.rc == 2);
  CHECK_THAT(missing.out, Catch::Contains((dir / "nope").string() + ": no such directory"));

  fs::create_directories(dir / "empty");
  auto empty = baton_cli("report " + (dir / "empty").string() + " -o " + out.string());
  CHECK(empty.rc == 2);
  CHECK_THAT(empty.out, Catch::Contains((dir / "empty").string() + ": no metrics.jsonl"));

  fs::create_directories(dir / "bad");
  std::ofstream(dir / "bad/metrics.jsonl")
      << R"({"event":"train","stage":"a","epoch":0,"batch":1,"sample":10,"loss":1.0,"lr":0.1,"samples_per_s":5})"
      << "\nnot json\n";
  auto bad = baton_cli("report " + (dir / "bad").string() + " -o " + out.string());
  CHECK(bad.rc == 2);
  CHECK_THAT(bad.out, Catch::Contains((dir / "bad/metrics.jsonl").string() + ":2: not a metrics line"));

  fs::create_directories(dir / "untrained");
  std::ofstream(dir / "untrained/metrics.jsonl") << R"({"event":"stage_start","stage":"a","sample":0})" << "\n";
  auto untrained = baton_cli("report " + (dir / "untrained").string() + " -o " + out.string());
  CHECK(untrained.rc == 2);
  CHECK_THAT(untrained.out, Catch::Contains("no training lines"));

  // A good directory after a bad one: still nothing written.
  std::ofstream(dir / "bad/metrics.jsonl", std::ios::trunc)
      << R"({"event":"train","stage":"a","epoch":0,"batch":1,"sample":10,"loss":1.0,"lr":0.1,"samples_per_s":5})" << "\n";
  CHECK(baton_cli("report " + (dir / "bad").string() + " " + (dir / "nope").string() + " -o " + out.string()).rc == 2);
  CHECK(baton_cli("report " + (dir / "bad").string() + " -o " + (dir / "no/such/dir/r.html").string()).rc == 2);
  CHECK_FALSE(fs::exists(out));
  for (const auto& f : fs::directory_iterator(dir)) CHECK(f.path().filename().string().find(".tmp") == std::string::npos);
  CHECK(baton_cli("report").rc == 2);
  fs::remove_all(dir);
}

TEST_CASE("baton report of a resumed run: re-logged batches replace the earlier lines, a cut-off last line is skipped",
          "[report]") {
  const auto dir = report_dir("resumed");
  fs::create_directories(dir / "run");
  {
    std::ofstream m(dir / "run/metrics.jsonl");
    auto train = [&](int sample, double loss) {
      m << fmt::format(R"({{"event":"train","stage":"s","epoch":0,"batch":{},"sample":{},"loss":{},"lr":0.1,"samples_per_s":100}})",
                       sample / 10, sample, loss)
        << "\n";
    };
    m << R"({"event":"stage_start","stage":"s","epoch":0,"batch":0,"sample":0,"optimizer_carry":"keep"})" << "\n";
    for (int s : {10, 20, 30, 40}) train(s, 1.0);
    // Killed after 40, resumed from a checkpoint at 20: 30 and 40 again, then 50.
    m << R"({"event":"stage_start","stage":"s","epoch":0,"batch":2,"sample":20,"resumed":true})" << "\n";
    for (int s : {30, 40, 50}) train(s, 0.5);
    m << R"({"event":"train","stage":"s","epo)";  // a write cut off by SIGKILL
  }
  const auto r = baton_cli("report " + (dir / "run").string());
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const auto series = series_in(slurp(dir / "run/report.html"));
  REQUIRE(series.count("loss") == 1);
  CHECK(series.at("loss").at("data-points") == "5");
  CHECK_THAT(slurp(dir / "run/report.html"), Catch::Contains("resumed 1×"));
  fs::remove_all(dir);
}

TEST_CASE("the report in headless Chromium: every plot draws its series with all points, the confusion matrix its cells, no console errors",
          "[report][browser]") {
  const char* chromium = "/usr/bin/chromium";
  if (!fs::exists(chromium))
    FAIL("this test needs Chromium at /usr/bin/chromium (Debian package chromium; scripts/common.sh installs it)");
  const auto dir = report_dir("browser");
  const auto run_dir = train_small(dir, "run");
  const auto e = expected_from(run_dir);
  const fs::path page = run_dir / "report.html";
  REQUIRE(fs::exists(page));
  const std::string flags = fmt::format("--headless --no-sandbox --disable-gpu --user-data-dir={} --hide-scrollbars",
                                        (dir / "profile").string());
  // The DOM after the page's scripts ran, and the browser's log (console messages are logged as
  // ":CONSOLE:" lines, uncaught errors and failed loads included).
  const auto dom = stdout_of(fmt::format("timeout 60 {} {} --enable-logging=stderr --v=0 --dump-dom file://{} 2>{}",
                                     chromium, flags, page.string(), (dir / "chromium.log").string()));
  const auto log = slurp(dir / "chromium.log");
  INFO("chromium log:\n" << log);
  REQUIRE(dom.rc == 0);
  CHECK(log.find(":CONSOLE:") == std::string::npos);
  std::smatch body;
  REQUIRE(std::regex_search(dom.out, body, std::regex("<body ([^>]*)>")));
  const std::string battrs = body[1];
  CHECK_THAT(battrs, Catch::Contains("data-ready=\"1\"") && Catch::Contains("data-errors=\"0\"") &&
                         Catch::Contains("data-series-mismatch=\"0\""));
  CHECK_THAT(battrs, Catch::Contains(fmt::format("data-series-drawn=\"{}\"", e.points.size())));
  // The confusion matrix: 4 x 4 cells, each painted by the browser.
  CHECK_THAT(battrs, Catch::Contains("data-confusion-cells=\"16\"") && Catch::Contains("data-confusion-mismatch=\"0\""));
  const auto series = series_in(dom.out);
  REQUIRE(series.size() == e.points.size());
  for (const auto& [name, n] : e.points) {
    INFO("series " << name);
    REQUIRE(series.count(name) == 1);
    const auto& s = series.at(name);
    // data-drawn: the points the browser's SVG parser read; data-drawn-box: the drawn extent.
    REQUIRE(s.count("data-drawn") == 1);
    CHECK(std::stoi(s.at("data-drawn")) == n);
    const auto box = s.at("data-drawn-box");
    CHECK(std::stod(box.substr(0, box.find('x'))) > 100);  // spans the plot, not a dot
  }
  // A screenshot, kept in the build directory for people to look at.
  const fs::path shot = fs::path(BATON_EXE).parent_path() / "report-browser-test.png";
  fs::remove(shot);
  const auto s = stdout_of(fmt::format("timeout 60 {} {} --window-size=1100,2600 --screenshot={} file://{} 2>&1", chromium,
                                   flags, shot.string(), page.string()));
  INFO(s.out);
  REQUIRE(s.rc == 0);
  REQUIRE(fs::exists(shot));
  CHECK(slurp(shot).substr(1, 3) == "PNG");
  CHECK(fs::file_size(shot) > 20000);
  fs::remove_all(dir);
}

TEST_CASE("y tick labels of a narrow range all differ (enough decimals for the step)", "[report]") {
  const auto dir = report_dir("ticks");
  fs::create_directories(dir / "run");
  {
    std::ofstream m(dir / "run/metrics.jsonl");
    m << R"({"event":"stage_start","stage":"s","epoch":0,"batch":0,"sample":0,"optimizer_carry":"keep"})" << "\n";
    for (int i = 1; i <= 9; ++i)
      m << fmt::format(R"({{"event":"train","stage":"s","epoch":0,"batch":{},"sample":{},"loss":{},"lr":0.1,"samples_per_s":100}})",
                       i, i * 10, 0.998 + 0.0001 * i)
        << "\n";
  }
  const auto r = baton_cli("report " + (dir / "run").string());
  INFO(r.out);
  REQUIRE(r.rc == 0);
  // The loss plot's y ticks: <text class="tick" ... text-anchor="end">LABEL</text>
  const std::string html = slurp(dir / "run/report.html");
  const auto plot_at = html.find("<svg");
  REQUIRE(plot_at != std::string::npos);
  const auto plot = html.substr(plot_at, html.find("</svg>", plot_at) - plot_at);
  std::vector<std::string> labels;
  const std::string key = "text-anchor=\"end\">";
  for (auto at = plot.find(key); at != std::string::npos; at = plot.find(key, at + 1))
    labels.push_back(plot.substr(at + key.size(), plot.find('<', at) - at - key.size()));
  INFO(fmt::format("{}", fmt::join(labels, " | ")));
  REQUIRE(labels.size() >= 3);
  CHECK(std::set<std::string>(labels.begin(), labels.end()).size() == labels.size());
  CHECK_THAT(labels.front(), Catch::StartsWith("0.998"));
  fs::remove_all(dir);
}

TEST_CASE("the shipped curriculum's report shows the confusion matrix of val and test, painted in Chromium, and keeps its best",
          "[report][browser][example]") {
  const char* chromium = "/usr/bin/chromium";
  if (!fs::exists(chromium))
    FAIL("this test needs Chromium at /usr/bin/chromium (Debian package chromium; scripts/common.sh installs it)");
  const auto dir = report_dir("shipped");
  // The main job, small: 3000 training images (300 held out as val), 500 test images, 3 one-epoch stages.
  const auto r = baton_cli(fmt::format(
      "run {}/examples/fashion_mnist.toml --run-dir {} --set datasets.train.limit=3000 --set datasets.val.limit=3000 "
      "--set datasets.test.limit=500 --set run.max_duration=3ep --set stage.main.duration=1ep "
      "--set stage.finetune.duration=1ep --set stage.finetune.eval.interval=4ba",
      BATON_SOURCE_DIR, (dir / "run").string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(fs::exists(dir / "run/best-finetune.baton"));  // keep_best
  const fs::path page = dir / "run/report.html";
  const auto html = slurp(page);
  for (const auto& [set, samples] : {std::pair{"val", 300}, std::pair{"test", 500}}) {
    INFO(set);
    const std::string cells = table_in(html, fmt::format("<table class=\"confusion\" data-set=\"{}\" data-classes=\"10\">", set));
    static const std::regex count("data-count=\"([0-9]+)\"");
    int n = 0, total = 0;
    for (auto it = std::sregex_iterator(cells.begin(), cells.end(), count); it != std::sregex_iterator(); ++it)
      ++n, total += std::stoi((*it)[1]);
    CHECK(n == 100);
    CHECK(total == samples);
  }
  // The end of the fine-tune restored its best evaluation, and says so.
  std::ifstream in(dir / "run/metrics.jsonl");
  bool restored = false;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == "stage_end" && j.value("stage", "") == "finetune") restored = j.contains("restored_best");
  }
  CHECK(restored);
  CHECK_THAT(html, Catch::Contains("restored best: restored the best weights"));  // the stage's notes
  const std::string flags = fmt::format("--headless --no-sandbox --disable-gpu --user-data-dir={} --hide-scrollbars",
                                        (dir / "profile").string());
  const auto dom = stdout_of(fmt::format("timeout 60 {} {} --dump-dom file://{} 2>/dev/null", chromium, flags, page.string()));
  REQUIRE(dom.rc == 0);
  std::smatch body;
  REQUIRE(std::regex_search(dom.out, body, std::regex("<body ([^>]*)>")));
  CHECK_THAT(std::string(body[1]), Catch::Contains("data-confusion-cells=\"200\"") &&
                                       Catch::Contains("data-confusion-mismatch=\"0\"") && Catch::Contains("data-errors=\"0\""));
  fs::remove_all(dir);
}
