#pragma once
/// \file text.hpp
/// Text: corpora of records (the fortune-cookie databases of Debian's `fortunes*` packages, or
/// your own records), a deterministic train/val/test split by record, a byte-level tokenizer,
/// and the datasets a language model and a text classifier train on. docs/language-models.md.
///
/// ```cpp
/// auto corpus = baton::text::fortunes({.languages = {"en", "de"}});       // records, deduplicated
/// auto train  = baton::text::split(*corpus, baton::text::Part::train);    // by record, stable
/// auto lm     = baton::text::lm_windows(train, {.block_size = 128});      // x = t[i, i+T), y = t[i+1, i+T+1)
/// ```

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "baton/data.hpp"
#include "baton/error.hpp"
#include "baton/metrics.hpp"

namespace baton::text {

/// One record of a corpus: its UTF-8 text and where it came from.
struct Record {
  std::string text{};
  std::string language{};  ///< "en", "de", ...: the corpus's directory
  std::string topic{};     ///< the file it came from: "computers", "science", ...
};

/// A corpus: its records in a fixed order (by language, then file name, then position), and what
/// reading it dropped, counted.
struct Corpus {
  std::vector<Record> records{};
  std::int64_t files = 0;            ///< files read
  std::int64_t duplicates = 0;       ///< records dropped as the same text as an earlier one
  std::int64_t undecodable = 0;      ///< records dropped as not UTF-8 (FortunesOptions::skip_undecodable)
  std::int64_t overstrikes = 0;      ///< records that held backspace overstrikes (cleaned, kept)
  std::int64_t empty = 0;            ///< records empty once cleaned (dropped)
};

/// Where Debian's fortunes packages install their databases.
inline const std::filesystem::path fortunes_dir = "/usr/share/games/fortunes";

/// Which fortune databases to read, and how.
///
/// Policy: a language is a directory: "en" is `dir` itself (package `fortunes`), another one its
/// subdirectory (`de`, `es`, `it`, `ru`, `pl`: packages `fortunes-de`, ...). A topic is a regular
/// file there; symbolic links (the top directory's links to Italian files), `.dat` indexes and
/// `.u8` files (links to, or empty copies of, the plain file) are not read. Records are separated
/// by lines holding only `%`. A record is cleaned: backspace overstrikes ("_\bx" underlining,
/// "x\bx" bold) become the character they print, and trailing whitespace and blank edge lines go.
/// Then it must be UTF-8: a record that is not is an error naming the file and line, or, with
/// `skip_undecodable`, a counted skip. The same text read twice is kept once (its first place).
struct FortunesOptions {
  std::filesystem::path dir = fortunes_dir;
  std::vector<std::string> languages = {"en"};
  std::vector<std::string> topics{};   ///< empty: every topic file of those languages
  bool skip_undecodable = false;
};

/// Reads fortune databases (see FortunesOptions for the policy). Errors: a missing directory or
/// language, a topic not found, a file that cannot be read, undecodable bytes (file:line), or no
/// record at all.
Expected<Corpus> fortunes(const FortunesOptions& options = {});

/// Splits `text` into records at lines holding only `%` and cleans them as `fortunes` does;
/// `source` names the text in errors ("computers:120"). Exposed for your own record files.
Expected<Corpus> parse_records(const std::string& text, const std::string& source, const std::string& language,
                               const std::string& topic, bool skip_undecodable = false);

/// The part of a split.
enum class Part { train, val, test };

/// The fractions of a split. Keep them the same in every dataset of a curriculum: then a record's
/// part is the same for the pretraining and for every downstream task, and no validation or test
/// record of any task is trained on.
struct SplitOptions {
  double val = 0.05;
  double test = 0.05;
};

/// The records of one part: a record's part is a function of its text alone (a hash), not of
/// the corpus it is in or its position, so a record is in the same part in every corpus that
/// holds it. Order kept.
std::vector<Record> split(const Corpus& corpus, Part part, const SplitOptions& options = {});

/// A tokenizer without training: each UTF-8 byte is a token (0-255), then the special tokens.
/// Its bits per token are bits per byte.
struct ByteTokenizer {
  static constexpr std::int64_t end_of_text = 256;  ///< between records in a stream
  static constexpr std::int64_t pad = 257;          ///< fills a classifier's input to its length
  static constexpr std::int64_t vocab_size = 258;
  /// "bytes-v1": what a run's fingerprint holds.
  [[nodiscard]] static std::string identity() { return "bytes-v1"; }
  [[nodiscard]] static std::vector<std::int64_t> encode(const std::string& text);
  /// The text of tokens; special tokens become "\n" (end of text) and nothing (padding). A token
  /// outside [0, vocab_size) is an error naming it.
  [[nodiscard]] static Expected<std::string> decode(const std::vector<std::int64_t>& tokens);
};

/// A tokenizer as a value: bytes (`ByteTokenizer`, no training) or a SentencePiece model
/// (libsentencepiece: `train_tokenizer`, `load_tokenizer`). Immutable and shared: copies are
/// cheap, and one may encode from many threads. Text round-trips exactly: a SentencePiece model
/// trained here keeps bytes as they are (no normalization, no added space, unknown characters as
/// UTF-8 byte tokens), so `decode(encode(t)) == t`.
class Tokenizer {
 public:
  Tokenizer();  ///< bytes
  /// A SentencePiece model from its serialized form (the `.model` file's bytes); `where` names it
  /// in errors. It must have been made by `train_tokenizer` (or with the same special tokens:
  /// unknown 0, padding 1, end of text 2, byte fallback).
  static Expected<Tokenizer> from_model(std::string serialized, const std::string& where);

  /// "bytes-v1", or "sentencepiece-" and the first 16 hex digits of the model's SHA-256: what
  /// fingerprints, datasets' identities and model cards hold.
  [[nodiscard]] const std::string& identity() const;
  [[nodiscard]] bool bytes() const;
  [[nodiscard]] std::int64_t vocab_size() const;
  [[nodiscard]] std::int64_t end_of_text() const;  ///< between records in a stream
  [[nodiscard]] std::int64_t pad() const;          ///< fills a classifier's input to its length
  [[nodiscard]] std::vector<std::int64_t> encode(const std::string& text) const;
  /// The text of tokens; end of text becomes "\n", padding nothing. A token outside
  /// [0, vocab_size) is an error naming it.
  [[nodiscard]] Expected<std::string> decode(const std::vector<std::int64_t>& tokens) const;
  /// For each token id, the bytes of text it stands for: 1 for a byte, a piece's UTF-8 length,
  /// 1 for end of text (the record separator, as in the bytes tokenizer), 0 for padding and
  /// unknown. `metric::bits_per_byte` divides by their sum, so bits per byte compare across
  /// tokenizers.
  [[nodiscard]] const std::vector<double>& byte_lengths() const;
  /// The SentencePiece model's bytes (empty for bytes): what `save` writes and artifacts hold.
  [[nodiscard]] const std::string& model() const;
  /// Writes `model()` to `file` (whole or not at all). Error: the bytes tokenizer (no file).
  [[nodiscard]] Expected<void> save(const std::filesystem::path& file) const;

  struct Impl;
 private:
  std::shared_ptr<const Impl> impl_;
};

/// How `train_tokenizer` trains a SentencePiece model.
struct TokenizerOptions {
  std::string type = "bpe";         ///< "bpe" or "unigram" (about 6x slower to train here)
  std::int64_t vocab_size = 4096;   ///< with the 3 special tokens and the 256 byte tokens
  double character_coverage = 0.9995;  ///< characters rarer than this share go to byte tokens
};

/// Trains a SentencePiece model on `records` (one sentence per record; give it the training
/// part only, so no validation or test record shapes the vocabulary). Deterministic: the same
/// records and options give the same model (one training thread). Errors: no records, a
/// vocabulary too small or too large for them (SentencePiece's message).
Expected<Tokenizer> train_tokenizer(const std::vector<Record>& records, const TokenizerOptions& options = {});

/// A tokenizer from a file: "bytes" (or an empty path) is the bytes tokenizer, anything else a
/// SentencePiece `.model` file. Read once per process per file (its size and time checked).
/// Errors name the file: missing, unreadable, not a SentencePiece model.
Expected<Tokenizer> load_tokenizer(const std::filesystem::path& file);

/// Options of a language-model dataset.
struct LmOptions {
  std::int64_t block_size = 128;  ///< T: the positions of a window
  std::string name = "lm";
  Tokenizer tokenizer{};
};

/// Windows over the records' tokens joined into one stream (each record followed by
/// end_of_text): sample i of epoch e is x = stream[s, s+T), y = stream[s+1, s+T+1) with
/// s = (i * T + phase(seed, e)) mod (length - T), the phase a pure function of the fit's data
/// seed and the epoch (evaluation: phase 0). So an epoch covers the stream once in windows that
/// do not overlap, each epoch cut elsewhere, and any split or resume sees the same windows.
/// Inputs and targets are int64 [T]. Error: fewer than T + 1 tokens.
Expected<Dataset> lm_windows(const std::vector<Record>& records, const LmOptions& options = {});

/// The tokenizer of a language-model dataset (`lm_windows`, `fortunes_lm`, `token_shards`, and
/// slices of them); nullopt for any other dataset.
std::optional<Tokenizer> tokenizer_of(const Dataset& dataset);

/// `metric::bits_per_byte` for evaluation sets of language-model data: their tokenizer's byte
/// lengths. Errors: a set that is not language-model data, sets with different tokenizers.
Expected<Metric> bits_per_byte(const std::vector<std::pair<std::string, Dataset>>& sets);

/// Options of `pack_tokens`.
struct TokenPackOptions {
  std::int64_t tokens_per_shard = std::int64_t{1} << 24;  ///< tokens per shard file (32 MiB); the last holds the rest
};

/// What `pack_tokens` wrote.
struct TokenPackSummary {
  std::int64_t tokens = 0;
  std::int64_t shards = 0;
  std::int64_t bytes = 0;  ///< all files together
};

/// Writes the token stream of a language-model dataset (`lm_windows`, `fortunes_lm`: its records'
/// tokens, each followed by end of text) to directory `dir` as token shards (docs/data.md): a
/// manifest `tokens.json` (the tokenizer's identity and vocabulary, the token count, each shard's
/// CRC-32), files `tokens-NNNNN.bin` of little-endian uint16 ids, and the tokenizer's model as
/// `tokenizer.model` (a SentencePiece one), so the directory is all a run needs. Written to a
/// temporary directory and renamed: `dir` is complete or absent. Errors: not a language-model
/// dataset, an existing `dir`, a vocabulary over 65,536 tokens.
Expected<TokenPackSummary> pack_tokens(const Dataset& lm, const std::filesystem::path& dir, const TokenPackOptions& options = {});

/// Options of `token_shards`.
struct TokenShardOptions {
  std::int64_t block_size = 128;
  std::string name = "tokens";
  bool verify = true;  ///< check every shard's CRC-32 (one read of each file)
};

/// The language-model windows of `lm_windows` over the token stream of a `pack_tokens` directory,
/// with its tokenizer. The stream is read into memory (8 bytes a token). A missing manifest, a
/// shard of the wrong size or checksum, a token beyond the vocabulary or a tokenizer file that is
/// not the manifest's is an error naming the file.
Expected<Dataset> token_shards(const std::filesystem::path& dir, const TokenShardOptions& options = {});

/// Options of a text-classification dataset.
struct ClassificationOptions {
  std::int64_t length = 256;  ///< tokens per sample: longer records keep their first `length` tokens
  std::string label = "topic";  ///< "topic" or "language": what a record's class is
  /// The classes in label order; empty: the labels of the records, sorted.
  std::vector<std::string> classes{};
  std::string name = "text";
  Tokenizer tokenizer{};
};

/// A classification dataset in memory: inputs int64 [N, length], a record's tokens then `pad`
/// (truncated to `length` when longer), targets int64 [N] the index of its label in `classes`.
/// Errors: no records, a record whose label is not among `classes`.
Expected<Dataset> classification(const std::vector<Record>& records, const ClassificationOptions& options = {});

/// The `fortunes_lm` kind of a curriculum in one call: `fortunes(corpus)`, the `part` of its
/// `split`, `lm_windows` of it. The dataset records where it came from (`Dataset::origin`), so the
/// `baton` tools rebuild it from a C++ run's directory. The corpus is read once per process for
/// every dataset of the same corpus (its files' names, sizes and times checked each call).
struct FortunesLmOptions {
  FortunesOptions corpus{};
  Part part = Part::train;
  SplitOptions split{};
  std::int64_t block_size = 128;
  std::string name = "fortunes-lm";
  std::filesystem::path tokenizer{};  ///< a SentencePiece model file (`load_tokenizer`); empty: bytes
};
Expected<Dataset> fortunes_lm(const FortunesLmOptions& options = {});

/// The `fortunes_text` kind in one call: the records of `part` whose label is one of
/// `fortunes_classes(options)`, as `classification` of them (origin recorded as above).
struct FortunesTextOptions {
  FortunesOptions corpus{};
  Part part = Part::train;
  SplitOptions split{};
  std::int64_t length = 256;
  std::string label = "topic";     ///< "topic" or "language"
  std::int64_t min_records = 200;  ///< a class needs this many training records
  std::string name = "fortunes-text";
  std::filesystem::path tokenizer{};  ///< a SentencePiece model file (`load_tokenizer`); empty: bytes
};
Expected<Dataset> fortunes_text(const FortunesTextOptions& options = {});
/// The classes of `fortunes_text(options)`: the labels with at least `min_records` records in the
/// training part, sorted (the same for every part). Error: fewer than two.
Expected<std::vector<std::string>> fortunes_classes(const FortunesTextOptions& options = {});

/// A tokenizer trained on the training part of fortune databases in one call (`baton tokenize`):
/// `train_tokenizer` of `split(fortunes(corpus), Part::train, split)`. Keep `split` the same as
/// the datasets': then no validation or test record of any task shapes the vocabulary.
struct FortunesTokenizerOptions {
  FortunesOptions corpus{};
  SplitOptions split{};
  TokenizerOptions tokenizer{};
};
Expected<Tokenizer> fortunes_tokenizer(const FortunesTokenizerOptions& options = {});

/// The labels (`label`: "topic" or "language") held by at least `min_records` of the given
/// `records`, sorted: pass the whole corpus to pick the topics with enough records to learn and
/// measure, whatever part is trained on.
std::vector<std::string> labels_with(const std::vector<Record>& records, const std::string& label, std::int64_t min_records);

}  // namespace baton::text
