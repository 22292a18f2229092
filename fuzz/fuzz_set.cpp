// `--set path=value` overrides (one per line of the input) applied to a valid curriculum.
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "baton/hparams.hpp"
#include "fuzz_common.hpp"

namespace {
constexpr const char* kBase = R"(
[run]
name = "fuzz"
seed = 1
max_duration = "4ep"
checkpoint_every = "100ba"
[model]
name = "mlp"
widths = [4, 8, 3]
[datasets.train]
kind = "synthetic"
samples = 16
[datasets.test]
kind = "csv"
path = "test.csv"
limit = 8
[defaults]
data = "train"
batch_size = 4
optimizer = { name = "sgd", lr = 0.1, momentum = 0.9 }
[[stages]]
name = "warmup"
duration = "1ep"
schedule = { name = "cosine" }
[[stages]]
name = "main"
duration = "2ep"
eval = { sets = ["test"], interval = "1ep" }
)";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const baton::Registry registry = baton::fuzz::offline_registry();
  std::vector<std::string> overrides;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  for (std::string line; std::getline(in, line);) overrides.push_back(line);
  auto cur = baton::parse_curriculum(kBase, "base.toml", overrides, registry);
  if (!cur) {
    if (cur.error().message.empty()) baton::fuzz::fail("an error without a message");
    return 0;
  }
  (void)cur->validate();
  return 0;
}
