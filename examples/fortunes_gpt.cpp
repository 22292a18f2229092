// examples/fortunes_gpt.toml in C++: a GPT pretrained on fortune cookies in six languages, then
// three fine-tunes from it (the topic of an English fortune, the language of a fortune, more
// language modelling on English science fortunes), each beside a scratch baseline, as one tree
// (docs/language-models.md, docs/curricula.md). The file's datasets, model, stages, durations and
// seed, written with the library's calls (not checked bit for bit against `baton run` of the file);
// `baton report runs/fortunes-gpt-cpp` and the other tools read its directory.
//
//   build/fortunes_gpt [--quick] [--dir DIR] [--threads N]
//
// --quick: English science and computers fortunes only, a 1-layer GPT and a few batches per
// stage (the test suite runs it). Ends with the tree's table.
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include <fmt/format.h>

#include <baton/baton.hpp>
#include <baton/text.hpp>
#include <baton/tree.hpp>

namespace {
namespace text = baton::text;

template <class T>
T or_exit(baton::Expected<T> r, const char* what) {
  if (!r) {
    std::cerr << what << ": " << r.error() << '\n';
    std::exit(1);
  }
  return std::move(*r);
}

}  // namespace

int main(int argc, char** argv) {
  baton::relaunch_with_thread_policy(argv);  // OpenMP's and OpenBLAS's idle threads sleep (runtime.hpp)
  using namespace baton::literals;
  bool quick = false;
  int threads = 0;
  std::string dir = "runs/fortunes-gpt-cpp";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") quick = true;
    else if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else {
      std::cerr << "usage: fortunes_gpt [--quick] [--dir DIR] [--threads N]\n";
      return 2;
    }
  }
  const auto runtime = or_exit(baton::configure_runtime({.threads = threads}), "configure_runtime");
  fmt::print("{}\n", runtime.to_string());

  // The corpora: every language for pretraining, English for the topic task; each dataset
  // records where it came from, so `baton eval` and the other tools rebuild it from the run.
  const std::vector<std::string> languages = quick ? std::vector<std::string>{"en"}
                                                   : std::vector<std::string>{"en", "de", "es", "it", "ru", "pl"};
  const std::vector<std::string> topics = quick ? std::vector<std::string>{"science", "computers"} : std::vector<std::string>{};
  const std::int64_t T = quick ? 32 : 128;
  const text::FortunesOptions all{.languages = languages, .topics = topics}, english{.topics = topics},
      science{.topics = {"science"}};
  // The tokenizer: a SentencePiece BPE trained on the training part of the pretraining corpus
  // (deterministic: the same file as `baton tokenize` with these options), saved beside the run;
  // every dataset reads through it, and the run's fingerprint holds its identity.
  const auto tokenizer = or_exit(text::fortunes_tokenizer({.corpus = all, .tokenizer = {.vocab_size = quick ? 512 : 4096}}),
                                 "fortunes_tokenizer");
  const auto tokenizer_file = std::filesystem::path(dir) / "tokenizer.model";
  std::filesystem::create_directories(dir);
  or_exit(tokenizer.save(tokenizer_file).map([] { return 0; }), "save the tokenizer");
  auto lm = [&](const text::FortunesOptions& c, text::Part part, const char* name) {
    return or_exit(text::fortunes_lm({.corpus = c, .part = part, .block_size = T, .name = name, .tokenizer = tokenizer_file}), name);
  };
  auto labelled = [&](const text::FortunesOptions& c, text::Part part, const char* label, const char* name) {
    return or_exit(text::fortunes_text({.corpus = c, .part = part, .length = T, .label = label,
                                        .min_records = quick ? 50 : 200, .name = name, .tokenizer = tokenizer_file}), name);
  };
  const auto pretrain_data = lm(all, text::Part::train, "pretrain");
  const auto pretrain_val = lm(all, text::Part::val, "pretrain_val");
  const auto topic = labelled(english, text::Part::train, "topic", "topic");
  const auto topic_test = labelled(english, text::Part::test, "topic", "topic_test");
  const auto topic_classes = or_exit(text::fortunes_classes({.corpus = english, .min_records = quick ? 50 : 200}), "topics");
  const bool languages_task = languages.size() >= 2;  // --quick has English only
  const auto science_data = lm(science, text::Part::train, "science");
  const auto science_test = lm(science, text::Part::test, "science_test");

  const baton::models::GptOptions gpt{.vocab = tokenizer.vocab_size(), .block_size = T, .n_layer = quick ? 1 : 4,
                                      .n_head = quick ? 2 : 4, .n_embd = quick ? 32 : 128, .pad = tokenizer.pad()};
  // AdamW as GPT-2 trains it: no weight decay on biases, LayerNorm and the embeddings.
  const auto adamw = [](double lr) {
    return baton::optim::adamw({.lr = lr, .weight_decay = 0.1})
        .with_groups({{.patterns = {"*.bias"}, .modules = {"LayerNorm", "Embedding"}, .weight_decay = 0.0}});
  };
  const auto bits_per_byte = baton::metric::bits_per_byte(tokenizer.byte_lengths());
  auto steps = [&](std::int64_t full) { return baton::Time::batches(quick ? std::max<std::int64_t>(full / 100, 2) : full); };

  baton::TrainingSpec pretrain{
      .name = "pretrain",
      .data = {.train = pretrain_data, .batch_size = 32},
      .loss = baton::loss::token_cross_entropy(),
      .optimizer = adamw(1e-3),
      .schedule = baton::schedule::linear_warmup(steps(50), baton::schedule::cosine()),
      .duration = steps(500),
  };
  pretrain.clip_grad_norm = 1.0;
  pretrain.evaluation = baton::EvalSchedule{.spec = {.sets = {{"pretrain_val", pretrain_val.head(512)}},
                                                     .loss = baton::loss::token_cross_entropy(),
                                                     .metrics = {bits_per_byte, baton::metric::perplexity()}}};
  // A fine-tune: its own data, head, loss, learning rate and duration; fresh optimizer moments.
  auto task = [&](std::string name, const baton::Dataset& train, const baton::Dataset& test, std::int64_t classes,
                  double lr, std::int64_t batches) {
    auto s = pretrain.with_name(std::move(name)).with_duration(steps(batches)).with_optimizer_carry(baton::Carry::fresh);
    s.data.train = train;
    s.optimizer = adamw(lr);
    s.schedule = baton::schedule::constant();
    const bool lm = classes == 0;
    s.loss = lm ? baton::loss::token_cross_entropy() : baton::loss::cross_entropy();
    if (!lm) {
      auto head = gpt;
      head.classes = classes;
      s.model = baton::ModelCarry::transfer(baton::models::gpt(head));
    }
    s.evaluation = baton::EvalSchedule{
        .spec = {.sets = {{s.name + "_test", test}},
                 .loss = s.loss,
                 .metrics = lm ? std::vector<baton::Metric>{bits_per_byte}
                               : std::vector<baton::Metric>{baton::metric::accuracy(), baton::metric::f1()}}};
    return s;
  };
  std::vector<baton::TreeStage> stages = {
      {pretrain},
      {task("topic", topic, topic_test, static_cast<std::int64_t>(topic_classes.size()), 5e-4, 300), "pretrain", true},
  };
  if (languages_task) {
    const auto language = labelled(all, text::Part::train, "language", "language");
    const auto language_test = labelled(all, text::Part::test, "language", "language_test");
    stages.push_back({task("language", language, language_test, language.classes(), 5e-4, 150), "pretrain", true});
  }
  stages.push_back({task("science", science_data, science_test, 0, 3e-4, 150), "pretrain", true});

  const auto initial = or_exit(baton::init_state(baton::models::gpt(gpt), {.seed = 7, .max_duration = steps(800)}), "init_state");
  const auto result = or_exit(baton::run_tree(baton::RunOptions{.dir = dir, .name = "fortunes-gpt"}, stages, initial), "run_tree");
  fmt::print("{}", result.table());
  return 0;
}
