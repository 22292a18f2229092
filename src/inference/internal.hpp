#pragma once
// What the inference files (src/inference/) share with interop.cpp and the CLI.
#include <string>
#include <string_view>

#include "baton/inference.hpp"
#include "baton/interop.hpp"

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

}  // namespace baton::detail
