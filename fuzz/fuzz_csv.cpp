// CSV tables, loaded the way `baton run` loads them (a [datasets.<name>] table of kind "csv").
// The first input byte picks the options: bit 0 classification = false, bit 1 target = "y".
#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "baton/hparams.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const auto path = baton::fuzz::write_file("in.csv", {reinterpret_cast<const char*>(data + 1), size - 1});
  const std::string toml = fmt::format(
      "[run]\nmax_duration = \"1ep\"\n[model]\nname = \"mlp\"\nwidths = [2, 2]\n"
      "[datasets.table]\nkind = \"csv\"\npath = \"{}\"\nclassification = {}\n{}"
      "[[stages]]\nname = \"s\"\nduration = \"1ep\"\ndata = \"table\"\n",
      path.string(), (mode & 1) ? "false" : "true", (mode & 2) ? "target = \"y\"\n" : "");
  static const baton::Registry registry = baton::Registry::builtin();
  auto cur = baton::parse_curriculum(toml, "csv.toml", {}, registry);
  if (!cur) baton::fuzz::fail("the harness's own curriculum does not parse: " + cur.error().message);
  auto ds = cur->dataset("table");
  if (!ds && ds.error().message.empty()) baton::fuzz::fail("an error without a message");
  return 0;
}
