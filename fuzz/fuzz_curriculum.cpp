// TOML curricula: parsing and validation of any text give a curriculum or an error, and the
// resolved configuration of a curriculum (what `baton run` writes to resolved.toml) parses again.
#include <cstdint>
#include <string>

#include "baton/hparams.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const baton::Registry registry = baton::fuzz::offline_registry();
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto cur = baton::parse_curriculum(text, "fuzz.toml", {}, registry);
  if (!cur) {
    if (cur.error().message.empty()) baton::fuzz::fail("an error without a message");
    return 0;
  }
  (void)cur->validate();
  for (const auto& stage : cur->stages()) (void)stage.eval();
  auto again = baton::parse_curriculum(cur->resolved_toml(), "resolved.toml", {}, registry);
  if (!again && again.error().message.find("TOML syntax error") != std::string::npos)
    baton::fuzz::fail("the resolved configuration is not valid TOML: " + again.error().message);
  return 0;
}
