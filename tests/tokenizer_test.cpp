// Trained tokenizers (text::Tokenizer, SentencePiece): exact round trips, determinism, files,
// datasets, bits per byte, and a curriculum that trains, exports and generates with one.
#include <cmath>
#include <fstream>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "baton/baton.hpp"
#include "baton/interop.hpp"
#include "baton/text.hpp"
#include "helpers.hpp"
#include "process.hpp"

namespace fs = std::filesystem;
using test::baton_cli;
using test::ok;

namespace {
std::vector<baton::text::Record> mixed_records(std::int64_t n) {
  std::vector<baton::text::Record> out;
  const char* words[] = {"the cat", "a dog", "über Straße", "кошка", "naïve café", "  two spaces", "tab\there"};
  for (std::int64_t i = 0; i < n; ++i)
    out.push_back({fmt::format("{} number {}\n{} and {}", words[i % 7], i, words[(i * 3) % 7], words[(i * 5 + 1) % 7]), "en", "mixed"});
  return out;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
}  // namespace

TEST_CASE("tokenizer: SentencePiece keeps text exactly, counts its bytes, and trains the same model twice", "[text][tokenizer]") {
  const auto records = mixed_records(300);
  const auto a = ok(baton::text::train_tokenizer(records, {.vocab_size = 320}));
  const auto b = ok(baton::text::train_tokenizer(records, {.vocab_size = 320}));
  CHECK(a.identity() == b.identity());
  CHECK(a.model() == b.model());
  CHECK_THAT(a.identity(), Catch::StartsWith("sentencepiece-"));
  CHECK_FALSE(a.bytes());
  CHECK(a.vocab_size() == 320);
  CHECK(a.pad() == 1);
  CHECK(a.end_of_text() == 2);
  // Texts it never saw too: characters outside its pieces become UTF-8 byte tokens.
  for (const std::string& t : {records[5].text, std::string("  leading and trailing  \n\n"), std::string("emoji \xF0\x9F\x98\x80 and 漢字"),
                              std::string("")}) {
    const auto ids = a.encode(t);
    CHECK(ok(a.decode(ids)) == t);
    double bytes = 0;
    for (const auto id : ids) bytes += a.byte_lengths().at(static_cast<std::size_t>(id));
    CHECK(bytes == static_cast<double>(t.size()));
  }
  CHECK(a.encode(records[7].text).size() < records[7].text.size());  // pieces, not bytes
  // End of text decodes to a line break; padding to nothing.
  auto ids = a.encode("x");
  ids.push_back(a.end_of_text());
  ids.push_back(a.pad());
  CHECK(ok(a.decode(ids)) == "x\n");
  CHECK_THAT(a.decode({320}).error().message, Catch::Contains("outside the tokenizer's vocabulary [0, 320)"));

  test::TempDir dir;
  REQUIRE(a.save(dir.path / "t.model"));
  const auto loaded = ok(baton::text::load_tokenizer(dir.path / "t.model"));
  CHECK(loaded.identity() == a.identity());
  CHECK(loaded.encode("über Straße") == a.encode("über Straße"));
  CHECK(ok(baton::text::load_tokenizer("bytes")).bytes());

  // Bad inputs: each names what is wrong.
  std::ofstream(dir.path / "junk.model") << "not a model";
  CHECK_THAT(baton::text::load_tokenizer(dir.path / "junk.model").error().message, Catch::Contains("junk.model: not a SentencePiece model"));
  CHECK_THAT(baton::text::load_tokenizer(dir.path / "missing.model").error().message, Catch::Contains("missing.model"));
  CHECK_THAT(baton::text::train_tokenizer(records, {.vocab_size = 100}).error().message, Catch::Contains("outside [260, 65535]"));
  CHECK_THAT(baton::text::train_tokenizer(records, {.type = "wordpiece"}).error().message, Catch::Contains("not one of bpe, unigram"));
  CHECK_THAT(baton::text::train_tokenizer({}, {}).error().message, Catch::Contains("no records"));
  CHECK_THAT(baton::text::Tokenizer().save(dir.path / "b.model").error().message, Catch::Contains("bytes tokenizer has no file"));
}

TEST_CASE("the shipped examples/fortunes-4096.model is what baton tokenize writes with the example's command",
          "[text][tokenizer][examples]") {
  // examples/fortunes_gpt.toml names the file; its header gives the command. The same command
  // must write the same bytes (training is deterministic), or the file is not what it says.
  test::TempDir dir;
  const auto out = dir.path / "t.model";
  const auto made = baton_cli(fmt::format("tokenize -o {} --languages en,de,es,it,ru,pl --vocab-size 4096", out.string()));
  INFO(made.out);
  REQUIRE(made.rc == 0);
  const auto read = [](const fs::path& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto shipped = read(fs::path(BATON_SOURCE_DIR) / "examples/fortunes-4096.model");
  CHECK(shipped.size() > 10000);
  CHECK(read(out) == shipped);
  CHECK_THAT(made.out, Catch::Contains(ok(baton::text::load_tokenizer(fs::path(BATON_SOURCE_DIR) / "examples/fortunes-4096.model")).identity()));
}

TEST_CASE("tokenizer: text datasets take it, and bits per byte compares it with bytes", "[text][tokenizer][metrics]") {
  const auto records = mixed_records(300);
  const auto tok = ok(baton::text::train_tokenizer(records, {.vocab_size = 320}));
  const auto lm = ok(baton::text::lm_windows(records, {.block_size = 16, .tokenizer = tok}));
  const auto bytes_lm = ok(baton::text::lm_windows(records, {.block_size = 16}));
  CHECK(lm.size() < bytes_lm.size() * 3 / 4);  // fewer tokens than bytes
  CHECK_THAT(lm.identity(), Catch::Contains(tok.identity()));
  const auto all = ok(lm.range(0, lm.size()));
  CHECK(all.targets.max().item<std::int64_t>() < tok.vocab_size());

  // A classifier's rows: the record's tokens, then the tokenizer's padding.
  const auto cls = ok(baton::text::classification(records, {.length = 64, .tokenizer = tok}));
  const auto row = cls.inputs[0];
  const auto expected = tok.encode(records[0].text);
  REQUIRE(expected.size() < 64);
  for (std::size_t i = 0; i < expected.size(); ++i) CHECK(row[static_cast<std::int64_t>(i)].item<std::int64_t>() == expected[i]);
  CHECK(row[63].item<std::int64_t>() == tok.pad());

  // Bits per byte: with bytes it is bits per token; with pieces, bits per token times tokens per byte.
  auto eval_with = [&](const baton::Dataset& data, const baton::text::Tokenizer& t) {
    auto state = ok(baton::init_state(baton::models::gpt({.vocab = t.vocab_size(), .block_size = 16, .n_layer = 1, .n_head = 2, .n_embd = 16}),
                                      {.seed = 3}));
    return ok(baton::eval({.sets = {{"val", data}},
                           .loss = baton::loss::token_cross_entropy(),
                           .metrics = {baton::metric::bits_per_byte(t.byte_lengths()), ok(baton::metric::builtin("bits_per_token"))}},
                          state))["val"];
  };
  auto bytes_m = eval_with(bytes_lm, baton::text::Tokenizer{});
  CHECK(bytes_m["bits_per_byte"] == Approx(bytes_m["bits_per_token"]).epsilon(1e-12));
  auto m = eval_with(lm, tok);
  double bytes = 0;
  const auto ids = all.targets.flatten();
  for (std::int64_t i = 0; i < ids.numel(); ++i) bytes += tok.byte_lengths()[static_cast<std::size_t>(ids[i].item<std::int64_t>())];
  CHECK(m["bits_per_byte"] == Approx(m["bits_per_token"] * static_cast<double>(ids.numel()) / bytes).epsilon(1e-9));
  CHECK(m["bits_per_byte"] < m["bits_per_token"]);
  CHECK_THAT(baton::metric::builtin("bits_per_byte").error().message, Catch::Contains("depends on the tokenizer"));
}

TEST_CASE("tokenizer in a curriculum: in the fingerprint, checked against the model, in the artifact, and generating",
          "[text][tokenizer][cli][gpt]") {
  test::TempDir dir;
  const auto tok = (dir.path / "tok.model").string();
  auto r = baton_cli(fmt::format("tokenize -o {} --topics science,computers --vocab-size 512", tok));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("[model] vocab = 512 (a classifier: pad = 1)"));
  auto curriculum = [&](const std::string& model_extra, const std::string& tokenizer = "tok.model") {
    return fmt::format(R"(
[run]
name = "sp-lm"
seed = 3
max_duration = "10ba"
[model]
name = "gpt"
block_size = 24
n_layer = 1
n_head = 2
n_embd = 32
{}
[datasets.science]
kind = "fortunes_lm"
topics = ["science"]
block_size = 24
tokenizer = "{}"
[datasets.science_val]
kind = "fortunes_lm"
topics = ["science"]
part = "val"
block_size = 24
limit = 40
tokenizer = "{}"
[[stages]]
name = "pretrain"
data = "science"
duration = "10ba"
batch_size = 8
loss = "token_cross_entropy"
optimizer = {{ name = "adamw", lr = 0.01 }}
eval = {{ sets = ["science_val"], metrics = ["bits_per_byte", "bits_per_token"] }}
)", model_extra, tokenizer, tokenizer);
  };
  std::ofstream(dir.path / "small.toml") << curriculum("");
  r = baton_cli("validate " + (dir.path / "small.toml").string());
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Catch::Contains("set [model] vocab = 512"));

  std::ofstream(dir.path / "c.toml") << curriculum("vocab = 512");
  auto fingerprint = [&](const std::string& file) {
    auto v = baton_cli("validate " + (dir.path / file).string());
    INFO(v.out);
    REQUIRE(v.rc == 0);
    return v.out.substr(v.out.find("fingerprint"));
  };
  const auto before = fingerprint("c.toml");
  // The same tokenizer under another name: the same run. Another tokenizer in the same file: another run.
  fs::copy_file(tok, dir.path / "same.model");
  std::ofstream(dir.path / "moved.toml") << curriculum("vocab = 512", "same.model");
  CHECK(fingerprint("moved.toml") == before);
  const auto kept = read_all(tok);
  REQUIRE(baton_cli(fmt::format("tokenize -o {} --topics science --vocab-size 400", tok)).rc == 0);
  CHECK(fingerprint("c.toml") != before);
  std::ofstream(tok, std::ios::binary | std::ios::trunc) << kept;
  CHECK(fingerprint("c.toml") == before);

  r = baton_cli(fmt::format("run {} --run-dir {}", (dir.path / "c.toml").string(), (dir.path / "run").string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("science_val/bits_per_byte"));
  // baton eval takes it by name too, from the data's tokenizer (a part of it here: limit = 40).
  auto e = baton_cli(fmt::format("eval --state {} --data science_val --metric bits_per_byte,bits_per_token",
                                 (dir.path / "run/final.baton").string()));
  INFO(e.out);
  CHECK(e.rc == 0);
  CHECK_THAT(e.out, Catch::Contains("\"bits_per_byte\""));
  CHECK(baton::text::bits_per_byte({{"topics", ok(baton::text::classification(mixed_records(20), {.length = 8}))}})
            .error().message.find("not language-model data") != std::string::npos);
  const auto artifact = (dir.path / "lm.pt").string();
  r = baton_cli(fmt::format("export {} -o {} --inference", (dir.path / "run/final.baton").string(), artifact));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const auto card = ok(baton::read_model_card(artifact));
  CHECK_THAT(card.tokenizer, Catch::StartsWith("sentencepiece-"));
  CHECK(card.tokenizer_model == kept);
  // The artifact needs no tokenizer file: it holds the model.
  fs::rename(tok, dir.path / "away.model");
  const auto args = " --prompt 'The universe ' --max-tokens 20 --seed 4";
  const auto a = baton_cli("generate " + artifact + args);
  INFO(a.out);
  REQUIRE(a.rc == 0);
  CHECK_THAT(a.out, Catch::StartsWith("The universe "));
  CHECK(baton_cli("generate " + artifact + args).out == a.out);

  // A card whose tokenizer model is not the one it names is refused.
  auto predictor = ok(baton::load_for_inference(artifact));
  auto wrong = card;
  wrong.tokenizer_model = ok(baton::text::train_tokenizer(mixed_records(300), {.vocab_size = 320})).model();
  const auto factory = ok(baton::Registry::builtin().models.at("gpt").make(card.options));
  const auto state = ok(baton::load_checkpoint((dir.path / "run/final.baton").string(), factory));
  CHECK_THAT(baton::predictor(state, wrong).error().message, Catch::Contains("do not belong together"));
  wrong.tokenizer = "wordpiece-v9";
  CHECK_THAT(baton::encode_texts({"x"}, wrong).error().message, Catch::Contains("\"wordpiece-v9\" is not one this baton knows"));
  CHECK(ok(predictor.generate("The universe ", {.max_tokens = 5, .seed = 1})).size() > 0);
}

TEST_CASE("token shards: a language model's stream packed once, read back as the same windows, damage named", "[text][tokenizer][data]") {
  test::TempDir dir;
  const auto tok = dir.path / "tok.model";
  REQUIRE(ok(baton::text::fortunes_tokenizer({.corpus = {.topics = {"science", "computers"}}, .tokenizer = {.vocab_size = 512}})).save(tok));
  const auto lm = ok(baton::text::fortunes_lm({.corpus = {.topics = {"science"}}, .block_size = 32, .tokenizer = tok}));
  const auto sum = ok(baton::text::pack_tokens(lm, dir.path / "shards", {.tokens_per_shard = 5000}));
  CHECK(sum.shards > 2);
  CHECK(fs::exists(dir.path / "shards/tokenizer.model"));
  const auto back = ok(baton::text::token_shards(dir.path / "shards", {.block_size = 32}));
  // The same stream, tokenizer and windows: the same identity (it holds the stream's SHA-256).
  CHECK(back.source->identity() == lm.source->identity());
  CHECK(back.size() == lm.size());
  const baton::SampleContext epoch3{.seed = 5, .epoch = 3};
  const auto idx = torch::arange(0, lm.size(), 7, torch::kLong);
  CHECK(ok(back.gather(idx, epoch3)).inputs.equal(ok(lm.gather(idx, epoch3)).inputs));
  CHECK(sum.tokens == (back.size() * 32) + (sum.tokens - 1) % 32 + 1);
  {
    // The manifest carries each id's byte length, so that readers without SentencePiece (Python)
    // compute bits per byte.
    std::ifstream in(dir.path / "shards/tokens.json");
    const auto manifest = nlohmann::json::parse(in);
    CHECK(manifest.at("byte_lengths").get<std::vector<double>>() == ok(baton::text::load_tokenizer(tok)).byte_lengths());
  }

  // Bad inputs, each named.
  CHECK_THAT(baton::text::pack_tokens(lm, dir.path / "shards").error().message, Catch::Contains("exists"));
  const auto classes = ok(baton::text::classification(mixed_records(20), {.length = 8}));
  CHECK_THAT(baton::text::pack_tokens(classes, dir.path / "x").error().message, Catch::Contains("not a language-model dataset"));
  CHECK_THAT(baton::text::pack_tokens(lm.head(5), dir.path / "x").error().message,
             Catch::Contains("is a part of a language-model dataset") && Catch::Contains("without its limit"));
  fs::copy(dir.path / "shards", dir.path / "damaged");
  {
    std::fstream f(dir.path / "damaged/tokens-00001.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('\x07');
  }
  CHECK_THAT(baton::text::token_shards(dir.path / "damaged").error().message, Catch::Contains("tokens-00001.bin: wrong checksum"));
  fs::resize_file(dir.path / "damaged/tokens-00001.bin", 100);
  CHECK_THAT(baton::text::token_shards(dir.path / "damaged").error().message, Catch::Contains("truncated"));
  fs::copy(dir.path / "shards", dir.path / "other-tokenizer");
  REQUIRE(ok(baton::text::train_tokenizer(mixed_records(300), {.vocab_size = 320})).save(dir.path / "other-tokenizer/tokenizer.model"));
  CHECK_THAT(baton::text::token_shards(dir.path / "other-tokenizer").error().message, Catch::Contains("do not belong together"));
  CHECK_THAT(baton::text::token_shards(dir.path / "nowhere").error().message, Catch::Contains("tokens.json"));

  // From the command line: baton pack of a curriculum's language-model dataset, then a curriculum
  // trains on the shards; the fingerprint follows their content.
  std::ofstream(dir.path / "c.toml") << R"(
[run]
name = "packed"
seed = 3
max_duration = "4ba"
[model]
name = "gpt"
vocab = 512
block_size = 32
n_layer = 1
n_head = 2
n_embd = 16
[datasets.science]
kind = "fortunes_lm"
topics = ["science"]
block_size = 32
tokenizer = "tok.model"
[datasets.packed]
kind = "token_shards"
dir = "cli-shards"
block_size = 32
[[stages]]
name = "pretrain"
data = "packed"
duration = "4ba"
batch_size = 4
loss = "token_cross_entropy"
optimizer = { name = "adamw", lr = 0.01 }
eval = { sets = ["packed"], metrics = ["bits_per_byte"] }
)";
  auto r = baton_cli(fmt::format("pack {} science -o {}", (dir.path / "c.toml").string(), (dir.path / "cli-shards").string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("kind = \"token_shards\""));
  r = baton_cli("validate " + (dir.path / "c.toml").string());
  INFO(r.out);
  REQUIRE(r.rc == 0);
  const auto fingerprint = r.out.substr(r.out.find("fingerprint"));
  r = baton_cli(fmt::format("run {} --run-dir {}", (dir.path / "c.toml").string(), (dir.path / "run").string()));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("packed/bits_per_byte"));
  fs::remove_all(dir.path / "cli-shards");
  REQUIRE(ok(baton::text::pack_tokens(ok(baton::text::fortunes_lm({.corpus = {.topics = {"computers"}}, .tokenizer = tok})),
                                      dir.path / "cli-shards")).tokens > 0);
  r = baton_cli("validate " + (dir.path / "c.toml").string());
  CHECK(r.out.substr(r.out.find("fingerprint")) != fingerprint);
}
