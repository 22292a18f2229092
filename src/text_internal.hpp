#pragma once
// What the text datasets' files share (data_text.cpp, data_tokens.cpp): a language model's token
// stream as windows, and back.
#include <cstdint>
#include <optional>
#include <string>

#include <torch/types.h>

#include "baton/text.hpp"

namespace baton::text::lm_internal {

/// `lm_windows`' dataset over a stream of token ids (int64 [L], L > block).
Expected<Dataset> lm_over(torch::Tensor stream, const Tokenizer& tokenizer, std::int64_t block, const std::string& name);

/// The stream and tokenizer under an lm-windows dataset (`lm_windows`, `fortunes_lm`,
/// `token_shards`); nullopt for any other dataset.
struct Stream {
  torch::Tensor tokens;  // int64 [L]
  Tokenizer tokenizer;
};
std::optional<Stream> stream_of(const Dataset& dataset);

}  // namespace baton::text::lm_internal
