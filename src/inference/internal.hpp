#pragma once
// What the inference files (src/inference/) share with interop.cpp and the CLI.
#include <filesystem>
#include <string>
#include <string_view>

#include "baton/inference.hpp"
#include "baton/interop.hpp"

namespace baton {
/// A predictor's model and card (predictor.cpp builds it; text.cpp generates with it).
struct Predictor::Impl {
  ModelCard card;
  Model model;  // in eval mode from construction on, never changed: safe to share between threads
  c10::Device device = c10::Device(c10::kCPU);
};
}  // namespace baton

namespace baton::detail {

/// The artifact's record that holds the card (beside PyTorch's data.pkl and data/N).
inline constexpr const char* kCardRecord = "baton/card.json";

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
