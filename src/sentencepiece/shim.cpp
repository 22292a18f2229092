// libbaton_sentencepiece.so: SentencePiece behind a C interface (shim.h), loaded by
// src/tokenizer.cpp in a link namespace of its own. Debian's libsentencepiece carries its own
// copy of protobuf-lite 3.14 and exports it; LibTorch loads the system's protobuf 3.21. In one
// namespace the two interpose and the process dies at start ("compiled against version 3.14.0 of
// the Protocol Buffer runtime library, which is not compatible with the installed version").
// Nothing here may throw across the interface: every entry point catches.
#include "shim.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

namespace {
char* copy(const std::string& s) {
  auto* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out) std::memcpy(out, s.data(), s.size()), out[s.size()] = '\0';
  return out;
}

void set_error(char** error, const std::string& message) {
  if (error) *error = copy(message);
}

class Sentences final : public sentencepiece::SentenceIterator {
 public:
  Sentences(const char* const* texts, const std::size_t* lengths, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) all_.emplace_back(texts[i], lengths[i]);
  }
  bool done() const override { return at_ >= all_.size(); }
  void Next() override { ++at_; }
  const std::string& value() const override { return all_[at_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::vector<std::string> all_;
  std::size_t at_ = 0;
};
}  // namespace

extern "C" {

int baton_spm_train(const char* const* texts, const std::size_t* lengths, std::size_t n, const char* const* keys,
                    const char* const* values, std::size_t n_args, char** model, std::size_t* model_size, char** error) {
  try {
    std::unordered_map<std::string, std::string> args;
    for (std::size_t i = 0; i < n_args; ++i) args[keys[i]] = values[i];
    Sentences input(texts, lengths, n);
    std::string out;
    const auto st = sentencepiece::SentencePieceTrainer::Train(args, &input, &out);
    if (!st.ok()) return set_error(error, st.ToString()), 1;
    *model = static_cast<char*>(std::malloc(out.size() ? out.size() : 1));
    if (!*model) return set_error(error, "out of memory"), 1;
    std::memcpy(*model, out.data(), out.size());
    *model_size = out.size();
    return 0;
  } catch (const std::exception& e) {
    return set_error(error, e.what()), 1;
  } catch (...) {
    return set_error(error, "unknown error"), 1;
  }
}

void* baton_spm_load(const char* model, std::size_t size, char** error) {
  try {
    auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
    if (const auto st = sp->LoadFromSerializedProto(std::string(model, size)); !st.ok())
      return set_error(error, st.ToString()), nullptr;
    return sp.release();
  } catch (const std::exception& e) {
    return set_error(error, e.what()), nullptr;
  }
}

void baton_spm_unload(void* handle) { delete static_cast<sentencepiece::SentencePieceProcessor*>(handle); }

int baton_spm_pieces(const void* handle) { return static_cast<const sentencepiece::SentencePieceProcessor*>(handle)->GetPieceSize(); }

int baton_spm_piece(const void* handle, int id, char** piece, int* kind) {
  try {
    const auto* sp = static_cast<const sentencepiece::SentencePieceProcessor*>(handle);
    *kind = sp->IsUnknown(id) ? BATON_SPM_UNKNOWN : sp->IsControl(id) ? BATON_SPM_CONTROL : sp->IsByte(id) ? BATON_SPM_BYTE
                                                                                                           : BATON_SPM_NORMAL;
    *piece = copy(sp->IdToPiece(id));
    return *piece ? 0 : 1;
  } catch (...) {
    return 1;
  }
}

int baton_spm_special(const void* handle, int which) {
  const auto* sp = static_cast<const sentencepiece::SentencePieceProcessor*>(handle);
  return which == 0 ? sp->unk_id() : which == 1 ? sp->pad_id() : which == 2 ? sp->eos_id() : sp->bos_id();
}

int baton_spm_encode(const void* handle, const char* text, std::size_t size, int** ids, std::size_t* n) {
  try {
    std::vector<int> out;
    if (!static_cast<const sentencepiece::SentencePieceProcessor*>(handle)->Encode(std::string(text, size), &out).ok()) return 1;
    *ids = static_cast<int*>(std::malloc((out.size() ? out.size() : 1) * sizeof(int)));
    if (!*ids) return 1;
    std::memcpy(*ids, out.data(), out.size() * sizeof(int));
    *n = out.size();
    return 0;
  } catch (...) {
    return 1;
  }
}

int baton_spm_decode(const void* handle, const int* ids, std::size_t n, char** text, std::size_t* size) {
  try {
    std::string out;
    if (!static_cast<const sentencepiece::SentencePieceProcessor*>(handle)->Decode(std::vector<int>(ids, ids + n), &out).ok()) return 1;
    *text = static_cast<char*>(std::malloc(out.size() ? out.size() : 1));
    if (!*text) return 1;
    std::memcpy(*text, out.data(), out.size());
    *size = out.size();
    return 0;
  } catch (...) {
    return 1;
  }
}

void baton_spm_free(void* p) { std::free(p); }

}  // extern "C"
