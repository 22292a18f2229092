#pragma once
/// \file inference.hpp
/// A trained model without the training library: an inference artifact (`baton export STATE -o
/// model.pt --inference`, or `save_for_inference` in <baton/interop.hpp>) holds the weights as a
/// state_dict Python's `torch.load` reads, plus a model card saying what the model is and what it
/// expects. `load_for_inference` rebuilds the model from the card and `Predictor::predict`
/// classifies. This header needs no training header (spec, state, fit); docs/interop.md.
///
/// ```cpp
/// auto predictor = baton::load_for_inference("model.pt");
/// auto inputs = predictor.and_then([](const baton::Predictor& p) { return baton::read_inputs("shirt.png", p.card()); });
/// auto out = predictor->predict(inputs->inputs);   // out->classes[0], out->probabilities[0]
/// ```

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <torch/types.h>

#include "baton/error.hpp"
#include "baton/model.hpp"
#include "baton/params.hpp"

namespace baton {

/// What raw inputs are: pixels (uint8, scaled to [0, 1] and normalized as in training), feature
/// columns (float, taken as they are), or token ids (int64, from text by the card's tokenizer).
enum class InputKind { image, features, tokens };

/// What a deployed model is and what it expects, stored in the artifact beside its weights.
struct ModelCard {
  std::string model{};                    ///< the registry's name ("small_cnn", "mlp"); "" for a model of your own
  Params options{};                       ///< its `[model]` keys
  InputKind input = InputKind::features;
  std::vector<std::int64_t> input_shape{};  ///< one sample as the model takes it: {1, 28, 28}, {4}
  bool normalize = false;                 ///< images: (pixel / 255 - mean) / std; else pixel / 255
  double mean = 0.0;
  double std = 1.0;
  /// Images: a file of another size is resized to `input_shape` (stb_image_resize, the image
  /// folder's own resizing), as the training data was; false: such a file is refused.
  bool resize = false;
  std::vector<std::string> columns{};     ///< features: the CSV columns, in input order (empty: by position)
  std::vector<std::string> classes{};     ///< class names by index (empty: indices only)
  /// Tokens: the tokenizer that turns text into the model's ids, by its identity ("bytes-v1":
  /// text::ByteTokenizer; "sentencepiece-<sha256>": a SentencePiece model, text::Tokenizer).
  /// `input_shape` is {T}, the longest input; a classifier's inputs are padded to T.
  std::string tokenizer{};
  /// The SentencePiece model's bytes (empty for bytes): an artifact holds them as the record
  /// `baton/tokenizer.model`, checked on reading against `tokenizer`.
  std::string tokenizer_model{};
  std::string weights{};                  ///< whose weights: "" (the model's), "ema" or "swa"
  std::string origin{};                   ///< where they came from (state file, stage, time, params_sha256)
};

/// What `Predictor::predict` answers, one row per input.
struct Predictions {
  torch::Tensor classes{};      ///< int64 [N]: the most likely class (the first of equal logits)
  torch::Tensor probabilities{};  ///< float32 [N, classes]: softmax of the logits
};

/// How `Predictor::generate` picks each next token.
struct GenerateOptions {
  std::int64_t max_tokens = 200;  ///< at most this many new tokens
  double temperature = 1.0;       ///< logits / temperature before sampling; 0: always the most likely token
  std::int64_t top_k = 0;         ///< sample among the k most likely tokens only (0: all)
  std::uint64_t seed = 0;         ///< the sampling generator's seed: the same seed gives the same text
  bool stop_at_end = true;        ///< stop at the tokenizer's end-of-text token (not part of the text)
};

/// A model ready to predict. Holds no mutable state: share it between threads.
class Predictor {
 public:
  [[nodiscard]] const ModelCard& card() const;
  [[nodiscard]] c10::Device device() const;
  /// Raw inputs as the card describes them into what the model was trained on: images uint8
  /// [N, H, W] or [N, C, H, W] scaled (and normalized) exactly as the training data was; features
  /// [N, columns] as float32. Checks the shape against `card().input_shape`.
  [[nodiscard]] Expected<torch::Tensor> prepare(const torch::Tensor& raw) const;
  /// The model's outputs [N, classes] (a language model's: [N, positions, vocab]) for prepared
  /// inputs [N, input_shape...] (tokens: [N, 1 to T]), in eval mode, in
  /// batches of `batch_size` (256 as `eval`, so that the same inputs give the same bits).
  [[nodiscard]] Expected<torch::Tensor> logits(const torch::Tensor& prepared, std::int64_t batch_size = 256) const;
  /// `prepare`, `logits`, then softmax and argmax.
  [[nodiscard]] Expected<Predictions> predict(const torch::Tensor& raw, std::int64_t batch_size = 256) const;
  /// A language model's continuation of `prompt` (token ids, 1 to T of them; longer is an error):
  /// each new token drawn from the last position's logits (eval mode, `options`); past T tokens
  /// the model sees the last T. Only the new tokens are returned. Needs a tokens card whose model
  /// answers [N, positions, vocab].
  [[nodiscard]] Expected<std::vector<std::int64_t>> generate_tokens(const std::vector<std::int64_t>& prompt,
                                                                    const GenerateOptions& options = {}) const;
  /// `generate_tokens` on text: the prompt encoded and the new tokens decoded by the card's
  /// tokenizer. An empty prompt starts from the end-of-text token (a new record).
  [[nodiscard]] Expected<std::string> generate(const std::string& prompt, const GenerateOptions& options = {}) const;

  struct Impl;
  explicit Predictor(std::shared_ptr<const Impl> impl);
 private:
  std::shared_ptr<const Impl> impl_;
};

/// The card of an artifact, without loading the model. A state_dict without a card (a plain
/// `baton export`, or Python's `torch.save`) is an error that says how to make an artifact.
Expected<ModelCard> read_model_card(const std::filesystem::path& artifact);

/// Loads an artifact whose card names a built-in model (`mlp`, `small_cnn`) onto `device`. Every
/// tensor of the model must come from the file with its shape.
Expected<Predictor> load_for_inference(const std::filesystem::path& artifact, c10::Device device = c10::Device(c10::kCPU));

struct Registry;  // <baton/hparams.hpp>

/// Loads an artifact whose card names a model of `models` (a program with models of its own
/// registers them, as for curriculum files; `baton::cli::main` does this with its registry).
Expected<Predictor> load_for_inference(const std::filesystem::path& artifact, const Registry& models,
                                       c10::Device device = c10::Device(c10::kCPU));

/// Loads an artifact into a model of your own (the factory must build the trained architecture).
Expected<Predictor> load_for_inference(const std::filesystem::path& artifact, const ModelFactory& model,
                                       c10::Device device = c10::Device(c10::kCPU));

/// Text as a tokens card's model takes it: each text encoded by the card's tokenizer, cut to the
/// card's T tokens (the first T: the policy of training's text datasets) and padded to T.
/// Errors: a card that is not of tokens, a tokenizer this baton does not know.
Expected<torch::Tensor> encode_texts(const std::vector<std::string>& texts, const ModelCard& card);

/// Inputs read from a file for a card, ready for `Predictor::predict`.
struct InputBatch {
  std::vector<std::string> ids{};  ///< one per input: the row number, or the image's file name
  torch::Tensor inputs{};        ///< raw: uint8 images [N, H, W] / [N, C, H, W], or float32 features [N, F]
};

/// Reads inputs for `card` from `path`: an IDX file of images (plain or .gz, as Fashion-MNIST's),
/// an image file (PNG, JPEG, BMP, PGM/PPM), a directory of image files (in name order), or, for
/// feature cards, a CSV file with a header (columns taken by the card's names, so a target column
/// or a different order does no harm); for token cards, a UTF-8 text file with one input per line
/// (`encode_texts`; ids are line numbers). Images must have the card's size and channels (no
/// resizing). Errors name the file and what does not fit.
Expected<InputBatch> read_inputs(const std::filesystem::path& path, const ModelCard& card);

}  // namespace baton
