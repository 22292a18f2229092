// The models a curriculum names: the run's [model], and a stage's own model (`model = { carry =
// "transfer", classes = 5 }`, or a [stages.model] table), and which of them a state has after a
// given stage. One reading serves SpecBuilder::build (the stage's factory), the tools
// (Curriculum::model(stage), model_card) and validation.
#include "suggest.hpp"
#include "internal.hpp"

namespace baton::detail {

namespace {
/// Keys of a stage's model table that say how the weights carry over, not what the model is.
const std::vector<std::string> kCarryKeys = {"carry", "fresh"};

bool names_a_model(const toml::table& t) {
  for (const auto& [key, node] : t)
    if (!contains(kCarryKeys, std::string(key.str()))) return true;
  return false;
}
}  // namespace

std::optional<ModelTable> run_model_table(const Document& doc, Problems& p) {
  const auto* t = doc.root["model"].as_table();
  if (!t) return std::nullopt;
  ModelTable m;
  m.name = (*t)["name"].value<std::string>().value_or("");
  m.params = to_params(*t, {"name", "init_from"}, "model", p);
  m.at = t;
  m.where = "model";
  return m;
}

std::optional<ModelTable> stage_model_table(const Document& doc, const toml::node* model, const std::string& stage,
                                            Problems& p) {
  const auto* t = model ? model->as_table() : nullptr;
  if (!t || !names_a_model(*t)) return std::nullopt;
  const std::string where = fmt::format("stage \"{}\": model", stage);
  const auto run = run_model_table(doc, p);
  ModelTable m;
  m.at = t;
  m.where = where;
  if (const auto* n = t->get("name")) {
    if (!n->is_string()) {
      p.add(n, fmt::format("{}.name: expected a string, got {}", where, type_name(*n)));
      return std::nullopt;
    }
    m.name = *n->value<std::string>();
  } else if (run && !run->name.empty()) {
    m.name = run->name;
  } else {
    p.add(t, fmt::format("{}: its keys need name = \"...\" (the model they belong to): the file has no [model] name to "
                         "take it from", where));
    return std::nullopt;
  }
  const auto entry = doc.registry.models.find(m.name);
  if (entry == doc.registry.models.end()) {
    std::vector<std::string> names;
    for (const auto& [k, v] : doc.registry.models) names.push_back(k);
    p.add(t->get("name") ? t->get("name") : t, fmt::format("{}.name: unknown model \"{}\"{}; models: {}", where, m.name,
                                                          did_you_mean(m.name, names), fmt::join(names, ", ")));
    return std::nullopt;
  }
  auto keys = entry->second.keys;
  keys.insert(keys.begin(), {"name", "carry", "fresh"});
  check_keys(*t, keys, where, p);
  // The same model as [model]: its keys, with the stage's over them (`classes = 5` is a new head).
  if (run && run->name == m.name) m.params = run->params;
  for (auto& [k, v] : to_params(*t, {"name", "carry", "fresh"}, where, p)) m.params[k] = v;
  return m;
}

Expected<ModelFactory> make_model(const Document& doc, const ModelTable& m) {
  const auto it = doc.registry.models.find(m.name);
  if (it == doc.registry.models.end())
    return fail(ErrorCode::invalid_spec, fmt::format("{}: {}: unknown model \"{}\"", doc.source, m.where, m.name));
  return it->second.make(m.params);
}

}  // namespace baton::detail
