#pragma once
/// \file interop.hpp
/// Weights to and from PyTorch: a state's weights as a state_dict file Python's `torch.load`
/// reads, and a state_dict Python's `torch.save(model.state_dict(), path)` wrote as weights of a
/// baton model, with a report of what was taken (docs/interop.md). Not part of <baton/baton.hpp>:
/// include it where you need it.

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "baton/error.hpp"
#include "baton/inference.hpp"
#include "baton/model.hpp"
#include "baton/state.hpp"

namespace baton {

/// Tensors by name, in the file's order ("0.weight", "1.running_mean", ...).
using StateDict = std::vector<std::pair<std::string, torch::Tensor>>;

/// The weights of a state by their names in the module tree: parameters, then buffers.
/// `weights`: "" for the model's own, or "ema" / "swa" for the weights that algorithm keeps.
Expected<StateDict> state_dict(const TrainState& state, const std::string& weights = "");

/// The weights of the checkpoint at `path` (checkpoint.hpp) as `state_dict` gives them for the
/// state it holds (same names, order and bits), read without building the model: what `baton
/// export STATE OUT` writes, for any run directory. `weights` as for `state_dict`.
Expected<StateDict> checkpoint_state_dict(const std::filesystem::path& path, const std::string& weights = "");

/// Writes a state dict (contiguous CPU tensors) in the format of Python's `torch.save`, so that
/// `model.load_state_dict(torch.load(path))` takes it. The file is replaced atomically.
Expected<void> save_state_dict(const StateDict& tensors, const std::filesystem::path& path);

/// Reads a file `torch.save(model.state_dict(), path)` wrote (PyTorch's zip format: an
/// OrderedDict or dict of tensors by name) or `save_state_dict` wrote. Only tensors by name are
/// read; anything else in the pickle is an error, and no code in it runs.
Expected<StateDict> read_state_dict(const std::filesystem::path& path);

/// Writes an inference artifact for `load_for_inference` and `baton predict`: the weights
/// `card.weights` names ("" the model's, "ema", "swa") as `save_state_dict` writes them (so
/// Python's `torch.load` reads the file as a state_dict) and the card as JSON in the record
/// `baton/card.json`. Checks the card against the model first: one sample of `input_shape` must
/// go through it, and the class names (when given) must match its outputs. Replaced atomically.
Expected<void> save_for_inference(const TrainState& state, const ModelCard& card, const std::filesystem::path& path);
/// A predictor of `state`'s weights (`card.weights` names which) described by `card`, without a
/// file: what `load_for_inference` of the artifact `save_for_inference` writes would give, e.g.
/// to generate text from a state in memory (`Curriculum::model_card` gives the card).
Expected<Predictor> predictor(const TrainState& state, const ModelCard& card, c10::Device device = c10::Device(c10::kCPU));

/// How a state dict's names become a model's.
struct ImportOptions {
  /// (ECMAScript regex, replacement) applied in order to every name of the file: e.g.
  /// {"^module\\.", ""} drops DataParallel's prefix, {"^fc\\.", "4."} maps a layer.
  std::vector<std::pair<std::string, std::string>> rename{};
  /// Name patterns (`*` any text) of the model's tensors to initialize anew even when the file
  /// has them (a new head), as ModelCarry::fresh.
  std::vector<std::string> fresh{};
  /// True: every tensor of the model must come from the file (or be in `fresh`) and every
  /// tensor of the file must be taken; a missing key, an unused key or a shape mismatch is an
  /// error naming each. False: the report says what was copied, skipped and initialized.
  bool strict = true;
};

/// A state whose model holds `tensors` under their (renamed) names, as parameters where
/// `target`'s model has a parameter of that name and as buffers else: the source of
/// `ModelCarry::transfer(factory, std::make_shared<TrainState>(*imported))`, which copies every
/// tensor whose name and shape match and reports the rest. The state cannot be trained or
/// evaluated (its model has no forward).
Expected<TrainState> imported_state(const StateDict& tensors, const ModelFactory& target, const ImportOptions& options = {});

/// `state` with its weights taken from `tensors` (renamed) where names and shapes match, and
/// what was copied, skipped (with the reason) and left as initialized. Optimizer moments of the
/// replaced weights are dropped. With `options.strict` anything not taken is an error.
Expected<std::pair<TrainState, TransferReport>> load_weights(TrainState state, const StateDict& tensors,
                                                             const ImportOptions& options = {});

}  // namespace baton
