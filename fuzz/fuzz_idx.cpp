// IDX files (MNIST format), plain and gzip. The first input byte picks how the rest reaches the
// reader: 0 as a plain file, 1 gzip-compressed (so the IDX parser sees fuzzed content through
// zlib), 2 as-is under a .gz name (fuzzed gzip framing); bit 2 also loads it as images + labels.
#include <zlib.h>

#include <cstdint>
#include <string>

#include "baton/data.hpp"
#include "fuzz_common.hpp"

namespace {
std::string gzip(std::string_view raw) {
  const auto path = baton::fuzz::scratch_dir() / "gz.tmp";
  gzFile f = gzopen(path.c_str(), "wb");
  if (!f) baton::fuzz::fail("cannot write the scratch gzip file");
  if (!raw.empty()) gzwrite(f, raw.data(), static_cast<unsigned>(raw.size()));
  gzclose(f);
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  std::filesystem::path path;
  switch (mode & 3) {
    case 1: path = baton::fuzz::write_file("in.idx.gz", gzip(rest)); break;
    case 2: path = baton::fuzz::write_file("in.idx.gz", rest); break;
    default: path = baton::fuzz::write_file("in.idx", rest); break;
  }
  auto t = baton::data::read_idx(path);
  if (!t && t.error().message.empty()) baton::fuzz::fail("an error without a message");
  if (mode & 4) {
    auto ds = baton::data::idx_images(path, path, "fuzz", {});
    if (!ds && ds.error().message.empty()) baton::fuzz::fail("an error without a message");
  }
  return 0;
}
