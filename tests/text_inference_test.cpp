// Text models deployed: generation and classification of text lines, from a checkpoint or an
// inference artifact, through the C++ API and the `baton` program.
#include <fstream>
#include <set>

#include <fmt/format.h>

#include "baton/baton.hpp"
#include "baton/interop.hpp"
#include "baton/text.hpp"
#include "helpers.hpp"
#include "process.hpp"

namespace fs = std::filesystem;
using test::baton_cli;
using test::ok;

namespace {
std::vector<baton::text::Record> records(std::int64_t n) {
  std::vector<baton::text::Record> out;
  for (std::int64_t i = 0; i < n; ++i)
    out.push_back({i % 2 ? "the cat sat on the mat " + std::to_string(i) : "a dog ran in the park " + std::to_string(i), "en",
                   i % 2 ? "cats" : "dogs"});
  return out;
}

const baton::models::GptOptions kLm{.block_size = 24, .n_layer = 1, .n_head = 2, .n_embd = 32};

/// A language model trained a little on `records`, and its card.
std::pair<baton::TrainState, baton::ModelCard> small_lm() {
  const auto data = ok(baton::text::lm_windows(records(200), {.block_size = kLm.block_size}));
  baton::TrainingSpec spec{.data = {.train = data, .batch_size = 8},
                           .loss = baton::loss::token_cross_entropy(),
                           .optimizer = baton::optim::adamw({.lr = 1e-2}),
                           .duration = baton::Time::batches(30)};
  auto state = ok(baton::fit(spec, ok(baton::init_state(baton::models::gpt(kLm), {.seed = 4, .max_duration = baton::Time::batches(30)}))));
  baton::ModelCard card;
  card.model = "gpt";
  card.options = state.factory.target<baton::models::Named>()->params;
  card.input = baton::InputKind::tokens;
  card.input_shape = {kLm.block_size};
  card.tokenizer = baton::text::ByteTokenizer::identity();
  return {std::move(state), std::move(card)};
}
}  // namespace

TEST_CASE("generate: the same seed gives the same text, from a state or its artifact, and prompts past block_size are errors",
          "[text][gpt][inference]") {
  auto [state, card] = small_lm();
  const auto in_memory = ok(baton::predictor(state, card));
  const baton::GenerateOptions o{.max_tokens = 40, .temperature = 1.0, .top_k = 20, .seed = 11, .stop_at_end = false};
  const auto a = ok(in_memory.generate("the ", o));
  CHECK(a.size() >= 30);  // 40 tokens, bytes (and no end-of-text: stop_at_end is off)
  CHECK(ok(in_memory.generate("the ", o)) == a);
  auto other = o;
  other.seed = 12;
  CHECK(ok(in_memory.generate("the ", other)) != a);

  test::TempDir dir;
  REQUIRE(baton::save_for_inference(state, card, dir.path / "lm.pt"));
  const auto loaded = ok(baton::load_for_inference(dir.path / "lm.pt"));
  CHECK(loaded.card().tokenizer == "bytes-v1");
  CHECK(loaded.card().input == baton::InputKind::tokens);
  CHECK(ok(loaded.generate("the ", o)) == a);

  // Greedy: the most likely token each time, the same for any seed; and what the model learned.
  const baton::GenerateOptions greedy{.max_tokens = 12, .temperature = 0.0, .seed = 1};
  auto greedy2 = greedy;
  greedy2.seed = 99;
  CHECK(ok(loaded.generate("the cat ", greedy)) == ok(loaded.generate("the cat ", greedy2)));

  // generate_tokens: the continuation of ids, never more than max_tokens.
  const auto ids = ok(loaded.generate_tokens({256, 't', 'h', 'e'}, {.max_tokens = 5, .seed = 3, .stop_at_end = false}));
  CHECK(ids.size() == 5);
  for (const auto t : ids) CHECK((t >= 0 && t < 258));

  const auto too_long = loaded.generate(std::string(kLm.block_size, 'x'), o);  // + the end-of-text token: T + 1
  REQUIRE_FALSE(too_long);
  CHECK_THAT(too_long.error().message, Catch::Contains("prompt of 25 tokens") && Catch::Contains("1 to 24 (its block_size)"));

  // A tokenizer this baton does not know, or a SentencePiece one without its model: refused on loading.
  auto bad = card;
  bad.tokenizer = "wordpiece-v9";
  const auto unknown = baton::predictor(state, bad);
  REQUIRE_FALSE(unknown);
  CHECK_THAT(unknown.error().message, Catch::Contains("tokenizer \"wordpiece-v9\" is not one this baton knows"));
  bad.tokenizer = "sentencepiece-0123456789abcdef";
  const auto without_model = baton::predictor(state, bad);
  REQUIRE_FALSE(without_model);
  CHECK_THAT(without_model.error().message, Catch::Contains("but its model is missing"));
  // A language model does not classify.
  const auto classified = loaded.predict(ok(baton::encode_texts({"the cat"}, loaded.card())));
  REQUIRE_FALSE(classified);
  CHECK_THAT(classified.error().message, Catch::Contains("a language model"));
}

TEST_CASE("text classification artifact: encode_texts cuts and pads as training did, predict agrees with the model",
          "[text][gpt][inference]") {
  auto o = kLm;
  o.classes = 2;
  const auto recs = records(120);
  const auto data = ok(baton::text::classification(recs, {.length = 16, .classes = {"cats", "dogs"}}));
  baton::TrainingSpec spec{.data = {.train = data, .batch_size = 8},
                           .loss = baton::loss::cross_entropy(),
                           .optimizer = baton::optim::adamw({.lr = 1e-2}),
                           .duration = baton::Time::batches(20)};
  auto state = ok(baton::fit(spec, ok(baton::init_state(baton::models::gpt(o), {.seed = 4, .max_duration = baton::Time::batches(20)}))));
  baton::ModelCard card{.model = "gpt", .options = state.factory.target<baton::models::Named>()->params, .input = baton::InputKind::tokens, .input_shape = {16},
                        .classes = {"cats", "dogs"}, .tokenizer = "bytes-v1"};
  test::TempDir dir;
  REQUIRE(baton::save_for_inference(state, card, dir.path / "cls.pt"));
  const auto p = ok(baton::load_for_inference(dir.path / "cls.pt"));
  std::vector<std::string> texts;
  for (const auto& r : recs) texts.push_back(r.text);
  const auto x = ok(baton::encode_texts(texts, p.card()));
  CHECK(x.equal(data.inputs));  // the same ids, cut at 16 and padded, as the training data
  const auto predicted = ok(p.predict(x));
  baton::EvalSpec es;
  es.sets = {{"all", data}};
  const auto m = ok(baton::eval(es, state));
  CHECK(predicted.classes.eq(data.targets).to(torch::kDouble).mean().item<double>() == Approx(m.at("all").at("accuracy")));

  // The same through `baton predict` on a text file, one input per line (empty lines skipped).
  std::ofstream(dir.path / "lines.txt") << recs[0].text << "\n\n" << recs[1].text << "\n";
  const auto r = baton_cli(fmt::format("predict {} {}", (dir.path / "cls.pt").string(), (dir.path / "lines.txt").string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const auto c0 = predicted.classes[0].item<std::int64_t>(), c1 = predicted.classes[1].item<std::int64_t>();
  CHECK_THAT(r.out, Catch::StartsWith("input,class,name,probability\n1," + std::to_string(c0) + "," + card.classes[c0]));
  CHECK_THAT(r.out, Catch::Contains("\n3," + std::to_string(c1) + "," + card.classes[c1]));
}

TEST_CASE("baton generate: from a run's checkpoint or its exported artifact, the same seed the same text", "[text][gpt][cli]") {
  test::TempDir dir;
  std::ofstream(dir.path / "c.toml") << R"(
[run]
name = "tiny-lm"
seed = 3
max_duration = "12ba"
[model]
name = "gpt"
block_size = 24
n_layer = 1
n_head = 2
n_embd = 32
[datasets.science]
kind = "fortunes_lm"
topics = ["science"]
block_size = 24
[[stages]]
name = "pretrain"
data = "science"
duration = "12ba"
batch_size = 8
loss = "token_cross_entropy"
optimizer = { name = "adamw", lr = 0.01 }
)";
  auto r = baton_cli(fmt::format("run {} --run-dir {}", (dir.path / "c.toml").string(), (dir.path / "run").string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  // The model summary takes token ids as the data holds them (int64), not floats.
  CHECK_THAT(r.out, Catch::Contains("input [24] -> output [24, 258]"));
  CHECK_THAT(r.out, !Catch::Contains("no model summary"));
  const auto state = (dir.path / "run/final.baton").string();
  const auto args = " --prompt 'A physicist ' --max-tokens 30 --top-k 40";
  const auto a = baton_cli("generate " + state + args + " --seed 5");
  INFO(a.out);
  REQUIRE(a.rc == 0);
  CHECK_THAT(a.out, Catch::StartsWith("A physicist "));
  CHECK(baton_cli("generate " + state + args + " --seed 5").out == a.out);
  CHECK(baton_cli("generate " + state + args + " --seed 6").out != a.out);

  const auto artifact = (dir.path / "lm.pt").string();
  r = baton_cli(fmt::format("export {} -o {} --inference", state, artifact));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("tokens [24] (bytes-v1), 0 class names; generate text with: baton generate"));
  CHECK(baton_cli("generate " + artifact + args + " --seed 5").out == a.out);

  const auto long_prompt = baton_cli(fmt::format("generate {} --prompt '{}'", artifact, std::string(30, 'x')));
  CHECK(long_prompt.rc != 0);
  CHECK_THAT(long_prompt.out, Catch::Contains("the model takes 1 to 24 (its block_size)"));
}
