// A stage with a model of its own: `[stages.model]` in a curriculum (a new head over the
// pretrained trunk), the same from C++, and what has to know which model a stage has: resume,
// the tools on a saved state, sweeps, and validation of a transfer that would take nothing.
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "baton/checkpoint.hpp"
#include "baton/sweep.hpp"
#include "helpers.hpp"
#include "process.hpp"

namespace {
using baton::Time;
using test::ok;

// Pretrain a 4-class mlp, then fine-tune a 3-class head on other data: [model]'s widths with the
// last one changed is the same trunk under a new head.
const std::string kNewHead = R"(
[run]
name = "heads"
seed = 11
max_duration = "40ba"

[model]
name = "mlp"
widths = [8, 16, 4]

[datasets.four]
kind = "synthetic"
samples = 64
features = 8
classes = 4
seed = 1

[datasets.three]
kind = "synthetic"
samples = 48
features = 8
classes = 3
seed = 2

[defaults]
batch_size = 8
optimizer = { name = "sgd", lr = 0.1 }

[[stages]]
name = "pretrain"
data = "four"
duration = "12ba"

[[stages]]
name = "finetune"
data = "three"
duration = "10ba"
eval = { sets = ["three"], metrics = ["accuracy"] }
[stages.model]
carry = "transfer"
widths = [8, 16, 3]
)";

baton::Curriculum curriculum(const std::string& text, const std::vector<std::string>& sets = {}) {
  return ok(baton::parse_curriculum(text, "heads.toml", sets));
}

std::int64_t outputs(const baton::TrainState& s) {
  return s.model.module->named_parameters().find("3.weight")->size(0);
}

baton::RunResult run_in(const baton::Curriculum& cur, const std::filesystem::path& dir, std::optional<Time> pause = {}) {
  auto o = cur.run_options();
  o.dir = dir;
  o.progress = false;
  o.pause_at = pause;
  return ok(cur.specs().and_then([&](const auto& specs) {
    return cur.init().and_then([&](baton::TrainState s) { return baton::run(o, specs, std::move(s)); });
  }));
}
}  // namespace

TEST_CASE("a stage's own model table: [model] with a new head, trunk transferred, head initialized anew", "[own_model]") {
  const auto cur = curriculum(kNewHead);
  REQUIRE(cur.validate());
  const auto specs = ok(cur.specs());
  REQUIRE(specs[0].model.kind == baton::ModelCarry::Kind::keep);
  REQUIRE(specs[1].model.kind == baton::ModelCarry::Kind::transfer);
  REQUIRE(specs[1].model.factory);
  // The stage's factory is [model] with its keys over [model]'s: a named mlp with the new widths.
  const auto* named = specs[1].model.factory.target<baton::models::Named>();
  REQUIRE(named);
  CHECK(named->name == "mlp");

  test::TempDir dir;
  const auto res = run_in(cur, dir.path / "run");
  CHECK(outputs(res.state) == 3);
  const auto& record = res.state.history.back();
  REQUIRE(record.transfer);
  INFO(record.transfer->to_string());
  CHECK(record.transfer->copied == std::vector<std::string>{"1.weight", "1.bias"});
  CHECK(record.transfer->initialized == std::vector<std::string>{"3.weight", "3.bias"});
  // The run's model and the model after each stage, as the tools load states with.
  CHECK(outputs(ok(baton::init_state(ok(cur.model("pretrain")), {.seed = 1, .max_duration = Time::batches(1)}))) == 4);
  CHECK(outputs(ok(baton::init_state(ok(cur.model("finetune")), {.seed = 1, .max_duration = Time::batches(1)}))) == 3);
  // The fingerprint covers the stage's model: another head is another run.
  CHECK(curriculum(kNewHead, {"stage.finetune.model.widths=[8, 16, 5]"}).fingerprint() != cur.fingerprint());
}

TEST_CASE("a new head is initialized from the run's seed and the stage: the same every time, another with another seed",
          "[own_model]") {
  // lr 0 in the fine-tune: the head keeps the values it was initialized with.
  const auto cur = curriculum(kNewHead, {"stage.finetune.optimizer.lr=0.0"});
  const auto specs = ok(cur.specs());
  const auto pre = ok(baton::fit(specs[0], ok(cur.init())));
  const auto a = ok(baton::fit(specs[1], pre));
  const auto b = ok(baton::fit(specs[1], pre));
  auto other_seed = pre;
  other_seed.seed += 1;
  const auto c = ok(baton::fit(specs[1], other_seed));
  auto param = [](const baton::TrainState& s, const char* name) { return s.model.module->named_parameters()[name]; };
  CHECK(param(a, "3.weight").equal(param(b, "3.weight")));
  CHECK(param(a, "1.weight").equal(param(pre, "1.weight")));  // the trunk is the pretrained one (lr 0)
  CHECK_FALSE(param(a, "3.weight").equal(param(c, "3.weight")));
  CHECK(param(c, "1.weight").equal(param(pre, "1.weight")));
}

TEST_CASE("a run paused inside a stage with its own model resumes from that stage's checkpoint, to the same bits",
          "[own_model][resume]") {
  const auto cur = curriculum(kNewHead);
  test::TempDir dir;
  const auto whole = run_in(cur, dir.path / "whole");
  const auto first = run_in(cur, dir.path / "cut", Time::batches(17));  // 5 batches into the fine-tune
  REQUIRE(first.paused);
  const auto rest = run_in(cur, dir.path / "cut");
  // Before, the checkpoint of the fine-tune did not load into [model] (4 outputs): the run went
  // back to the end of the pretraining.
  REQUIRE(rest.resumed_from);
  CHECK(ok(baton::read_checkpoint_info(*rest.resumed_from)).stage == "finetune");
  CHECK(ok(baton::read_checkpoint_info(*rest.resumed_from)).time.batch == 17);
  test::require_same_bits(whole.state, rest.state);
}

TEST_CASE("the tools load a saved state with the model of its stage", "[own_model][cli]") {
  test::TempDir dir;
  const auto file = dir.path / "heads.toml";
  std::ofstream(file) << kNewHead;
  const auto run = test::shell(fmt::format("{} run {} --run-dir {}", BATON_EXE, file.string(), (dir.path / "r").string()));
  REQUIRE(run.rc == 0);
  const auto eval = test::shell(fmt::format("{} eval --state {} --data three", BATON_EXE, (dir.path / "r/final.baton").string()));
  INFO(eval.out);
  CHECK(eval.rc == 0);
  CHECK_THAT(eval.out, Catch::Contains("accuracy"));
  const auto exported = test::shell(fmt::format("{} export {} -o {} --inference", BATON_EXE, (dir.path / "r/final.baton").string(),
                                                (dir.path / "m.pt").string()));
  INFO(exported.out);
  REQUIRE(exported.rc == 0);
  const auto card = ok(baton::read_model_card(dir.path / "m.pt"));
  CHECK(card.model == "mlp");
  CHECK(std::get<std::vector<double>>(card.options.at("widths")) == std::vector<double>{8, 16, 3});
}

TEST_CASE("a sweep over a fine-tune with its own model loads the pretrained parent with the parent's model",
          "[own_model][sweep]") {
  test::TempDir dir;
  const auto file = dir.path / "heads.toml";
  // The swept stage comes after the one with the new head: its parent holds a 3-output model.
  std::ofstream(file) << kNewHead << "\n[[stages]]\nname = \"polish\"\ndata = \"three\"\nduration = \"4ba\"\n"
                      << "\n[sweep]\ngrid = { \"stage.polish.optimizer.lr\" = [0.05, 0.1] }\n";
  const auto out = test::shell(fmt::format("{} sweep {} --dir {}", BATON_EXE, file.string(), (dir.path / "s").string()));
  INFO(out.out);
  CHECK(out.rc == 0);
  CHECK_THAT(out.out, Catch::Contains("stage.polish.optimizer.lr=0.05") && Catch::Contains("stage.polish.optimizer.lr=0.1"));
}

TEST_CASE("a transfer that takes nothing is an error: at validation with file:line, and from fit", "[own_model][errors]") {
  // The stage's own model shares no name and shape with the one before it.
  auto bad = curriculum(kNewHead, {"stage.finetune.model.widths=[8, 3]"});
  auto v = bad.validate();
  REQUIRE_FALSE(v);
  INFO(v.error().message);
  CHECK_THAT(v.error().message, Catch::Contains("heads.toml:") && Catch::Contains("stage \"finetune\": model: the transfer "
                                                                                  "takes nothing") &&
                                    Catch::Contains("1.weight [16, 8]") && Catch::Contains("carry = \"reinitialize\""));
  // From C++: fit refuses before training, and the state given is untouched.
  const auto specs = ok(curriculum(kNewHead).specs());
  const auto pre = ok(baton::fit(specs[0], ok(curriculum(kNewHead).init())));
  const auto other = baton::models::mlp({8, 3});
  const auto before = baton::params_sha256(pre);
  auto r = baton::fit(specs[1].with_model(baton::ModelCarry::transfer(other)), pre);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("stage \"finetune\": model: the transfer takes nothing"));
  CHECK(baton::params_sha256(pre) == before);
  // Fresh by request is not a mistake: everything anew on purpose.
  CHECK(baton::fit(specs[1].with_model(baton::ModelCarry::transfer().reinitializing({"*"})), pre));
}

TEST_CASE("a stage's own model: bad tables are errors with file:line", "[own_model][errors]") {
  // The file with another [stages.model] table for the fine-tune (written in the file: lines).
  auto message = [](const std::string& table) {
    std::string text = kNewHead;
    const std::string mine = "carry = \"transfer\"\nwidths = [8, 16, 3]\n";
    text.replace(text.find(mine), mine.size(), table);
    auto cur = baton::parse_curriculum(text, "heads.toml");
    if (cur) {
      auto v = cur->validate();
      return v ? std::string() : v.error().message;
    }
    return cur.error().message;
  };
  // Model keys with carry = "keep" (or none): a model of its own needs transfer or reinitialize.
  CHECK_THAT(message("carry = \"keep\"\nwidths = [8, 16, 3]\n"),
             Catch::Contains("heads.toml:40:9:") && Catch::Contains("needs carry = \"transfer\""));
  CHECK_THAT(message("widths = [8, 16, 3]\n"), Catch::Contains("heads.toml:39:1:") && Catch::Contains("needs carry"));
  // A key the model does not take, with a suggestion.
  CHECK_THAT(message("carry = \"transfer\"\nwidht = [8, 3]\n"),
             Catch::Contains("heads.toml:41:9:") && Catch::Contains("unknown key \"widht\" (did you mean \"widths\"?)"));
  // A model the registry does not know.
  CHECK_THAT(message("carry = \"transfer\"\nname = \"mpl\"\n"),
             Catch::Contains("heads.toml:41:8:") && Catch::Contains("unknown model \"mpl\" (did you mean \"mlp\"?)"));
  // The model's own checks, placed at the stage's table.
  CHECK_THAT(message("carry = \"transfer\"\nwidths = [8]\n"),
             Catch::Contains("heads.toml:39:1:") && Catch::Contains("stage \"finetune\": model \"mlp\"") &&
                 Catch::Contains("at least two"));
  // The new head must fit the stage's data: 2 outputs for 3 classes.
  CHECK_THAT(message("carry = \"transfer\"\nwidths = [8, 16, 2]\n"),
             Catch::Contains("stage \"finetune\": the model's output [2, 2] does not fit the training data (\"three\")"));
}
