// Tokenizers as values (text.hpp): bytes, or a SentencePiece model trained here or read from a
// file. SentencePiece is configured to keep text exactly (identity normalization, no dummy
// prefix, whitespace as it is, byte fallback), so every text encodes and decodes to itself. It
// is called through libbaton_sentencepiece.so in a link namespace of its own (dlmopen): Debian's
// libsentencepiece exports a protobuf that clashes with LibTorch's (src/sentencepiece/shim.cpp).
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <filesystem>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "baton/text.hpp"
#include "detail.hpp"
#include "io.hpp"
#include "sentencepiece/shim.h"

namespace baton::text {
namespace {
/// The shim's entry points, loaded once per process.
struct Shim {
  decltype(&baton_spm_train) train = nullptr;
  decltype(&baton_spm_load) load = nullptr;
  decltype(&baton_spm_unload) unload = nullptr;
  decltype(&baton_spm_pieces) pieces = nullptr;
  decltype(&baton_spm_piece) piece = nullptr;
  decltype(&baton_spm_special) special = nullptr;
  decltype(&baton_spm_encode) encode = nullptr;
  decltype(&baton_spm_decode) decode = nullptr;
  decltype(&baton_spm_free) free = nullptr;
};

Expected<const Shim*> shim() {
  static const Expected<Shim> loaded = []() -> Expected<Shim> {
    std::vector<std::string> tried;
    if (const char* env = std::getenv("BATON_SENTENCEPIECE_SHIM"); env && *env) {
      tried.push_back(env);
    } else {
      tried = {BATON_SHIM_BUILD_PATH, BATON_SHIM_INSTALL_PATH};
      // An installed tree moved elsewhere: lib/ beside the program's bin/.
      std::error_code ec;
      if (const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec); !ec)
        tried.push_back((exe.parent_path().parent_path() / "lib" / std::filesystem::path(BATON_SHIM_INSTALL_PATH).filename()).string());
    }
    std::string why;
    for (const auto& path : tried) {
      std::error_code ec;
      if (!std::filesystem::exists(path, ec)) {
        why += fmt::format("\n  {}: no such file", path);
        continue;
      }
      void* h = dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        const char* e = dlerror();
        why += fmt::format("\n  {}: {}", path, e ? e : "cannot be loaded");
        continue;
      }
      Shim s;
      bool all = true;
      auto get = [&](auto& fn, const char* name) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
        all = all && fn != nullptr;
      };
      get(s.train, "baton_spm_train"), get(s.load, "baton_spm_load"), get(s.unload, "baton_spm_unload");
      get(s.pieces, "baton_spm_pieces"), get(s.piece, "baton_spm_piece"), get(s.special, "baton_spm_special");
      get(s.encode, "baton_spm_encode"), get(s.decode, "baton_spm_decode"), get(s.free, "baton_spm_free");
      if (all) return s;
      why += fmt::format("\n  {}: not baton's SentencePiece shim (a function is missing)", path);
    }
    return fail(ErrorCode::runtime, fmt::format("SentencePiece tokenizers need libbaton_sentencepiece.so, installed beside "
                                                "libbaton (set BATON_SENTENCEPIECE_SHIM to its path); tried:{}", why));
  }();
  if (!loaded) return tl::unexpected(loaded.error());
  return &*loaded;
}

/// A string the shim allocated, as a std::string (and freed in the shim's namespace).
std::string take(const Shim& s, char* p, std::size_t n) {
  std::string out = p ? std::string(p, n) : std::string();
  s.free(p);
  return out;
}
std::string take(const Shim& s, char* p) { return take(s, p, p ? std::strlen(p) : 0); }
}  // namespace

struct Tokenizer::Impl {
  std::string identity;
  std::string model;  // serialized SentencePiece model; empty: bytes
  std::shared_ptr<void> sp;  // the shim's processor (unloaded with the last copy)
  const Shim* shim = nullptr;
  std::int64_t vocab = ByteTokenizer::vocab_size, eot = ByteTokenizer::end_of_text, pad = ByteTokenizer::pad;
  std::vector<double> lengths;
};

namespace {
// The special tokens of a model trained here (SentencePiece's ids).
constexpr int kUnknown = 0, kPad = 1, kEnd = 2;

std::shared_ptr<const Tokenizer::Impl> bytes_impl() {
  static const auto impl = [] {
    auto i = std::make_shared<Tokenizer::Impl>();
    i->identity = ByteTokenizer::identity();
    i->lengths.assign(ByteTokenizer::vocab_size, 1.0);
    i->lengths[ByteTokenizer::pad] = 0.0;
    return std::shared_ptr<const Tokenizer::Impl>(std::move(i));
  }();
  return impl;
}

/// UTF-8 bytes of the text a piece stands for: SentencePiece writes a space as U+2581 (3 bytes).
double piece_bytes(const std::string& piece) {
  static const std::string space = "\xE2\x96\x81";
  double n = 0;
  for (std::size_t i = 0; i < piece.size(); ++n) i += piece.compare(i, space.size(), space) == 0 ? space.size() : 1;
  return n;
}
}  // namespace

Tokenizer::Tokenizer() : impl_(bytes_impl()) {}

Expected<Tokenizer> Tokenizer::from_model(std::string serialized, const std::string& where) {
  auto shim_loaded = shim();
  if (!shim_loaded) return tl::unexpected(shim_loaded.error());
  const Shim& api = **shim_loaded;
  auto impl = std::make_shared<Impl>();
  impl->shim = &api;
  char* error = nullptr;
  void* sp = api.load(serialized.data(), serialized.size(), &error);
  if (!sp) return fail(ErrorCode::data, fmt::format("{}: not a SentencePiece model ({})", where, take(api, error)));
  impl->sp = std::shared_ptr<void>(sp, api.unload);
  const int vocab = api.pieces(sp);
  // Each id's piece and kind; and the byte tokens must be there (byte fallback).
  std::vector<int> kinds(static_cast<std::size_t>(std::max(vocab, 0)));
  std::vector<std::string> pieces(kinds.size());
  for (int id = 0; id < vocab; ++id) {
    char* piece = nullptr;
    if (api.piece(sp, id, &piece, &kinds[static_cast<std::size_t>(id)]) != 0)
      return fail(ErrorCode::data, fmt::format("{}: piece {} of the SentencePiece model cannot be read", where, id));
    pieces[static_cast<std::size_t>(id)] = take(api, piece);
  }
  const auto bytes = std::count(kinds.begin(), kinds.end(), BATON_SPM_BYTE);
  if (vocab <= kEnd || kinds[kUnknown] != BATON_SPM_UNKNOWN || api.special(sp, 1) != kPad || api.special(sp, 2) != kEnd || bytes != 256)
    return fail(ErrorCode::data, fmt::format("{}: a SentencePiece model without baton's special tokens (unknown 0, padding 1, "
                                             "end of text 2, 256 byte tokens); make one with `baton tokenize` or "
                                             "text::train_tokenizer", where));
  impl->vocab = vocab, impl->eot = kEnd, impl->pad = kPad;
  impl->lengths.resize(kinds.size());
  for (std::size_t id = 0; id < kinds.size(); ++id)
    impl->lengths[id] = id == kEnd || kinds[id] == BATON_SPM_BYTE                       ? 1.0
                        : kinds[id] == BATON_SPM_CONTROL || kinds[id] == BATON_SPM_UNKNOWN ? 0.0
                                                                                         : piece_bytes(pieces[id]);
  impl->identity = "sentencepiece-" + detail::sha256_hex(serialized).substr(0, 16);
  impl->model = std::move(serialized);
  Tokenizer t;
  t.impl_ = std::move(impl);
  return t;
}

const std::string& Tokenizer::identity() const { return impl_->identity; }
bool Tokenizer::bytes() const { return impl_->sp == nullptr; }
std::int64_t Tokenizer::vocab_size() const { return impl_->vocab; }
std::int64_t Tokenizer::end_of_text() const { return impl_->eot; }
std::int64_t Tokenizer::pad() const { return impl_->pad; }
const std::vector<double>& Tokenizer::byte_lengths() const { return impl_->lengths; }
const std::string& Tokenizer::model() const { return impl_->model; }

std::vector<std::int64_t> Tokenizer::encode(const std::string& text) const {
  if (!impl_->sp) return ByteTokenizer::encode(text);
  int* ids = nullptr;
  std::size_t n = 0;
  // Const and thread-safe in SentencePiece; byte fallback: every text encodes. Only allocation
  // can fail, as anywhere else.
  if (impl_->shim->encode(impl_->sp.get(), text.data(), text.size(), &ids, &n) != 0) throw std::bad_alloc();
  std::vector<std::int64_t> out(ids, ids + n);
  impl_->shim->free(ids);
  return out;
}

Expected<std::string> Tokenizer::decode(const std::vector<std::int64_t>& tokens) const {
  if (!impl_->sp) return ByteTokenizer::decode(tokens);
  std::string out;
  std::vector<int> run;  // pieces between end-of-text tokens, decoded together (byte tokens join)
  bool failed = false;
  auto flush = [&] {
    char* part = nullptr;
    std::size_t n = 0;
    failed = failed || impl_->shim->decode(impl_->sp.get(), run.data(), run.size(), &part, &n) != 0;
    out += take(*impl_->shim, part, n), run.clear();
  };
  for (const auto t : tokens) {
    if (t < 0 || t >= impl_->vocab)
      return fail(ErrorCode::invalid_argument, fmt::format("token {} is outside the tokenizer's vocabulary [0, {}) ({})", t,
                                                           impl_->vocab, impl_->identity));
    if (t == impl_->eot) flush(), out += '\n';
    else if (t != impl_->pad) run.push_back(static_cast<int>(t));
  }
  flush();
  if (failed) return fail(ErrorCode::invalid_argument, fmt::format("tokens cannot be decoded by {}", impl_->identity));
  return out;
}

Expected<void> Tokenizer::save(const std::filesystem::path& file) const {
  if (bytes()) return fail(ErrorCode::invalid_argument, "the bytes tokenizer has no file to save; it is named \"bytes\"");
  return detail::write_file_atomic(file, impl_->model, "tokenizer");
}

Expected<Tokenizer> train_tokenizer(const std::vector<Record>& records, const TokenizerOptions& o) {
  if (records.empty()) return fail(ErrorCode::invalid_argument, "train_tokenizer: no records to train on");
  if (o.type != "bpe" && o.type != "unigram")
    return fail(ErrorCode::invalid_argument, fmt::format("train_tokenizer: type \"{}\" is not one of bpe, unigram", o.type));
  if (o.vocab_size < 260 || o.vocab_size > 65535)
    return fail(ErrorCode::invalid_argument, fmt::format("train_tokenizer: vocab_size {} is outside [260, 65535] (3 special "
                                                         "tokens and 256 byte tokens come first; ids fit 16 bits)", o.vocab_size));
  if (!(o.character_coverage > 0 && o.character_coverage <= 1))
    return fail(ErrorCode::invalid_argument, fmt::format("train_tokenizer: character_coverage {} is outside (0, 1]", o.character_coverage));
  std::size_t longest = 0;
  for (const auto& r : records) longest = std::max(longest, r.text.size());
  auto shim_loaded = shim();
  if (!shim_loaded) return tl::unexpected(shim_loaded.error());
  const Shim& api = **shim_loaded;
  const std::vector<std::pair<std::string, std::string>> args = {
      {"model_type", o.type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"character_coverage", fmt::format("{}", o.character_coverage)},
      {"normalization_rule_name", "identity"},  // text as it is: decode(encode(t)) == t
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"byte_fallback", "true"},
      {"unk_id", std::to_string(kUnknown)}, {"pad_id", std::to_string(kPad)},
      {"eos_id", std::to_string(kEnd)}, {"bos_id", "-1"},
      {"num_threads", "1"},  // one thread: the same model from the same records
      {"max_sentence_length", std::to_string(std::max<std::size_t>(longest + 1, 4192))},
      {"input_sentence_size", "0"},  // every record (no sampling)
      {"minloglevel", "2"}};
  std::vector<const char*> texts, keys, values;
  std::vector<std::size_t> lengths;
  for (const auto& r : records) texts.push_back(r.text.data()), lengths.push_back(r.text.size());
  for (const auto& [k, v] : args) keys.push_back(k.c_str()), values.push_back(v.c_str());
  char *model = nullptr, *error = nullptr;
  std::size_t size = 0;
  if (api.train(texts.data(), lengths.data(), texts.size(), keys.data(), values.data(), keys.size(), &model, &size, &error) != 0)
    return fail(ErrorCode::invalid_argument, fmt::format("train_tokenizer: SentencePiece: {}", take(api, error)));
  return Tokenizer::from_model(take(api, model, size), "train_tokenizer");
}

Expected<Tokenizer> load_tokenizer(const std::filesystem::path& file) {
  if (file.empty() || file == "bytes") return Tokenizer{};
  if (auto ok = detail::check_regular_file(file, "tokenizer"); !ok) return tl::unexpected(ok.error());  // before the cache's key
  static std::mutex mutex;
  static std::map<std::string, Tokenizer> cache;
  std::error_code ec;
  const auto key = fmt::format("{}|{}|{}", std::filesystem::absolute(file, ec).string(), std::filesystem::file_size(file, ec),
                               std::filesystem::last_write_time(file, ec).time_since_epoch().count());
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  const auto bytes = detail::read_file(file, "tokenizer");
  if (!bytes) return tl::unexpected(bytes.error());
  auto t = Tokenizer::from_model(*bytes, file.string());
  if (!t) return t;
  std::lock_guard<std::mutex> lock(mutex);
  cache.insert_or_assign(key, *t);
  return t;
}

}  // namespace baton::text
