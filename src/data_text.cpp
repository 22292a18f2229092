// The text datasets (text.hpp): language-model windows over a token stream, and records as
// padded token rows with a class.
#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <torch/torch.h>

#include "baton/text.hpp"
#include "data_internal.hpp"
#include "text_internal.hpp"
#include "detail.hpp"

namespace baton::text {
namespace {

/// Windows of T tokens over one stream; which windows an epoch gives is a pure function of
/// (seed, epoch, index), so workers, splits and resumes agree.
class LmSource final : public Source {
 public:
  LmSource(torch::Tensor stream, std::int64_t block, std::string identity, Tokenizer tokenizer)
      : stream_(std::move(stream)), block_(block), identity_(std::move(identity)), tokenizer_(std::move(tokenizer)) {}
  const torch::Tensor& stream() const { return stream_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  std::int64_t size() const override { return (stream_.size(0) - 1) / block_; }
  std::vector<std::int64_t> input_shape() const override { return {block_}; }
  std::int64_t classes() const override { return 0; }
  std::string identity() const override { return identity_; }

  Expected<Batch> batch(const torch::Tensor& indices, const SampleContext& context) const override {
    const std::int64_t room = stream_.size(0) - block_;  // window starts in [0, room)
    std::int64_t phase = 0;
    if (context.epoch >= 0) {
      std::uint64_t x = context.seed ^ (static_cast<std::uint64_t>(context.epoch) * 0xD1B54A32D192ED03ULL);
      phase = static_cast<std::int64_t>(baton::detail::splitmix64(x) % static_cast<std::uint64_t>(room));
    }
    const auto starts = (indices.to(torch::kLong) * block_ + phase).remainder(room);
    const auto at = starts.unsqueeze(1) + torch::arange(block_ + 1, torch::kLong).unsqueeze(0);  // [B, T + 1]
    const auto rows = stream_.index({at});
    return Batch{rows.narrow(1, 0, block_).contiguous(), rows.narrow(1, 1, block_).contiguous()};
  }

 private:
  torch::Tensor stream_;  // int64 [L]
  std::int64_t block_;
  std::string identity_;
  Tokenizer tokenizer_;
};

}  // namespace

Expected<Dataset> lm_internal::lm_over(torch::Tensor stream, const Tokenizer& tokenizer, std::int64_t block, const std::string& name) {
  const auto n = stream.size(0);
  const auto identity = fmt::format("lm windows of {} tokens ({}) over {} tokens, sha256 {}", block, tokenizer.identity(), n,
                                    baton::detail::tensor_digest(stream).substr(0, 16));
  return make_dataset(std::make_shared<LmSource>(std::move(stream), block, identity, tokenizer), name);
}

std::optional<lm_internal::Stream> lm_internal::stream_of(const Dataset& d) {
  const auto* lm = dynamic_cast<const LmSource*>(d.source.get());
  if (!lm) return std::nullopt;
  return Stream{lm->stream(), lm->tokenizer()};
}

std::optional<Tokenizer> tokenizer_of(const Dataset& d) {
  if (auto s = lm_internal::stream_of(d)) return s->tokenizer;
  // A part of one (slice, hold_out): its origin says which, and where its tokenizer is.
  if (d.origin.kind != "fortunes_lm" && d.origin.kind != "token_shards") return std::nullopt;
  const auto it = d.origin.keys.find("tokenizer");
  const auto* file = it == d.origin.keys.end() ? nullptr : std::get_if<std::string>(&it->second);
  auto t = load_tokenizer(file ? *file : std::string());
  return t ? std::optional<Tokenizer>(*t) : std::nullopt;
}

Expected<Metric> bits_per_byte(const std::vector<std::pair<std::string, Dataset>>& sets) {
  std::optional<Tokenizer> tokenizer;
  std::string first;
  for (const auto& [name, ds] : sets) {
    auto t = tokenizer_of(ds);
    if (!t)
      return fail(ErrorCode::invalid_argument, fmt::format("bits_per_byte: \"{}\" is not language-model data (fortunes_lm, "
                                                           "token_shards, text::lm_windows)", name));
    if (tokenizer && t->identity() != tokenizer->identity())
      return fail(ErrorCode::invalid_argument, fmt::format("bits_per_byte: \"{}\" and \"{}\" have different tokenizers ({} and "
                                                           "{}); evaluate them in different stages",
                                                           first, name, tokenizer->identity(), t->identity()));
    if (!tokenizer) tokenizer = t, first = name;
  }
  return metric::bits_per_byte((tokenizer ? *tokenizer : Tokenizer{}).byte_lengths());
}

Expected<Dataset> lm_windows(const std::vector<Record>& records, const LmOptions& o) {
  if (o.block_size < 1) return fail(ErrorCode::invalid_argument, fmt::format("lm: block_size must be at least 1, got {}", o.block_size));
  std::vector<std::int64_t> tokens;
  for (const auto& r : records) {
    const auto t = o.tokenizer.encode(r.text);
    tokens.insert(tokens.end(), t.begin(), t.end());
    tokens.push_back(o.tokenizer.end_of_text());
  }
  if (static_cast<std::int64_t>(tokens.size()) < o.block_size + 1)
    return fail(ErrorCode::invalid_argument,
                fmt::format("lm \"{}\": {} records give {} tokens, fewer than block_size + 1 = {}; an empty corpus or part?",
                            o.name, records.size(), tokens.size(), o.block_size + 1));
  return lm_internal::lm_over(torch::tensor(tokens, torch::kLong), o.tokenizer, o.block_size, o.name);
}

Expected<Dataset> classification(const std::vector<Record>& records, const ClassificationOptions& o) {
  if (o.length < 1) return fail(ErrorCode::invalid_argument, fmt::format("text: length must be at least 1, got {}", o.length));
  if (o.label != "topic" && o.label != "language")
    return fail(ErrorCode::invalid_argument, fmt::format("text: label \"{}\" is not one of topic, language", o.label));
  if (records.empty()) return fail(ErrorCode::invalid_argument, fmt::format("text \"{}\": no records", o.name));
  auto label_of = [&](const Record& r) -> const std::string& { return o.label == "language" ? r.language : r.topic; };
  auto classes = o.classes;
  if (classes.empty()) classes = labels_with(records, o.label, 1);
  std::map<std::string, std::int64_t> index;
  for (std::size_t i = 0; i < classes.size(); ++i) index[classes[i]] = static_cast<std::int64_t>(i);
  const auto n = static_cast<std::int64_t>(records.size());
  auto inputs = torch::full({n, o.length}, o.tokenizer.pad(), torch::kLong);
  auto targets = torch::empty({n}, torch::kLong);
  auto* x = inputs.data_ptr<std::int64_t>();
  auto* y = targets.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto& r = records[static_cast<std::size_t>(i)];
    const auto it = index.find(label_of(r));
    if (it == index.end())
      return fail(ErrorCode::invalid_argument, fmt::format("text \"{}\": record {} has {} \"{}\", not one of the classes {}",
                                                           o.name, i, o.label, label_of(r), fmt::join(classes, ", ")));
    y[i] = it->second;
    const auto tokens = o.tokenizer.encode(r.text);
    const auto take = std::min<std::int64_t>(o.length, static_cast<std::int64_t>(tokens.size()));
    std::copy_n(tokens.begin(), take, x + i * o.length);
  }
  return make_dataset(std::move(inputs), std::move(targets), o.name);
}

}  // namespace baton::text
