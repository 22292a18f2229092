// Text in and out of a tokens card's model: encoding inputs for `predict`, and generation.
#include <fstream>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include "baton/text.hpp"
#include "detail.hpp"
#include "inference/internal.hpp"

namespace baton {

Expected<text::Tokenizer> detail::card_tokenizer(const ModelCard& card, const std::string& what) {
  if (card.input != InputKind::tokens)
    return fail(ErrorCode::invalid_argument, fmt::format("{}: the model takes {}, not text", what,
                                                         card.input == InputKind::image ? "images" : "feature columns"));
  if (card.tokenizer == text::ByteTokenizer::identity()) return text::Tokenizer{};
  if (card.tokenizer.rfind("sentencepiece-", 0) != 0)
    return fail(ErrorCode::invalid_argument, fmt::format("{}: the card's tokenizer \"{}\" is not one this baton knows ({}, "
                                                         "sentencepiece-<sha256>)", what, card.tokenizer,
                                                         text::ByteTokenizer::identity()));
  if (card.tokenizer_model.empty())
    return fail(ErrorCode::data, fmt::format("{}: the card names the tokenizer {}, but its model is missing (an artifact holds it "
                                             "as {})", what, card.tokenizer, kTokenizerRecord));
  auto t = text::Tokenizer::from_model(card.tokenizer_model, what + ": the card's tokenizer");
  if (t && t->identity() != card.tokenizer)
    return fail(ErrorCode::data, fmt::format("{}: the tokenizer model held is {}, but the card names {}: they do not belong "
                                             "together", what, t->identity(), card.tokenizer));
  return t;
}

Expected<torch::Tensor> encode_texts(const std::vector<std::string>& texts, const ModelCard& card) {
  auto tokenizer = detail::card_tokenizer(card, "encode_texts");
  if (!tokenizer) return tl::unexpected(tokenizer.error());
  const auto T = card.input_shape.at(0);
  auto x = torch::full({static_cast<std::int64_t>(texts.size()), T}, tokenizer->pad(), torch::kLong);
  auto* p = x.data_ptr<std::int64_t>();
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const auto ids = tokenizer->encode(texts[i]);
    const auto take = std::min<std::int64_t>(T, static_cast<std::int64_t>(ids.size()));
    std::copy_n(ids.begin(), take, p + static_cast<std::int64_t>(i) * T);
  }
  return x;
}

Expected<InputBatch> detail::text_inputs(const std::filesystem::path& path, const ModelCard& card) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(ErrorCode::io, fmt::format("{}: cannot open the text file", path.string()));
  InputBatch out;
  std::vector<std::string> lines;
  std::string line;
  for (std::int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    out.ids.push_back(std::to_string(number));
    lines.push_back(std::move(line));
  }
  if (lines.empty()) return fail(ErrorCode::data, fmt::format("{}: no text (one input per line)", path.string()));
  auto x = encode_texts(lines, card);
  if (!x) return tl::unexpected(x.error().with_context(path.string()));
  out.inputs = *x;
  return out;
}

Expected<std::vector<std::int64_t>> Predictor::generate_tokens(const std::vector<std::int64_t>& prompt,
                                                               const GenerateOptions& o) const {
  return detail::guard([&]() -> Expected<std::vector<std::int64_t>> {
    const ModelCard& c = impl_->card;
    if (c.input != InputKind::tokens || !c.classes.empty())
      return fail(ErrorCode::invalid_argument, "generate: the artifact is not a language model (a tokens card without classes)");
    const auto T = c.input_shape.at(0);
    if (prompt.empty() || static_cast<std::int64_t>(prompt.size()) > T)
      return fail(ErrorCode::invalid_argument,
                  fmt::format("generate: a prompt of {} tokens; the model takes 1 to {} (its block_size)", prompt.size(), T));
    if (o.max_tokens < 0 || !(o.temperature >= 0) || o.top_k < 0)
      return fail(ErrorCode::invalid_argument, fmt::format("generate: max_tokens {}, temperature {}, top_k {}: none may be negative",
                                                           o.max_tokens, o.temperature, o.top_k));
    torch::NoGradGuard no_grad;
    auto generator = at::make_generator<at::CPUGeneratorImpl>(o.seed);
    std::vector<std::int64_t> all = prompt, out;
    for (std::int64_t step = 0; step < o.max_tokens; ++step) {
      const auto from = all.size() > static_cast<std::size_t>(T) ? all.end() - T : all.begin();
      const auto x = torch::tensor(std::vector<std::int64_t>(from, all.end()), torch::kLong).unsqueeze(0).to(impl_->device);
      const auto y = impl_->model.forward(x);
      if (y.dim() != 3 || y.size(1) != x.size(1))
        return fail(ErrorCode::shape_mismatch, fmt::format("generate: the model answered {}, not [1, positions, vocab]",
                                                           detail::shape_string(y)));
      auto logits = y[0][-1].to(torch::kCPU, torch::kFloat32);
      std::int64_t next = 0;
      if (o.temperature == 0) {
        next = logits.argmax().item<std::int64_t>();
      } else {
        logits = logits / o.temperature;
        if (o.top_k > 0 && o.top_k < logits.size(0)) {  // everything below the k-th largest logit is out
          const auto kth = std::get<0>(logits.topk(o.top_k)).min();
          logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
        }
        next = torch::multinomial(torch::softmax(logits, 0), 1, false, generator).item<std::int64_t>();
      }
      if (o.stop_at_end && c.input == InputKind::tokens && next == impl_->tokenizer.end_of_text()) break;
      all.push_back(next);
      out.push_back(next);
    }
    return out;
  });
}

Expected<std::string> Predictor::generate(const std::string& prompt, const GenerateOptions& o) const {
  if (impl_->card.input != InputKind::tokens) return tl::unexpected(detail::card_tokenizer(impl_->card, "generate").error());
  const auto& tokenizer = impl_->tokenizer;
  // A record of the training stream follows an end-of-text token: so does the prompt.
  std::vector<std::int64_t> ids = {tokenizer.end_of_text()};
  const auto body = tokenizer.encode(prompt);
  ids.insert(ids.end(), body.begin(), body.end());
  auto out = generate_tokens(ids, o);
  if (!out) return tl::unexpected(out.error());
  return tokenizer.decode(*out);
}

}  // namespace baton
