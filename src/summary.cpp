// Model summary (summary.hpp): one forward pass of a zero sample through a copy of the model,
// module by module for a Sequential, with parameter counts and FLOPs by layer type.
#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/torch.h>

#include "baton/summary.hpp"
#include "detail.hpp"
#include "weights.hpp"

namespace baton {
namespace {

/// "torch::nn::Conv2dImpl" -> "Conv2d"; a user's "MyNetImpl" -> "MyNet".
std::string type_of(const torch::nn::Module& m) {
  std::string n = m.name();
  if (const auto colon = n.rfind("::"); colon != std::string::npos) n = n.substr(colon + 2);
  if (n.size() > 4 && n.compare(n.size() - 4, 4, "Impl") == 0) n.resize(n.size() - 4);
  return n;
}

std::int64_t elements(const std::vector<torch::Tensor>& ts) {
  std::int64_t n = 0;
  for (const auto& t : ts) n += t.numel();
  return n;
}

std::int64_t numel(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

/// FLOPs of one sample through `m`, whose output (per sample) is `out`; nullopt for a type whose
/// count is not known. Parameter-free shape and selection layers count 0.
std::optional<double> flops_of(torch::nn::Module& m, const std::vector<std::int64_t>& out) {
  const double positions = static_cast<double>(numel(out));
  if (auto* c = dynamic_cast<torch::nn::Conv2dImpl*>(&m)) {
    const auto& o = c->options;
    const double per = 2.0 * static_cast<double>(o.in_channels() / o.groups()) * static_cast<double>((*o.kernel_size())[0] * (*o.kernel_size())[1]);
    return positions * per + (o.bias() ? positions : 0.0);
  }
  if (auto* c = dynamic_cast<torch::nn::Conv1dImpl*>(&m)) {
    const auto& o = c->options;
    const double per = 2.0 * static_cast<double>(o.in_channels() / o.groups()) * static_cast<double>((*o.kernel_size())[0]);
    return positions * per + (o.bias() ? positions : 0.0);
  }
  if (auto* l = dynamic_cast<torch::nn::LinearImpl*>(&m)) {
    const auto& o = l->options;
    return positions * (2.0 * static_cast<double>(o.in_features())) + (o.bias() ? positions : 0.0);
  }
  if (dynamic_cast<torch::nn::BatchNorm1dImpl*>(&m) || dynamic_cast<torch::nn::BatchNorm2dImpl*>(&m)) return 2.0 * positions;
  const std::string t = type_of(m);
  if (t == "ReLU") return positions;
  if (t == "Flatten" || t == "Dropout" || t == "Dropout2d" || t == "Identity" || t == "MaxPool2d" || t == "MaxPool1d")
    return 0.0;  // a comparison per input element at most: not counted
  return std::nullopt;
}

std::vector<std::int64_t> per_sample(const torch::Tensor& t) {
  if (t.dim() == 0) return {};
  auto s = t.sizes().vec();
  s.erase(s.begin());
  return s;
}

std::string grouped(std::int64_t n) {
  std::string digits = std::to_string(n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0 && digits[i - 1] != '-') out += ',';
    out += digits[i];
  }
  return out;
}

std::string shape_text(const std::vector<std::int64_t>& s) { return s.empty() ? "-" : fmt::format("[{}]", fmt::join(s, ", ")); }

Expected<torch::Tensor> forward(const std::string& what, const std::function<torch::Tensor()>& f, const torch::Tensor& x) {
  try {
    return f();
  } catch (const c10::Error& e) {
    return fail(ErrorCode::shape_mismatch, fmt::format("summary: {} failed on inputs of shape {} (a batch of one sample): {}",
                                                       what, detail::shape_string(x), detail::torch_message(e)));
  }
}

/// Rows of a Sequential, each module's forward on the output of the one before.
Expected<torch::Tensor> sequential_rows(torch::nn::SequentialImpl& seq, torch::Tensor x, ModelSummary& s) {
  const auto names = seq.named_children();
  std::size_t i = 0;
  bool known = true;
  for (auto it = seq.begin(); it != seq.end(); ++it, ++i) {
    auto& module = *seq.ptr(i);
    auto y = forward(fmt::format("module {} ({})", names[i].key(), type_of(module)), [&] { return it->forward(x); }, x);
    if (!y) return y;
    x = *y;
    ModelSummary::Row row{names[i].key(), type_of(module), per_sample(x), elements(module.parameters()), {}};
    row.flops = flops_of(module, row.output);
    if (!row.flops && row.params > 0) known = false;
    s.rows.push_back(std::move(row));
  }
  if (known) {
    double total = 0;
    for (const auto& r : s.rows) total += r.flops.value_or(0.0);
    s.flops = total;
  }
  return x;
}
}  // namespace

Expected<ModelSummary> summarize(const TrainState& state, const std::vector<std::int64_t>& sample,
                                 const std::vector<TrainingSpec>& stages, std::optional<c10::ScalarType> dtype) {
  return detail::guard([&]() -> Expected<ModelSummary> {
    if (!state.model.module) return fail(ErrorCode::invalid_argument, "summary: the state has no model");
    TrainState copy = state;  // a forward pass changes nothing of the caller's, even in eval mode
    auto& m = *copy.model.module;
    m.eval();
    torch::NoGradGuard no_grad;
    ModelSummary s;
    s.input = sample;
    const auto params = m.parameters(), buffers = m.buffers();
    s.params = elements(params);
    s.buffer_elements = elements(buffers);
    double bytes = 0;
    for (const auto& t : params) bytes += static_cast<double>(t.numel() * static_cast<std::int64_t>(t.element_size()));
    for (const auto& t : buffers) bytes += static_cast<double>(t.numel() * static_cast<std::int64_t>(t.element_size()));
    s.megabytes = bytes / 1e6;
    std::vector<std::int64_t> shape{1};
    shape.insert(shape.end(), sample.begin(), sample.end());
    const auto options = torch::TensorOptions().dtype(dtype ? *dtype : params.empty() ? torch::kFloat : params.front().scalar_type())
                             .device(params.empty() ? c10::Device(c10::kCPU) : params.front().device());
    const auto x = torch::zeros(shape, options);
    Expected<torch::Tensor> out = x;
    if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&m)) {
      out = sequential_rows(*seq, x, s);
    } else {
      for (const auto& child : m.named_children())
        s.rows.push_back({child.key(), type_of(*child.value()), {}, elements(child.value()->parameters()), std::nullopt});
      out = forward("the model's forward", [&] { return copy.model.forward(x); }, x);
    }
    if (!out) return tl::unexpected(out.error());
    s.output = per_sample(*out);
    // A stage that builds a model of its own (a new head) counts that model's parameters.
    std::map<const ModelFactory*, Model> own;
    for (std::size_t i = 0; i < stages.size(); ++i) {
      const auto& spec = stages[i];
      const ModelFactory& f = detail::factory_after(stages, i, state.factory);
      const torch::nn::Module* model = &m;
      if (&f != &state.factory) {
        auto it = own.find(&f);
        if (it == own.end()) it = own.emplace(&f, detail::build_model(f, state.seed, spec.name)).first;
        model = it->second.module.get();
      }
      ModelSummary::Stage st{spec.name, 0, 0};
      for (const auto& p : model->named_parameters()) {
        const bool frozen = !p.value().requires_grad() ||
                            std::any_of(spec.freeze.begin(), spec.freeze.end(), [&](const auto& f) { return detail::matches(f, p.key()); });
        (frozen ? st.frozen : st.trainable) += p.value().numel();
      }
      s.stages.push_back(std::move(st));
    }
    return s;
  });
}

std::string ModelSummary::to_string() const {
  std::string out = fmt::format("model: {} parameters ({:.2f} MB with buffers), {} per sample; input {} -> output {}\n",
                                grouped(params), megabytes,
                                flops ? fmt::format("{:.2f} MFLOPs", *flops / 1e6) : std::string("FLOPs not known"),
                                shape_text(input), shape_text(output));
  out += fmt::format("  {:<10} {:<14} {:<16} {:>12} {:>9}\n", "module", "type", "output", "params", "MFLOPs");
  for (const auto& r : rows)
    out += fmt::format("  {:<10} {:<14} {:<16} {:>12} {:>9}\n", r.name, r.type, shape_text(r.output), grouped(r.params),
                       r.flops ? fmt::format("{:.3f}", *r.flops / 1e6) : std::string("-"));
  // Stages with the same counts share a line.
  std::vector<std::pair<std::pair<std::int64_t, std::int64_t>, std::vector<std::string>>> lines;
  for (const auto& st : stages) {
    const auto counts = std::make_pair(st.trainable, st.frozen);
    auto it = std::find_if(lines.begin(), lines.end(), [&](const auto& l) { return l.first == counts; });
    if (it == lines.end()) it = lines.insert(lines.end(), {counts, {}});
    it->second.push_back(fmt::format("\"{}\"", st.name));
  }
  for (const auto& [counts, names] : lines)
    out += fmt::format("  stage{} {}: {} trainable, {} frozen\n", names.size() == 1 ? "" : "s", fmt::join(names, ", "),
                       grouped(counts.first), grouped(counts.second));
  return out;
}

}  // namespace baton
