#pragma once
/// \file model.hpp
/// How baton holds a user's model: a module plus its forward function, made by a factory.
///
/// Requirements on a user module: it is a `torch::nn::Module` (or a `ModuleHolder` such as
/// `torch::nn::Sequential`) with `torch::Tensor forward(torch::Tensor)`, and a factory (any
/// callable returning it) builds it with the same parameter and buffer names each time. baton
/// uses the factory to make the independent copies a value `TrainState` needs (then copies the
/// tensors over), so the module need not be `Cloneable`.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include "baton/params.hpp"

namespace baton {

/// A module and how to call it.
struct Model {
  std::shared_ptr<torch::nn::Module> module{};
  std::function<torch::Tensor(const torch::Tensor&)> forward{};
};

/// Makes a fresh Model. Must build the same architecture every time.
using ModelFactory = std::function<Model()>;

/// Wraps a callable returning a module holder (`torch::nn::Sequential`, `torch::nn::Linear`,
/// a `TORCH_MODULE` of your own) or a `std::shared_ptr<YourModule>` into a `ModelFactory`.
///
/// ```cpp
/// auto factory = baton::model_factory([] { return torch::nn::Sequential(torch::nn::Linear(4, 2)); });
/// ```
template <class F>
ModelFactory model_factory(F make) {
  return [make = std::move(make)]() -> Model {
    auto made = make();
    auto ptr = [&] {
      if constexpr (requires { made.ptr(); }) return made.ptr();  // a ModuleHolder
      else return std::move(made);                               // a std::shared_ptr<Module>
    }();
    std::shared_ptr<torch::nn::Module> base = ptr;
    return Model{std::move(base), [p = std::move(ptr)](const torch::Tensor& x) { return p->forward(x); }};
  };
}

namespace models {

/// A factory that says what it builds, by a name a `Registry` knows and that entry's `[model]`
/// keys: what a C++ run records (run.hpp) so that `baton eval`, `baton export` and `baton
/// predict` rebuild the model from its run directory. The built-in factories are `Named`
/// (`mlp`, `small_cnn`); `named` makes one of your own factory. Recover it from any
/// `ModelFactory` with `factory.target<baton::models::Named>()` (null: the factory says nothing).
struct Named {
  std::string name{};  ///< the registry's name: "mlp", "small_cnn", or yours ("my_net")
  Params params{};   ///< its `[model]` keys, as a curriculum file would give them
  ModelFactory make{};
  Model operator()() const { return make(); }
};

/// `factory`, named for the `baton` tools: `name` and `params` must build the same architecture
/// through the registry of the program that reads the run (a program on `baton::cli::main`
/// with `registry.models[name]`).
///
/// ```cpp
/// auto factory = baton::models::named("my_net", {{"width", 64.0}}, baton::model_factory([] { return MyNet(64); }));
/// ```
ModelFactory named(std::string name, Params params, ModelFactory factory);

/// A multi-layer perceptron over flattened inputs: widths {784, 256, 128, 10} gives
/// Flatten, Linear(784,256), ReLU, Linear(256,128), ReLU, Linear(128,10). A `Named` "mlp"
/// (`widths`).
ModelFactory mlp(std::vector<std::int64_t> widths);

/// Options of the small CNN for 28x28 single-channel images.
struct SmallCnnOptions {
  std::int64_t channels1 = 32;
  std::int64_t channels2 = 64;
  std::int64_t hidden = 128;
  std::int64_t classes = 10;
  std::int64_t in_channels = 1;
  std::int64_t image_size = 28;  ///< must be divisible by 4
  double dropout = 0.0;          ///< dropout before and after the hidden layer (0: none)
};

/// Conv(3x3)-BatchNorm-ReLU-MaxPool twice, then Linear-ReLU-Linear: about 0.9 test accuracy on
/// Fashion-MNIST after one epoch, 0.91-0.92 after three. A `Named` "small_cnn" (every option
/// by its field name).
ModelFactory small_cnn(SmallCnnOptions options = {});

/// Options of the GPT (a decoder-only transformer, as GPT-2 and nanoGPT).
struct GptOptions {
  std::int64_t vocab = 258;        ///< tokens (text::ByteTokenizer: 256 bytes, end of text, padding)
  std::int64_t block_size = 128;   ///< the longest input: positions 0 .. block_size - 1
  std::int64_t n_layer = 4;
  std::int64_t n_head = 4;
  std::int64_t n_embd = 128;       ///< divisible by n_head
  double dropout = 0.0;            ///< on embeddings, attention weights and residual branches
  /// 0: a language model, logits [B, T, vocab] from the token embedding (weight tying: one
  /// tensor, one optimizer slot). > 0: a classifier, logits [B, classes] from the positions
  /// `pool` says, by a new `head` over the same trunk (same parameter names), so a
  /// fine-tune stage transfers the pretrained trunk (`[stages.model] carry = "transfer"`).
  std::int64_t classes = 0;
  std::int64_t pad = 257;          ///< the padding token a classifier looks past (-1: none)
  /// What a classifier's head reads: "last", the last position that is not `pad` (as GPT-2's
  /// sequence classifier), or "mean", the mean over the positions that are not `pad` (every
  /// token's contextual features; padding then changes the logits only by float rounding).
  std::string pool = "last";
};

/// Token and position embeddings, `n_layer` pre-LayerNorm blocks of causal self-attention and a
/// GELU MLP (4 x n_embd), a final LayerNorm; parameters `wte`, `wpe`, `h.<i>.ln_1`,
/// `h.<i>.attn.c_attn`, `h.<i>.attn.c_proj`, `h.<i>.ln_2`, `h.<i>.mlp.c_fc`, `h.<i>.mlp.c_proj`,
/// `ln_f` (and `head` for a classifier). Initialized as GPT-2: N(0, 0.02), residual projections
/// N(0, 0.02 / sqrt(2 n_layer)), biases 0. Inputs int64 [B, T] with T <= block_size. Because
/// attention is causal, padding after a sequence changes no logit before it. A `Named` "gpt".
ModelFactory gpt(GptOptions options = {});

}  // namespace models
}  // namespace baton
