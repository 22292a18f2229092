// Weights to and from PyTorch (include/baton/interop.hpp): export through LibTorch's own pickler
// (the format torch.load reads), import through pt_reader.cpp and the transfer every stage uses.
#include "baton/interop.hpp"

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <torch/torch.h>

#include "checkpoint_header.hpp"
#include "detail.hpp"
#include "inference/internal.hpp"
#include "interop/internal.hpp"
#include "io.hpp"
#include "weights.hpp"

namespace baton {
namespace {

/// A module tree that only holds tensors by dotted name ("features.0.weight"): the shape of a
/// state_dict, so that the stage transfer (which walks named parameters and buffers) takes it.
class TensorTree final : public torch::nn::Module {
 public:
  void put(std::string_view name, const torch::Tensor& t, bool buffer) {
    const auto dot = name.find('.');
    if (dot == std::string_view::npos) {
      if (buffer) register_buffer(std::string(name), t);
      else register_parameter(std::string(name), t, /*requires_grad=*/false);
      return;
    }
    const std::string head(name.substr(0, dot));
    auto child = children_.find(head);
    if (child == children_.end()) child = children_.emplace(head, register_module(head, std::make_shared<TensorTree>())).first;
    child->second->put(name.substr(dot + 1), t, buffer);
  }

 private:
  std::map<std::string, std::shared_ptr<TensorTree>> children_;
};

/// The names after `rename`; two names that become one are an error.
Expected<StateDict> renamed(const StateDict& tensors, const ImportOptions& o) {
  std::vector<std::pair<std::regex, std::string>> rules;
  for (const auto& [pattern, to] : o.rename) {
    try {
      rules.emplace_back(std::regex(pattern, std::regex::ECMAScript), to);
    } catch (const std::regex_error& e) {
      return fail(ErrorCode::invalid_argument, fmt::format("rename: \"{}\" is not a regular expression ({})", pattern, e.what()));
    }
  }
  StateDict out;
  std::map<std::string, std::string> seen;  // new name -> old
  for (const auto& [name, t] : tensors) {
    std::string n = name;
    for (const auto& [re, to] : rules) n = std::regex_replace(n, re, to);
    if (n.empty() || n.front() == '.' || n.back() == '.' || n.find("..") != std::string::npos)
      return fail(ErrorCode::invalid_argument, fmt::format("rename: \"{}\" became \"{}\", not a tensor name", name, n));
    if (auto [it, fresh] = seen.emplace(n, name); !fresh)
      return fail(ErrorCode::invalid_argument, fmt::format("rename: \"{}\" and \"{}\" both became \"{}\"", it->second, name, n));
    out.emplace_back(n, t);
  }
  return out;
}

/// The tensors as a module tree: parameters where `target` has a parameter of the name, in the
/// dtype and on the device of the target's tensor of that name and shape (a file of float64
/// weights does not turn a float32 model into float64).
std::shared_ptr<TensorTree> tree_of(const StateDict& tensors, const torch::nn::Module& target) {
  std::set<std::string> params;
  std::map<std::string, torch::Tensor> like;
  for (const auto& p : target.named_parameters()) params.insert(p.key()), like[p.key()] = p.value();
  for (const auto& b : target.named_buffers()) like[b.key()] = b.value();
  auto tree = std::make_shared<TensorTree>();
  for (const auto& [name, t] : tensors) {
    const auto it = like.find(name);
    const bool fits = it != like.end() && it->second.sizes() == t.sizes();
    tree->put(name, fits ? t.to(it->second.options()) : t, !params.count(name));
  }
  return tree;
}

/// With `strict`: what the transfer did not take, as one error naming every tensor.
Expected<void> check_strict(const TransferReport& r, const ImportOptions& o) {
  std::vector<std::string> problems;
  for (const auto& s : r.skipped)
    if (s.find("(initialized anew by request)") == std::string::npos) problems.push_back(s);
  std::vector<std::string> missing;
  for (const auto& name : r.initialized) {
    const bool asked = std::any_of(o.fresh.begin(), o.fresh.end(), [&](const auto& p) { return detail::matches(p, name); });
    const bool mismatched = std::any_of(r.skipped.begin(), r.skipped.end(), [&](const auto& s) { return s.rfind(name + " (shape", 0) == 0; });
    if (!asked && !mismatched) missing.push_back(name);
  }
  if (problems.empty() && missing.empty()) return {};
  std::vector<std::string> parts;
  if (!missing.empty()) parts.push_back(fmt::format("not in the file: {}", fmt::join(missing, ", ")));
  if (!problems.empty()) parts.push_back(fmt::format("not taken: {}", fmt::join(problems, ", ")));
  return fail(ErrorCode::shape_mismatch,
              fmt::format("the weights do not fit the model ({} copied); {}. Rename names (rename = [[\"^old\\\\.\", "
                          "\"new.\"]]: a list of [pattern, replacement] pairs), list new layers in fresh, or set strict "
                          "= false to take what fits",
                          r.copied.size(), fmt::join(parts, "; ")));
}
}  // namespace

Expected<StateDict> state_dict(const TrainState& state, const std::string& weights) {
  return detail::guard([&]() -> Expected<StateDict> {
    if (!state.model.module) return fail(ErrorCode::invalid_argument, "state_dict: the state has no model");
    torch::NoGradGuard no_grad;  // the EMA/SWA weights are copied into a copy of the model
    if (!weights.empty())
      return detail::with_weights(weights, state).and_then([](const TrainState& s) { return state_dict(s, ""); });
    StateDict out;
    for (auto named : {state.named_parameters(), state.named_buffers()})
      for (auto& [name, t] : named) out.emplace_back(name, t.detach().to(torch::kCPU).contiguous().clone());
    return out;
  });
}

Expected<StateDict> checkpoint_state_dict(const std::filesystem::path& path, const std::string& weights) {
  return detail::guard([&]() -> Expected<StateDict> {
    const auto entries = detail::ckpt::read_entries(path);
    std::map<std::string, torch::Tensor> kept;  // the algorithm's tensors by name
    for (const auto& e : entries)
      if (!weights.empty() && e.group == "algorithm" && e.owner == weights) kept[e.name] = e.tensor;
    if (!weights.empty() && kept.empty())
      return fail(ErrorCode::invalid_argument,
                  fmt::format("{}: weights \"{}\" requested, but the checkpoint holds none; add the algorithm \"{}\" to "
                              "the training spec and train at least one step with it", path.string(), weights, weights));
    StateDict out;
    for (const std::string group : {"parameter", "buffer"})  // as state_dict: parameters, then buffers, in module order
      for (const auto& e : entries) {
        if (e.group != group || !e.tensor.defined()) continue;
        if (weights.empty()) {
          out.emplace_back(e.name, e.tensor);
          continue;
        }
        const auto it = kept.find(e.name);
        if (it == kept.end() || !it->second.defined() || it->second.sizes() != e.tensor.sizes())
          return fail(ErrorCode::shape_mismatch, fmt::format("{}: weights \"{}\" have no tensor \"{}\" of shape {}", path.string(),
                                                             weights, e.name, detail::shape_string(e.tensor)));
        out.emplace_back(e.name, it->second.to(e.tensor.scalar_type()).contiguous());
      }
    return out;
  });
}

namespace {
/// The bytes torch.save(tensors) writes (LibTorch's pickler), with `records` (name, content)
/// added to the archive: its records are copied into a new archive, which PyTorch's readers
/// accept whatever else it holds.
Expected<std::string> pt_bytes(const StateDict& tensors, const std::vector<std::pair<std::string, std::string>>& records) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : tensors) {
    if (dict.contains(name)) return fail(ErrorCode::invalid_argument, fmt::format("save_state_dict: \"{}\" twice", name));
    dict.insert(name, t.detach().to(torch::kCPU).contiguous());
  }
  const auto plain = torch::pickle_save(c10::IValue(dict));
  if (records.empty()) return std::string(plain.data(), plain.size());
  std::istringstream in(std::string(plain.data(), plain.size()));
  caffe2::serialize::PyTorchStreamReader reader(&in);
  std::string out;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, std::size_t n) {
      out.append(static_cast<const char*>(p), n);
      return n;
    });
    writer.setMinVersion(reader.version());
    for (const auto& name : reader.getAllRecords()) {
      if (name == "version") continue;  // the writer writes its own
      auto [data, size] = reader.getRecord(name);
      writer.writeRecord(name, data.get(), size);
    }
    for (const auto& [name, content] : records) writer.writeRecord(name, content.data(), content.size());
    writer.writeEndOfFile();
  }
  return out;
}
}  // namespace

Expected<void> save_state_dict(const StateDict& tensors, const std::filesystem::path& path) {
  return detail::guard([&]() -> Expected<void> {
    return pt_bytes(tensors, {}).and_then([&](const std::string& bytes) {
      return detail::write_file_atomic(path, bytes, "state_dict");
    });
  });
}

Expected<void> save_for_inference(const TrainState& state, const ModelCard& card, const std::filesystem::path& path) {
  return detail::guard([&]() -> Expected<void> {
    // The card as load_for_inference will read it: written once, checked by reading it back.
    const auto card_json = detail::card_to_json(card);
    if (auto checked = detail::card_from_json(card_json, "save_for_inference"); !checked)
      return tl::unexpected(checked.error());
    auto tensors = state_dict(state, card.weights);
    if (!tensors) return tl::unexpected(tensors.error());
    // The card must describe this model: a sample of its shape goes through the model as
    // load_for_inference will build it, and the outputs are one per class name.
    auto predictor = detail::make_predictor(card, state.factory, *tensors, c10::Device(c10::kCPU));
    if (!predictor) return tl::unexpected(predictor.error().with_context("save_for_inference"));
    std::vector<std::int64_t> one = {1};
    one.insert(one.end(), card.input_shape.begin(), card.input_shape.end());
    auto out = predictor->logits(torch::zeros(one, card.input == InputKind::tokens ? torch::kLong : torch::kFloat32));
    if (!out)
      return fail(ErrorCode::shape_mismatch, fmt::format("save_for_inference: input_shape [{}] does not fit the model: {}",
                                                         fmt::join(card.input_shape, ", "), out.error().message));
    if (!card.classes.empty() && out->size(1) != static_cast<std::int64_t>(card.classes.size()))
      return fail(ErrorCode::shape_mismatch, fmt::format("save_for_inference: {} class names for a model of {} outputs",
                                                         card.classes.size(), out->size(1)));
    std::vector<std::pair<std::string, std::string>> records = {{detail::kCardRecord, card_json}};
    if (!card.tokenizer_model.empty()) records.emplace_back(detail::kTokenizerRecord, card.tokenizer_model);
    return pt_bytes(*tensors, records).and_then([&](const std::string& bytes) {
      return detail::write_file_atomic(path, bytes, "inference artifact");
    });
  });
}

Expected<Predictor> predictor(const TrainState& state, const ModelCard& card, c10::Device device) {
  auto tensors = state_dict(state, card.weights);
  if (!tensors) return tl::unexpected(tensors.error());
  return detail::make_predictor(card, state.factory, *tensors, device);
}

Expected<StateDict> read_state_dict(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    return fail(ErrorCode::io, fmt::format("{}: no such file (a state_dict saved with torch.save)", path.string()));
  return detail::read_torch_save(path);
}

Expected<TrainState> imported_state(const StateDict& tensors, const ModelFactory& target, const ImportOptions& options) {
  return detail::guard([&]() -> Expected<TrainState> {
    auto names = renamed(tensors, options);
    if (!names) return tl::unexpected(names.error());
    const Model probe = detail::build_model(target, 0, "import");
    TrainState s;
    s.model.module = tree_of(*names, *probe.module);
    s.model.forward = [](const torch::Tensor&) -> torch::Tensor {
      throw detail::BatonException(Error{ErrorCode::invalid_argument, "an imported state_dict has no forward: use it as a transfer source", {}});
    };
    return s;
  });
}

Expected<std::pair<TrainState, TransferReport>> load_weights(TrainState state, const StateDict& tensors,
                                                             const ImportOptions& options) {
  return detail::guard([&]() -> Expected<std::pair<TrainState, TransferReport>> {
    if (!state.model.module) return fail(ErrorCode::invalid_argument, "load_weights: the state has no model");
    auto names = renamed(tensors, options);
    if (!names) return tl::unexpected(names.error());
    const auto source = tree_of(*names, *state.model.module);
    std::vector<std::string> copied;
    TransferReport report = detail::transfer_weights(*source, *state.model.module, options.fresh, &copied);
    if (options.strict)
      if (auto ok = check_strict(report, options); !ok) return tl::unexpected(ok.error());
    for (const auto& name : copied) state.optimizer.params.erase(name);  // moments of other weights
    return std::pair{std::move(state), std::move(report)};
  });
}

}  // namespace baton
