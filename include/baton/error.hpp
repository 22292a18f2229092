#pragma once
/// \file error.hpp
/// The one error type of baton's public API. Nothing throws across the API: every fallible
/// function returns `tl::expected<T, baton::Error>`.

#include <string>
#include <string_view>
#include <vector>
#include <ostream>

#include <tl/expected.hpp>

namespace baton {

/// What kind of failure an `Error` reports. Stable: callers may switch on it.
enum class ErrorCode {
  invalid_argument,  ///< a value given to baton is out of range or malformed
  invalid_time,      ///< a duration string such as "3ep" could not be parsed
  invalid_spec,      ///< a TrainingSpec failed validation
  io,                ///< a file could not be opened, read or written
  data,              ///< a data file or tensor dataset is malformed
  shape_mismatch,    ///< model output and targets (or inputs and model) disagree in shape
  non_finite,        ///< a loss or gradient became NaN or infinite
  run_finished,      ///< fit was called on a state that has reached its max duration
  runtime,           ///< the process runtime (threads, BLAS) is not as required
  torch,             ///< any other LibTorch error, converted at the API boundary
};

/// Name of an error code, e.g. "invalid_time".
std::string_view to_string(ErrorCode code) noexcept;

/// A failure: a code, a message that says what went wrong, where, and how to fix it, and a
/// context chain from the outermost caller inwards (e.g. `stage "finetune" > data.train`).
///
/// ```cpp
/// auto t = baton::Time::parse("10xx");
/// if (!t) std::cerr << t.error() << '\n';   // [invalid_time] "10xx": unknown unit "xx" ...
/// ```
struct Error {
  ErrorCode code = ErrorCode::invalid_argument;
  std::string message{};
  std::vector<std::string> context{};  ///< outermost first

  /// A copy with `where` put in front of the context chain (the new outermost frame).
  [[nodiscard]] Error with_context(std::string where) const;

  /// "stage \"finetune\" > data.train: [data] <message>" (no context: "[code] message").
  [[nodiscard]] std::string to_string() const;
};

std::ostream& operator<<(std::ostream& os, const Error& e);

/// Shorthand for the result of every fallible baton function.
template <class T>
using Expected = tl::expected<T, Error>;

/// Builds an unexpected error value: `return baton::fail(ErrorCode::io, "cannot open ...");`
inline tl::unexpected<Error> fail(ErrorCode code, std::string message) {
  return tl::unexpected<Error>(Error{code, std::move(message), {}});
}

/// A function usable with `map_error` that adds a context frame:
/// `load(...).map_error(baton::add_context("data.train"))`.
inline auto add_context(std::string where) {
  return [where = std::move(where)](const Error& e) { return e.with_context(where); };
}

}  // namespace baton
