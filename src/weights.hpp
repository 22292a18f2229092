#pragma once
// Models and their weights, below the loop: a model built from its factory with a seed derived
// from the run's seed and a name (so a new head is initialized the same way in every run), and
// weights copied by name and shape (a stage's transfer, an imported state_dict), and the weights
// an algorithm keeps (EMA, SWA) swapped into a copy of a state (eval and the state_dict export).

#include <string>
#include <string_view>
#include <vector>

#include <torch/nn/module.h>

#include "baton/error.hpp"
#include "baton/model.hpp"
#include "baton/spec.hpp"
#include "baton/state.hpp"

namespace baton::detail {

/// Builds a model with `factory`, seeded from the run's seed and the stage name, leaving the
/// caller's global generator intact; raises if the factory returns no module or no forward.
Model build_model(const ModelFactory& factory, std::uint64_t seed, std::string_view stage);

/// Copies every parameter and buffer of `from` whose name and shape match one of `to` (unless
/// its name matches a `fresh` pattern), and says what was copied, skipped and left as
/// initialized; `copied_params` gets the names of the parameters copied.
TransferReport transfer_weights(const torch::nn::Module& from, torch::nn::Module& to, const std::vector<std::string>& fresh,
                                std::vector<std::string>* copied_params = nullptr);

/// Why a transfer that made `r` took nothing: no parameter or buffer of the new model has a name
/// and shape of the old one's, and none was left fresh by request (names of each listed); "" when
/// it took something. A transfer of nothing is a model built anew by mistake: its trunk is named
/// differently.
std::string transfer_took_nothing(const torch::nn::Module& from, const torch::nn::Module& to, const TransferReport& r);

/// The model factory a state has after (and while training) `stages[index]`: the last stage up to
/// it that builds a model of its own (`ModelCarry` reinitialize or transfer with a factory), else
/// `initial`. Checkpoints load with it.
const ModelFactory& factory_after(const std::vector<TrainingSpec>& stages, std::size_t index, const ModelFactory& initial);

/// A copy of `s` holding the parameters and buffers `s.algorithm_state[which]` keeps in place of
/// its own; an error naming `which` when the state keeps none or they do not fit the model
/// (src/eval.cpp).
Expected<TrainState> with_weights(const std::string& which, const TrainState& s);

}  // namespace baton::detail
