// Text corpora, the text datasets, the GPT and the token loss and metrics (text.hpp, model.hpp).
#include <cmath>
#include <fstream>
#include <set>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include "baton/baton.hpp"
#include "baton/testing.hpp"
#include "baton/text.hpp"
#include "helpers.hpp"
#include "process.hpp"

using baton::text::ByteTokenizer;
using test::ok;

namespace {
namespace fs = std::filesystem;

void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

/// A fortunes directory with the traps of the real one: links to another language's file, `.u8`
/// and `.dat` companions, overstrikes, a duplicate record, an empty `.u8` file.
void fake_fortunes(const fs::path& dir) {
  write_text(dir / "computers", "Fortran is\nforever.\n%\n_\bh_\bi bold: b\bbo\bol\bld\bd *___\b\b\bone*\n%\nSame text.\n%\n");
  write_text(dir / "science", "Same text.\n%\nE = mc^2\n%\n");
  write_text(dir / "science.dat", "binary index");
  write_text(dir / "it" / "computer", "Il computer.\n%\n");
  fs::create_symlink("it/computer", dir / "computer");
  fs::create_symlink("computers", dir / "computers.u8");
  write_text(dir / "de" / "witze", "Ein Witz \xc3\xbc" "ber Katzen.\n%\n");
  write_text(dir / "de" / "witze.u8", "");
}

std::vector<baton::text::Record> some_records(std::int64_t n) {
  std::vector<baton::text::Record> out;
  for (std::int64_t i = 0; i < n; ++i)
    out.push_back({"record number " + std::to_string(i) + (i % 3 == 0 ? " about cats" : " about dogs"), "en",
                   i % 3 == 0 ? "cats" : "dogs"});
  return out;
}

baton::models::GptOptions tiny_gpt(std::int64_t classes = 0, double dropout = 0.0) {
  return {.block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32, .dropout = dropout, .classes = classes};
}

baton::TrainingSpec lm_spec(const baton::Dataset& data, baton::Time duration) {
  return baton::TrainingSpec{
      .name = "pretrain",
      .data = {.train = data, .batch_size = 8},
      .loss = baton::loss::token_cross_entropy(),
      .optimizer = baton::optim::adamw({.lr = 3e-3}),
      .duration = duration,
  };
}
/// The promise of bits: fits split at `splits` and a resume at `at` give the bits of one fit.
void check_split_and_resume(const baton::TrainingSpec& spec, const baton::TrainState& state, std::vector<baton::Time> splits,
                            baton::Time at) {
  const auto split = baton::testing::split_invariant(spec, state, std::move(splits));
  INFO(split);
  CHECK(split.passed);
  const auto resume = baton::testing::resume_invariant(spec, state, at);
  INFO(resume);
  CHECK(resume.passed);
}

}  // namespace

TEST_CASE("fortunes: links, .u8 and .dat files are not read, overstrikes cleaned, duplicates kept once", "[text]") {
  test::TempDir tmp;
  fake_fortunes(tmp.path);
  auto c = ok(baton::text::fortunes({.dir = tmp.path, .languages = {"en", "de"}}));
  std::vector<std::string> texts, topics;
  for (const auto& r : c.records) texts.push_back(r.text), topics.push_back(r.language + "/" + r.topic);
  CHECK(texts == std::vector<std::string>{"Fortran is\nforever.", "hi bold: bold *one*", "Same text.", "E = mc^2",
                                          "Ein Witz \xc3\xbc" "ber Katzen."});
  CHECK(topics == std::vector<std::string>{"en/computers", "en/computers", "en/computers", "en/science", "de/witze"});
  CHECK(c.files == 3);
  CHECK(c.duplicates == 1);
  CHECK(c.overstrikes == 1);
  CHECK(c.undecodable == 0);
}

TEST_CASE("fortunes: bytes that are not UTF-8 are an error at file:line, or a counted skip", "[text]") {
  test::TempDir tmp;
  write_text(tmp.path / "pl" / "stare", "dobry\n%\nz\xb3y tekst\n%\nok\n");
  auto bad = baton::text::fortunes({.dir = tmp.path, .languages = {"pl"}});
  REQUIRE_FALSE(bad);
  CHECK_THAT(bad.error().message, Catch::Contains((tmp.path / "pl" / "stare").string() + ":3") &&
                                      Catch::Contains("not UTF-8"));
  auto skipped = ok(baton::text::fortunes({.dir = tmp.path, .languages = {"pl"}, .skip_undecodable = true}));
  CHECK(skipped.records.size() == 2);
  CHECK(skipped.undecodable == 1);
  CHECK_FALSE(baton::text::fortunes({.dir = tmp.path, .languages = {"xx"}}));
  CHECK_FALSE(baton::text::fortunes({.dir = tmp.path / "missing"}));
}

TEST_CASE("fortunes from the Debian packages: English topics only, no Italian links, duplicates dropped", "[text][fortunes]") {
  auto c = ok(baton::text::fortunes({.languages = {"en"}}));
  std::set<std::string> topics;
  for (const auto& r : c.records) topics.insert(r.topic);
  CHECK(topics.count("computers") == 1);
  CHECK(topics.count("computer") == 0);  // a link to it/computer, an Italian file
  CHECK(topics.count("zuse") == 0);
  CHECK(c.files == static_cast<std::int64_t>(topics.size()));
  CHECK(c.records.size() > 14000);
  CHECK(c.duplicates > 20);
  CHECK(c.overstrikes > 10);
  for (const auto& r : c.records) REQUIRE(r.text.find('\b') == std::string::npos);
  auto all = ok(baton::text::fortunes({.languages = {"en", "de", "es", "it", "ru", "pl"}}));
  CHECK(all.records.size() > 70000);
  const auto train = baton::text::split(c, baton::text::Part::train);
  const auto topic_classes = baton::text::labels_with(train, "topic", 200);
  CHECK(topic_classes.size() == 21);
  // The Python baseline (benchmarks/tfidf_topic.py) reads and splits the corpus by its own code
  // of the same policy: the same records, duplicates and parts, or its figures compare nothing.
  const auto py = test::shell("python3 " BATON_SOURCE_DIR "/benchmarks/tfidf_topic.py --check");
  REQUIRE(py.rc == 0);
  CHECK(py.out == fmt::format("records {} duplicates {} train {} val {} test {} classes {}\n", c.records.size(), c.duplicates,
                              train.size(), baton::text::split(c, baton::text::Part::val).size(),
                              baton::text::split(c, baton::text::Part::test).size(), topic_classes.size()));
}

TEST_CASE("text split: parts are disjoint, cover the corpus, and a record's part does not depend on its corpus", "[text]") {
  baton::text::Corpus c;
  c.records = some_records(2000);
  const auto train = baton::text::split(c, baton::text::Part::train);
  const auto val = baton::text::split(c, baton::text::Part::val);
  const auto test_part = baton::text::split(c, baton::text::Part::test);
  CHECK(train.size() + val.size() + test_part.size() == 2000);
  CHECK(val.size() > 60);
  CHECK(val.size() < 140);
  // The same record in a smaller corpus lands in the same part.
  baton::text::Corpus smaller;
  smaller.records.assign(c.records.begin() + 1000, c.records.end());
  std::set<std::string> val_texts;
  for (const auto& r : val) val_texts.insert(r.text);
  for (const auto& r : baton::text::split(smaller, baton::text::Part::val)) CHECK(val_texts.count(r.text) == 1);
  for (const auto& r : train) CHECK(val_texts.count(r.text) == 0);
}

TEST_CASE("lm windows: targets are inputs shifted by one, windows are a pure function of seed, epoch and index", "[text]") {
  const auto data = ok(baton::text::lm_windows(some_records(50), {.block_size = 16}));
  const auto idx = torch::arange(data.size(), torch::kLong);
  const auto a = ok(data.gather(idx, {.seed = 3, .epoch = 1}));
  CHECK(a.inputs.sizes() == std::vector<std::int64_t>{data.size(), 16});
  CHECK(a.inputs.narrow(1, 1, 15).equal(a.targets.narrow(1, 0, 15)));
  CHECK(a.inputs.equal(ok(data.gather(idx, {.seed = 3, .epoch = 1})).inputs));
  CHECK_FALSE(a.inputs.equal(ok(data.gather(idx, {.seed = 3, .epoch = 2})).inputs));
  CHECK_FALSE(a.inputs.equal(ok(data.gather(idx, {.seed = 4, .epoch = 1})).inputs));
  // Evaluation (epoch -1) reads the stream from its start: the first window is the first record.
  const auto e = ok(data.range(0, 1));
  CHECK(ok(ByteTokenizer::decode(std::vector<std::int64_t>(e.inputs.data_ptr<std::int64_t>(),
                                                            e.inputs.data_ptr<std::int64_t>() + 16))) == "record number 0 ");
  CHECK_FALSE(baton::text::lm_windows(some_records(0), {.block_size = 16}));
}

TEST_CASE("text classification: a record's bytes then padding, truncated to length, labels in class order", "[text]") {
  std::vector<baton::text::Record> r = {{"abc", "en", "b"}, {"0123456789", "en", "a"}};
  const auto d = ok(baton::text::classification(r, {.length = 6}));
  CHECK(d.inputs[0].equal(torch::tensor({97, 98, 99, 257, 257, 257}, torch::kLong)));
  CHECK(d.inputs[1].equal(torch::tensor({48, 49, 50, 51, 52, 53}, torch::kLong)));
  CHECK(d.targets.equal(torch::tensor({1, 0}, torch::kLong)));
  auto unknown = baton::text::classification(r, {.length = 6, .classes = {"a"}});
  REQUIRE_FALSE(unknown);
  CHECK_THAT(unknown.error().message, Catch::Contains("topic \"b\""));
}

TEST_CASE("gpt classifier: padding after a text changes no logit (causal attention)", "[text][gpt]") {
  auto state = ok(baton::init_state(baton::models::gpt(tiny_gpt(3)), {.seed = 5}));
  state.model.module->eval();
  const auto text = torch::tensor({{72, 105, 33, 257, 257, 257, 257, 257}}, torch::kLong);
  const auto shorter = text.narrow(1, 0, 4);
  const auto a = state.model.forward(text), b = state.model.forward(shorter);
  CHECK(a.sizes() == std::vector<std::int64_t>{1, 3});
  // Equal up to the rounding of matrix products of another shape (the padding's own keys are
  // masked out of every earlier position's attention).
  CHECK(torch::allclose(a, b, 1e-5, 1e-6));
  CHECK_FALSE(a.equal(state.model.forward(torch::tensor({{72, 105, 34, 257}}, torch::kLong))));
  // Mean pooling reads every position that is not padding: the same holds, and an earlier token counts.
  auto mean_options = tiny_gpt(3);
  mean_options.pool = "mean";
  auto mean = ok(baton::init_state(baton::models::gpt(mean_options), {.seed = 5}));
  mean.model.module->eval();
  const auto m = mean.model.forward(text);
  CHECK(torch::allclose(m, mean.model.forward(shorter), 1e-5, 1e-6));
  CHECK_FALSE(torch::allclose(m, a, 1e-5, 1e-6));
  CHECK_FALSE(torch::allclose(m, mean.model.forward(torch::tensor({{73, 105, 33, 257}}, torch::kLong)), 1e-5, 1e-6));
  const auto bad_pool = baton::Registry::builtin().models.at("gpt").make({{"classes", 3.0}, {"pool", std::string("max")}});
  REQUIRE_FALSE(bad_pool);
  CHECK_THAT(bad_pool.error().message, Catch::Contains("model.pool: \"max\" is not \"last\" or \"mean\""));
  // A sequence longer than block_size is a clear error of the forward, caught by train_step.
  auto spec = lm_spec(ok(baton::text::lm_windows(some_records(50), {.block_size = 16})), baton::Time::batches(1));
  auto long_batch = baton::Batch{torch::zeros({2, 17}, torch::kLong), torch::zeros({2, 17}, torch::kLong)};
  auto lm = ok(baton::init_state(baton::models::gpt(tiny_gpt()), {.seed = 5}));
  auto r = baton::train_step(spec, lm, long_batch);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message, Catch::Contains("block_size 16"));
  auto beyond = baton::train_step(spec, lm, {torch::full({2, 4}, 258, torch::kLong), torch::zeros({2, 4}, torch::kLong)});
  REQUIRE_FALSE(beyond);
  CHECK_THAT(beyond.error().message, Catch::Contains("token ids must be in [0, 258), got 258 to 258"));
}

TEST_CASE("token_cross_entropy: padded positions change nothing, microbatches weigh by their tokens", "[text][gpt]") {
  const auto loss = baton::loss::token_cross_entropy();
  torch::manual_seed(1);
  const auto logits = torch::randn({2, 5, 7});
  const auto y = torch::tensor({{1, 2, 3, -100, -100}, {4, 5, 6, 0, 1}}, torch::kLong);
  auto changed = logits.clone();
  changed.index_put_({0, torch::indexing::Slice(3, 5)}, 100.0);  // the padded positions
  CHECK(loss.fn(logits, y).item<double>() == loss.fn(changed, y).item<double>());
  CHECK(loss.units(y) == 8);
  // The mean over the 8 real tokens, not the mean of the two rows' means.
  const auto per = torch::nn::functional::cross_entropy(logits.reshape({10, 7}), y.reshape({10}),
                                                        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone).ignore_index(-100));
  CHECK(loss.fn(logits, y).item<double>() == Approx(per.sum().item<double>() / 8));
  const auto bad = torch::tensor({{1, 2, 3, 9, -100}, {4, 5, 6, 0, 1}}, torch::kLong);
  CHECK_THROWS_WITH(loss.fn(logits, bad), Catch::Contains("token 9 is outside the vocabulary [0, 7)"));

  // A step with two microbatches of 3 and 8 real tokens gives the loss of the whole batch.
  auto lm = ok(baton::init_state(baton::models::gpt(tiny_gpt()), {.seed = 5}));
  auto x = torch::randint(0, 256, {2, 16}, torch::kLong);
  auto t = torch::randint(0, 256, {2, 16}, torch::kLong);
  t.index_put_({0, torch::indexing::Slice(3, 16)}, -100);
  auto spec = lm_spec(ok(baton::text::lm_windows(some_records(50), {.block_size = 16})), baton::Time::batches(1));
  spec.optimizer = baton::optim::sgd({.lr = 0.5});  // updates proportional to the gradients (Adam's are not)
  const auto whole = ok(baton::train_step(spec, lm, {x, t}));
  auto halves = spec;
  halves.grad_accum = 2;
  const auto split = ok(baton::train_step(halves, lm, {x, t}));
  CHECK(split.loss == Approx(whole.loss).epsilon(1e-6));
  auto wa = whole.state.model.module->parameters(), sa = split.state.model.module->parameters();
  for (std::size_t i = 0; i < wa.size(); ++i) CHECK(torch::allclose(wa[i], sa[i], 1e-5, 1e-6));
}

TEST_CASE("gpt: the testing kit's checks pass (loss at init ln(vocab), gradients flow, overfits one batch)", "[text][gpt]") {
  const auto data = ok(baton::text::lm_windows(some_records(200), {.block_size = 16}));
  auto spec = lm_spec(data, baton::Time::epochs(1));
  auto state = ok(baton::init_state(baton::models::gpt(tiny_gpt()), {.seed = 5, .max_duration = baton::Time::epochs(1)}));
  const auto batch = baton::testing::first_batch(spec);
  CHECK(baton::testing::loss_at_init(spec, state, batch, {.tolerance = 0.05}).passed);
  CHECK(baton::testing::gradients_flow(spec, state, batch).passed);
  const auto fit = baton::testing::overfits_one_batch(spec, state, batch, {.steps = 300, .below = 0.5});
  INFO(fit);
  CHECK(fit.passed);
  // One tensor for the tied embedding and read-out: one optimizer slot, one update.
  std::int64_t tensors = 0;
  for (const auto& p : state.model.module->named_parameters()) tensors += p.key() == "wte.weight" ? 1 : 0;
  CHECK(tensors == 1);
  CHECK(state.model.module->named_parameters().size() == 4 + 2 * 12);
}

TEST_CASE("gpt: split and resume give the bits of one fit, with dropout", "[text][gpt]") {
  const auto data = ok(baton::text::lm_windows(some_records(300), {.block_size = 16}));
  auto spec = lm_spec(data, baton::Time::epochs(2));
  spec.clip_grad_norm = 1.0;
  spec.schedule = baton::schedule::linear_warmup(baton::Time::batches(5), baton::schedule::cosine());
  auto state = ok(baton::init_state(baton::models::gpt(tiny_gpt(0, 0.1)), {.seed = 9, .max_duration = baton::Time::epochs(2)}));
  check_split_and_resume(spec, state, {baton::Time::batches(7), baton::Time::epochs(1)}, baton::Time::batches(11));
}

TEST_CASE("gpt: sequence-length warm-up grows the windows over the stage, and split and resume keep the bits",
          "[text][gpt][algorithms]") {
  const auto data = ok(baton::text::lm_windows(some_records(300), {.block_size = 16}));
  auto spec = lm_spec(data, baton::Time::batches(20));
  spec.algorithms = {baton::algorithms::seq_length_warmup({.min_length = 4, .duration = 0.5, .step = 4})};
  // The lengths the step sees: a hook on the loss records each batch's positions.
  std::vector<std::int64_t> lengths;
  auto watched = spec;
  watched.loss.fn = [inner = spec.loss.fn, &lengths](const torch::Tensor& out, const torch::Tensor& target) {
    lengths.push_back(target.size(1));
    return inner(out, target);
  };
  auto state = ok(baton::init_state(baton::models::gpt(tiny_gpt(0, 0.1)), {.seed = 9, .max_duration = baton::Time::batches(20)}));
  (void)ok(baton::fit(watched, state));
  REQUIRE(lengths.size() == 20);
  CHECK(lengths.front() == 4);
  CHECK(lengths.back() == 16);
  CHECK(std::is_sorted(lengths.begin(), lengths.end()));
  CHECK(std::count(lengths.begin(), lengths.end(), 16) == 10);  // full length from half the stage on
  check_split_and_resume(spec, state, {baton::Time::batches(3), baton::Time::batches(11)}, baton::Time::batches(7));
  // Not token inputs: a clear error.
  const auto bad = baton::algorithms::seq_length_warmup({.min_length = 0});
  CHECK_THAT(bad.invalid, Catch::Contains("seq_length_warmup.min_length: must be >= 1, got 0"));
}

TEST_CASE("gpt in bf16: split and resume give the bits of one fit, with dropout and sequence-length warm-up",
          "[text][gpt][precision]") {
  // Autocast to bf16 (LayerNorm, softmax and the loss in fp32): the promise of bits holds as in
  // fp32. Where the CPU emulates bf16 this is slow, but the model is tiny.
  const auto data = ok(baton::text::lm_windows(some_records(200), {.block_size = 16}));
  auto spec = lm_spec(data, baton::Time::batches(14)).with_precision(baton::Precision::bf16);
  spec.clip_grad_norm = 1.0;
  spec.algorithms = {baton::algorithms::seq_length_warmup({.min_length = 4, .duration = 0.5, .step = 4})};
  auto state = ok(baton::init_state(baton::models::gpt(tiny_gpt(0, 0.1)), {.seed = 9, .max_duration = baton::Time::batches(14)}));
  const auto fp32 = ok(baton::fit(lm_spec(data, baton::Time::batches(14)), state));
  const auto bf16 = ok(baton::fit(spec, state));
  CHECK_FALSE(baton::bitwise_equal(fp32, bf16));  // bf16 arithmetic did run
  check_split_and_resume(spec, state, {baton::Time::batches(3), baton::Time::batches(9)}, baton::Time::batches(6));
}

TEST_CASE("gpt: a classifier stage transfers the pretrained trunk and trains a new head", "[text][gpt]") {
  const auto records = some_records(300);
  const auto lm = ok(baton::text::lm_windows(records, {.block_size = 16}));
  auto pre = lm_spec(lm, baton::Time::batches(10));
  auto state = ok(baton::init_state(baton::models::gpt(tiny_gpt()), {.seed = 9, .max_duration = baton::Time::batches(30)}));
  auto pretrained = ok(baton::fit(pre, state));
  const auto topics = ok(baton::text::classification(records, {.length = 16}));
  auto tune = pre.with_name("topic").with_duration(baton::Time::batches(20));
  tune.data.train = topics;
  tune.loss = baton::loss::cross_entropy();
  tune.model = baton::ModelCarry::transfer(baton::models::gpt(tiny_gpt(2)));
  tune.optimizer_carry = baton::Carry::fresh;
  tune.freeze = {"wte.*", "wpe.*", "h.*", "ln_f.*"};  // the trunk as pretrained: it must arrive unchanged
  auto tuned = ok(baton::fit(tune, pretrained));
  const auto before = pretrained.model.module->named_parameters();
  const auto after = tuned.model.module->named_parameters();
  CHECK(after.contains("head.weight"));
  CHECK_FALSE(before.contains("head.weight"));
  for (const auto& p : before) {
    INFO(p.key());
    CHECK(after[p.key()].equal(p.value()));
  }
  auto fresh = ok(baton::init_state(baton::models::gpt(tiny_gpt(2)), {.seed = 9}));
  CHECK_FALSE(after["head.weight"].equal(fresh.model.module->named_parameters()["head.weight"]));
  auto m = ok(baton::eval({.sets = {{"train", topics}}}, tuned));
  CHECK(m["train"]["accuracy"] >= 0.0);
  CHECK(m["train"]["accuracy"] <= 1.0);
}

TEST_CASE("token metrics: perplexity, bits per token and token accuracy from the real tokens", "[text][metrics]") {
  const auto data = ok(baton::text::lm_windows(some_records(60), {.block_size = 16}));
  auto state = ok(baton::init_state(baton::models::gpt(tiny_gpt()), {.seed = 2}));
  auto m = ok(baton::eval({.sets = {{"val", data}},
                           .loss = baton::loss::token_cross_entropy(),
                           .batch_size = 5,
                           .metrics = {ok(baton::metric::builtin("perplexity")), ok(baton::metric::builtin("bits_per_token")),
                                       ok(baton::metric::builtin("token_accuracy"))}},
                          state));
  const double loss = m["val"]["loss"];
  CHECK(m["val"]["perplexity"] == Approx(std::exp(loss)).epsilon(1e-6));
  CHECK(m["val"]["bits_per_token"] == Approx(loss / std::log(2.0)).epsilon(1e-6));
  CHECK(m["val"]["token_accuracy"] >= 0.0);
  CHECK(m["val"]["token_accuracy"] < 0.2);
  // The same for any eval batch size (up to the forward's rounding on other batch shapes).
  auto again = ok(baton::eval({.sets = {{"val", data}}, .loss = baton::loss::token_cross_entropy(), .batch_size = 7,
                               .metrics = {ok(baton::metric::builtin("perplexity"))}},
                              state));
  CHECK(again["val"]["perplexity"] == Approx(m["val"]["perplexity"]).epsilon(1e-9));
}
