// TOML plumbing of the curriculum reader: problems placed at file:line:column, typed reads of
// single values, TOML values as by-name parameters, and `--set path=value` overrides.
#include <algorithm>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <sstream>

#include "suggest.hpp"
#include "internal.hpp"

namespace baton::detail {

bool contains(const std::vector<std::string>& v, std::string_view s) { return std::find(v.begin(), v.end(), s) != v.end(); }

// ---------------------------------------------------------------- problems
void Problems::add(const toml::node* at, const std::string& message) {
  if (at != nullptr && at->source().begin)
    list.push_back(fmt::format("{}:{}:{}: {}", source, at->source().begin.line, at->source().begin.column, message));
  else if (at != nullptr)
    list.push_back(fmt::format("{} (from --set or set()): {}", source, message));
  else
    list.push_back(fmt::format("{}: {}", source, message));
}

Error Problems::error() const {
  return Error{ErrorCode::invalid_spec,
               fmt::format("{} problem{}:\n  {}", list.size(), list.size() == 1 ? "" : "s", fmt::join(list, "\n  ")), {}};
}

std::vector<std::string> problem_lines(const Error& e) {
  std::vector<std::string> out;
  std::stringstream ss(e.message);
  std::string line;
  std::getline(ss, line);
  if (line.find("problem") != std::string::npos && line.back() == ':') {
    while (std::getline(ss, line)) out.push_back(line.substr(line.find_first_not_of(' ')));
  } else {
    out.push_back(e.context.empty() ? e.message : e.to_string());
  }
  return out;
}

void add_unique(std::vector<std::string>& list, const std::vector<std::string>& lines) {
  for (const auto& l : lines)
    if (std::find(list.begin(), list.end(), l) == list.end()) list.push_back(l);
}

void check_keys(const toml::table& t, const std::vector<std::string>& known, const std::string& path, Problems& p) {
  for (auto&& [key, value] : t) {
    const std::string k(key.str());
    if (contains(known, k)) continue;
    p.add(&value, fmt::format("{}: unknown key \"{}\"{}; valid keys: {}", path, k, did_you_mean(k, known),
                              fmt::join(known, ", ")));
  }
}

// ---------------------------------------------------------------- values
std::string type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    default: return "a date/time";
  }
}

std::optional<ParamValue> to_param(const toml::node& n) {
  // is_integer first: toml++'s value<int64_t>() converts a float node with an unchecked cast (UB for 2e44).
  if (n.is_integer()) return static_cast<double>(*n.value<std::int64_t>());
  if (n.is_floating_point()) return *n.value<double>();
  if (n.is_boolean()) return *n.value<bool>();
  if (n.is_string()) return *n.value<std::string>();
  if (const auto* a = n.as_array()) {
    if (a->empty()) return std::vector<std::string>{};
    if (a->is_homogeneous(toml::node_type::string)) {
      std::vector<std::string> out;
      for (const auto& e : *a) out.push_back(*e.value<std::string>());
      return out;
    }
    std::vector<double> out;
    for (const auto& e : *a) {
      if (!e.is_number()) return std::nullopt;
      out.push_back(*e.value<double>());
    }
    return out;
  }
  return std::nullopt;
}

Params to_params(const toml::table& t, const std::vector<std::string>& skip, const std::string& path, Problems& p) {
  Params out;
  for (auto&& [key, value] : t) {
    const std::string k(key.str());
    if (contains(skip, k)) continue;
    if (auto v = to_param(value)) out[k] = *v;
    else p.add(&value, fmt::format("{}.{}: {} is not allowed here", path, k, type_name(value)));
  }
  return out;
}

// ---------------------------------------------------------------- Reader
std::optional<std::string> Reader::string(const toml::node* n, const std::string& key) {
  if (!n) return std::nullopt;
  if (auto v = n->value<std::string>(); v && n->is_string()) return *v;
  p.add(n, fmt::format("{}{}: expected a string, got {}", path, key, type_name(*n)));
  return std::nullopt;
}

std::optional<std::int64_t> Reader::integer(const toml::node* n, const std::string& key, std::int64_t min) {
  if (!n) return std::nullopt;
  if (!n->is_integer()) {
    p.add(n, fmt::format("{}{}: expected an integer, got {}", path, key, type_name(*n)));
    return std::nullopt;
  }
  const auto v = *n->value<std::int64_t>();
  if (v < min) {
    p.add(n, fmt::format("{}{}: must be >= {}, got {}", path, key, min, v));
    return std::nullopt;
  }
  return v;
}

std::optional<double> Reader::number(const toml::node* n, const std::string& key) {
  if (!n) return std::nullopt;
  if (!n->is_number()) {
    p.add(n, fmt::format("{}{}: expected a number, got {}", path, key, type_name(*n)));
    return std::nullopt;
  }
  return *n->value<double>();
}

std::optional<bool> Reader::boolean(const toml::node* n, const std::string& key) {
  if (!n) return std::nullopt;
  if (!n->is_boolean()) {
    p.add(n, fmt::format("{}{}: expected true or false, got {}", path, key, type_name(*n)));
    return std::nullopt;
  }
  return *n->value<bool>();
}

std::optional<Time> Reader::time(const toml::node* n, const std::string& key) {
  auto s = string(n, key);
  if (!s) return std::nullopt;
  auto t = Time::parse(*s);
  if (!t) {
    p.add(n, fmt::format("{}{}: {}", path, key, t.error().message));
    return std::nullopt;
  }
  return *t;
}

std::optional<std::vector<std::string>> Reader::strings(const toml::node* n, const std::string& key) {
  if (!n) return std::nullopt;
  const auto* a = n->as_array();
  if (!a || !(a->empty() || a->is_homogeneous(toml::node_type::string))) {
    p.add(n, fmt::format("{}{}: expected an array of strings", path, key));
    return std::nullopt;
  }
  std::vector<std::string> out;
  for (const auto& e : *a) out.push_back(*e.value<std::string>());
  return out;
}

// ---------------------------------------------------------------- overrides
std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string part; std::getline(ss, part, '.');) parts.push_back(part);
  return parts;
}

bool insert_at(toml::table& t, const std::vector<std::string>& parts, std::size_t from, const toml::node& value) {
  toml::table* cur = &t;
  for (std::size_t i = from; i + 1 < parts.size(); ++i) {
    auto* next = cur->get(parts[i]);
    if (!next) next = &cur->insert_or_assign(parts[i], toml::table{}).first->second;
    if (!next->is_table()) return false;
    cur = next->as_table();
  }
  value.visit([&](auto&& v) { cur->insert_or_assign(parts.back(), v); });
  return true;
}

namespace {
/// Parses the right side of `--set k=v` as a TOML value, or takes it as text.
toml::table value_table(const std::string& text) {
  try {
    auto t = toml::parse("v = " + text);
    if (t.contains("v")) return t;
  } catch (const toml::parse_error&) {
  }
  toml::table t;
  t.insert("v", text);
  return t;
}

/// The [[stages]] entry named `name` (nullptr if none), and every stage's name.
toml::table* find_stage(toml::table& root, const std::string& name, std::vector<std::string>& names) {
  toml::table* target = nullptr;
  if (auto* stages = root["stages"].as_array())
    for (auto& s : *stages)
      if (auto* t = s.as_table()) {
        names.push_back((*t)["name"].value<std::string>().value_or(""));
        if (names.back() == name) target = t;
      }
  return target;
}
}  // namespace

void apply_overrides(toml::table& root, const std::vector<std::string>& overrides, Problems& p) {
  for (const auto& o : overrides) {
    const auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      p.list.push_back(fmt::format("--set \"{}\": expected path=value, e.g. stage.main.optimizer.lr=1e-3", o));
      continue;
    }
    const auto parts = split_path(o.substr(0, eq));
    const auto value = value_table(o.substr(eq + 1));
    const auto& v = *value.get("v");
    if ((parts[0] == "stage" || parts[0] == "stages") && parts.size() >= 3) {
      std::vector<std::string> names;
      auto* target = find_stage(root, parts[1], names);
      if (!target) {
        p.list.push_back(fmt::format("--set \"{}\": no stage \"{}\"{}; stages: {}", o, parts[1],
                                     did_you_mean(parts[1], names), fmt::join(names, ", ")));
        continue;
      }
      if (!insert_at(*target, parts, 2, v)) p.list.push_back(fmt::format("--set \"{}\": the path goes through a value that is not a table", o));
    } else if (contains({"run", "model", "datasets", "defaults"}, parts[0]) && parts.size() >= 2) {
      if (!insert_at(root, parts, 0, v)) p.list.push_back(fmt::format("--set \"{}\": the path goes through a value that is not a table", o));
    } else {
      p.list.push_back(fmt::format("--set \"{}\": paths start with run., model., datasets.<name>., defaults. or stage.<name>.", o));
    }
  }
}

}  // namespace baton::detail
