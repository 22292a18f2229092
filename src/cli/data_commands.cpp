// `baton pack` and `baton tokenize` (commands.hpp): a curriculum's dataset as packed shards; a tokenizer.
#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "baton/data.hpp"
#include "baton/inference.hpp"
#include "commands.hpp"

namespace baton::cli {

int pack(const PackArgs& a, const Registry& registry) {
  auto cur = load_curriculum(a.config, a.sets, registry);
  if (!cur) return report(cur.error());
  auto ds = cur->dataset(a.data);
  if (!ds) return report(ds.error());
  // A language model's windows: their token stream, once (text::pack_tokens).
  if (auto card = cur->model_card(a.data); card && card->input == InputKind::tokens && card->classes.empty()) {
    auto sum = text::pack_tokens(*ds, a.out, {.tokens_per_shard = a.tokens_per_shard});
    if (!sum) return report(sum.error());
    fmt::print("{}: {} tokens of \"{}\" ({}) in {} shard(s), {:.1f} MB; train on it with [datasets.<name>] kind = "
               "\"token_shards\", dir = \"{}\"\n",
               a.out, sum->tokens, ds->name, card->tokenizer, sum->shards, static_cast<double>(sum->bytes) / 1e6, a.out);
    return exit_ok;
  }
  data::PackOptions o;
  o.records_per_shard = a.records_per_shard;
  // Images keep their 8-bit pixels (4x smaller) and the dataset's scaling, read back exactly.
  if (!a.as_float)
    if (auto card = cur->model_card(a.data); card && card->input == InputKind::image)
      o.pixels = data::ImageOptions{card->normalize, card->mean, card->std};
  auto sum = data::pack(*ds, a.out, o);
  if (!sum) return report(sum.error());
  fmt::print("{}: {} samples of \"{}\" in {} shard(s), {:.1f} MB ({}); train on it with "
             "[datasets.<name>] kind = \"shards\", dir = \"{}\"\n",
             a.out, sum->samples, ds->name, sum->shards, static_cast<double>(sum->bytes) / 1e6,
             o.pixels ? "8-bit pixels" : "float32 inputs", a.out);
  return exit_ok;
}

}  // namespace baton::cli

namespace baton::cli {

int tokenize(const TokenizeArgs& a) {
  const auto start = std::chrono::steady_clock::now();
  auto tokenizer = text::fortunes_tokenizer(a.options);
  if (!tokenizer) return report(tokenizer.error());
  if (auto saved = tokenizer->save(a.out); !saved) return report(saved.error());
  const auto& o = a.options;
  fmt::print("{}: {} tokenizer of {} tokens ({}), trained on the training part of fortunes {} in {:.1f} s; use it with "
             "[datasets.<name>] tokenizer = \"{}\" and [model] vocab = {} (a classifier: pad = {})\n",
             a.out, o.tokenizer.type, tokenizer->vocab_size(), tokenizer->identity(), fmt::join(o.corpus.languages, ", "),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), a.out, tokenizer->vocab_size(),
             tokenizer->pad());
  return exit_ok;
}

}  // namespace baton::cli
