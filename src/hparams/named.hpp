#pragma once
// One lookup for everything a stage names (optimizer, schedule, algorithms, callbacks): the
// registry's own entries first, then the built-ins; an unknown name lists both, with a did-you-mean.
#include <algorithm>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)

#include "baton/hparams.hpp"
#include "suggest.hpp"

namespace baton::detail {

template <class T, class Builtin>
Expected<T> make_named(const char* what, const std::map<std::string, NamedEntry<T>>& mine,
                       const std::vector<std::string>& builtin_names, const std::string& name, const Params& params,
                       Builtin&& builtin) {
  if (auto it = mine.find(name); it != mine.end()) {
    const NamedEntry<T>& e = it->second;
    for (const auto& [key, value] : params)
      if (std::find(e.keys.begin(), e.keys.end(), key) == e.keys.end())
        return fail(ErrorCode::invalid_argument,
                    fmt::format("{} \"{}\": unknown key \"{}\"{}; its keys: {}", what, name, key, did_you_mean(key, e.keys),
                                e.keys.empty() ? std::string("none") : fmt::format("{}", fmt::join(e.keys, ", "))));
    if (!e.make) return fail(ErrorCode::invalid_argument, fmt::format("{} \"{}\": the registry's entry has no make function", what, name));
    try {
      return e.make(params).map_error([&](Error err) {
        err.message = fmt::format("{} \"{}\": {}", what, name, err.message);
        return err;
      });
    } catch (const std::exception& x) {
      return fail(ErrorCode::invalid_argument, fmt::format("{} \"{}\": {}", what, name, x.what()));
    }
  }
  if (std::find(builtin_names.begin(), builtin_names.end(), name) == builtin_names.end()) {
    std::vector<std::string> all = builtin_names;
    for (const auto& [k, e] : mine) all.push_back(k);
    return fail(ErrorCode::invalid_argument, fmt::format("unknown {} \"{}\"{}; known: {}", what, name, did_you_mean(name, all),
                                                         fmt::join(all, ", ")));
  }
  return builtin(name, params);
}

}  // namespace baton::detail
