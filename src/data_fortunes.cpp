// The fortunes datasets in one call (text.hpp): one corpus read per process, and the origin that
// lets the tools rebuild a dataset from a run's directory.
#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "baton/text.hpp"
#include "data_internal.hpp"
#include "detail.hpp"

namespace baton::text {
namespace {
/// What a read of fortune databases depends on: the options, and each regular file's name, size
/// and modification time in the languages' directories (a changed file is read again).
std::string corpus_key(const FortunesOptions& o) {
  std::string key = fmt::format("{}|{}|{}|{}", o.dir.string(), fmt::join(o.languages, ","), fmt::join(o.topics, ","),
                                o.skip_undecodable);
  for (const auto& language : o.languages) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(language == "en" ? o.dir : o.dir / language, ec)) {
      std::error_code fe;
      if (!e.is_regular_file(fe)) continue;
      key += fmt::format("|{}:{}:{}", e.path().filename().string(), e.file_size(fe),
                         e.last_write_time(fe).time_since_epoch().count());
    }
  }
  return key;
}

/// The corpus, read once per process for every dataset that names it (a curriculum of several
/// fortunes datasets would otherwise read and clean the same 14 MB for each).
Expected<Corpus> cached(const FortunesOptions& o) {
  static std::mutex mutex;
  static std::map<std::string, Corpus> cache;
  const auto key = corpus_key(o);
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  auto corpus = fortunes(o);
  if (!corpus) return corpus;
  if (corpus->undecodable > 0)  // counted, and said once: the user asked for it, but should know
    fmt::print(stderr, "baton: fortunes in {}: skipped {} record(s) that are not UTF-8\n", o.dir.string(), corpus->undecodable);
  std::lock_guard<std::mutex> lock(mutex);
  cache.insert_or_assign(key, *corpus);
  return corpus;
}

const char* part_name(Part p) { return p == Part::train ? "train" : p == Part::val ? "val" : "test"; }

/// The keys a curriculum's fortunes kinds take, as this dataset's origin gives them to the tools.
Params corpus_keys(const FortunesOptions& c, Part part, const SplitOptions& split) {
  return {{"dir", detail::absolute_path(c.dir)},
          {"languages", c.languages},
          {"topics", c.topics},
          {"part", std::string(part_name(part))},
          {"val", split.val},
          {"test", split.test},
          {"skip_undecodable", c.skip_undecodable}};
}
}  // namespace

Expected<Dataset> fortunes_lm(const FortunesLmOptions& o) {
  auto tokenizer = load_tokenizer(o.tokenizer);
  if (!tokenizer) return tl::unexpected(tokenizer.error());
  auto corpus = cached(o.corpus);
  if (!corpus) return tl::unexpected(corpus.error());
  auto ds = lm_windows(split(*corpus, o.part, o.split), {.block_size = o.block_size, .name = o.name, .tokenizer = *tokenizer});
  if (!ds) return ds;
  ds->origin = {"fortunes_lm", corpus_keys(o.corpus, o.part, o.split)};
  ds->origin.keys["block_size"] = static_cast<double>(o.block_size);
  if (!tokenizer->bytes()) ds->origin.keys["tokenizer"] = detail::absolute_path(o.tokenizer);
  return ds;
}

Expected<Tokenizer> fortunes_tokenizer(const FortunesTokenizerOptions& o) {
  auto corpus = cached(o.corpus);
  if (!corpus) return tl::unexpected(corpus.error());
  return train_tokenizer(split(*corpus, Part::train, o.split), o.tokenizer);
}

Expected<std::vector<std::string>> fortunes_classes(const FortunesTextOptions& o) {
  if (o.label != "topic" && o.label != "language")
    return fail(ErrorCode::invalid_argument, fmt::format("fortunes: label \"{}\" is not one of topic, language", o.label));
  auto corpus = cached(o.corpus);
  if (!corpus) return tl::unexpected(corpus.error());
  auto classes = labels_with(split(*corpus, Part::train, o.split), o.label, o.min_records);
  if (classes.size() < 2)
    return fail(ErrorCode::invalid_argument, fmt::format("fortunes: fewer than two {}s have {} training records; lower min_records",
                                                         o.label, o.min_records));
  return classes;
}

Expected<Dataset> fortunes_text(const FortunesTextOptions& o) {
  auto classes = fortunes_classes(o);
  if (!classes) return tl::unexpected(classes.error());
  auto tokenizer = load_tokenizer(o.tokenizer);
  if (!tokenizer) return tl::unexpected(tokenizer.error());
  auto corpus = cached(o.corpus);
  if (!corpus) return tl::unexpected(corpus.error());
  std::vector<Record> kept;
  for (auto& r : split(*corpus, o.part, o.split))
    if (std::binary_search(classes->begin(), classes->end(), o.label == "language" ? r.language : r.topic)) kept.push_back(std::move(r));
  auto ds = classification(kept, {.length = o.length, .label = o.label, .classes = *classes, .name = o.name, .tokenizer = *tokenizer});
  if (!ds) return ds;
  ds->origin = {"fortunes_text", corpus_keys(o.corpus, o.part, o.split)};
  ds->origin.keys["length"] = static_cast<double>(o.length);
  ds->origin.keys["label"] = o.label;
  ds->origin.keys["min_records"] = static_cast<double>(o.min_records);
  if (!tokenizer->bytes()) ds->origin.keys["tokenizer"] = detail::absolute_path(o.tokenizer);
  return ds;
}

}  // namespace baton::text
