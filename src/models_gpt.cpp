// The GPT of models::gpt (model.hpp): nanoGPT's shape in LibTorch's C++ frontend.
#include <cmath>

#include <torch/torch.h>

#include "baton/model.hpp"

namespace baton::models {
namespace {
namespace nn = torch::nn;

struct AttentionImpl : nn::Module {
  AttentionImpl(const GptOptions& o) : heads(o.n_head), p(o.dropout) {
    c_attn = register_module("c_attn", nn::Linear(o.n_embd, 3 * o.n_embd));
    c_proj = register_module("c_proj", nn::Linear(o.n_embd, o.n_embd));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2), hd = C / heads;
    auto qkv = c_attn(x).split(C, 2);
    auto shape = [&](const torch::Tensor& t) { return t.view({B, T, heads, hd}).transpose(1, 2); };
    const auto q = shape(qkv[0]), k = shape(qkv[1]), v = shape(qkv[2]);
    auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    // Causal: position t attends to positions <= t only (what makes padding after a text inert).
    const auto future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    // Softmax in float32 under bf16/fp16 autocast too (LibTorch's CPU autocast leaves it in the low
    // precision); the matmul with v casts back. In fp32 the same kernel as before.
    att = torch::softmax(att.masked_fill(future, -std::numeric_limits<float>::infinity()), -1, torch::kFloat);
    if (p > 0) att = nn::functional::dropout(att, nn::functional::DropoutFuncOptions().p(p).training(is_training()));
    const auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
    return c_proj(y);
  }
  std::int64_t heads;
  double p;
  nn::Linear c_attn{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(Attention);

struct MlpImpl : nn::Module {
  MlpImpl(const GptOptions& o) {
    c_fc = register_module("c_fc", nn::Linear(o.n_embd, 4 * o.n_embd));
    c_proj = register_module("c_proj", nn::Linear(4 * o.n_embd, o.n_embd));
  }
  torch::Tensor forward(const torch::Tensor& x) { return c_proj(torch::gelu(c_fc(x))); }
  nn::Linear c_fc{nullptr}, c_proj{nullptr};
};
TORCH_MODULE(Mlp);

struct BlockImpl : nn::Module {
  BlockImpl(const GptOptions& o) : p(o.dropout) {
    ln_1 = register_module("ln_1", nn::LayerNorm(nn::LayerNormOptions({o.n_embd})));
    attn = register_module("attn", Attention(o));
    ln_2 = register_module("ln_2", nn::LayerNorm(nn::LayerNormOptions({o.n_embd})));
    mlp = register_module("mlp", Mlp(o));
  }
  torch::Tensor drop(const torch::Tensor& x) {
    return p > 0 ? nn::functional::dropout(x, nn::functional::DropoutFuncOptions().p(p).training(is_training())) : x;
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + drop(attn(ln_1(x)));
    return x + drop(mlp(ln_2(x)));
  }
  double p;
  nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

struct GptImpl : nn::Module {
  explicit GptImpl(const GptOptions& o) : o(o) {
    wte = register_module("wte", nn::Embedding(o.vocab, o.n_embd));
    wpe = register_module("wpe", nn::Embedding(o.block_size, o.n_embd));
    h = register_module("h", nn::ModuleList());
    for (std::int64_t i = 0; i < o.n_layer; ++i) h->push_back(Block(o));
    ln_f = register_module("ln_f", nn::LayerNorm(nn::LayerNormOptions({o.n_embd})));
    if (o.classes > 0) head = register_module("head", nn::Linear(o.n_embd, o.classes));
    torch::NoGradGuard no_grad;
    const double residual = 0.02 / std::sqrt(2.0 * static_cast<double>(o.n_layer));
    for (auto& item : named_parameters()) {
      const std::string& name = item.key();
      auto& t = item.value();
      const bool bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
      if (name.find(".ln_") != std::string::npos || name.rfind("ln_f.", 0) == 0) continue;  // LayerNorm: 1 and 0
      if (bias) t.zero_();
      else if (name.find("c_proj.weight") != std::string::npos) t.normal_(0.0, residual);
      else t.normal_(0.0, 0.02);
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kLong,
                "gpt needs int64 token ids [batch, positions], got ", x.sizes(), " ", x.scalar_type());
    const auto T = x.size(1);
    TORCH_CHECK(T >= 1 && T <= o.block_size, "gpt: ", T, " positions is more than block_size ", o.block_size);
    const auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(x.device()));
    auto y = embed(x) + wpe(pos).unsqueeze(0);
    if (o.dropout > 0) y = nn::functional::dropout(y, nn::functional::DropoutFuncOptions().p(o.dropout).training(is_training()));
    for (const auto& block : *h) y = block->as<Block>()->forward(y);
    y = ln_f(y);
    if (o.classes == 0) return torch::matmul(y, wte->weight.t());  // tied: the embedding reads out
    if (o.pool == "mean") {  // over the positions that are not padding (none: zeros)
      if (o.pad < 0) return head(y.mean(1));
      const auto keep = x.ne(o.pad).unsqueeze(2).to(y.scalar_type());
      return head((y * keep).sum(1) / keep.sum(1).clamp_min(1.0));
    }
    // The last position that is not padding (position 0 for a sequence of padding only).
    const auto positions = pos.unsqueeze(0).expand_as(x);
    const auto last = o.pad < 0 ? torch::full({x.size(0)}, T - 1, positions.options())
                                : positions.masked_fill(x.eq(o.pad), 0).amax(1);
    const auto at = last.view({-1, 1, 1}).expand({x.size(0), 1, y.size(2)});
    return head(y.gather(1, at).squeeze(1));
  }

  /// The token embeddings of `x`, an id outside the vocabulary a clear error. On the CPU the
  /// embedding checks its indices itself, and its error is translated (no extra pass over the
  /// ids); on an accelerator a bad id would be a device-side assert, so the ids are checked first
  /// (one reduction and sync).
  torch::Tensor embed(const torch::Tensor& x) {
    auto range_error = [&] {
      const auto [lo, hi] = torch::aminmax(x);
      return c10::str("gpt: token ids must be in [0, ", o.vocab, "), got ", lo.item<std::int64_t>(), " to ",
                      hi.item<std::int64_t>(), "; does the tokenizer match the model?");
    };
    if (!x.is_cpu()) {
      const auto [lo, hi] = torch::aminmax(x);
      TORCH_CHECK(lo.item<std::int64_t>() >= 0 && hi.item<std::int64_t>() < o.vocab, range_error());
      return wte(x);
    }
    try {
      return wte(x);
    } catch (const c10::IndexError&) {
      TORCH_CHECK(false, range_error());
    }
  }

  GptOptions o;
  nn::Embedding wte{nullptr}, wpe{nullptr};
  nn::ModuleList h{nullptr};
  nn::LayerNorm ln_f{nullptr};
  nn::Linear head{nullptr};
};
TORCH_MODULE(Gpt);
}  // namespace

ModelFactory gpt(GptOptions o) {
  // The keys Registry::builtin's "gpt" reads (src/hparams/registry.cpp).
  auto whole = [](std::int64_t v) { return static_cast<double>(v); };
  Params params = {{"vocab", whole(o.vocab)},     {"block_size", whole(o.block_size)}, {"n_layer", whole(o.n_layer)},
                         {"n_head", whole(o.n_head)},   {"n_embd", whole(o.n_embd)},         {"dropout", o.dropout},
                         {"classes", whole(o.classes)}, {"pad", whole(o.pad)}};
  // Only where it differs from the default, so that the classifiers of earlier versions (all
  // "last") keep their fingerprints and cards.
  if (o.pool != "last") params["pool"] = o.pool;
  return named("gpt", params, model_factory([o] { return Gpt(o); }));
}

}  // namespace baton::models
