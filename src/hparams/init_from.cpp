// [model] init_from: the run starts from weights in a state_dict file (Python's torch.save, or
// `baton export`) or in a baton checkpoint of any run directory, taken by name and shape as a
// transfer takes them (docs/interop.md).
#include <array>
#include <fstream>

#include "internal.hpp"

namespace baton::detail {

std::optional<InitFrom> read_init_from(const Document& doc, Problems& p) {
  const auto* model = doc.root["model"].as_table();
  const toml::node* n = model ? model->get("init_from") : nullptr;
  if (!n) return std::nullopt;
  Reader r{p, "model.init_from"};
  InitFrom from;
  from.at = n;
  const toml::node* path = n;
  if (const auto* t = n->as_table()) {
    check_keys(*t, {"path", "rename", "fresh", "strict", "weights"}, "model.init_from", p);
    path = t->get("path");
    if (!path) p.add(n, "model.init_from.path: required, the state_dict file (e.g. \"resnet.pt\")");
    if (const auto* rename = t->get("rename")) {
      const auto* rules = rename->as_array();
      if (!rules) p.add(rename, "model.init_from.rename: expected a list of [pattern, replacement] pairs, e.g. [[\"^module\\\\.\", \"\"]]");
      for (std::size_t i = 0; rules && i < rules->size(); ++i) {
        const auto* pair = rules->get(i)->as_array();
        const auto a = pair && pair->size() == 2 ? pair->get(0)->value<std::string>() : std::nullopt;
        const auto b = pair && pair->size() == 2 ? pair->get(1)->value<std::string>() : std::nullopt;
        if (a && b) from.options.rename.emplace_back(*a, *b);
        else p.add(rules->get(i), "model.init_from.rename: each rule is a [pattern, replacement] pair of strings");
      }
    }
    if (auto f = r.strings(t->get("fresh"), ".fresh")) from.options.fresh = *f;
    if (auto s = r.boolean(t->get("strict"), ".strict")) from.options.strict = *s;
    if (const auto* w = t->get("weights")) {
      const auto name = w->value<std::string>();
      if (name && (*name == "ema" || *name == "swa")) from.weights = *name;
      else p.add(w, "model.init_from.weights: expected \"ema\" or \"swa\" (the weights that algorithm kept in the checkpoint); "
                    "leave it out for the model's own");
    }
  }
  if (path) {
    if (auto s = path->value<std::string>()) {
      from.path = *s;
      if (from.path.is_relative() && !doc.base_dir.empty()) from.path = doc.base_dir / from.path;  // as data paths
    } else {
      p.add(path, "model.init_from: expected a file name or a table { path, rename, fresh, strict, weights }");
    }
  }
  return from;
}

Expected<StateDict> read_init_weights(const InitFrom& from) {
  std::array<char, 8> magic{};
  std::ifstream(from.path, std::ios::binary).read(magic.data(), magic.size());
  if (std::string_view(magic.data(), magic.size()) == "BATONCKP") return checkpoint_state_dict(from.path, from.weights);
  if (!from.weights.empty())
    return fail(ErrorCode::invalid_argument,
                fmt::format("{}: weights = \"{}\" picks an algorithm's weights from a baton checkpoint, and this is not "
                            "one (a state_dict file holds one set of weights)", from.path.string(), from.weights));
  return read_state_dict(from.path);
}

}  // namespace baton::detail
