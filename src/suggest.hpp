#pragma once
// "Did you mean" suggestions for unknown names and keys: one wording for every message.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace baton::detail {

/// Edit distance (insertions, deletions, substitutions).
std::size_t edit_distance(std::string_view a, std::string_view b);
/// The closest candidate within a small distance, or "".
std::string closest(std::string_view word, const std::vector<std::string>& candidates);
/// ` (did you mean "x"?)` for the closest of `known`, or "" when none is close: the piece every
/// unknown-name message puts right after the name.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& known);

}  // namespace baton::detail
