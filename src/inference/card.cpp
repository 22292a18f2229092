// The model card of an inference artifact as JSON (record baton/card.json), checked on reading:
// the card comes from a file, so every field is checked for its type and range.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "detail.hpp"
#include "inference/internal.hpp"

namespace baton::detail {
namespace {
using json = nlohmann::json;
constexpr int kCardVersion = 1;

json params_json(const Params& params) {
  json out = json::object();
  for (const auto& [key, value] : params) std::visit([&, &key = key](const auto& v) { out[key] = v; }, value);
  return out;
}

Params params_of(const json& j) {
  Params out;
  for (const auto& [key, v] : j.items()) {
    if (v.is_boolean()) out[key] = v.get<bool>();
    else if (v.is_number()) out[key] = v.get<double>();
    else if (v.is_string()) out[key] = v.get<std::string>();
    else if (v.is_array() && !v.empty() && v.front().is_string()) out[key] = v.get<std::vector<std::string>>();
    else if (v.is_array()) out[key] = v.get<std::vector<double>>();
    else raise(ErrorCode::data, fmt::format("model option \"{}\" is {}, not a number, flag, text or list", key, v.type_name()));
  }
  return out;
}
}  // namespace

std::string card_to_json(const ModelCard& c) {
  json j = {{"format", "baton-model-card"},
            {"version", kCardVersion},
            {"model", c.model},
            {"options", params_json(c.options)},
            {"input", c.input == InputKind::image ? "image" : c.input == InputKind::tokens ? "tokens" : "features"},
            {"input_shape", c.input_shape},
            {"normalize", c.normalize},
            {"mean", c.mean},
            {"std", c.std},
            {"resize", c.resize},
            {"columns", c.columns},
            {"classes", c.classes},
            {"tokenizer", c.tokenizer},
            {"weights", c.weights},
            {"origin", c.origin}};
  return j.dump(2) + "\n";
}

Expected<ModelCard> card_from_json(std::string_view text, const std::string& where) {
  return guard([&]() -> Expected<ModelCard> {
    try {
      const json j = json::parse(text);
      if (j.value("format", "") != "baton-model-card")
        return fail(ErrorCode::data, fmt::format("{}: {} is not a baton model card", where, kCardRecord));
      if (const int v = j.at("version").get<int>(); v != kCardVersion)
        return fail(ErrorCode::data, fmt::format("{}: model card version {}; this baton reads version {}", where, v, kCardVersion));
      ModelCard c;
      c.model = j.at("model").get<std::string>();
      c.options = params_of(j.at("options"));
      const auto input = j.at("input").get<std::string>();
      if (input != "image" && input != "features" && input != "tokens")
        return fail(ErrorCode::data, fmt::format("{}: input \"{}\": expected \"image\", \"features\" or \"tokens\"", where, input));
      c.input = input == "image" ? InputKind::image : input == "tokens" ? InputKind::tokens : InputKind::features;
      c.input_shape = j.at("input_shape").get<std::vector<std::int64_t>>();
      double elements = 1;
      for (const auto d : c.input_shape) elements *= static_cast<double>(d);
      if (c.input_shape.empty() || c.input_shape.size() > 8 ||
          std::any_of(c.input_shape.begin(), c.input_shape.end(), [](auto d) { return d < 1; }) || elements > 1 << 30)
        return fail(ErrorCode::data, fmt::format("{}: input_shape [{}] is not the shape of a sample", where,
                                                 fmt::join(c.input_shape, ", ")));
      if (c.input == InputKind::image && c.input_shape.size() != 3)
        return fail(ErrorCode::data, fmt::format("{}: an image input needs input_shape [channels, height, width]", where));
      c.normalize = j.at("normalize").get<bool>();
      c.mean = j.at("mean").get<double>();
      c.std = j.at("std").get<double>();
      c.resize = j.value("resize", false);  // cards before resizing have none
      if (!std::isfinite(c.mean) || !std::isfinite(c.std) || c.std == 0)
        return fail(ErrorCode::data, fmt::format("{}: mean {} and std {} cannot normalize", where, c.mean, c.std));
      c.columns = j.at("columns").get<std::vector<std::string>>();
      c.classes = j.at("classes").get<std::vector<std::string>>();
      c.tokenizer = j.value("tokenizer", "");  // cards before text inputs have none
      if (c.input == InputKind::tokens && (c.input_shape.size() != 1 || c.tokenizer.empty()))
        return fail(ErrorCode::data, fmt::format("{}: a tokens input needs input_shape [positions] and a tokenizer", where));
      c.weights = j.at("weights").get<std::string>();
      c.origin = j.at("origin").get<std::string>();
      return c;
    } catch (const json::exception& e) {
      return fail(ErrorCode::data, fmt::format("{}: the model card ({}) is damaged: {}", where, kCardRecord, e.what()));
    }
  });
}

}  // namespace baton::detail
