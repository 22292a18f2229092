// Time strings ("3ep", "500ba", "0.25dur"): parsing never crashes, and what parses prints back to
// a text that parses to the same value.
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

#include "baton/time.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto t = baton::Time::parse(text);
  if (!t) {
    if (t.error().message.empty()) baton::fuzz::fail("an error without a message");
    return 0;
  }
  const std::string printed = t->to_string();
  const auto again = baton::Time::parse(printed);
  if (!again || again->unit != t->unit || again->value != t->value)
    baton::fuzz::fail(fmt::format("\"{}\" parses but prints as \"{}\", which does not parse back to it", text, printed));
  return 0;
}
