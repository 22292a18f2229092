// Predictor: a model rebuilt from an artifact's card and weights, in eval mode, for inference only.
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "baton/hparams.hpp"
#include "data_internal.hpp"
#include "detail.hpp"
#include "inference/internal.hpp"
#include "interop/internal.hpp"
#include "weights.hpp"

namespace baton {

Predictor::Predictor(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
const ModelCard& Predictor::card() const { return impl_->card; }
c10::Device Predictor::device() const { return impl_->device; }

namespace {
std::string expected_shape(const ModelCard& c) { return fmt::format("[N, {}]", fmt::join(c.input_shape, ", ")); }

bool sample_shape_is(const torch::Tensor& t, const std::vector<std::int64_t>& shape) {
  return t.dim() == static_cast<std::int64_t>(shape.size()) + 1 && t.sizes().slice(1).vec() == shape;
}
}  // namespace

Expected<torch::Tensor> Predictor::prepare(const torch::Tensor& raw) const {
  return detail::guard([&]() -> Expected<torch::Tensor> {
    const ModelCard& c = impl_->card;
    if (!raw.defined()) return fail(ErrorCode::invalid_argument, "predict: no inputs");
    torch::Tensor x = raw;
    if (c.input == InputKind::tokens) {  // int64 ids [N, t], 1 <= t <= T (a language model takes fewer)
      if (x.dim() != 2 || x.scalar_type() != torch::kLong || x.size(1) < 1 || x.size(1) > c.input_shape[0])
        return fail(ErrorCode::shape_mismatch, fmt::format("predict: inputs {} {}; the model takes int64 token ids [N, 1 to {}]",
                                                           c10::toString(x.scalar_type()), detail::shape_string(raw), c.input_shape[0]));
      return x;
    }
    // [N, H, W] pixels of a one-channel model: the channel dimension is implied.
    if (c.input == InputKind::image && x.dim() == 3 && c.input_shape.size() == 3 && c.input_shape[0] == 1) x = x.unsqueeze(1);
    if (!sample_shape_is(x, c.input_shape))
      return fail(ErrorCode::shape_mismatch, fmt::format("predict: inputs of shape {}; the model takes {}{}", detail::shape_string(raw),
                                                         expected_shape(c), c.input == InputKind::image ? " (uint8 pixels)" : ""));
    if (c.input == InputKind::image && x.scalar_type() == torch::kUInt8) return detail::scale_pixels(x, c.normalize, c.mean, c.std);
    if (c.input == InputKind::image && !x.is_floating_point())
      return fail(ErrorCode::invalid_argument, fmt::format("predict: images as {}; give uint8 pixels or prepared floats",
                                                           c10::toString(x.scalar_type())));
    return x.to(torch::kFloat32);  // features, and images already prepared as in training
  });
}

Expected<torch::Tensor> Predictor::logits(const torch::Tensor& prepared, std::int64_t batch_size) const {
  return detail::guard([&]() -> Expected<torch::Tensor> {
    const ModelCard& c = impl_->card;
    if (batch_size < 1) return fail(ErrorCode::invalid_argument, fmt::format("predict: batch size {}; must be positive", batch_size));
    const bool tokens = c.input == InputKind::tokens && prepared.defined() && prepared.dim() == 2 && prepared.size(1) >= 1 &&
                        prepared.size(1) <= c.input_shape[0];
    if (!prepared.defined() || (!tokens && !sample_shape_is(prepared, c.input_shape)))
      return fail(ErrorCode::shape_mismatch, fmt::format("predict: prepared inputs of shape {}; the model takes {}",
                                                         prepared.defined() ? detail::shape_string(prepared) : "(none)",
                                                         expected_shape(c)));
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> outs;
    const auto n = prepared.size(0);
    for (std::int64_t i = 0; i < n; i += batch_size) {
      auto x = prepared.narrow(0, i, std::min(batch_size, n - i)).to(impl_->device);
      outs.push_back(impl_->model.forward(x).to(torch::kCPU, torch::kFloat32));
    }
    auto out = outs.empty() ? torch::empty({0, static_cast<std::int64_t>(c.classes.size())}) : torch::cat(outs);
    const bool language_model = c.input == InputKind::tokens && c.classes.empty() && out.dim() == 3;
    if (out.dim() != 2 && !language_model)
      return fail(ErrorCode::shape_mismatch, fmt::format("predict: the model answered {}, not [N, classes]", detail::shape_string(out)));
    return out;
  });
}

Expected<Predictions> Predictor::predict(const torch::Tensor& raw, std::int64_t batch_size) const {
  return prepare(raw)
      .and_then([&](const torch::Tensor& x) { return logits(x, batch_size); })
      .and_then([](const torch::Tensor& out) {
        return detail::guard([&]() -> Expected<Predictions> {
          if (out.dim() != 2)
            return fail(ErrorCode::invalid_argument, fmt::format("predict: the model answers {} (a language model): it "
                                                                 "generates text (generate, baton generate), it does not classify",
                                                                 detail::shape_string(out)));
          return Predictions{out.argmax(1), torch::softmax(out, 1)};
        });
      });
}

Expected<Predictor> detail::make_predictor(const ModelCard& card, const ModelFactory& factory, const StateDict& weights,
                                           c10::Device device) {
  return guard([&]() -> Expected<Predictor> {
    TrainState s;
    s.model = build_model(factory, 0, "inference");
    auto loaded = load_weights(std::move(s), weights, {.strict = true});
    if (!loaded) return tl::unexpected(loaded.error());
    auto impl = std::make_shared<Predictor::Impl>();
    impl->card = card;
    if (card.input == InputKind::tokens) {
      auto tokenizer = card_tokenizer(card, "the model card");
      if (!tokenizer) return tl::unexpected(tokenizer.error());
      impl->tokenizer = *tokenizer;
    }
    impl->model = std::move(loaded->first.model);
    impl->model.module->eval();
    impl->model.module->to(device);
    impl->device = device;
    return Predictor(std::move(impl));
  });
}

Expected<ModelCard> read_model_card(const std::filesystem::path& artifact) {
  const std::string where = artifact.string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(artifact, ec))
    return fail(ErrorCode::io, fmt::format("{}: no such file (an inference artifact: baton export STATE -o FILE --inference)", where));
  return detail::guard([&]() -> Expected<ModelCard> {
    auto opened = detail::open_archive(artifact, "an inference artifact");
    if (!opened) return tl::unexpected(opened.error());
    auto& zip = *opened;
    if (!zip->hasRecord(detail::kCardRecord))
      return fail(ErrorCode::data, fmt::format("{}: a state_dict without a model card, not an inference artifact; write one with "
                                               "baton export STATE -o FILE --inference (or save_for_inference)", where));
    auto [data, size] = zip->getRecord(detail::kCardRecord);
    auto card = detail::card_from_json(std::string_view(static_cast<const char*>(data.get()), size), where);
    if (card && zip->hasRecord(detail::kTokenizerRecord)) {
      auto [model, model_size] = zip->getRecord(detail::kTokenizerRecord);
      card->tokenizer_model.assign(static_cast<const char*>(model.get()), model_size);
    }
    return card;
  });
}

Expected<Predictor> load_for_inference(const std::filesystem::path& artifact, const ModelFactory& model, c10::Device device) {
  auto card = read_model_card(artifact);
  if (!card) return tl::unexpected(card.error());
  auto weights = read_state_dict(artifact);
  if (!weights) return tl::unexpected(weights.error());
  auto loaded = detail::make_predictor(*card, model, *weights, device);
  if (!loaded) return tl::unexpected(loaded.error().with_context(artifact.string()));
  return loaded;
}

Expected<Predictor> load_for_inference(const std::filesystem::path& artifact, const Registry& models, c10::Device device) {
  auto card = read_model_card(artifact);
  if (!card) return tl::unexpected(card.error());
  if (card->model.empty())
    return fail(ErrorCode::invalid_argument,
                fmt::format("{}: the model is one of your own (the card names none); pass its factory: "
                            "load_for_inference(path, factory)", artifact.string()));
  const auto it = models.models.find(card->model);
  if (it == models.models.end()) {
    std::vector<std::string> known;
    for (const auto& [name, entry] : models.models) known.push_back(name);
    return fail(ErrorCode::invalid_argument,
                fmt::format("{}: model \"{}\" is not in the registry (it has: {}); register it, or pass its factory: "
                            "load_for_inference(path, factory)",
                            artifact.string(), card->model, known.empty() ? "none" : fmt::format("{}", fmt::join(known, ", "))));
  }
  auto factory = it->second.make(card->options);
  if (!factory) return tl::unexpected(factory.error().with_context(fmt::format("{}: model \"{}\"", artifact.string(), card->model)));
  return load_for_inference(artifact, *factory, device);
}

Expected<Predictor> load_for_inference(const std::filesystem::path& artifact, c10::Device device) {
  return load_for_inference(artifact, Registry::builtin(), device);
}

}  // namespace baton
