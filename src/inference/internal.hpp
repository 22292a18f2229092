#pragma once
// What the inference files (src/inference/) share with interop.cpp and the CLI.
#include <filesystem>
#include <string>
#include <string_view>

#include "baton/inference.hpp"
#include "baton/interop.hpp"
#include "baton/text.hpp"

namespace baton {
/// A predictor's model and card (predictor.cpp builds it; text.cpp generates with it).
struct Predictor::Impl {
  ModelCard card;
  Model model;  // in eval mode from construction on, never changed: safe to share between threads
  c10::Device device = c10::Device(c10::kCPU);
  text::Tokenizer tokenizer{};  // a tokens card's (card_tokenizer), checked when built
};
}  // namespace baton

namespace baton::detail {

/// The artifact's record that holds the card (beside PyTorch's data.pkl and data/N).
inline constexpr const char* kCardRecord = "baton/card.json";
/// The record that holds a SentencePiece tokenizer's model (ModelCard::tokenizer_model).
inline constexpr const char* kTokenizerRecord = "baton/tokenizer.model";

/// A tokens card's tokenizer: bytes, or its SentencePiece model checked against the card's
/// identity. Errors (`what` leads them): not a tokens card, an unknown tokenizer, a missing
/// model, a model that is not the one the card names.
Expected<text::Tokenizer> card_tokenizer(const ModelCard& card, const std::string& what);

/// The card as JSON text, and back; `where` names the file in errors.
std::string card_to_json(const ModelCard& card);
Expected<ModelCard> card_from_json(std::string_view text, const std::string& where);

/// A predictor of `card` over a model `factory` builds, holding `weights` (every tensor of the
/// model by name and shape, and nothing else), on `device`.
Expected<Predictor> make_predictor(const ModelCard& card, const ModelFactory& factory, const StateDict& weights,
                                   c10::Device device);

/// A tokens card's inputs from a UTF-8 text file, one per line (empty lines skipped; ids are
/// line numbers).
Expected<InputBatch> text_inputs(const std::filesystem::path& path, const ModelCard& card);

}  // namespace baton::detail
