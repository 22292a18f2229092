// Run directories from C++ (run.hpp): the files `baton run` writes, resume after a stop or a
// kill to the uninterrupted bits and metrics, and `baton run` as a thin layer over the same call.
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "helpers.hpp"
#include "process.hpp"

namespace fs = std::filesystem;
using baton::Time;

namespace {
/// metrics.jsonl without its timing fields (wall-clock throughput and stage seconds).
std::vector<nlohmann::json> metric_lines(const fs::path& dir) {
  std::ifstream in(dir / "metrics.jsonl");
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    j.erase("samples_per_s");
    j.erase("seconds");
    out.push_back(j);
  }
  return out;
}

/// Three stages on blobs: 2 epochs (20 batches), a 1-batch stage, 5 batches with evaluation.
std::vector<baton::TrainingSpec> stages(const baton::Callback& watcher) {
  const auto data = test::blobs(300);
  const auto a = test::spec(data, Time::epochs(2)).with_name("a").with_callbacks({watcher});
  const auto b = a.with_name("b").with_duration(Time::batches(1)).with_lr(0.02);
  const auto c = b.with_name("c")
                     .with_duration(Time::batches(5))
                     .with_optimizer(baton::optim::adam({.lr = 1e-3}), baton::Carry::fresh)
                     .with_evaluation(baton::EvalSchedule{.spec = {.sets = {{"blobs", data.head(100)}}}});
  return {a, b, c};
}

/// Sets `flag` at the end of run batch `at` (never, when at < 0).
baton::Callback stop_at(std::shared_ptr<std::atomic<bool>> flag, std::shared_ptr<std::int64_t> at) {
  return {"stop_at", [flag, at](const baton::EventView& v) -> std::optional<std::string> {
            if (v.event == baton::Event::batch_end && v.state.time.batch == *at) flag->store(true);
            return std::nullopt;
          },
          /*observer=*/true};
}

/// A run directory whose run of `stages` (4 epochs) stopped at batch 5 as Ctrl-C stops it, with
/// that batch's checkpoint; `again()` runs the same stages there once more.
struct StoppedRun {
  test::TempDir tmp;
  std::shared_ptr<std::atomic<bool>> flag = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::int64_t> at = std::make_shared<std::int64_t>(5);
  std::vector<baton::TrainingSpec> specs = stages(stop_at(flag, at));
  baton::RunOptions options{.dir = tmp.path, .progress = false, .stop = flag};
  StoppedRun() {
    REQUIRE(baton::run(options, specs, test::new_state(1, Time::epochs(4)))->interrupted);
    flag->store(false), *at = -1;
  }
  [[nodiscard]] fs::path checkpoint() const { return tmp.path / "checkpoints" / "ckpt-0000000005.baton"; }
  auto again() { return baton::run(options, specs, test::new_state(1, Time::epochs(4))); }
};
}  // namespace

TEST_CASE("a C++ chain with a run directory: stopped in a stage's last batch or a 1-batch stage, resumed to the same bits",
          "[run][resume]") {
  test::TempDir tmp;
  auto flag = std::make_shared<std::atomic<bool>>(false);
  auto at = std::make_shared<std::int64_t>(-1);
  const auto specs = stages(stop_at(flag, at));
  const baton::RunOptions base{.dir = tmp.path / "whole", .name = "t", .progress = false, .stop = flag};
  const auto whole = baton::run(base, specs, test::new_state(1, Time::epochs(4)));
  REQUIRE(whole);
  REQUIRE_FALSE(whole->interrupted);
  CHECK(whole->state.time.batch == 26);
  for (const char* f : {"config.toml", "metrics.jsonl", "metrics.csv", "final.baton", "report.html",
                        "checkpoints/ckpt-0000000020-end.baton", "checkpoints/ckpt-0000000021-end.baton"})
    CHECK(fs::exists(base.dir / f));
  REQUIRE(whole->final_metrics.count("blobs"));
  CHECK_THAT(whole->summary(), Catch::Contains("a ") && Catch::Contains("blobs/accuracy="));
  // The table fits a terminal: 80 columns (UTF-8 code points; the sparkline's bars are 3 bytes).
  {
    std::istringstream lines(whole->summary());
    for (std::string line; std::getline(lines, line);) {
      const auto columns = std::count_if(line.begin(), line.end(), [](char c) { return (c & 0xC0) != 0x80; });
      INFO(line);
      CHECK(columns <= 80);
    }
  }
  // Called again on the finished directory: nothing to train, and the table says so.
  const auto again = baton::run(base, specs, test::new_state(1, Time::epochs(4)));
  REQUIRE(again);
  CHECK_THAT(again->summary(), Catch::Contains("the run had already finished"));
  // final.baton is the last stage's end: stage_index counts from 0, as every checkpoint's.
  const auto final_info = baton::read_checkpoint_info(base.dir / "final.baton");
  REQUIRE(final_info);
  CHECK(final_info->meta.stage_index == 2);
  CHECK(final_info->meta.extra.at("stage_done") == "1");

  // 20: the last batch of stage a; 21: stage b's only batch; 23: inside c.
  for (std::int64_t k : {20, 21, 23}) {
    INFO("stopped at the end of batch " << k);
    auto options = base;
    options.dir = tmp.path / fmt::format("cut-{}", k);
    *at = k, flag->store(false);
    const auto cut = baton::run(options, specs, test::new_state(1, Time::epochs(4)));
    REQUIRE(cut);
    REQUIRE(cut->interrupted);
    // The checkpoint the result names exists and holds the batch reached.
    REQUIRE(fs::is_regular_file(cut->checkpoint));
    const auto info = baton::read_checkpoint_info(cut->checkpoint);
    REQUIRE(info);
    CHECK(info->time.batch == cut->state.time.batch);
    CHECK(cut->state.time.batch == k);
    *at = -1, flag->store(false);
    const auto resumed = baton::run(options, specs, test::new_state(1, Time::epochs(4)));
    REQUIRE(resumed);
    REQUIRE(resumed->resumed_from);
    test::require_same_bits(whole->state, resumed->state);
    CHECK(baton::params_sha256(resumed->state) == baton::params_sha256(whole->state));
    CHECK(metric_lines(options.dir) == metric_lines(base.dir));
  }
}

TEST_CASE("a run killed before its first checkpoint starts over, metrics files included", "[run][resume]") {
  test::TempDir tmp;
  auto flag = std::make_shared<std::atomic<bool>>(false);
  auto at = std::make_shared<std::int64_t>(-1);
  const auto specs = stages(stop_at(flag, at));
  const baton::RunOptions whole{.dir = tmp.path / "whole", .progress = false, .stop = flag};
  REQUIRE(baton::run(whole, specs, test::new_state(1, Time::epochs(4))));
  // What a SIGKILL after a few logged batches leaves: lines, no checkpoint.
  auto killed = whole;
  killed.dir = tmp.path / "killed";
  fs::create_directories(killed.dir / "checkpoints");
  {
    std::ifstream in(whole.dir / "metrics.jsonl");
    std::ofstream out(killed.dir / "metrics.jsonl");
    std::string line;
    for (int i = 0; i < 3 && std::getline(in, line); ++i) out << line << "\n";
  }
  const auto again = baton::run(killed, specs, test::new_state(1, Time::epochs(4)));
  REQUIRE(again);
  CHECK_FALSE(again->resumed_from);
  CHECK(metric_lines(killed.dir) == metric_lines(whole.dir));
}

TEST_CASE("a run directory refuses another configuration and --fresh removes only what a run wrote", "[run]") {
  test::TempDir tmp;
  auto flag = std::make_shared<std::atomic<bool>>(false);
  auto at = std::make_shared<std::int64_t>(5);
  const auto specs = stages(stop_at(flag, at));
  baton::RunOptions options{.dir = tmp.path, .progress = false, .stop = flag};
  REQUIRE(baton::run(options, specs, test::new_state(1, Time::epochs(4)))->interrupted);
  std::ofstream(tmp.path / "stage-notes.txt") << "mine";
  std::ofstream(tmp.path / "checkpoints" / "my-ckpt.baton") << "mine";
  auto changed = specs;
  changed[1] = changed[1].with_lr(0.5);
  flag->store(false), *at = -1;
  const auto refused = baton::run(options, changed, test::new_state(1, Time::epochs(4)));
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error().to_string(), Catch::Contains("another configuration") && Catch::Contains("+ stages[1]: optimizer = \"sgd(lr=0.5, momentum=0.9"));
  options.fresh = true;
  const auto fresh = baton::run(options, changed, test::new_state(1, Time::epochs(4)));
  REQUIRE(fresh);
  CHECK_FALSE(fresh->resumed_from);
  CHECK(fs::exists(tmp.path / "stage-notes.txt"));
  CHECK(fs::exists(tmp.path / "checkpoints" / "my-ckpt.baton"));
  CHECK(fs::exists(tmp.path / "final.baton"));
}

TEST_CASE("a resume where the threads differ is refused naming them, or accepted and recorded as not bit-exact",
          "[run][resume][runtime]") {
  const int threads = at::get_num_threads();
  struct Restore {
    int n;
    ~Restore() { at::set_num_threads(n); }
  } restore{threads};
  StoppedRun stopped;
  auto& options = stopped.options;
  const auto written = baton::read_checkpoint_info(stopped.checkpoint());
  REQUIRE(written);
  CHECK_THAT(written->meta.extra.at("numerics"), Catch::Contains(fmt::format("threads={}", threads)));

  at::set_num_threads(threads + 1);
  const auto refused = stopped.again();
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == baton::ErrorCode::invalid_spec);
  CHECK_THAT(refused.error().to_string(), Catch::Contains(fmt::format("threads {} -> {}", threads, threads + 1)) &&
                                              Catch::Contains("Resume with the same threads") &&
                                              !Catch::Contains("processes") &&
                                              Catch::Contains("--accept-runtime-change"));

  options.accept_runtime_change = true;
  const auto accepted = stopped.again();
  REQUIRE(accepted);
  CHECK(accepted->resumed_from);
  CHECK_THAT(accepted->not_bit_exact, Catch::Contains(fmt::format("threads {} -> {}", threads, threads + 1)));
  CHECK_THAT(accepted->summary(), Catch::Contains("not bit-exact"));
  const auto final_info = baton::read_checkpoint_info(stopped.tmp.path / "final.baton");
  REQUIRE(final_info);
  CHECK_THAT(final_info->meta.extra.at("not_bit_exact"), Catch::Contains("threads"));

  // The same threads as the checkpoint: resumes without a word (nothing left to train here).
  at::set_num_threads(threads + 1);
  options.accept_runtime_change = false;
  const auto again = stopped.again();
  REQUIRE(again);
  CHECK_THAT(again->not_bit_exact, Catch::Contains("threads"));  // the record is kept
}

TEST_CASE("a checkpoint from before baton's kernel choices changed is refused naming baton_kernels, or accepted",
          "[run][resume][runtime]") {
  StoppedRun stopped;
  // The checkpoint as a build before baton_kernels existed wrote it: the same numerics without it.
  const auto path = stopped.checkpoint();
  auto info = baton::read_checkpoint_info(path);
  REQUIRE(info);
  std::string numerics = info->meta.extra.at("numerics");
  const auto key = numerics.find("; baton_kernels=");
  REQUIRE(key != std::string::npos);
  const std::string generation = numerics.substr(key + 16, numerics.find(';', key + 2) - (key + 16));
  numerics.erase(key, numerics.find(';', key + 2) == std::string::npos ? std::string::npos : numerics.find(';', key + 2) - key);
  info->meta.extra["numerics"] = numerics;
  auto state = baton::load_checkpoint(path, test::bn_dropout_mlp());
  REQUIRE(state);
  REQUIRE(baton::save_checkpoint(*state, path, info->meta));

  const auto refused = stopped.again();
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.error().to_string(), Catch::Contains(fmt::format("baton_kernels (none) -> {}", generation)) &&
                                              Catch::Contains("--accept-runtime-change"));
  stopped.options.accept_runtime_change = true;
  const auto accepted = stopped.again();
  REQUIRE(accepted);
  CHECK_THAT(accepted->not_bit_exact, Catch::Contains("baton_kernels"));
}

TEST_CASE("a FIFO, a device or a symlink loop where a file is expected: a clear error, never a read that blocks",
          "[run][bad_inputs][files]") {
  test::TempDir tmp;
  const auto fifo = tmp.path / "pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  fs::create_symlink(tmp.path / "loop-b", tmp.path / "loop-a");
  fs::create_symlink(tmp.path / "loop-a", tmp.path / "loop-b");
  auto message = [](const auto& r) { return r ? std::string("(no error)") : r.error().to_string(); };
  CHECK_THAT(message(baton::load_curriculum(fifo)), Catch::Contains("is a FIFO (named pipe), not a regular file (the curriculum)"));
  CHECK_THAT(message(baton::load_curriculum("/dev/zero")), Catch::Contains("is a character device"));
  CHECK_THAT(message(baton::load_curriculum(tmp.path / "loop-a")), Catch::Contains("a loop of symbolic links"));
  CHECK_THAT(message(baton::data::read_idx(fifo)), Catch::Contains("is a FIFO"));
  CHECK_THAT(message(baton::data::csv({.path = fifo, .target = ""})), Catch::Contains("is a FIFO"));
  CHECK_THAT(message(baton::read_checkpoint_info(fifo)), Catch::Contains("not a regular file"));

  // A FIFO as the newest checkpoint of a run directory is skipped like a corrupt one.
  auto flag = std::make_shared<std::atomic<bool>>(false);
  auto at = std::make_shared<std::int64_t>(5);
  const auto specs = stages(stop_at(flag, at));
  const baton::RunOptions options{.dir = tmp.path / "run", .progress = false, .stop = flag};
  REQUIRE(baton::run(options, specs, test::new_state(1, Time::epochs(4)))->interrupted);
  REQUIRE(::mkfifo((options.dir / "checkpoints" / "ckpt-0000000009.baton").c_str(), 0600) == 0);
  // Newer still: whole checkpoints of this configuration that cannot be a point of this run.
  const auto five = baton::read_checkpoint_info(options.dir / "checkpoints" / "ckpt-0000000005.baton");
  REQUIRE(five);
  auto state = baton::load_checkpoint(options.dir / "checkpoints" / "ckpt-0000000005.baton", test::bn_dropout_mlp());
  REQUIRE(state);
  auto meta = five->meta;
  meta.stage_index = 99;
  REQUIRE(baton::save_checkpoint(*state, options.dir / "checkpoints" / "ckpt-0000000010.baton", meta));
  meta.stage_index = 1;  // stage "b", but the state is in stage "a"
  REQUIRE(baton::save_checkpoint(*state, options.dir / "checkpoints" / "ckpt-0000000011.baton", meta));
  flag->store(false), *at = -1;
  const auto resumed = baton::run(options, specs, test::new_state(1, Time::epochs(4)));
  REQUIRE(resumed);
  REQUIRE(resumed->resumed_from);
  CHECK(resumed->resumed_from->filename() == "ckpt-0000000005.baton");
}

TEST_CASE("the same curriculum via baton run and via baton::run: the same params_sha256 and metrics lines", "[run][cli]") {
  test::TempDir tmp;
  std::ofstream(tmp.path / "c.toml") << R"(
[run]
name = "same"
seed = 4
max_duration = "3ep"
checkpoint_every = "7ba"
[model]
name = "mlp"
widths = [8, 16, 4]
[datasets.train]
kind = "synthetic"
samples = 400
features = 8
classes = 4
seed = 1
[datasets.test]
kind = "synthetic"
samples = 100
features = 8
classes = 4
seed = 2
[defaults]
data = "train"
batch_size = 32
optimizer = { name = "sgd", lr = 0.05, momentum = 0.9 }
eval = { sets = ["test"], interval = "5ba" }
[[stages]]
name = "one"
duration = "2ep"
[[stages]]
name = "two"
duration = "1ep"
batch_size = 64
)";
  const std::string file = (tmp.path / "c.toml").string();
  const auto cli = std::system((std::string(BATON_EXE) + " run " + file + " --run-dir " + (tmp.path / "cli").string() +
                                " > /dev/null 2>&1").c_str());
  REQUIRE(cli == 0);
  auto cur = baton::load_curriculum(file);
  REQUIRE(cur);
  auto specs = cur->specs();
  REQUIRE(specs);
  auto options = cur->run_options();
  options.dir = tmp.path / "cpp";
  options.progress = false;
  const auto cpp = baton::run(options, *specs, test::ok(cur->init()));
  REQUIRE(cpp);
  const auto from_cli = baton::read_checkpoint_info(tmp.path / "cli" / "final.baton");
  REQUIRE(from_cli);
  CHECK(from_cli->params_sha256 == baton::params_sha256(cpp->state));
  const auto lines = metric_lines(options.dir);
  CHECK(lines.size() > 10);
  CHECK(lines == metric_lines(tmp.path / "cli"));
}

#ifdef BATON_RUN_EXAMPLE  // built with the examples (the sanitizer build leaves them out)
TEST_CASE("a C++ chain killed (SIGKILL) at random moments and resumed with the same call equals the uninterrupted chain",
          "[run][resume][kill]") {
  test::TempDir tmp;
  std::string log;
  auto whole = test::spawn(BATON_RUN_EXAMPLE, {(tmp.path / "whole").string()});
  REQUIRE(test::finish(whole, log) == 0);
  std::mt19937 rng(20261203);
  std::uniform_int_distribution<int> delay_ms(30, 900);
  const fs::path cut = tmp.path / "cut";
  int kills = 0;
  for (int i = 0; i < 8; ++i) {
    auto child = test::spawn(BATON_RUN_EXAMPLE, {cut.string()});
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ::kill(child.pid, SIGKILL);
    std::string out;
    kills += test::finish(child, out) == 128 + SIGKILL;
  }
  INFO(kills << " of 8 runs were killed before they finished");
  auto last = test::spawn(BATON_RUN_EXAMPLE, {cut.string()});
  std::string out;
  REQUIRE(test::finish(last, out) == 0);
  const auto a = baton::read_checkpoint_info(tmp.path / "whole" / "final.baton");
  const auto b = baton::read_checkpoint_info(cut / "final.baton");
  REQUIRE(a);
  REQUIRE(b);
  CHECK(a->params_sha256 == b->params_sha256);
  CHECK(metric_lines(cut) == metric_lines(tmp.path / "whole"));
}
#endif

TEST_CASE("baton run: SIGINT at 20 random moments -- every checkpoint announced exists at its batch, resume gives the same bits",
          "[run][cli][resume][slow]") {
  test::TempDir tmp;
  // Stages of 1 batch between longer ones: signals land in last batches and in 1-batch stages.
  std::ofstream(tmp.path / "s.toml") << R"(
[run]
name = "signals"
seed = 9
max_duration = "600ba"
[model]
name = "mlp"
widths = [8, 1024, 1024, 4]
[datasets.train]
kind = "synthetic"
samples = 2000
features = 8
classes = 4
seed = 1
[defaults]
data = "train"
batch_size = 16
optimizer = { name = "sgd", lr = 0.02, momentum = 0.9 }
[[stages]]
name = "a"
duration = "150ba"
[[stages]]
name = "one"
duration = "1ba"
[[stages]]
name = "b"
duration = "150ba"
[[stages]]
name = "two"
duration = "1ba"
[[stages]]
name = "c"
duration = "200ba"
)";
  const std::string file = (tmp.path / "s.toml").string();
  std::string log;
  // The moments fall in the training: after the line baton run prints before baton::run, up to
  // the time the uninterrupted run took from there.
  const std::string marker = "run \"signals\"";
  auto whole = test::spawn(BATON_EXE, {"run", file, "--run-dir", (tmp.path / "whole").string()});
  REQUIRE(test::read_until(whole, marker, log));
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(test::finish(whole, log) == 0);
  const auto span = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  const auto expected = baton::read_checkpoint_info(tmp.path / "whole" / "final.baton");
  REQUIRE(expected);
  std::mt19937 rng(3);
  std::uniform_int_distribution<long> delay_ms(0, span.count());
  const std::string cut = (tmp.path / "cut").string();
  int interrupted = 0;
  for (int i = 0; i < 20; ++i) {
    auto child = test::spawn(BATON_EXE, {"run", file, "--run-dir", cut});
    std::string out;
    REQUIRE(test::read_until(child, marker, out));
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ::kill(child.pid, SIGINT);
    const int rc = test::finish(child, out);
    INFO(out);
    // 130: the signal came after baton::run returned, when Ctrl-C ends the program as usual; the
    // run had finished, so its final state must be complete and right.
    REQUIRE((rc == 0 || rc == 3 || rc == 128 + SIGINT));
    if (rc == 128 + SIGINT) {
      const auto done = baton::read_checkpoint_info(fs::path(cut) / "final.baton");
      REQUIRE(done);
      CHECK(done->params_sha256 == expected->params_sha256);
    }
    if (rc != 3) {
      fs::remove_all(cut);  // it finished: start over for the next moment
      continue;
    }
    ++interrupted;
    // "interrupted at epoch E, batch B (stage "s"); checkpoint written to PATH."
    const auto at = out.find("interrupted at epoch");
    REQUIRE(at != std::string::npos);
    const auto b = out.find(", batch ", at);
    const auto w = out.find("checkpoint written to ", at);
    REQUIRE(b != std::string::npos);
    REQUIRE(w != std::string::npos);
    const std::int64_t batch = std::stoll(out.substr(b + 8));
    const std::string path = out.substr(w + 22, out.find(".\n", w) - (w + 22));
    REQUIRE(fs::is_regular_file(path));
    const auto info = baton::read_checkpoint_info(path);
    REQUIRE(info);
    CHECK(info->time.batch == batch);
  }
  INFO(interrupted << " of 20 runs were interrupted");
  CHECK(interrupted >= 10);
  auto last = test::spawn(BATON_EXE, {"run", file, "--run-dir", cut});
  REQUIRE(test::finish(last, log) == 0);
  const auto got = baton::read_checkpoint_info(fs::path(cut) / "final.baton");
  REQUIRE(got);
  CHECK(got->params_sha256 == expected->params_sha256);
  CHECK(metric_lines(cut) == metric_lines(tmp.path / "whole"));
}

TEST_CASE("a run paused with pause_after / pause_at and called again equals the run never paused", "[run][pause]") {
  test::TempDir tmp;
  auto flag = std::make_shared<std::atomic<bool>>(false);
  const auto specs = stages(stop_at(flag, std::make_shared<std::int64_t>(-1)));
  const baton::RunOptions base{.dir = tmp.path / "whole", .name = "t", .progress = false};
  const auto whole = baton::run(base, specs, test::new_state(1, Time::epochs(4)));
  REQUIRE(whole);

  SECTION("one epoch at a time: paused mid-stage, at a stage's end, before a stage that closes a partial epoch") {
    auto options = base;
    options.dir = tmp.path / "epochs";
    options.pause_after = Time::epochs(1);
    // Stage a is 2 epochs of 10 batches, b one batch (into epoch 2), c five batches from epoch 3.
    const std::vector<std::int64_t> expected_batches = {10, 20, 21, 26};
    std::vector<std::int64_t> batches;
    for (int call = 0; call < 6; ++call) {
      auto r = baton::run(options, specs, test::new_state(1, Time::epochs(4)));
      REQUIRE(r);
      REQUIRE_FALSE(r->interrupted);
      batches.push_back(r->state.time.batch);
      if (!r->paused) {
        test::require_same_bits(whole->state, r->state);
        CHECK(fs::exists(options.dir / "final.baton"));
        break;
      }
      // The checkpoint the result names exists and holds the state the call ended with.
      REQUIRE(fs::is_regular_file(r->checkpoint));
      const auto info = baton::read_checkpoint_info(r->checkpoint);
      REQUIRE(info);
      CHECK(info->time.batch == r->state.time.batch);
      CHECK_FALSE(fs::exists(options.dir / "final.baton"));
    }
    CHECK(batches == expected_batches);
    CHECK(metric_lines(options.dir) == metric_lines(base.dir));
  }
  SECTION("half an epoch at a time (300 samples, 10 batches an epoch): on the batch grid, a pause at a stage's start") {
    auto options = base;
    options.dir = tmp.path / "halves";
    options.pause_after = Time{0.5, baton::TimeUnit::epoch};
    // Each call: 150 samples of the order more than where it starts, to the first batch end at or
    // past that: 0 -> 150 (batch 5 ends at 160), 160 -> 310 (batch 11, 332), 332 -> 482 (batch
    // 16, 492), 492 -> 642: stage a ends (600), b takes its one batch (632), and c, which begins by
    // closing that epoch, starts past the point: paused at 21. Then c to the run's end.
    const std::vector<std::int64_t> expected_batches = {5, 11, 16, 21, 26};
    std::vector<std::int64_t> batches;
    for (int call = 0; call < 8; ++call) {
      auto r = baton::run(options, specs, test::new_state(1, Time::epochs(4)));
      REQUIRE(r);
      batches.push_back(r->state.time.batch);
      if (!r->paused) {
        test::require_same_bits(whole->state, r->state);
        break;
      }
    }
    CHECK(batches == expected_batches);
    CHECK(metric_lines(options.dir) == metric_lines(base.dir));
  }
  SECTION("a point in epochs that is a part of one, and the max duration stays whole") {
    auto options = base;
    options.dir = tmp.path / "part";
    options.pause_at = Time{1.5, baton::TimeUnit::epoch};
    auto r = baton::run(options, specs, test::new_state(1, Time::epochs(4)));
    REQUIRE(r);
    REQUIRE(r->paused);
    CHECK(r->state.time.batch == 15);
    CHECK(r->state.time.sample_in_epoch == 160);
    auto again = baton::run(options, specs, test::new_state(1, Time::epochs(4)));
    REQUIRE_FALSE(again);
    CHECK_THAT(again.error().to_string(), Catch::Contains("nothing to train before the pause point 1.5ep"));
    auto bad = baton::init_state(test::bn_dropout_mlp(), {.seed = 1, .max_duration = Time{3.5, baton::TimeUnit::epoch}});
    REQUIRE_FALSE(bad);
    CHECK_THAT(bad.error().message, Catch::Contains("max_duration \"3.5ep\": the run's max duration counts whole epochs"));
  }
  SECTION("at points of the run's clock in batches, then samples, then to the end") {
    auto options = base;
    options.dir = tmp.path / "points";
    options.pause_at = Time::batches(15);
    auto r = baton::run(options, specs, test::new_state(1, Time::epochs(4)));
    REQUIRE(r);
    REQUIRE(r->paused);
    CHECK(r->state.time.batch == 15);
    options.pause_at = Time::samples(700);  // the first batch end at or past 700 samples: inside stage c
    r = baton::run(options, specs, test::new_state(1, Time::epochs(4)));
    REQUIRE(r);
    REQUIRE(r->paused);
    CHECK(r->state.time.sample == 728);
    CHECK(r->state.time.batch == 24);
    // A point already reached is an error that trains nothing.
    auto reached = options;
    reached.pause_at = Time::batches(20);
    auto again = baton::run(reached, specs, test::new_state(1, Time::epochs(4)));
    REQUIRE_FALSE(again);
    CHECK_THAT(again.error().to_string(), Catch::Contains("nothing to train before the pause point 20ba"));
    reached.pause_at.reset();
    reached.pause_after = Time::batches(0);
    CHECK_FALSE(baton::run(reached, specs, test::new_state(1, Time::epochs(4))));
    options.pause_at.reset();
    r = baton::run(options, specs, test::new_state(1, Time::epochs(4)));
    REQUIRE(r);
    CHECK_FALSE(r->paused);
    test::require_same_bits(whole->state, r->state);
    CHECK(metric_lines(options.dir) == metric_lines(base.dir));
  }
  SECTION("both points at once is an error") {
    auto options = base;
    options.dir = tmp.path / "both";
    options.pause_at = Time::epochs(1);
    options.pause_after = Time::epochs(1);
    auto r = baton::run(options, specs, test::new_state(1, Time::epochs(4)));
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().to_string(), Catch::Contains("pause_at and pause_after are both set"));
  }
}
