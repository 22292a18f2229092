#pragma once
// Typed reads from a Params table, collecting every problem, and an unknown-key check.
#include <cmath>
#include <cstdint>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)

#include "baton/params.hpp"
#include "baton/time.hpp"
#include "suggest.hpp"

namespace baton::detail {

class ParamReader {
 public:
  ParamReader(const Params& params, std::string what) : params_(params), what_(std::move(what)) {}

  double number(const std::string& key, double fallback) {
    seen_.push_back(key);
    auto it = params_.find(key);
    if (it == params_.end()) return fallback;
    if (const auto* d = std::get_if<double>(&it->second)) return *d;
    problem(fmt::format("{}.{}: expected a number", what_, key));
    return fallback;
  }
  /// A whole number in [min, max] (sizes, counts, seeds): a fraction, a non-finite value or one
  /// out of range is a problem (and never reaches an integer conversion, where it would be UB).
  std::int64_t whole(const std::string& key, std::int64_t fallback, std::int64_t min,
                     std::int64_t max = std::int64_t{1} << 53) {
    const double v = number(key, static_cast<double>(fallback));
    if (!(v >= static_cast<double>(min) && v <= static_cast<double>(max)) || v != std::floor(v)) {
      problem(fmt::format("{}.{}: expected a whole number from {} to {}, got {}", what_, key, min, max, v));
      return fallback;
    }
    return static_cast<std::int64_t>(v);
  }
  bool flag(const std::string& key, bool fallback) {
    seen_.push_back(key);
    auto it = params_.find(key);
    if (it == params_.end()) return fallback;
    if (const auto* b = std::get_if<bool>(&it->second)) return *b;
    problem(fmt::format("{}.{}: expected true or false", what_, key));
    return fallback;
  }
  /// A string; another type is a problem. `fallback` when the key is absent.
  std::string text(const std::string& key, std::string fallback = {}) {
    seen_.push_back(key);
    auto it = params_.find(key);
    if (it == params_.end()) return fallback;
    if (const auto* s = std::get_if<std::string>(&it->second)) return *s;
    problem(fmt::format("{}.{}: expected a string", what_, key));
    return fallback;
  }
  /// A string that must be given; `needs` says what it names (in the problem when it is absent).
  std::string required_text(const std::string& key, const std::string& needs) {
    if (!params_.count(key)) {
      seen_.push_back(key);
      problem(fmt::format("{}.{}: required ({})", what_, key, needs));
      return {};
    }
    return text(key);
  }
  /// A list of strings; `fallback` when the key is absent.
  std::vector<std::string> texts(const std::string& key, std::vector<std::string> fallback = {}) {
    seen_.push_back(key);
    auto it = params_.find(key);
    if (it == params_.end()) return fallback;
    if (const auto* v = std::get_if<std::vector<std::string>>(&it->second)) return *v;
    problem(fmt::format("{}.{}: expected a list of strings", what_, key));
    return fallback;
  }
  Time time(const std::string& key, Time fallback) {
    seen_.push_back(key);
    auto it = params_.find(key);
    if (it == params_.end()) return fallback;
    if (const auto* s = std::get_if<std::string>(&it->second)) {
      auto t = Time::parse(*s);
      if (t) return *t;
      problem(fmt::format("{}.{}: {}", what_, key, t.error().message));
      return fallback;
    }
    problem(fmt::format("{}.{}: expected a duration such as \"500ba\" or \"0.1dur\"", what_, key));
    return fallback;
  }
  std::optional<Time> optional_time(const std::string& key) {
    if (!params_.count(key)) { seen_.push_back(key); return std::nullopt; }
    return time(key, Time{});
  }
  std::vector<Time> times(const std::string& key) {
    seen_.push_back(key);
    std::vector<Time> out;
    auto it = params_.find(key);
    if (it == params_.end()) {
      problem(fmt::format("{}.{}: required (a list of durations)", what_, key));
      return out;
    }
    const auto* list = std::get_if<std::vector<std::string>>(&it->second);
    if (!list) {
      problem(fmt::format("{}.{}: expected a list of durations such as [\"30ep\", \"60ep\"]", what_, key));
      return out;
    }
    for (const auto& s : *list) {
      if (auto t = Time::parse(s)) out.push_back(*t);
      else problem(fmt::format("{}.{}: {}", what_, key, t.error().message));
    }
    return out;
  }
  Time required_time(const std::string& key) {
    if (!params_.count(key)) {
      seen_.push_back(key);
      problem(fmt::format("{}.{}: required (a duration such as \"2ep\")", what_, key));
      return Time::batches(1);
    }
    return time(key, Time{});
  }

  void problem(std::string p) { problems_.push_back(std::move(p)); }
  /// Marks `key` as known (read by the caller itself).
  void seen(const std::string& key) { seen_.push_back(key); }

  /// Every key that was not read is an error with a suggestion; all problems in one message.
  Expected<void> finish() {
    for (const auto& [key, value] : params_) {
      if (std::find(seen_.begin(), seen_.end(), key) != seen_.end()) continue;
      problems_.push_back(fmt::format("{}: unknown key \"{}\"{}; valid keys: {}", what_, key,
                                      did_you_mean(key, seen_), fmt::join(seen_, ", ")));
    }
    if (problems_.empty()) return {};
    return fail(ErrorCode::invalid_argument, fmt::format("{}", fmt::join(problems_, "; ")));
  }

 private:
  const Params& params_;
  std::string what_;
  std::vector<std::string> seen_;
  std::vector<std::string> problems_;
};

}  // namespace baton::detail
