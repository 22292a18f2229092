// Curricula that branch (tree.hpp): every branch equals an independent run of its path, the shared
// prefix trains once, a branch's own data leaves the others alone, an edited branch is refused
// alone, a killed tree resumes to the same bits, and the same tree from C++ specs.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "baton/interop.hpp"
#include "baton/text.hpp"
#include "baton/tree.hpp"
#include "helpers.hpp"
#include "process.hpp"

namespace fs = std::filesystem;

namespace {
// pre -> a; pre -> b (its own data, a 3-way head, a scratch baseline); pre -> c -> c2.
const char* kTree = R"(
[run]
name = "tree"
seed = 5
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
[datasets.own]
kind = "synthetic"
samples = 300
classes = 3
seed = 11
[defaults]
data = "all"
batch_size = 20
optimizer = { name = "adam", lr = 0.01 }
eval = { sets = ["val"] }
[[stages]]
name = "pre"
duration = "2ep"
[[stages]]
name = "a"
from = "pre"
duration = "1ep"
optimizer = { lr = 0.003 }
[[stages]]
name = "b"
from = "pre"
baseline = "scratch"
data = "own"
duration = "1ep"
eval = { sets = ["own"] }
model = { carry = "transfer", widths = [8, 16, 3] }
[[stages]]
name = "c"
from = "pre"
duration = "1ep"
batch_size = 10
[[stages]]
name = "c2"
duration = "1ep"
)";

template <class T>
T tree_value(baton::Expected<T> r) {
  if (!r) FAIL(r.error().to_string());
  return std::move(*r);
}

/// branch (with "@scratch" for a baseline) -> params_sha256, from a tree's summary.json.
std::map<std::string, std::string> branch_hashes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  const auto summary = nlohmann::json::parse(std::ifstream(dir / "summary.json"));
  for (const auto& p : summary.at("points"))
    out[p.at("branch").get<std::string>() + (p.at("baseline").get<std::string>().empty() ? "" : "@scratch")] =
        p.at("params_sha256").get<std::string>();
  return out;
}

std::map<std::string, std::string> hashes_of(const baton::SweepResult& r) {
  std::map<std::string, std::string> out;
  for (const auto& p : r.points) out[p.branch + (p.baseline ? "@scratch" : "")] = p.params_sha256;
  return out;
}

fs::file_time_type mtime(const fs::path& p) { return fs::last_write_time(p); }
}  // namespace

TEST_CASE("a tree: each branch equals an independent run of its path, and the prefix trains once", "[tree]") {
  test::TempDir tmp;
  const fs::path file = tmp.path / "t.toml";
  std::ofstream(file) << kTree;
  const auto cur = tree_value(baton::load_curriculum(file));
  REQUIRE(cur.is_tree());
  REQUIRE(cur.branches().size() == 4);
  CHECK(cur.branches()[1].name == "b");
  CHECK(cur.branches()[2].baseline);
  CHECK(cur.branches()[2].stages == std::vector<std::string>{"b"});
  CHECK(cur.branches()[3].stages == std::vector<std::string>{"pre", "c", "c2"});
  CHECK_FALSE(cur.specs());  // a tree has no one order of stages

  const fs::path dir = tmp.path / "tree";
  const auto r = tree_value(baton::run_tree(file, {.dir = dir, .progress = false}));
  REQUIRE(r.points.size() == 4);
  CHECK(r.stages_total == 8);
  CHECK(r.stages_trained == 6);  // "pre" once for three branches
  for (const auto* stage : {"pre", "a", "b", "c", "c2", "scratch/b"}) {
    INFO(stage);
    CHECK(fs::is_regular_file(dir / stage / "final.baton"));
    CHECK(fs::is_regular_file(dir / stage / "metrics.jsonl"));
  }
  CHECK(fs::is_regular_file(dir / "summary.json"));
  CHECK(fs::is_regular_file(dir / "report.html"));
  {  // every stage's curves, the baseline's named apart from its branch's
    std::ifstream in(dir / "report.html");
    const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK_THAT(page, Catch::Contains("<b>b</b>") && Catch::Contains("<b>scratch/b</b>") && Catch::Contains("<b>c2</b>"));
  }
  CHECK(r.points[0].shared_stages == 1);
  CHECK(r.points[2].shared_stages == 0);
  CHECK(r.points[1].metric == "own/accuracy");
  CHECK_THAT(r.table(), Catch::Contains("b (scratch)") && Catch::Contains("6 stage runs for 8 branch stages (2 shared)"));

  // Every branch, and the baseline, as the chain of its path in a directory of its own.
  for (std::size_t i = 0; i < cur.branches().size(); ++i) {
    const auto& b = cur.branches()[i];
    INFO("branch " << b.name << (b.baseline ? " (scratch)" : ""));
    auto ro = b.curriculum->run_options();
    ro.dir = tmp.path / fmt::format("alone-{}", i);
    ro.progress = false;
    const auto alone = tree_value(baton::run(ro, tree_value(b.curriculum->specs()), tree_value(b.curriculum->init())));
    CHECK(r.points[i].params_sha256 == baton::params_sha256(alone.state));
    CHECK(r.points[i].branch == b.name);
  }
  // The longest path as a file of its own, written by hand: no `from`, three stages.
  std::string chain = kTree;
  const auto cut = chain.find("[[stages]]\nname = \"a\"");
  const auto resume = chain.find("[[stages]]\nname = \"c\"");
  chain = chain.substr(0, cut) + chain.substr(resume);
  chain.replace(chain.find("from = \"pre\"\n"), 13, "");
  std::ofstream(tmp.path / "chain.toml") << chain;
  const auto plain = tree_value(baton::load_curriculum(tmp.path / "chain.toml"));
  REQUIRE_FALSE(plain.is_tree());
  auto ro = plain.run_options();
  ro.dir = tmp.path / "chain";
  ro.progress = false;
  const auto by_hand = tree_value(baton::run(ro, value(plain.specs()), value(plain.init())));
  CHECK(r.points[3].params_sha256 == baton::params_sha256(by_hand.state));
  // The branches differ (each stage reaches the training), and the baseline differs from its branch.
  CHECK(r.points[0].params_sha256 != r.points[3].params_sha256);
  CHECK(r.points[1].params_sha256 != r.points[2].params_sha256);

  SECTION("run again: nothing trains, the same results") {
    const auto before = mtime(dir / "pre" / "final.baton");
    const auto again = tree_value(baton::run_tree(file, {.dir = dir, .progress = false}));
    CHECK(hashes_of(again) == hashes_of(r));
    CHECK(mtime(dir / "pre" / "final.baton") == before);
  }
  SECTION("a branch's own data: the other branches' bits do not depend on it") {
    const auto other = tree_value(baton::run_tree(file, {.dir = tmp.path / "other", .sets = {"datasets.own.samples=200"}, .progress = false}));
    CHECK(other.points[0].params_sha256 == r.points[0].params_sha256);
    CHECK(other.points[3].params_sha256 == r.points[3].params_sha256);
    CHECK(other.points[1].params_sha256 != r.points[1].params_sha256);
  }
  SECTION("an edited branch is refused, naming it; the other branches are not touched") {
    const auto before = mtime(dir / "c2" / "final.baton");
    const auto edited = baton::run_tree(file, {.dir = dir, .sets = {"stage.b.optimizer.lr=0.002"}, .progress = false});
    REQUIRE_FALSE(edited);
    const auto text = edited.error().to_string();
    CHECK_THAT(text, Catch::Contains("branch \"b\"") && Catch::Contains("stage \"b\"") && Catch::Contains("--fresh"));
    CHECK_THAT(text, !Catch::Contains("branch \"a\"") && !Catch::Contains("branch \"c2\""));
    CHECK(mtime(dir / "c2" / "final.baton") == before);
    // --fresh trains it again with the change.
    const auto fresh = tree_value(baton::run_tree(file, {.dir = tmp.path / "edited", .sets = {"stage.b.optimizer.lr=0.002"}, .progress = false}));
    CHECK(fresh.points[0].params_sha256 == r.points[0].params_sha256);
    CHECK(fresh.points[1].params_sha256 != r.points[1].params_sha256);
  }
  SECTION("the same tree from C++ specs, in one call, gives the same bits") {
    std::vector<baton::TreeStage> stages;
    const auto names = std::vector<std::string>{"pre", "a", "b", "c", "c2"};
    const auto spec_of = [&](const std::string& stage) -> baton::TrainingSpec {
      for (const auto& b : cur.branches())
        for (std::size_t k = 0; k < b.stages.size(); ++k)
          if (b.stages[k] == stage && !b.baseline) return tree_value(b.curriculum->specs())[k];
      FAIL("no stage " << stage);
      return {};
    };
    stages.push_back({spec_of("pre")});
    stages.push_back({spec_of("a"), "pre"});
    stages.push_back({spec_of("b"), "pre", true});
    stages.push_back({spec_of("c"), "pre"});
    stages.push_back({spec_of("c2")});
    baton::RunOptions o{.dir = tmp.path / "specs", .progress = false};
    const auto from_specs = tree_value(baton::run_tree(o, stages, tree_value(cur.init())));
    CHECK(hashes_of(from_specs) == hashes_of(r));
    CHECK(from_specs.stages_trained == 6);
    CHECK(fs::is_regular_file(tmp.path / "specs" / "scratch" / "b" / "final.baton"));
    // A stage of the path changed: refused on resume, naming the stage.
    stages[3].spec = stages[3].spec.with_batch_size(20);
    const auto changed = baton::run_tree(o, stages, tree_value(cur.init()));
    REQUIRE_FALSE(changed);
    CHECK_THAT(changed.error().to_string(), Catch::Contains("stage \"c\""));
    // Bad trees from C++: the same messages as a file's.
    stages[1].from = "c2";
    stages[2].from = "prex";
    const auto bad = baton::run_tree(o, stages, tree_value(cur.init()));
    REQUIRE_FALSE(bad);
    CHECK_THAT(bad.error().to_string(), Catch::Contains("\"c2\" comes later") && Catch::Contains("did you mean \"pre\""));
  }
}

TEST_CASE("a tree's bad `from` and `baseline` are errors at file:line before anything trains", "[tree]") {
  test::TempDir tmp;
  const auto load = [&](const std::string& from, const std::string& to) {
    std::string text = kTree;
    text.replace(text.find(from), from.size(), to);
    std::ofstream(tmp.path / "t.toml") << text;
    return baton::load_curriculum(tmp.path / "t.toml");
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"name = \"a\"\nfrom = \"pre\"", "name = \"a\"\nfrom = \"c\""},
      {"name = \"a\"\nfrom = \"pre\"", "name = \"a\"\nfrom = \"a\""},
      {"name = \"a\"\nfrom = \"pre\"", "name = \"a\"\nfrom = \"prr\""},
      {"name = \"b\"\nfrom = \"pre\"\nbaseline = \"scratch\"", "name = \"b\"\nfrom = \"pre\"\nbaseline = \"random\""},
      {"name = \"pre\"\n", "name = \"pre\"\nbaseline = \"scratch\"\n"},
      {"name = \"c2\"", "name = \"a\""}};
  const std::vector<std::string> want = {"t.toml:32:8: stage \"a\": from: \"c\" comes later (stage 4 of 5)",
                                         "t.toml:32:8: stage \"a\": from: a stage cannot start from itself",
                                         "t.toml:32:8: stage \"a\": from: no stage is named \"prr\" (did you mean \"pre\"?)",
                                         "t.toml:38:12: stage \"b\": baseline: \"random\" is not one of scratch",
                                         "stage \"pre\": baseline: the first stage has no pretraining to compare with",
                                         "stages[4].name: \"a\" is used by an earlier stage"};
  for (std::size_t i = 0; i < cases.size(); ++i) {
    INFO(want[i]);
    const auto r = load(cases[i].first, cases[i].second);
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().to_string(), Catch::Contains(want[i]));
  }
}

TEST_CASE("baton run of a tree: the table, and killed (kill -9) at random moments or by SIGTERM then run again, the same bits", "[tree][cli]") {
  test::TempDir tmp;
  const fs::path file = tmp.path / "t.toml";
  std::ofstream(file) << kTree;
  const std::vector<std::string> longer = {"--set", "stage.pre.duration=\"6ep\"", "--set", "run.max_duration=\"8ep\"",
                                           "--set", "run.checkpoint_every=\"4ba\"", "--set", "datasets.all.samples=1600"};
  auto args_for = [&](int jobs, const std::string& dir) {
    std::vector<std::string> a = {"run", file.string(), "--set", fmt::format("run.threads={}", jobs), "--jobs",
                                  std::to_string(jobs), "--run-dir", (tmp.path / dir).string()};
    a.insert(a.end(), longer.begin(), longer.end());
    return a;
  };
  const auto started = std::chrono::steady_clock::now();
  auto reference = test::spawn(BATON_EXE, args_for(1, "ref"));
  std::string ref_log;
  REQUIRE(test::finish(reference, ref_log) == 0);
  INFO(ref_log);
  CHECK_THAT(ref_log, Catch::Contains("a tree of 5 stages, 3 branches and 1 scratch baseline") &&
                          Catch::Contains("b (scratch)") && Catch::Contains("summary "));
  const auto ref_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count();
  const auto want = branch_hashes(tmp.path / "ref");
  REQUIRE(want.size() == 4);
  std::mt19937 rng(std::random_device{}());
  for (int jobs : {1, 2}) {
    const std::string dir = fmt::format("killed-{}", jobs);
    int stops = 0;
    for (; stops < 4; ++stops) {
      const int ms = std::uniform_int_distribution<int>(100, static_cast<int>(ref_ms * (jobs == 1 ? 1.0 : 1.6)))(rng);
      const int sig = stops % 2 == 0 ? SIGKILL : SIGTERM;
      INFO("jobs " << jobs << ", signal " << sig << " after " << ms << " ms");
      auto c = test::spawn(BATON_EXE, args_for(jobs, dir));
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      ::kill(c.pid, sig);
      std::string log;
      const int rc = test::finish(c, log);
      if (rc == 0) break;  // it had finished
      INFO(log);
      if (sig == SIGKILL) REQUIRE(rc == 128 + SIGKILL);
      else CHECK((rc == 3 || rc == 128 + SIGTERM));  // 3 once its handlers are up: a checkpoint was written
    }
    auto last = test::spawn(BATON_EXE, args_for(jobs, dir));
    std::string log;
    const int rc = test::finish(last, log);
    INFO("jobs " << jobs << " after " << stops << " stops: " << log);
    REQUIRE(rc == 0);
    if (jobs == 1) CHECK(branch_hashes(tmp.path / dir) == want);
    else CHECK(branch_hashes(tmp.path / dir).size() == 4);  // other threads per stage: other bits (sweep.hpp)
  }
  // --jobs 2 against --jobs 1 with the same threads per stage run: the same bits.
  std::vector<std::string> one = args_for(1, "one-thread");
  one[3] = "run.threads=1";
  auto c = test::spawn(BATON_EXE, one);
  std::string log;
  REQUIRE(test::finish(c, log) == 0);
  CHECK(branch_hashes(tmp.path / "one-thread") == branch_hashes(tmp.path / "killed-2"));
}

TEST_CASE("the shipped suite: three tasks from one pretraining, each with a scratch baseline, and merged classes named", "[tree]") {
  const auto cur = tree_value(baton::load_curriculum(fs::path(BATON_SOURCE_DIR) / "examples/fashion_suite.toml"));
  REQUIRE(cur.is_tree());
  REQUIRE(cur.branches().size() == 6);
  for (std::size_t i = 0; i < 6; i += 2) {
    CHECK(cur.branches()[i].stages.front() == "pretrain");
    CHECK(cur.branches()[i + 1].baseline);
    CHECK(cur.branches()[i + 1].stages.size() == 1);
  }
  REQUIRE(cur.validate());
  // The coarse task's artifact names each coarse class by the classes its label_map merges.
  const auto card = tree_value(cur.model_card("coarse", "coarse"));
  REQUIRE(card.classes.size() == 4);
  CHECK(card.classes[1] == "Trouser");
  CHECK(card.classes[2] == "Sandal|Sneaker|Ankle boot");
  CHECK(card.options.at("classes") == baton::ParamValue(4.0));
}

/// A GPT tree on the fortunes: pretraining, a topic classifier (with dropout and its scratch
/// baseline), continued LM with sequence-length warm-up.
const char* kGptTree = R"(
[run]
name = "gpt-tree"
seed = 7
max_duration = "30ba"
[model]
name = "gpt"
block_size = 24
n_layer = 1
n_head = 2
n_embd = 32
dropout = 0.1
[datasets.pre]
kind = "fortunes_lm"
topics = ["science", "computers"]
block_size = 24
[datasets.science]
kind = "fortunes_lm"
topics = ["science"]
block_size = 24
[datasets.topic]
kind = "fortunes_text"
topics = ["science", "computers"]
length = 24
min_records = 50
[datasets.topic_val]
kind = "fortunes_text"
topics = ["science", "computers"]
part = "val"
length = 24
min_records = 50
[defaults]
batch_size = 8
loss = "token_cross_entropy"
optimizer = { name = "adamw", lr = 0.003, weight_decay = 0.1, groups = [{ patterns = ["*.bias"], modules = ["LayerNorm", "Embedding"], weight_decay = 0.0 }] }
[[stages]]
name = "pre"
data = "pre"
duration = "8ba"
[[stages]]
name = "topic"
from = "pre"
baseline = "scratch"
data = "topic"
loss = "cross_entropy"
duration = "6ba"
model = { carry = "transfer", classes = 2 }
eval = { sets = ["topic_val"], limit = 64 }
[[stages]]
name = "lm"
from = "pre"
data = "science"
duration = "6ba"
optimizer = { lr = 0.001 }
algorithms = { seq_length_warmup = { min_length = 8, duration = 0.5 } }
)";

TEST_CASE("a GPT tree on fortunes: pretraining, a topic classifier with its scratch baseline, continued LM. Each branch "
          "equals an independent run of its path", "[tree][gpt][text]") {
  test::TempDir tmp;
  const fs::path file = tmp.path / "gpt.toml";
  std::ofstream(file) << kGptTree;
  const auto cur = tree_value(baton::load_curriculum(file));
  REQUIRE(cur.is_tree());
  REQUIRE(cur.branches().size() == 3);
  const auto r = tree_value(baton::run_tree(file, {.dir = tmp.path / "tree", .progress = false}));
  REQUIRE(r.points.size() == 3);
  CHECK(r.stages_trained == 4);  // "pre" once for both branches
  std::set<std::string> distinct;
  for (std::size_t i = 0; i < cur.branches().size(); ++i) {
    const auto& b = cur.branches()[i];
    INFO("branch " << b.name << (b.baseline ? " (scratch)" : ""));
    auto ro = b.curriculum->run_options();
    ro.dir = tmp.path / fmt::format("alone-{}", i);
    ro.progress = false;
    const auto alone = tree_value(baton::run(ro, tree_value(b.curriculum->specs()), tree_value(b.curriculum->init())));
    CHECK(r.points[i].params_sha256 == baton::params_sha256(alone.state));
    distinct.insert(r.points[i].params_sha256);
  }
  CHECK(distinct.size() == 3);  // the branches, and the baseline, differ
}

TEST_CASE("baton run of a GPT tree: Ctrl-C in a branch, then the same command trains that branch only, to the bits of "
          "the uninterrupted tree", "[tree][gpt][cli]") {
  test::TempDir tmp;
  const fs::path file = tmp.path / "gpt.toml";
  std::ofstream(file) << kGptTree;
  // The last branch long enough to be interrupted, with checkpoints inside it.
  const std::vector<std::string> longer = {"--set", "stage.lm.duration=\"400ba\"", "--set", "run.max_duration=\"420ba\"",
                                           "--set", "run.checkpoint_every=\"50ba\""};
  auto args_for = [&](const std::string& dir) {
    std::vector<std::string> a = {"run", file.string(), "--run-dir", (tmp.path / dir).string()};
    a.insert(a.end(), longer.begin(), longer.end());
    return a;
  };
  auto reference = test::spawn(BATON_EXE, args_for("ref"));
  std::string ref_log;
  REQUIRE(test::finish(reference, ref_log) == 0);
  const auto want = branch_hashes(tmp.path / "ref");
  REQUIRE(want.size() == 3);

  const fs::path dir = tmp.path / "stopped";
  auto c = test::spawn(BATON_EXE, args_for("stopped"));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(dir / "lm") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // inside the branch's training
  ::kill(c.pid, SIGINT);
  std::string log;
  const int rc = test::finish(c, log);
  INFO(log);
  REQUIRE(rc == 3);  // interrupted, with a checkpoint
  REQUIRE_FALSE(fs::exists(dir / "lm" / "final.baton"));
  std::map<std::string, fs::file_time_type> done;
  for (const auto* stage : {"pre", "topic", "scratch/topic"}) {
    INFO(stage);
    REQUIRE(fs::is_regular_file(dir / stage / "final.baton"));
    done[stage] = mtime(dir / stage / "final.baton");
  }
  auto again = test::spawn(BATON_EXE, args_for("stopped"));
  std::string log2;
  REQUIRE(test::finish(again, log2) == 0);
  INFO(log2);
  for (const auto& [stage, when] : done) CHECK(mtime(dir / stage / "final.baton") == when);  // not trained again
  CHECK(fs::is_regular_file(dir / "lm" / "final.baton"));
  CHECK(branch_hashes(dir) == want);
}

TEST_CASE("a tree from C++ specs on fortunes: every tool reads its stage directories (eval, export --inference, generate)",
          "[tree][gpt][cli]") {
  test::TempDir tmp;
  namespace text = baton::text;
  const baton::models::GptOptions gpt{.block_size = 24, .n_layer = 1, .n_head = 2, .n_embd = 32};
  const auto lm = tree_value(text::fortunes_lm({.corpus = {.topics = {"science"}}, .block_size = 24, .name = "science"}));
  const text::FortunesTextOptions topics{.corpus = {.topics = {"science", "computers"}}, .length = 24, .min_records = 50, .name = "topic"};
  const auto topic = tree_value(text::fortunes_text(topics));
  auto test_part = topics;
  test_part.part = text::Part::test, test_part.name = "topic_test";
  const auto topic_test = tree_value(text::fortunes_text(test_part));
  baton::TrainingSpec pre{.name = "pre", .data = {.train = lm, .batch_size = 8}, .loss = baton::loss::token_cross_entropy(),
                          .optimizer = baton::optim::adamw({.lr = 3e-3}), .duration = baton::Time::batches(6)};
  auto tune = pre.with_name("topic").with_optimizer_carry(baton::Carry::fresh);
  tune.data.train = topic;
  tune.loss = baton::loss::cross_entropy();
  auto head = gpt;
  head.classes = 2;
  tune.model = baton::ModelCarry::transfer(baton::models::gpt(head));
  tune.evaluation = baton::EvalSchedule{.spec = {.sets = {{"topic_test", topic_test}}}};
  const auto initial = tree_value(baton::init_state(baton::models::gpt(gpt), {.seed = 3, .max_duration = baton::Time::batches(12)}));
  const fs::path dir = tmp.path / "tree";
  const auto r = tree_value(baton::run_tree(baton::RunOptions{.dir = dir, .progress = false}, {{pre}, {tune, "pre"}}, initial));
  REQUIRE(r.points.size() == 1);
  const auto baton_cli = [](const std::string& args) { return test::shell(std::string(BATON_EXE) + " " + args); };

  auto e = baton_cli(fmt::format("eval --state {} --data topic_test --metric accuracy", (dir / "topic/final.baton").string()));
  INFO(e.out);
  REQUIRE(e.rc == 0);
  const auto accuracy = nlohmann::json::parse(e.out.substr(e.out.find('{'))).at("metrics").at("accuracy").get<double>();
  CHECK(accuracy == Approx(r.points[0].final_metrics.at("topic_test").at("accuracy")));
  e = baton_cli(fmt::format("export {} -o {} --inference", (dir / "topic/final.baton").string(), (tmp.path / "topic.pt").string()));
  INFO(e.out);
  REQUIRE(e.rc == 0);
  CHECK_THAT(e.out, Catch::Contains("tokens [24] (bytes-v1), 2 class names; classify with: baton predict"));
  const auto g = baton_cli(fmt::format("generate {} --prompt 'An atom ' --max-tokens 10 --seed 2", (dir / "pre/final.baton").string()));
  INFO(g.out);
  CHECK(g.rc == 0);
  CHECK_THAT(g.out, Catch::StartsWith("An atom "));
}

TEST_CASE("a fine-tune in another file starts from a tree stage's checkpoint (model.init_from names a .baton)", "[tree][interop]") {
  test::TempDir tmp;
  const fs::path file = tmp.path / "t.toml";
  std::ofstream(file) << kTree;
  const fs::path dir = tmp.path / "tree";
  tree_value(baton::run_tree(file, {.dir = dir, .progress = false}));
  const fs::path pre = dir / "pre" / "final.baton";
  const auto info = tree_value(baton::read_checkpoint_info(pre));

  auto fine_tune = [&](const std::string& init_from, const std::string& widths) {
    return fmt::format(R"(
[run]
seed = 9
max_duration = "1ep"
[model]
name = "mlp"
widths = {}
init_from = {}
[datasets.own]
kind = "synthetic"
samples = 300
classes = 3
seed = 11
[[stages]]
name = "ft"
data = "own"
batch_size = 20
duration = "1ep"
)", widths, init_from);
  };
  const std::string path = fmt::format("\"{}\"", pre.string());
  {  // the same model: every tensor taken, so the run starts with the pretraining's bits
    const auto cur = tree_value(baton::parse_curriculum(fine_tune(path, "[8, 16, 4]"), "same.toml"));
    const auto init = tree_value(cur.init());
    CHECK(baton::params_sha256(init) == info.params_sha256);
    CHECK(init.time.batch == 0);  // weights only: its own clock, optimizer and RNG
  }
  {  // a new 3-way head over the pretrained trunk, as a tree's transfer gives
    const auto cur = tree_value(baton::parse_curriculum(
        fine_tune(fmt::format("{{ path = {}, fresh = [\"3.*\"] }}", path), "[8, 16, 3]"), "head.toml"));
    baton::TransferReport report;
    const auto init = tree_value(cur.init(&report));
    CHECK(report.copied == std::vector<std::string>{"1.weight", "1.bias"});
    const auto sd = tree_value(baton::checkpoint_state_dict(pre));
    CHECK(init.named_parameters()[0].second.equal(sd.at(0).second));
    const auto done = tree_value(baton::fit(tree_value(cur.specs()).at(0), init));
    CHECK(done.time.batch == 15);
  }
  {  // weights = "ema" where the pretraining kept none, and where the file is not a checkpoint
    const auto cur = tree_value(baton::parse_curriculum(
        fine_tune(fmt::format("{{ path = {}, weights = \"ema\" }}", path), "[8, 16, 4]"), "ema.toml"));
    const auto init = cur.init();
    REQUIRE_FALSE(init);
    CHECK_THAT(init.error().to_string(), Catch::Contains("ema.toml: model.init_from") && Catch::Contains("holds none"));
    const fs::path exported = tmp.path / "pre.pt";
    REQUIRE(baton::save_state_dict(tree_value(baton::checkpoint_state_dict(pre)), exported));
    const auto not_ckpt = tree_value(baton::parse_curriculum(
        fine_tune(fmt::format("{{ path = \"{}\", weights = \"swa\" }}", exported.string()), "[8, 16, 4]"), "swa.toml")).init();
    REQUIRE_FALSE(not_ckpt);
    CHECK_THAT(not_ckpt.error().to_string(), Catch::Contains("is not") && Catch::Contains("pre.pt"));
    const auto bad = baton::parse_curriculum(fine_tune(fmt::format("{{ path = {}, weights = \"best\" }}", path), "[8, 16, 4]"), "bad.toml");
    CHECK_FALSE((bad && bad->init()));
  }
}

TEST_CASE("baton run of a tree with --for is refused before any dataset is read", "[tree][cli]") {
  test::TempDir tmp;
  const fs::path file = tmp.path / "t.toml";
  // stage a's data is a folder that does not exist: reading it would fail first
  std::string text = kTree;
  text.replace(text.find("optimizer = { lr = 0.003 }"), 0, "data = \"far\"\n");
  text += "[datasets.far]\nkind = \"image_folder\"\nroot = \"no-such-folder\"\n";
  std::ofstream(file) << text;
  for (const char* flag : {"--for 2ba", "--until 2ba"}) {
    const auto r = test::baton_cli(fmt::format("run {} {} --run-dir {}", file.string(), flag, (tmp.path / "run").string()));
    INFO(r.out);
    CHECK(r.rc == 2);
    CHECK_THAT(r.out, Catch::Contains("the stages make a tree"));
    CHECK_THAT(r.out, !Catch::Contains("no-such-folder"));
  }
  const auto plain = test::baton_cli(fmt::format("validate {}", file.string()));
  CHECK_THAT(plain.out, Catch::Contains("no-such-folder"));  // the folder is read when nothing refuses first
  CHECK_FALSE(fs::exists(tmp.path / "run"));
}

TEST_CASE("a scratch baseline trains its branch's stages as the branch resolves them, keys inherited from the stages it leaves out included",
          "[tree]") {
  // The fine-tune says nothing of schedule, clipping, precision or batch size: it inherits them from
  // the pretraining. Its scratch twin must train with the same, or "vs" compares two recipes.
  const std::string text = R"(
[run]
seed = 5
max_duration = "6ep"
[model]
name = "mlp"
widths = [8, 16, 4]
[datasets.all]
kind = "synthetic"
samples = 200
[defaults]
data = "all"
optimizer = { name = "adam", lr = 0.01 }
[[stages]]
name = "pre"
duration = "2ep"
batch_size = 10
clip_grad_norm = 0.5
precision = "bf16"
schedule = { name = "cosine", warmup = "2ba" }
[[stages]]
name = "ft"
from = "pre"
baseline = "scratch"
duration = "1ep"
)";
  const auto cur = tree_value(baton::parse_curriculum(text, "inherit.toml"));
  REQUIRE(cur.branches().size() == 2);
  const auto& branch = cur.branches()[0];
  const auto& twin = cur.branches()[1];
  REQUIRE(twin.baseline);
  CHECK(twin.stages == std::vector<std::string>{"ft"});
  REQUIRE(twin.curriculum->stages().size() == 1);  // it trains the fine-tune only
  const auto a = tree_value(branch.curriculum->stages().back().build());
  const auto b = tree_value(twin.curriculum->stages()[0].build());
  CHECK(b.name == "ft");
  CHECK(b.data.batch_size == 10);
  CHECK(b.clip_grad_norm == std::optional<double>(0.5));
  CHECK(b.precision == baton::Precision::bf16);
  CHECK(b.schedule.name == a.schedule.name);
  CHECK_THAT(b.schedule.name, Catch::Contains("cosine"));
  CHECK(b.schedule.warmup == a.schedule.warmup);
  CHECK(b.optimizer.rule.identity == a.optimizer.rule.identity);
  // Trained, the twin's stage directory holds the same resolved stage as the branch's.
  test::TempDir tmp;
  const fs::path file = tmp.path / "inherit.toml";
  std::ofstream(file) << text;
  const auto r = tree_value(baton::run_tree(file, {.dir = tmp.path / "run", .progress = false}));
  CHECK(r.stages_trained == 3);  // pre, ft, scratch/ft
  auto stage_of = [](const fs::path& config) {
    std::ifstream in(config);
    const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return all.substr(all.rfind("[[stages]]"));
  };
  CHECK(stage_of(tmp.path / "run" / "scratch" / "ft" / "config.toml") == stage_of(tmp.path / "run" / "ft" / "config.toml"));
}
