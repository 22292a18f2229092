#pragma once
/// \file time.hpp
/// Durations with units, as in Composer: "3ep" (epochs), "500ba" (batches), "12000sp" (samples),
/// "0.25dur" (a fraction of the run's max duration), and the Timestamp of a training run.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "baton/error.hpp"

namespace baton {

/// The unit of a `Time`.
enum class TimeUnit { epoch, batch, sample, duration };

/// Suffix of a unit: "ep", "ba", "sp", "dur".
std::string_view unit_suffix(TimeUnit unit) noexcept;

/// An amount of training time with a unit. `ba` and `sp` are non-negative integers; `ep` is a
/// non-negative number of epochs, whole or not ("0.5ep"); `dur` is a fraction in [0, 1] of the
/// run's max duration.
///
/// A part of an epoch lies on the batch grid: `x` epochs of data of `n` samples are
/// `round(x * n)` samples of the data order, and a point in epochs is reached at the first batch
/// end at or past it (`floor(x)` epochs, then `round(frac(x) * n)` samples of the next one's
/// order). Every interval, budget, pause point and stage duration takes them; only the run's max
/// duration (`InitOptions::max_duration`) counts whole epochs, as its epoch counter does.
///
/// ```cpp
/// auto t = baton::Time::parse("500ba");            // Expected<Time>
/// using namespace baton::literals;  auto u = "2ep"_t;   // checked at compile time
/// ```
struct Time {
  double value = 0;
  TimeUnit unit = TimeUnit::epoch;

  /// Parses "<number><unit>". Errors quote the input and list the valid units.
  static Expected<Time> parse(std::string_view text);
  /// The same rule without a message, usable at compile time: nullopt for any malformed text.
  static constexpr std::optional<Time> try_parse(std::string_view text) noexcept;

  static constexpr Time epochs(std::int64_t n) { return {static_cast<double>(n), TimeUnit::epoch}; }
  static constexpr Time batches(std::int64_t n) { return {static_cast<double>(n), TimeUnit::batch}; }
  static constexpr Time samples(std::int64_t n) { return {static_cast<double>(n), TimeUnit::sample}; }
  static constexpr Time fraction(double f) { return {f, TimeUnit::duration}; }

  /// The integer count of a `ba`/`sp` time (or of a whole number of epochs).
  [[nodiscard]] constexpr std::int64_t count() const { return static_cast<std::int64_t>(value); }

  /// Canonical text, e.g. "500ba", "0.5ep", "0.25dur"; `parse(t.to_string()) == t` for a valid time. An
  /// invalid one prints as it is ("1.5ba"), so that messages about it are true.
  [[nodiscard]] std::string to_string() const;

  /// The fields are public (an aggregate, like Timestamp), so a `Time` can hold what no text
  /// parses to: `Time{1.5, TimeUnit::batch}`, a negative or NaN value, `2dur`. Every function of
  /// baton that takes a Time checks it with this: an error (invalid_argument) saying what is wrong.
  [[nodiscard]] Expected<void> check() const;

  friend constexpr bool operator==(const Time&, const Time&) = default;
};

/// Where a run is: counters since the run began (all zero at `init_state`).
/// `sample_in_epoch` is the position in the epoch's data order, so it stays meaningful when a
/// later stage changes the batch size.
struct Timestamp {
  std::int64_t epoch = 0;            ///< completed epochs
  std::int64_t batch = 0;            ///< optimizer steps taken
  std::int64_t sample = 0;           ///< samples trained on
  std::int64_t batch_in_epoch = 0;   ///< steps taken in the current epoch
  std::int64_t sample_in_epoch = 0;  ///< samples of the current epoch's order consumed

  friend constexpr bool operator==(const Timestamp&, const Timestamp&) = default;
  [[nodiscard]] std::string to_string() const;  ///< "epoch 1, batch 700 (sample 89600) ..."
};

constexpr std::optional<Time> Time::try_parse(std::string_view s) noexcept {
  if (s.empty()) return std::nullopt;
  std::size_t i = 0;
  std::uint64_t int_part = 0, frac = 0, frac_scale = 1;
  bool digits = false, dot = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c >= '0' && c <= '9') {
      digits = true;
      if (dot) {
        if (frac_scale >= 1000000000000000ULL) return std::nullopt;  // > 15 decimals
        frac = frac * 10 + static_cast<std::uint64_t>(c - '0');
        frac_scale *= 10;
      } else {
        if (int_part > 100000000000000ULL) return std::nullopt;      // beyond exact doubles
        int_part = int_part * 10 + static_cast<std::uint64_t>(c - '0');
      }
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (!digits) return std::nullopt;
  const std::string_view suffix = s.substr(i);
  TimeUnit unit{};
  if (suffix == "ep") unit = TimeUnit::epoch;
  else if (suffix == "ba") unit = TimeUnit::batch;
  else if (suffix == "sp") unit = TimeUnit::sample;
  else if (suffix == "dur") unit = TimeUnit::duration;
  else return std::nullopt;
  // One correctly rounded division of two exact integers: equals strtod's result.
  const double value = static_cast<double>(int_part) +
                       static_cast<double>(frac) / static_cast<double>(frac_scale);
  if ((unit == TimeUnit::batch || unit == TimeUnit::sample) && frac != 0) return std::nullopt;  // "1.5ba": whole counts
  if (unit == TimeUnit::duration && value > 1.0) return std::nullopt;
  return Time{value, unit};
}

/// Wall-clock seconds as "m:ss" below an hour, "h:mm:ss" above (ETAs, the report's stage times).
std::string duration_text(double seconds);

namespace literals {
/// `"3ep"_t`: a Time checked at compile time (a malformed literal does not compile).
consteval Time operator""_t(const char* s, std::size_t n) {
  const auto t = Time::try_parse(std::string_view(s, n));
  if (!t) throw "invalid baton time literal";
  return *t;
}
}  // namespace literals

}  // namespace baton
