#pragma once
/// \file params.hpp
/// Key/value tables for building optimizers and schedules by name (the hparams layer's input).

#include <map>
#include <string>
#include <variant>
#include <vector>

namespace baton {

/// A value in a by-name table: a number, a flag, a text (times are texts such as "500ba"), or a
/// list of numbers or texts.
using ParamValue = std::variant<double, bool, std::string, std::vector<double>, std::vector<std::string>>;

/// Keys to values, e.g. {{"lr", 0.1}, {"momentum", 0.9}}.
using Params = std::map<std::string, ParamValue>;

}  // namespace baton
