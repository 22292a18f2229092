// Every record of a .pt archive against the CRC-32 and sizes its zip directory gives.
//
// Why: LibTorch's zip reader (miniz, built with MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS) checks no
// CRC, so one flipped byte in a tensor's record loads as a different weight, silently. This reads
// the central directory itself (zip64 included, as PyTorch writes archives over 4 GiB), finds each
// record's data through its local header, and computes the CRC-32 (zlib) of what it holds: one more
// sequential read of the file, about as long as loading it.
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "interop/zip_check.hpp"

namespace baton::detail {
namespace {
namespace fs = std::filesystem;

constexpr std::uint32_t kEndOfDirectory = 0x06054b50, kZip64Locator = 0x07064b50, kZip64End = 0x06064b50;
constexpr std::uint32_t kDirectoryEntry = 0x02014b50, kLocalHeader = 0x04034b50;
constexpr std::uint32_t kFull32 = 0xffffffff;
constexpr std::size_t kChunk = std::size_t{1} << 20;

std::uint64_t le(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

/// One record as the central directory describes it.
struct Entry {
  std::string name;
  std::uint16_t flags = 0, method = 0;
  std::uint32_t crc = 0;
  std::uint64_t packed = 0, size = 0, local = 0;
};

/// Reads the file at offsets, every read checked against its size; errors are thrown as text and
/// become one data error naming the file.
class File {
 public:
  explicit File(const fs::path& path) : in_(path, std::ios::binary), size_(fs::file_size(path)) {
    if (!in_) throw std::runtime_error("cannot be opened");
  }
  [[nodiscard]] std::uint64_t size() const { return size_; }
  std::vector<unsigned char> read(std::uint64_t at, std::uint64_t n, std::string_view what) {
    if (at > size_ || n > size_ - at)
      throw std::runtime_error(fmt::format("{} reaches past the end of the file (byte {} of {}): the file is truncated or damaged",
                                           what, at + n, size_));
    std::vector<unsigned char> out(n);
    in_.seekg(static_cast<std::streamoff>(at));
    if (!in_.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(n)))
      throw std::runtime_error(fmt::format("{} could not be read", what));
    return out;
  }

 private:
  std::ifstream in_;
  std::uint64_t size_;
};

[[noreturn]] void damaged(const std::string& what) {
  throw std::runtime_error(fmt::format("the zip archive's directory is damaged ({})", what));
}

/// Where the central directory starts and how many entries it has (zip64 where PyTorch wrote it).
std::pair<std::uint64_t, std::uint64_t> directory(File& f) {
  const std::uint64_t tail = std::min<std::uint64_t>(f.size(), 22 + 65535 + 20);
  const auto t = f.read(f.size() - tail, tail, "the end of the archive");
  std::size_t at = t.size() < 22 ? std::string::npos : t.size() - 22;
  while (at != std::string::npos && le(&t[at], 4) != kEndOfDirectory) at = at == 0 ? std::string::npos : at - 1;
  if (at == std::string::npos) damaged("no end-of-directory record");
  std::uint64_t entries = le(&t[at + 10], 2), offset = le(&t[at + 16], 4);
  if ((entries == 0xffff || offset == kFull32) && at >= 20 && le(&t[at - 20], 4) == kZip64Locator) {
    const auto z = f.read(le(&t[at - 12], 8), 56, "the zip64 end-of-directory record");
    if (le(z.data(), 4) != kZip64End) damaged("the zip64 end-of-directory record has a wrong signature");
    entries = le(&z[32], 8);
    offset = le(&z[48], 8);
  }
  return {offset, entries};
}

/// The central directory's entries, with zip64 sizes and offsets where the 32-bit fields are full.
std::vector<Entry> entries(File& f) {
  const auto [offset, count] = directory(f);
  if (offset >= f.size()) damaged(fmt::format("its directory starts at byte {} of {}", offset, f.size()));
  const auto d = f.read(offset, f.size() - offset, "the central directory");
  std::vector<Entry> out;
  std::size_t at = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    if (at + 46 > d.size() || le(&d[at], 4) != kDirectoryEntry) damaged(fmt::format("entry {} of {} is not where it should be", i, count));
    Entry e;
    e.flags = static_cast<std::uint16_t>(le(&d[at + 8], 2));
    e.method = static_cast<std::uint16_t>(le(&d[at + 10], 2));
    e.crc = static_cast<std::uint32_t>(le(&d[at + 16], 4));
    e.packed = le(&d[at + 20], 4);
    e.size = le(&d[at + 24], 4);
    e.local = le(&d[at + 42], 4);
    const std::size_t name = le(&d[at + 28], 2), extra = le(&d[at + 30], 2), comment = le(&d[at + 32], 2);
    if (at + 46 + name + extra + comment > d.size()) damaged(fmt::format("entry {} runs past its end", i));
    e.name.assign(reinterpret_cast<const char*>(&d[at + 46]), name);
    // The zip64 extra field holds, in this order, the fields whose 32-bit value is full.
    for (std::size_t x = at + 46 + name, end = x + extra; x + 4 <= end;) {
      const auto id = le(&d[x], 2), len = le(&d[x + 2], 2);
      if (x + 4 + len > end) damaged(fmt::format("record '{}' has an extra field past its end", e.name));
      std::size_t v = x + 4;
      for (std::uint64_t* field : {&e.size, &e.packed, &e.local})
        if (id == 1 && *field == kFull32 && v + 8 <= x + 4 + len) *field = le(&d[v], 8), v += 8;
      x += 4 + len;
    }
    out.push_back(std::move(e));
    at += 46 + name + extra + comment;
  }
  return out;
}

/// A raw deflate stream (zip method 8), ended however its scope is left.
struct Inflater {
  z_stream z{};
  Inflater() {
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK) throw std::runtime_error("zlib could not start inflating");
  }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;
  ~Inflater() { inflateEnd(&z); }
};

/// The CRC-32 and length of what record `e` holds (its data inflated where it is deflated); the
/// length is kUnreadable for a deflate stream that is broken or ends early, and stops counting
/// once past the size the directory gives (a mismatch already).
constexpr std::uint64_t kUnreadable = ~std::uint64_t{0};
std::pair<std::uint32_t, std::uint64_t> contents(File& f, const Entry& e, std::uint64_t data) {
  uLong crc = crc32(0L, Z_NULL, 0);
  std::uint64_t length = 0;
  std::optional<Inflater> inflater;
  if (e.method == 8) inflater.emplace();
  std::vector<unsigned char> out(inflater ? kChunk : 0);
  int status = Z_OK;
  for (std::uint64_t done = 0; done < e.packed && length <= e.size && (status == Z_OK || status == Z_STREAM_END);) {
    const auto n = std::min<std::uint64_t>(kChunk, e.packed - done);
    auto chunk = f.read(data + done, n, fmt::format("record '{}'", e.name));
    done += n;
    if (!inflater) {
      crc = crc32(crc, chunk.data(), static_cast<uInt>(n));
      length += n;
      continue;
    }
    z_stream& z = inflater->z;
    z.next_in = chunk.data();
    z.avail_in = static_cast<uInt>(n);
    while (z.avail_in > 0 && status == Z_OK && length <= e.size) {
      z.next_out = out.data();
      z.avail_out = static_cast<uInt>(out.size());
      status = inflate(&z, Z_NO_FLUSH);
      if (status != Z_OK && status != Z_STREAM_END) break;
      const auto made = out.size() - z.avail_out;
      crc = crc32(crc, out.data(), static_cast<uInt>(made));
      length += made;
    }
  }
  if (inflater && status != Z_STREAM_END && length <= e.size) length = kUnreadable;
  return {static_cast<std::uint32_t>(crc), length};
}

/// Record `e`'s local header (the same name; the same CRC and sizes where it gives them) and
/// where its data starts.
std::uint64_t data_start(File& f, const Entry& e) {
  const auto h = f.read(e.local, 30, fmt::format("the local header of record '{}'", e.name));
  if (le(h.data(), 4) != kLocalHeader) damaged(fmt::format("record '{}' has no local header at byte {}", e.name, e.local));
  const std::size_t name = le(&h[26], 2), extra = le(&h[28], 2);
  const auto n = f.read(e.local + 30, name, fmt::format("the local header of record '{}'", e.name));
  if (std::string(n.begin(), n.end()) != e.name) damaged(fmt::format("record '{}' is named otherwise in its local header", e.name));
  const bool described = !(le(&h[6], 2) & 0x8) && le(&h[18], 4) != kFull32 && le(&h[22], 4) != kFull32;
  if (described && (le(&h[14], 4) != e.crc || le(&h[18], 4) != e.packed || le(&h[22], 4) != e.size))
    damaged(fmt::format("record '{}' has another CRC-32 or size in its local header than in the directory", e.name));
  return e.local + 30 + name + extra;
}
}  // namespace

Expected<void> check_zip_records(const std::filesystem::path& file) {
  const std::string where = file.string();
  try {
    File f(file);
    for (const auto& e : entries(f)) {
      if (e.method != 0 && e.method != 8)
        return fail(ErrorCode::data, fmt::format("{}: record '{}' is compressed with zip method {}, which baton does not read; "
                                                 "save it again with torch.save", where, e.name, e.method));
      if (e.method == 0 && e.packed != e.size) damaged(fmt::format("record '{}' is stored with two sizes, {} and {}", e.name, e.packed, e.size));
      const auto [crc, length] = contents(f, e, data_start(f, e));
      if (length != e.size)
        return fail(ErrorCode::data, fmt::format("{}: record '{}' holds {} bytes where the archive says {}: the file is damaged; "
                                                 "export or copy it again from where it was made",
                                                 where, e.name, length == kUnreadable ? std::string("unreadable") : std::to_string(length), e.size));
      if (crc != e.crc)
        return fail(ErrorCode::data, fmt::format("{}: record '{}' fails its CRC-32 check: the file is damaged (its CRC-32 is "
                                                 "{:08x}, the archive says {:08x}); export or copy it again from where it was made",
                                                 where, e.name, crc, e.crc));
    }
  } catch (const std::exception& e) {  // a read past the end, a damaged directory, an unreadable file
    return fail(ErrorCode::data, fmt::format("{}: {}; export or copy it again from where it was made", where, e.what()));
  }
  return {};
}

}  // namespace baton::detail
