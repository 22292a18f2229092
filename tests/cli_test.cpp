// The baton command line, run as a user runs it: as a separate process.
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <regex>
#include <random>

#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "helpers.hpp"
#include "process.hpp"

namespace fs = std::filesystem;

namespace {
using Result = test::Output;  // rc, and stdout with stderr

Result run(const std::string& args) { return test::shell(std::string(BATON_EXE) + " " + args); }

fs::path cli_dir(const std::string& name) { return test::temp_dir("cli-" + name); }

std::string sha_of(const fs::path& state) {
  auto r = run("inspect " + state.string());
  REQUIRE(r.rc == 0);
  return nlohmann::json::parse(r.out).at("params_sha256").get<std::string>();
}

const char* kSynthetic = R"(
[run]
name = "cli"
seed = 4
max_duration = "2ep"
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
schedule = { name = "cosine" }
eval = { sets = ["test"] }
)";
}  // namespace

TEST_CASE("bf16 on a CPU that emulates it: validate and the first fit warn with the cost, a native one does not",
          "[cli][precision]") {
  const auto dir = cli_dir("bf16");
  std::ofstream(dir / "c.toml") << kSynthetic << "[[stages]]\nname = \"s\"\nduration = \"1ep\"\ndata = \"train\"\nprecision = \"bf16\"\n";
  const auto file = (dir / "c.toml").string();
  // BATON_CPU_BF16 pretends either capability, whatever this machine has.
  const auto emulated = test::shell(fmt::format("BATON_CPU_BF16=emulated {} validate {}", BATON_EXE, file));
  INFO(emulated.out);
  CHECK(emulated.rc == 0);
  CHECK_THAT(emulated.out, Catch::Contains("warning: stage \"s\" trains in bf16, but this CPU (") &&
                               Catch::Contains("has no native bf16") && Catch::Contains("13x") &&
                               Catch::Contains("precision = \"fp32\""));
  const auto native = test::shell(fmt::format("BATON_CPU_BF16=native {} validate {}", BATON_EXE, file));
  CHECK(native.rc == 0);
  CHECK_THAT(native.out, !Catch::Contains("warning"));
  // The fit says it once, and the runtime line names the CPU and what it does with bf16.
  const auto trained = test::shell(fmt::format("BATON_CPU_BF16=emulated {} run {} --run-dir {}", BATON_EXE, file, (dir / "r").string()));
  INFO(trained.out);
  CHECK(trained.rc == 0);
  CHECK_THAT(trained.out, Catch::Contains("runtime: CPU ") && Catch::Contains("bf16 emulated") &&
                              Catch::Contains("baton: warning: bf16: this CPU"));
  const auto once = trained.out.find("baton: warning: bf16");
  CHECK(trained.out.find("baton: warning: bf16", once + 1) == std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("baton relaunches itself with OpenMP's and OpenBLAS's idle threads set to sleep, keeping what the user set",
          "[cli][runtime]") {
  const auto dir = cli_dir("waits");
  std::ofstream(dir / "c.toml") << kSynthetic << "[[stages]]\nname = \"s\"\nduration = \"1ba\"\ndata = \"train\"\n";
  const auto run = [&](const std::string& env, const std::string& name) {
    return test::shell(fmt::format("env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY -u OPENBLAS_THREAD_TIMEOUT -u GOTO_THREAD_TIMEOUT {} "
                                   "{} run {} --run-dir {} --set run.threads=2",
                                   env, BATON_EXE, (dir / "c.toml").string(), (dir / name).string()));
  };
  const auto plain = run("", "a");
  INFO(plain.out);
  CHECK(plain.rc == 0);
  CHECK_THAT(plain.out, Catch::Contains("2 intra-op threads (GOMP_SPINCOUNT=1000)") &&
                            Catch::Contains("2 threads, OPENBLAS_THREAD_TIMEOUT=10)"));
  const auto own = run("OPENBLAS_THREAD_TIMEOUT=6", "b");
  INFO(own.out);
  CHECK(own.rc == 0);
  CHECK_THAT(own.out, Catch::Contains("(GOMP_SPINCOUNT=1000)") && Catch::Contains("2 threads, OPENBLAS_THREAD_TIMEOUT=6)"));
  fs::remove_all(dir);
}

TEST_CASE("every malformed curriculum in tests/data/bad fails validation with its message and exit code", "[cli][bad]") {
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(BATON_SOURCE_DIR) / "tests/data/bad")) {
    if (entry.path().extension() != ".toml") continue;
    std::ifstream in(entry.path());
    std::vector<std::string> expects;
    int exit_code = -1;
    for (std::string line; std::getline(in, line) && line.rfind("# ", 0) == 0;) {
      if (line.rfind("# expect: ", 0) == 0) expects.push_back(line.substr(10));
      if (line.rfind("# exit: ", 0) == 0) exit_code = std::stoi(line.substr(8));
    }
    const auto r = run("validate " + entry.path().string());
    INFO(entry.path().filename().string() << " printed:\n" << r.out);
    CHECK(r.rc == exit_code);
    REQUIRE_FALSE(expects.empty());
    for (const auto& e : expects) CHECK_THAT(r.out, Catch::Contains(e));
    ++checked;
  }
  CHECK(checked >= 15);
}

TEST_CASE("the command line: help, unknown commands, bad --set, missing files", "[cli]") {
  CHECK(run("--help").rc == 0);
  const auto version = run("--version");
  CHECK(version.rc == 0);
  CHECK_THAT(version.out, Catch::StartsWith("baton 0.") && Catch::Contains("LibTorch 1."));
  CHECK_THAT(run("run --help").out, Catch::Contains("--set"));
  CHECK(run("frobnicate").rc == 2);
  CHECK(run("run /nonexistent.toml").rc == 2);
  const auto dir = cli_dir("set");
  std::ofstream(dir / "c.toml") << kSynthetic << "[[stages]]\nname = \"a\"\nduration = \"1ep\"\n";
  const auto bad = run("validate " + (dir / "c.toml").string() + " --set stage.b.optimizer.lr=1");
  CHECK(bad.rc == 2);
  CHECK_THAT(bad.out, Catch::Contains("no stage \"b\""));
  CHECK(run("validate " + (dir / "c.toml").string() + " --set stage.a.optimizer.lr=0.1").rc == 0);
  CHECK(run("inspect " + (dir / "c.toml").string()).rc == 2);  // not a checkpoint
  fs::remove_all(dir);
}

TEST_CASE("[2ep] equals [1ep, 1ep] with the optimizer continued on the run clock (via baton inspect)", "[cli][property]") {
  const auto dir = cli_dir("split");
  std::ofstream(dir / "one.toml") << kSynthetic << "[[stages]]\nname = \"all\"\nduration = \"2ep\"\n";
  std::ofstream(dir / "two.toml") << kSynthetic
                                  << "[[stages]]\nname = \"first\"\nduration = \"1ep\"\n"
                                     "[[stages]]\nname = \"second\"\nduration = \"1ep\"\noptimizer_carry = \"keep\"\nclock = \"run\"\n";
  const auto one = run("run " + (dir / "one.toml").string() + " --run-dir " + (dir / "one").string());
  const auto two = run("run " + (dir / "two.toml").string() + " --dir " + (dir / "two").string());  // the alias
  INFO(one.out << "\n----\n" << two.out);
  REQUIRE(one.rc == 0);
  REQUIRE(two.rc == 0);
  CHECK(sha_of(dir / "one/final.baton") == sha_of(dir / "two/final.baton"));
  const auto fresh = run("run " + (dir / "two.toml").string() + " --run-dir " + (dir / "three").string() +
                         " --set stage.second.optimizer_carry=fresh");
  REQUIRE(fresh.rc == 0);
  CHECK(sha_of(dir / "one/final.baton") != sha_of(dir / "three/final.baton"));
  fs::remove_all(dir);
}

TEST_CASE("baton run end to end on a Fashion-MNIST subset: run directory, inspect, eval", "[cli][fashion]") {
  const auto dir = cli_dir("fashion");
  std::ofstream(dir / "f.toml") << R"(
[run]
name = "fmnist-small"
seed = 1
max_duration = "2ep"
[model]
name = "small_cnn"
channels1 = 8
channels2 = 16
hidden = 32
[datasets.train]
kind = "fashion-mnist"
split = "train"
limit = 3000
[datasets.test]
kind = "fashion-mnist"
split = "test"
limit = 500
[defaults]
batch_size = 64
optimizer = { name = "sgd", lr = 0.05, momentum = 0.9 }
eval = { sets = ["test"] }
[[stages]]
name = "warmup"
duration = "1ep"
eval = { interval = "20ba" }
[[stages]]
name = "finetune"
duration = "1ep"
optimizer = { lr = 0.01 }
)";
  const auto r = run("run " + (dir / "f.toml").string() + " --run-dir " + (dir / "run").string());
  INFO(r.out);
  REQUIRE(r.rc == 0);
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, std::regex("test_accuracy=([0-9.]+)")));
  CHECK(std::stod(m[1]) > 0.6);
  CHECK_THAT(r.out, Catch::Contains("warmup") && Catch::Contains("finetune") && Catch::Contains("total time"));
  // The model summary at the start: 8*9 + 16 (conv1, bn1), 8*16*9 + 32 (conv2, bn2), 16*7*7*32 + 32, 32*10 + 10.
  CHECK_THAT(r.out, Catch::Contains("model: 26,722 parameters") && Catch::Contains("input [1, 28, 28] -> output [10]") &&
                        Catch::Contains("stages \"warmup\", \"finetune\": 26,722 trainable, 0 frozen"));
  for (const char* f : {"config.toml", "metrics.jsonl", "metrics.csv", "final.baton", "checkpoints"})
    CHECK(fs::exists(dir / "run" / f));
  // Interval evaluations (every 20 batches of 47) and stage-end ones are in the JSONL log.
  std::ifstream jsonl(dir / "run/metrics.jsonl");
  int evals = 0, trains = 0;
  for (std::string line; std::getline(jsonl, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("event") == "eval") {
      ++evals;
      CHECK(j.contains("accuracy"));
    }
    if (j.at("event") == "train") ++trains;
  }
  CHECK(evals == 6);  // finetune inherits warmup's eval interval: 2 + 2 interval evals, 2 stage ends
  CHECK(trains > 10);
  const auto info = nlohmann::json::parse(run("inspect " + (dir / "run/final.baton").string()).out);
  CHECK(info.at("stage") == "finetune");
  CHECK(info.at("timestamp").at("epoch") == 2);
  CHECK_THAT(r.out, Catch::Contains(info.at("params_sha256").get<std::string>()));
  const auto ev = run("eval --state " + (dir / "run/final.baton").string() + " --data test");
  INFO(ev.out);
  REQUIRE(ev.rc == 0);
  CHECK(nlohmann::json::parse(ev.out).at("metrics").at("accuracy").get<double>() == Approx(std::stod(m[1])).margin(1e-4));
  // A checkpoint inside the run's checkpoints/ finds the run's config.toml one level up.
  fs::path ckpt;
  for (const auto& e : fs::directory_iterator(dir / "run" / "checkpoints")) ckpt = e.path();
  REQUIRE_FALSE(ckpt.empty());
  const auto ev_ckpt = run("eval --state " + ckpt.string() + " --data test");
  INFO(ev_ckpt.out);
  CHECK(ev_ckpt.rc == 0);
  fs::remove_all(dir);
}

namespace {
using test::Child;

/// A `baton` command in a child process (tests/process.hpp).
Child spawn(const std::vector<std::string>& args) { return test::spawn(BATON_EXE, args); }
using test::finish;
using test::read_until;

const char* kLong = R"(
[run]
name = "long"
seed = 11
max_duration = "6ep"
checkpoint_every = "40ba"
keep_checkpoints = 2
[model]
name = "mlp"
widths = [32, 256, 256, 4]
[datasets.train]
kind = "synthetic"
samples = 4000
features = 32
[defaults]
batch_size = 25
optimizer = { name = "adam", lr = 0.002 }
grad_accum = 2
[[stages]]
name = "first"
duration = "2ep"
schedule = { name = "cosine" }
clock = "stage"
[[stages]]
name = "second"
duration = "4ep"
optimizer = { name = "sgd", lr = 0.01, momentum = 0.9 }
optimizer_carry = "fresh"
)";
}  // namespace

TEST_CASE("Ctrl-C checkpoints and exits 3 -- running again resumes to the same bits", "[cli][resume]") {
  const auto dir = cli_dir("sigint");
  std::ofstream(dir / "long.toml") << kLong;
  const auto file = (dir / "long.toml").string();
  const auto whole = run("run " + file + " --run-dir " + (dir / "whole").string());
  REQUIRE(whole.rc == 0);
  const auto expected = sha_of(dir / "whole/final.baton");

  // Interrupt mid-epoch in the first stage, then in the second.
  for (const char* marker : {"[first] epoch 0 batch", "[second] epoch 3 batch"}) {
    auto child = spawn({"run", file, "--run-dir", (dir / "cut").string()});
    std::string log;
    REQUIRE(read_until(child, marker, log));
    ::kill(child.pid, SIGINT);
    const int rc = finish(child, log);
    INFO(log);
    CHECK(rc == 3);
    // The hint names the program as it was started (here by its path), so it can be pasted.
    CHECK_THAT(log, Catch::Contains("interrupted at epoch") && Catch::Contains(fmt::format("Resume with: {} run", BATON_EXE)));
  }
  const auto resumed = run("run " + file + " --run-dir " + (dir / "cut").string());
  INFO(resumed.out);
  REQUIRE(resumed.rc == 0);
  CHECK_THAT(resumed.out, Catch::Contains("resuming from"));
  CHECK(sha_of(dir / "cut/final.baton") == expected);

  // A changed configuration refuses to resume, saying what changed; --fresh starts over.
  auto child = spawn({"run", file, "--run-dir", (dir / "changed").string()});
  std::string log;
  REQUIRE(read_until(child, "[first] epoch 0 batch", log));
  ::kill(child.pid, SIGTERM);
  CHECK(finish(child, log) == 3);
  const auto changed = run("run " + file + " --run-dir " + (dir / "changed").string() + " --set stage.second.optimizer.lr=0.02");
  CHECK(changed.rc == 2);
  CHECK_THAT(changed.out, Catch::Contains("another configuration") && Catch::Contains("  + ") && Catch::Contains("lr =") &&
                              Catch::Contains("--fresh"));
  const auto fresh = run("run " + file + " --run-dir " + (dir / "changed").string() + " --fresh");
  REQUIRE(fresh.rc == 0);
  CHECK_THAT(fresh.out, !Catch::Contains("resuming from"));
  CHECK(sha_of(dir / "changed/final.baton") == expected);
  fs::remove_all(dir);
}

TEST_CASE("SIGINT or SIGTERM while baton starts, before any handler of its own: exit 3 and a checkpoint, never a death by signal",
          "[cli][signals]") {
  const auto dir = cli_dir("early-signal");
  std::ofstream(dir / "long.toml") << kLong;
  // From 150 ms on the process is past the dynamic loader, in LibTorch's static initialization
  // (about a second), in the thread-policy re-exec, or reading the curriculum and its data.
  int k = 0;
  for (const int sig : {SIGTERM, SIGINT})
    for (const int ms : {150, 400, 900, 1500}) {
      const auto run_dir = dir / fmt::format("r{}", k++);
      auto child = spawn({"run", (dir / "long.toml").string(), "--run-dir", run_dir.string()});
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      ::kill(child.pid, sig);
      std::string log;
      const int rc = finish(child, log);
      INFO("signal " << sig << " after " << ms << " ms:\n" << log);
      CHECK(rc == 3);
      CHECK_THAT(log, Catch::Contains("interrupted at epoch"));
    }
  fs::remove_all(dir);
}

TEST_CASE("SIGKILL at random moments, a corrupt newest checkpoint: resume still gives the same bits", "[cli][resume]") {
  const auto dir = cli_dir("sigkill");
  std::ofstream(dir / "long.toml") << kLong;
  const auto file = (dir / "long.toml").string();
  const auto whole = run("run " + file + " --run-dir " + (dir / "whole").string());
  REQUIRE(whole.rc == 0);
  const auto expected = sha_of(dir / "whole/final.baton");

  std::mt19937 rng(static_cast<unsigned>(::getpid()));
  for (int k = 0; k < 3; ++k) {
    auto child = spawn({"run", file, "--run-dir", (dir / "killed").string()});
    std::string log;
    REQUIRE(read_until(child, "%)", log));  // training has started
    ::usleep(std::uniform_int_distribution<unsigned>(0, 400000)(rng));
    ::kill(child.pid, SIGKILL);
    finish(child, log);
  }
  // No temporary file may pass for a checkpoint; flip a byte of the newest one.
  std::vector<fs::path> ckpts;
  for (const auto& e : fs::directory_iterator(dir / "killed/checkpoints"))
    if (e.path().extension() == ".baton") ckpts.push_back(e.path());
  std::sort(ckpts.begin(), ckpts.end());
  if (!ckpts.empty()) {
    std::fstream f(ckpts.back(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(200);
    char c = 0;
    f.get(c);
    f.seekp(200);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  const auto resumed = run("run " + file + " --run-dir " + (dir / "killed").string());
  INFO(resumed.out);
  REQUIRE(resumed.rc == 0);
  if (ckpts.size() > 1) CHECK_THAT(resumed.out, Catch::Contains("skipping checkpoint"));
  CHECK(sha_of(dir / "killed/final.baton") == expected);
  fs::remove_all(dir);
}

TEST_CASE("SIGKILL in the middle of a checkpoint write loses nothing", "[cli][resume]") {
  const auto dir = cli_dir("sigkill-write");
  std::ofstream(dir / "long.toml") << kLong;
  const auto file = (dir / "long.toml").string();
  const auto whole = run("run " + file + " --run-dir " + (dir / "whole").string());
  REQUIRE(whole.rc == 0);
  const auto expected = sha_of(dir / "whole/final.baton");

  // Each checkpoint write pauses 20 s after its first bytes (the test hook): kill it there.
  ::setenv("BATON_TEST_CHECKPOINT_PAUSE_MS", "20000", 1);
  auto child = spawn({"run", file, "--run-dir", (dir / "killed").string()});
  ::unsetenv("BATON_TEST_CHECKPOINT_PAUSE_MS");
  const fs::path ckpts = dir / "killed/checkpoints";
  fs::path partial;
  for (int i = 0; i < 600 && partial.empty(); ++i) {  // up to 60 s
    ::usleep(100000);
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(ckpts, ec))
      if (e.path().filename().string().find(".tmp-") != std::string::npos && fs::file_size(e.path(), ec) > 0) partial = e.path();
  }
  REQUIRE_FALSE(partial.empty());
  ::kill(child.pid, SIGKILL);
  std::string log;
  CHECK(finish(child, log) == 128 + SIGKILL);
  // The half-written file is only ever the temporary one: no checkpoint exists yet (the first
  // write was the one killed), and the temporary file is not one.
  std::vector<fs::path> real;
  for (const auto& e : fs::directory_iterator(ckpts))
    if (e.path().filename().string().rfind("ckpt-", 0) == 0) real.push_back(e.path());
  CHECK(real.empty());
  REQUIRE(fs::exists(partial));
  CHECK(fs::file_size(partial) < fs::file_size(dir / "whole/final.baton"));

  const auto resumed = run("run " + file + " --run-dir " + (dir / "killed").string());
  INFO(resumed.out);
  REQUIRE(resumed.rc == 0);
  CHECK_THAT(resumed.out, Catch::Contains("an unfinished checkpoint write"));
  CHECK_FALSE(fs::exists(partial));
  CHECK(sha_of(dir / "killed/final.baton") == expected);

  // Killed in a later write, with earlier checkpoints on disk: resume from the last whole one.
  ::setenv("BATON_TEST_CHECKPOINT_PAUSE_MS", "20000", 1);
  auto again = spawn({"run", file, "--run-dir", (dir / "later").string()});
  ::unsetenv("BATON_TEST_CHECKPOINT_PAUSE_MS");
  std::string log2;
  // The first write pauses too; wait for the second temporary file (a later checkpoint).
  std::set<std::string> temps;
  for (int i = 0; i < 1200 && temps.size() < 2; ++i) {
    ::usleep(100000);
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir / "later/checkpoints", ec))
      if (e.path().filename().string().find(".tmp-") != std::string::npos) temps.insert(e.path().filename().string());
  }
  REQUIRE(temps.size() == 2);
  ::kill(again.pid, SIGKILL);
  finish(again, log2);
  const auto later = run("run " + file + " --run-dir " + (dir / "later").string());
  INFO(later.out);
  REQUIRE(later.rc == 0);
  CHECK_THAT(later.out, Catch::Contains("resuming from"));
  CHECK(sha_of(dir / "later/final.baton") == expected);
  fs::remove_all(dir);
}

TEST_CASE("a second Ctrl-C exits at once in the middle of the interrupt checkpoint and loses nothing", "[cli][resume]") {
  const auto dir = cli_dir("double-ctrl-c");
  std::ofstream(dir / "long.toml") << kLong;
  const auto file = (dir / "long.toml").string();
  const auto whole = run("run " + file + " --run-dir " + (dir / "whole").string());
  REQUIRE(whole.rc == 0);
  const auto expected = sha_of(dir / "whole/final.baton");

  const fs::path ckpts = dir / "run/checkpoints";
  auto temp_file = [&]() -> fs::path {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(ckpts, ec))
      if (e.path().filename().string().find(".tmp-") != std::string::npos) return e.path();
    return {};
  };
  // Every checkpoint write pauses 20 s after its first bytes (the test hook).
  ::setenv("BATON_TEST_CHECKPOINT_PAUSE_MS", "20000", 1);
  auto child = spawn({"run", file, "--run-dir", (dir / "run").string()});
  ::unsetenv("BATON_TEST_CHECKPOINT_PAUSE_MS");
  // The first Ctrl-C lands in the pause of the first interval checkpoint (batch 40): that write
  // completes, the loop stops before the next batch and starts the interrupt checkpoint.
  bool in_write = false;
  for (int i = 0; i < 600 && !in_write; ++i) ::usleep(100000), in_write = !temp_file().empty();
  REQUIRE(in_write);
  ::kill(child.pid, SIGINT);
  bool second_write = false;
  for (int i = 0; i < 600 && !second_write; ++i) {
    ::usleep(100000);
    std::error_code ec;
    second_write = fs::exists(ckpts / "ckpt-0000000040.baton", ec) && !temp_file().empty();
  }
  REQUIRE(second_write);
  // The second Ctrl-C: out at once (128 + SIGINT), long before the 20 s pause is over.
  const auto t0 = std::chrono::steady_clock::now();
  ::kill(child.pid, SIGINT);
  std::string log;
  CHECK(finish(child, log) == 128 + SIGINT);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  INFO(log);
  // What is on disk is whole: every checkpoint loads; the cut write is only a temporary file.
  for (const auto& e : fs::directory_iterator(ckpts))
    if (e.path().filename().string().rfind("ckpt-", 0) == 0) CHECK(run("inspect " + e.path().string()).rc == 0);
  const auto resumed = run("run " + file + " --run-dir " + (dir / "run").string());
  INFO(resumed.out);
  REQUIRE(resumed.rc == 0);
  CHECK_THAT(resumed.out, Catch::Contains("resuming from"));
  CHECK(sha_of(dir / "run/final.baton") == expected);
  fs::remove_all(dir);
}

TEST_CASE("baton run with algorithms, callbacks and TensorBoard from the TOML file", "[cli][algorithms]") {
  const auto dir = cli_dir("algorithms");
  std::ofstream(dir / "a.toml") << R"(
[run]
name = "algos"
seed = 3
max_duration = "6ep"
tensorboard = true
[model]
name = "mlp"
widths = [8, 32, 4]
[datasets.train]
kind = "synthetic"
samples = 400
[datasets.test]
kind = "synthetic"
samples = 200
sample_seed = 99
[defaults]
batch_size = 20
optimizer = { name = "sgd", lr = 0.0 }
eval = { sets = ["test"], interval = "5ba" }
[[stages]]
name = "mixed"
duration = "2ep"
optimizer = { lr = 0.05, momentum = 0.9 }
algorithms = { mixup = { alpha = 0.3 }, label_smoothing = { smoothing = 0.1 }, ema = { decay = 0.9 } }
[[stages]]
name = "still"
duration = "4ep"
optimizer = { lr = 0.0 }
algorithms = {}
callbacks = { early_stopping = { metric = "test/loss", patience = 2 } }
eval = { weights = "ema" }
)";
  const auto file = (dir / "a.toml").string();
  const auto r = run("run " + file + " --run-dir " + (dir / "run").string());
  INFO(r.out);
  REQUIRE(r.rc == 0);
  // Stage 2 has lr 0 and no EMA (algorithms = {} switches the inherited ones off): the EMA
  // weights it evaluates stay put, so the loss cannot improve, so early stopping ends it after 2 more evaluations.
  CHECK_THAT(r.out, Catch::Contains("[still] stage ended early: early_stopping: test/loss did not improve"));
  std::size_t tb_files = 0;
  for (const auto& e : fs::directory_iterator(dir / "run/tensorboard"))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0 && fs::file_size(e.path()) > 100) ++tb_files;
  CHECK(tb_files == 1);
  // Stage 2 ended at batch 40 + 3 * 5 = 55 (evaluations at 45 best, 50, 55), and that is where
  // the final state is.
  const auto info = run("inspect " + (dir / "run/final.baton").string());
  REQUIRE(info.rc == 0);
  CHECK(nlohmann::json::parse(info.out).at("timestamp").at("batch") == 55);
  // The early stop right after the evaluation at 55 does not evaluate the same weights again.
  std::vector<std::int64_t> stage2_evals;
  std::ifstream jsonl(dir / "run/metrics.jsonl");
  for (std::string line; std::getline(jsonl, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == "eval" && j.value("stage", "") == "still") stage2_evals.push_back(j.at("batch"));
  }
  CHECK(stage2_evals == std::vector<std::int64_t>{45, 50, 55});
  // Running again trains nothing: stage 2's end checkpoint says it is done.
  const auto before = sha_of(dir / "run/final.baton");
  const auto again = run("run " + file + " --run-dir " + (dir / "run").string());
  INFO(again.out);
  CHECK(again.rc == 0);
  CHECK_THAT(again.out, !Catch::Contains("[mixed] epoch") && !Catch::Contains("[still] epoch"));
  CHECK(sha_of(dir / "run/final.baton") == before);
  fs::remove_all(dir);
}

TEST_CASE("a TOML run resumed with bit-neutral data settings changed (workers, prefetch) goes on to the same bits",
          "[cli][fingerprint]") {
  const auto dir = cli_dir("neutral");
  std::ofstream(dir / "c.toml") << kSynthetic << "[[stages]]\nname = \"a\"\nduration = \"2ep\"\n";
  const std::string file = (dir / "c.toml").string();
  const auto whole = run("run " + file + " --run-dir " + (dir / "whole").string());
  REQUIRE(whole.rc == 0);
  const std::string pieces = " --run-dir " + (dir / "pieces").string();
  REQUIRE(run("run " + file + pieces + " --until 9ba").rc == 0);
  const auto resumed = run("run " + file + pieces + " --set defaults.workers=2 --set defaults.prefetch=4");
  INFO(resumed.out);
  REQUIRE(resumed.rc == 0);
  CHECK_THAT(resumed.out, !Catch::Contains("changed"));
  CHECK(sha_of(dir / "pieces/final.baton") == sha_of(dir / "whole/final.baton"));
  // A setting that changes the bits is still refused, naming it.
  const auto lr = run("run " + file + " --run-dir " + (dir / "lr").string() + " --until 9ba");
  REQUIRE(lr.rc == 0);
  const auto changed = run("run " + file + " --run-dir " + (dir / "lr").string() + " --set defaults.optimizer.lr=0.02");
  CHECK(changed.rc == 2);
  CHECK_THAT(changed.out, Catch::Contains("lr"));
  fs::remove_all(dir);
}

TEST_CASE("baton run --for / --until: stop cleanly, look, go on -- the pieces equal one run", "[cli][pause]") {
  const auto dir = cli_dir("pause");
  std::ofstream(dir / "c.toml") << kSynthetic
                                << "[[stages]]\nname = \"a\"\nduration = \"1ep\"\n"
                                   "[[stages]]\nname = \"b\"\nduration = \"1ep\"\nbatch_size = 50\n";
  const std::string file = (dir / "c.toml").string();
  const auto whole = run("run " + file + " --run-dir " + (dir / "whole").string());
  REQUIRE(whole.rc == 0);
  const std::string pieces = " --run-dir " + (dir / "pieces").string();

  // 20 batches of 25 in stage a: pause inside it, evaluate the checkpoint, go on by epochs.
  auto first = run("run " + file + pieces + " --until 7ba");
  INFO(first.out);
  REQUIRE(first.rc == 0);
  std::smatch m;
  REQUIRE(std::regex_search(first.out, m, std::regex("paused at epoch 0, batch 7 \\(stage \"a\"\\); checkpoint (\\S+)")));
  const std::string checkpoint = m[1];
  REQUIRE(fs::is_regular_file(checkpoint));
  CHECK_THAT(first.out, Catch::Contains(std::string("continue with: ") + BATON_EXE + " run " + file + pieces));
  CHECK_FALSE(fs::exists(dir / "pieces/final.baton"));
  const auto look = run("eval --state " + checkpoint + " --data test");
  CHECK(look.rc == 0);
  CHECK_THAT(look.out, Catch::Contains("\"accuracy\""));

  // Half an epoch more: from 175 of 500 samples to 425, the end of batch 17.
  const auto half = run("run " + file + pieces + " --for 0.5ep");
  INFO(half.out);
  REQUIRE(half.rc == 0);
  CHECK_THAT(half.out, Catch::Contains("paused at epoch 0, batch 17"));
  // One epoch more: through the end of stage a (batch 20) to 425 samples of stage b's order, which
  // its batches of 50 pass at batch 9 of it.
  const auto second = run("run " + file + pieces + " --for 1ep");
  INFO(second.out);
  REQUIRE(second.rc == 0);
  CHECK_THAT(second.out, Catch::Contains("paused at epoch 1, batch 29"));
  const auto last = run("run " + file + pieces + " --for 1ep");  // the rest of stage b: the run's end
  INFO(last.out);
  REQUIRE(last.rc == 0);
  CHECK_THAT(last.out, !Catch::Contains("paused") && Catch::Contains("test_accuracy="));
  CHECK(sha_of(dir / "pieces/final.baton") == sha_of(dir / "whole/final.baton"));

  SECTION("bad pause points: clear errors, exit 2") {
    const auto both = run("run " + file + pieces + "-x --for 1ep --until 2ep");
    CHECK(both.rc == 2);
    CHECK_THAT(both.out, Catch::Contains("--until") && Catch::Contains("--for"));
    const auto fraction = run("run " + file + pieces + "-x --for 1.5ba");
    CHECK(fraction.rc == 2);
    CHECK_THAT(fraction.out, Catch::Contains("--for") && Catch::Contains("whole batches"));
    const auto done = run("run " + file + pieces + " --until 1ep");
    CHECK(done.rc == 0);  // the run is finished: nothing is trained, the final state stands
    CHECK(sha_of(dir / "pieces/final.baton") == sha_of(dir / "whole/final.baton"));
  }
  fs::remove_all(dir);
}
