#pragma once
// The weights an algorithm keeps (EMA, SWA), swapped into a copy of the state: shared by eval and
// the state_dict export.
#include <string>

#include "baton/error.hpp"
#include "baton/state.hpp"

namespace baton::detail {
/// A copy of `s` holding the parameters and buffers `s.algorithm_state[which]` keeps in place of
/// its own; an error naming `which` when the state keeps none or they do not fit the model.
Expected<TrainState> with_weights(const std::string& which, const TrainState& s);
}  // namespace baton::detail
