// Packed shards (data::shards): the manifest `shards.json` and one shard file, both from the
// input. Byte 0: bit 0 verifies the payload's CRC-32 when opening (off, fuzzed records reach
// the batch reader past the checksum). Bytes 1-2: the manifest's length L (little-endian), then
// L bytes of manifest, then the rest as `shard-00000.bin`. What opens is read: its first samples
// and its last one.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "baton/data.hpp"
#include "fuzz_common.hpp"

namespace {
void check(const baton::Expected<baton::Batch>& b, std::int64_t count, const baton::Dataset& ds) {
  if (!b) {
    if (b.error().message.empty()) baton::fuzz::fail("an error without a message");
    return;
  }
  if (b->inputs.size(0) != count || b->targets.size(0) != count) baton::fuzz::fail("a batch of another size than asked");
  auto shape = ds.source->input_shape();
  shape.insert(shape.begin(), count);
  if (b->inputs.sizes().vec() != shape) baton::fuzz::fail("inputs of another shape than the dataset's");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  const bool verify = (data[0] & 1) != 0;
  const std::size_t manifest_size = std::min<std::size_t>(data[1] | (std::size_t{data[2]} << 8), size - 3);
  const std::string_view rest(reinterpret_cast<const char*>(data + 3), size - 3);
  const auto dir = baton::fuzz::scratch_dir() / "shards";
  std::filesystem::create_directories(dir);
  baton::fuzz::write_file("shards/shards.json", rest.substr(0, manifest_size));
  baton::fuzz::write_file("shards/shard-00000.bin", rest.substr(manifest_size));
  auto ds = baton::data::shards(dir, {.verify = verify});
  if (!ds) {
    if (ds.error().message.empty()) baton::fuzz::fail("an error without a message");
    return 0;
  }
  const std::int64_t n = ds->size();
  if (n < 1 || !ds->source) baton::fuzz::fail("shards opened as an empty or in-memory dataset");
  const std::int64_t first = std::min<std::int64_t>(n, 64);
  check(ds->range(0, first), first, *ds);
  check(ds->range(n - 1, 1), 1, *ds);
  return 0;
}
