// Packed shards (data.hpp, docs/data.md): `data::pack` writes them, `data::shards` reads them
// with positional reads from files opened once. Not by memory mapping: measured, a mapping's
// faults map whole large folios of the page cache (resident memory grew ~200 KiB per 4 KiB
// record), and dropping those pages again (madvise) cost the CNN a tenth to a fifth of its speed.
//
// A directory holds `shards.json` (the manifest) and `shard-00000.bin`, ... Each shard file is a
// 32-byte header (magic "BTNSHRD1", records and record size as little-endian uint64, CRC-32 of
// the payload as uint32, 4 zero bytes) and a payload of fixed-size records: one sample's input
// (uint8 pixels or float32, row-major) then its target (int64 class or float32 values).
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <zlib.h>

#include "baton/data.hpp"
#include "data_internal.hpp"
#include "detail.hpp"
#include "io.hpp"

namespace baton::data {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kMagic[8] = {'B', 'T', 'N', 'S', 'H', 'R', 'D', '1'};
constexpr std::size_t kHeader = 32;
constexpr int kVersion = 1;

/// What a record holds: the manifest's description of one sample.
struct Layout {
  bool pixels = false;  // inputs stored as uint8 (else float32)
  ImageOptions scale;   // with pixels: how they become inputs
  std::vector<std::int64_t> input_shape;
  bool classes = true;  // int64 class targets (else float32 values)
  std::vector<std::int64_t> target_shape;
  std::int64_t num_classes = 0;

  [[nodiscard]] std::int64_t input_elems() const { return product(input_shape); }
  [[nodiscard]] std::int64_t target_elems() const { return product(target_shape); }
  [[nodiscard]] std::int64_t input_bytes() const { return input_elems() * (pixels ? 1 : 4); }
  [[nodiscard]] std::int64_t record_bytes() const { return input_bytes() + target_elems() * (classes ? 8 : 4); }
  static std::int64_t product(const std::vector<std::int64_t>& v) {
    std::int64_t p = 1;
    for (auto d : v) p *= d;
    return p;
  }
};

std::string shard_name(std::int64_t k) { return fmt::format("shard-{:05d}.bin", k); }

void put64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
std::uint64_t get64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

/// The records of one batch: inputs as stored (uint8 or float32) and targets, as raw bytes.
std::vector<unsigned char> encode(const Batch& b, const Layout& l) {
  const std::int64_t n = b.inputs.size(0);
  std::vector<unsigned char> out(static_cast<std::size_t>(n * l.record_bytes()));
  auto x = b.inputs.reshape({n, -1}).contiguous();
  auto y = b.targets.reshape({n, -1}).contiguous();
  for (std::int64_t i = 0; i < n; ++i) {
    unsigned char* r = out.data() + i * l.record_bytes();
    std::memcpy(r, x[i].data_ptr(), static_cast<std::size_t>(l.input_bytes()));
    std::memcpy(r + l.input_bytes(), y[i].data_ptr(), static_cast<std::size_t>(l.record_bytes() - l.input_bytes()));
  }
  return out;
}

/// Inputs as the record stores them; with pixels, checks that scaling them back gives the inputs' bits.
Expected<torch::Tensor> stored_inputs(const torch::Tensor& inputs, const Layout& l, std::int64_t first) {
  auto x = inputs.to(torch::kFloat32).contiguous();
  if (!l.pixels) return x;
  const auto& o = l.scale;
  auto p = (o.normalize ? x * o.std + o.mean : x).mul(255.0).round().clamp(0, 255).to(torch::kUInt8);
  const auto back = detail::scale_pixels(p, o.normalize, o.mean, o.std);
  const auto bad = back.ne(x).reshape({x.size(0), -1}).any(1).nonzero();
  if (bad.numel() > 0)
    return fail(ErrorCode::data, fmt::format("sample {} is not 8-bit pixels scaled with mean {} and std {} (normalize "
                                             "{}): pack it without pixels, as float32",
                                             first + bad[0][0].item<std::int64_t>(), o.mean, o.std, o.normalize));
  return p;
}

json manifest(const Dataset& d, const Layout& l, std::int64_t per_shard, const json& shards) {
  json j = {{"format", "baton-shards"}, {"version", kVersion}, {"name", d.name}, {"samples", d.size()},
            {"records_per_shard", per_shard}, {"record_bytes", l.record_bytes()}, {"classes", l.num_classes}};
  j["input"] = {{"dtype", l.pixels ? "uint8" : "float32"}, {"shape", l.input_shape}};
  if (l.pixels) j["input"]["pixels"] = {{"normalize", l.scale.normalize}, {"mean", l.scale.mean}, {"std", l.scale.std}};
  j["target"] = {{"dtype", l.classes ? "int64" : "float32"}, {"shape", l.target_shape}};
  j["shards"] = shards;
  return j;
}

/// Writes the shards of `d` into `tmp` (an empty directory of ours).
Expected<PackSummary> write_shards(const Dataset& d, const fs::path& tmp, const Layout& l, const PackOptions& o) {
  PackSummary sum{d.size(), 0, 0};
  json list = json::array();
  constexpr std::int64_t kChunk = 4096;  // samples read at once
  for (std::int64_t first = 0; first < d.size(); first += o.records_per_shard, ++sum.shards) {
    const std::int64_t count = std::min(o.records_per_shard, d.size() - first);
    detail::AtomicFile file(tmp / shard_name(sum.shards), "shard");
    std::array<unsigned char, kHeader> header{};
    std::memcpy(header.data(), kMagic, 8);
    put64(header.data() + 8, static_cast<std::uint64_t>(count));
    put64(header.data() + 16, static_cast<std::uint64_t>(l.record_bytes()));
    file.write(header.data(), header.size());  // the CRC is known at the end: written again below
    uLong crc = crc32(0L, Z_NULL, 0);
    for (std::int64_t i = first; i < first + count; i += kChunk) {
      auto b = d.range(i, std::min(kChunk, first + count - i));
      if (!b) return tl::unexpected(b.error());
      auto x = stored_inputs(b->inputs, l, i);
      if (!x) return tl::unexpected(x.error());
      const auto bytes = encode(Batch{*x, b->targets.to(l.classes ? torch::kLong : torch::kFloat32)}, l);
      crc = crc32(crc, bytes.data(), static_cast<uInt>(bytes.size()));
      file.write(bytes.data(), bytes.size());
    }
    file.commit();
    // The header's CRC, in place (the file is complete and ours).
    header[24] = static_cast<unsigned char>(crc), header[25] = static_cast<unsigned char>(crc >> 8);
    header[26] = static_cast<unsigned char>(crc >> 16), header[27] = static_cast<unsigned char>(crc >> 24);
    const fs::path path = tmp / shard_name(sum.shards);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    const bool ok = fd >= 0 && ::pwrite(fd, header.data(), kHeader, 0) == static_cast<ssize_t>(kHeader) && ::fsync(fd) == 0;
    const int err = errno;
    if (fd >= 0) ::close(fd);
    if (!ok) return fail(ErrorCode::io, fmt::format("{}: cannot write its header: {}", path.string(), std::strerror(err)));
    const std::int64_t bytes = static_cast<std::int64_t>(kHeader) + count * l.record_bytes();
    list.push_back({{"file", shard_name(sum.shards)}, {"records", count}, {"crc32", static_cast<std::uint32_t>(crc)}, {"bytes", bytes}});
    sum.bytes += bytes;
  }
  const auto text = manifest(d, l, o.records_per_shard, list).dump(1) + "\n";
  if (auto ok = detail::write_file_atomic(tmp / "shards.json", text, "manifest"); !ok) return tl::unexpected(ok.error());
  sum.bytes += static_cast<std::int64_t>(text.size());
  return sum;
}

/// One shard file, open for positional reads (pread: any number of threads at once).
struct ShardFile {
  int fd = -1;
  std::size_t bytes = 0;
  ShardFile() = default;
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;
  ~ShardFile() {
    if (fd >= 0) ::close(fd);
  }
};

std::string at(const fs::path& file, const std::string& what) { return fmt::format("{}: {}", file.string(), what); }

/// The payload's CRC-32 by a streaming read (through the page cache, not this process's memory).
Expected<std::uint32_t> payload_crc(int fd, const fs::path& file, std::uint64_t end) {
  std::vector<unsigned char> buf(std::size_t{4} << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  for (std::uint64_t off = kHeader; off < end;) {
    const ssize_t n = ::pread(fd, buf.data(), std::min<std::uint64_t>(buf.size(), end - off), static_cast<off_t>(off));
    if (n <= 0)
      return fail(ErrorCode::io, at(file, fmt::format("read failed at byte {}: {}", off, n < 0 ? std::strerror(errno) : "end of file")));
    crc = crc32(crc, buf.data(), static_cast<uInt>(n));
    off += static_cast<std::uint64_t>(n);
  }
  return static_cast<std::uint32_t>(crc);
}

/// Opens and checks (size, header, CRC when asked) one shard.
Expected<std::unique_ptr<ShardFile>> open_shard(const fs::path& file, std::int64_t records, std::int64_t record_bytes,
                                             std::uint32_t crc_expected, bool verify) {
  if (auto ok = detail::check_regular_file(file, "shard"); !ok) return tl::unexpected(ok.error());
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(ErrorCode::io, at(file, fmt::format("cannot open: {}", std::strerror(errno))));
  auto m = std::make_unique<ShardFile>();
  m->fd = fd;  // closed with it, on every path
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail(ErrorCode::io, at(file, std::strerror(errno)));
  const auto expected = static_cast<std::uint64_t>(kHeader) + static_cast<std::uint64_t>(records * record_bytes);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size != expected)
    return fail(ErrorCode::data, at(file, fmt::format("{} bytes, expected {} ({} records of {} bytes and the header): {}", size,
                                                      expected, records, record_bytes, size < expected ? "truncated" : "too long")));
  std::array<unsigned char, kHeader> h{};
  if (::pread(fd, h.data(), kHeader, 0) != static_cast<ssize_t>(kHeader) || std::memcmp(h.data(), kMagic, 8) != 0 ||
      get64(h.data() + 8) != static_cast<std::uint64_t>(records) || get64(h.data() + 16) != static_cast<std::uint64_t>(record_bytes))
    return fail(ErrorCode::data, at(file, "not a baton shard of this manifest (its header differs)"));
  const std::uint32_t crc_header = h[24] | (h[25] << 8) | (h[26] << 16) | (static_cast<std::uint32_t>(h[27]) << 24);
  if (crc_header != crc_expected)
    return fail(ErrorCode::data, at(file, fmt::format("its header's checksum {:08x} differs from the manifest's {:08x}",
                                                      crc_header, crc_expected)));
  if (verify) {
    auto crc = payload_crc(fd, file, expected);
    if (!crc) return tl::unexpected(crc.error());
    if (*crc != crc_expected)
      return fail(ErrorCode::data, at(file, fmt::format("wrong checksum: the payload's CRC-32 is {:08x}, the manifest says "
                                                        "{:08x} (the file is damaged)", *crc, crc_expected)));
  }
  m->bytes = expected;
  return m;
}

class ShardSource final : public Source {
 public:
  ShardSource(Layout l, std::int64_t per_shard, std::int64_t samples, std::vector<std::unique_ptr<ShardFile>> maps, fs::path dir,
              std::string identity)
      : l_(std::move(l)), per_shard_(per_shard), samples_(samples), maps_(std::move(maps)), dir_(std::move(dir)),
        identity_(std::move(identity)) {}
  std::string identity() const override { return identity_; }
  std::int64_t size() const override { return samples_; }
  std::vector<std::int64_t> input_shape() const override { return l_.input_shape; }
  std::int64_t classes() const override { return l_.classes ? std::max<std::int64_t>(l_.num_classes, 1) : 0; }

  Expected<Batch> batch(const torch::Tensor& indices, const SampleContext&) const override {
    const auto idx = indices.to(torch::kLong).contiguous();
    const std::int64_t n = idx.size(0);
    const auto* ip = idx.data_ptr<std::int64_t>();
    std::vector<std::int64_t> xs{n}, ys{n};
    xs.insert(xs.end(), l_.input_shape.begin(), l_.input_shape.end());
    ys.insert(ys.end(), l_.target_shape.begin(), l_.target_shape.end());
    auto x = torch::empty(xs, l_.pixels ? torch::kUInt8 : torch::kFloat32);
    auto y = torch::empty(ys, l_.classes ? torch::kLong : torch::kFloat32);
    auto* xp = static_cast<unsigned char*>(x.data_ptr());
    auto* yp = static_cast<unsigned char*>(y.data_ptr());
    const auto in_bytes = static_cast<std::size_t>(l_.input_bytes());
    const auto out_bytes = static_cast<std::size_t>(l_.record_bytes()) - in_bytes;
    std::vector<unsigned char> record(in_bytes + out_bytes);
    for (std::int64_t i = 0; i < n; ++i) {
      if (ip[i] < 0 || ip[i] >= samples_)
        return fail(ErrorCode::data, fmt::format("{}: sample {} is out of range (0 to {})", dir_.string(), ip[i], samples_ - 1));
      const auto k = static_cast<std::size_t>(ip[i] / per_shard_);
      const ShardFile& m = *maps_[k];
      const auto off = static_cast<off_t>(kHeader + static_cast<std::size_t>((ip[i] % per_shard_) * l_.record_bytes()));
      if (const auto got = ::pread(m.fd, record.data(), record.size(), off); got != static_cast<ssize_t>(record.size()))
        return fail(ErrorCode::io,
                    got < 0 ? fmt::format("{}: cannot read sample {}: {}", dir_.string(), ip[i], std::strerror(errno))
                            : fmt::format("{}: cannot read sample {}: its shard ends at byte {}, before the record ({} "
                                          "bytes at {}); the file was cut after it was opened (pack it again)",
                                          dir_.string(), ip[i], static_cast<std::int64_t>(off) + got, record.size(), off));
      std::memcpy(xp + i * in_bytes, record.data(), in_bytes);
      std::memcpy(yp + i * out_bytes, record.data() + in_bytes, out_bytes);
    }
    if (l_.pixels) x = detail::scale_pixels(x, l_.scale.normalize, l_.scale.mean, l_.scale.std);
    if (l_.classes && l_.num_classes > 0) {
      const auto bad = y.lt(0).logical_or(y.ge(l_.num_classes)).reshape({n, -1}).any(1).nonzero();
      if (bad.numel() > 0) {
        const auto k = bad[0][0].item<std::int64_t>();
        return fail(ErrorCode::data, fmt::format("{}: sample {} has a class outside 0 to {}", dir_.string(), ip[k], l_.num_classes - 1));
      }
    }
    return Batch{std::move(x), std::move(y)};
  }

 private:
  Layout l_;
  std::int64_t per_shard_, samples_;
  std::vector<std::unique_ptr<ShardFile>> maps_;
  fs::path dir_;
  std::string identity_;
};

std::vector<std::int64_t> shape_of(const json& j, const char* what) {
  auto v = j.get<std::vector<std::int64_t>>();
  std::int64_t elems = 1;  // checked as it grows: no overflow
  for (auto d : v) {
    if (d < 1 || d > (std::int64_t{1} << 31)) throw std::runtime_error(fmt::format("{}: a dimension of {} is outside [1, 2^31]", what, d));
    elems *= d;
    if (elems > (std::int64_t{1} << 31)) throw std::runtime_error(fmt::format("{}: more than 2^31 elements", what));
  }
  return v;
}

struct Manifest {
  Layout l;
  std::int64_t samples = 0, per_shard = 0;
  std::string name;
  std::vector<std::tuple<std::string, std::int64_t, std::uint32_t>> files;
};

/// The manifest's fields, each checked (a file is outside input); throws on a bad one.
Manifest read_manifest(const json& j) {
  Manifest m;
  if (j.at("format") != "baton-shards") throw std::runtime_error("format: not \"baton-shards\"");
  if (j.at("version").get<int>() != kVersion)
    throw std::runtime_error(fmt::format("version {} (this baton reads version {})", j.at("version").dump(), kVersion));
  m.samples = j.at("samples").get<std::int64_t>();
  m.per_shard = j.at("records_per_shard").get<std::int64_t>();
  m.name = j.at("name").get<std::string>();
  const auto& in = j.at("input");
  const auto dtype = in.at("dtype").get<std::string>();
  if (dtype != "uint8" && dtype != "float32") throw std::runtime_error("input.dtype: \"" + dtype + "\" is not uint8 or float32");
  m.l.pixels = dtype == "uint8";
  m.l.input_shape = shape_of(in.at("shape"), "input.shape");
  if (m.l.pixels) {
    const auto& p = in.at("pixels");
    m.l.scale = {p.at("normalize").get<bool>(), p.at("mean").get<double>(), p.at("std").get<double>()};
    if (m.l.scale.normalize && !(m.l.scale.std > 0)) throw std::runtime_error("input.pixels.std: must be > 0");
  }
  const auto tdtype = j.at("target").at("dtype").get<std::string>();
  if (tdtype != "int64" && tdtype != "float32") throw std::runtime_error("target.dtype: \"" + tdtype + "\" is not int64 or float32");
  m.l.classes = tdtype == "int64";
  const auto& ts = j.at("target").at("shape");
  m.l.target_shape = ts.empty() ? std::vector<std::int64_t>{} : shape_of(ts, "target.shape");
  m.l.num_classes = j.at("classes").get<std::int64_t>();
  if (j.at("record_bytes").get<std::int64_t>() != m.l.record_bytes())
    throw std::runtime_error(fmt::format("record_bytes {} does not match input and target ({})", j.at("record_bytes").dump(), m.l.record_bytes()));
  if (m.samples < 1 || m.per_shard < 1 || m.l.num_classes < 0) throw std::runtime_error("samples and records_per_shard must be >= 1, classes >= 0");
  // Bounded so that every byte offset fits in 63 bits (a file is outside input: no overflow).
  if (m.samples > (std::int64_t{1} << 62) / m.l.record_bytes())
    throw std::runtime_error(fmt::format("samples ({}) times record_bytes ({}) is beyond 2^62 bytes", m.samples, m.l.record_bytes()));
  for (const auto& s : j.at("shards")) {
    const auto file = s.at("file").get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file[0] == '.')
      throw std::runtime_error("shards: file \"" + file + "\" is not a plain name in the directory");
    m.files.emplace_back(file, s.at("records").get<std::int64_t>(), s.at("crc32").get<std::uint32_t>());
  }
  return m;
}

Expected<Dataset> open_shards(const fs::path& dir, const ShardOptions& options) {
  const fs::path mf = dir / "shards.json";
  if (auto ok = detail::check_regular_file(mf, "shard manifest"); !ok) return tl::unexpected(ok.error());
  Manifest m;
  try {
    std::ifstream in(mf, std::ios::binary);
    m = read_manifest(json::parse(in));
  } catch (const json::parse_error& e) {
    // nlohmann's text ("[json.exception.parse_error.101] ...") says where, in its own words.
    return fail(ErrorCode::data, at(mf, fmt::format("not a valid shard manifest: not JSON (a syntax error at byte {}; "
                                                    "the manifest is written by baton pack)", e.byte)));
  } catch (const json::exception& e) {
    const std::string what = e.what();  // "[json.exception.out_of_range.403] key 'samples' not found"
    return fail(ErrorCode::data, at(mf, fmt::format("not a valid shard manifest: a field is missing or of the wrong type "
                                                    "({}; the manifest is written by baton pack)",
                                                    what.substr(what.find("] ") == std::string::npos ? 0 : what.find("] ") + 2))));
  } catch (const std::exception& e) {
    return fail(ErrorCode::data, at(mf, fmt::format("not a valid shard manifest: {}", e.what())));
  }
  const auto want = static_cast<std::size_t>((m.samples + m.per_shard - 1) / m.per_shard);
  if (m.files.size() != want)
    return fail(ErrorCode::data, at(mf, fmt::format("{} shards listed; {} samples of {} per shard need {}", m.files.size(),
                                                    m.samples, m.per_shard, want)));
  std::vector<std::unique_ptr<ShardFile>> maps;
  for (std::size_t k = 0; k < m.files.size(); ++k) {
    const auto& [file, records, crc] = m.files[k];
    const std::int64_t expect = std::min(m.per_shard, m.samples - static_cast<std::int64_t>(k) * m.per_shard);
    if (records != expect) return fail(ErrorCode::data, at(mf, fmt::format("shard {} lists {} records, expected {}", file, records, expect)));
    auto opened = open_shard(dir / file, records, m.l.record_bytes(), crc, options.verify);
    if (!opened) return tl::unexpected(opened.error());
    maps.push_back(std::move(*opened));
  }
  // The shards' payload checksums (from the manifest) stand for their contents.
  detail::Sha256 sha;
  for (const auto& [file, records, crc] : m.files) sha.update(fmt::format("{} {} {:08x}\n", file, records, crc));
  auto identity = fmt::format("shards sha256 {}, normalize={} mean={} std={}", detail::hex(sha.finish()).substr(0, 16),
                              m.l.scale.normalize, m.l.scale.mean, m.l.scale.std);
  return make_dataset(std::make_shared<ShardSource>(m.l, m.per_shard, m.samples, std::move(maps), dir, std::move(identity)),
                      m.name);
}
}  // namespace

Expected<PackSummary> pack(const Dataset& dataset, const fs::path& dir, const PackOptions& options) {
  if (auto ok = dataset.validate(); !ok) return tl::unexpected(ok.error());
  if (options.records_per_shard < 1)
    return fail(ErrorCode::invalid_argument, fmt::format("pack: records_per_shard must be >= 1, got {}", options.records_per_shard));
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir, ec)))
    return fail(ErrorCode::io, fmt::format("{}: already exists; pack writes a new directory", dir.string()));
  auto probe = dataset.range(0, 1);
  if (!probe) return tl::unexpected(probe.error());
  Layout l;
  l.pixels = options.pixels.has_value();
  if (l.pixels) l.scale = *options.pixels;
  l.input_shape = dataset.input_shape();
  l.classes = dataset.class_targets();
  l.target_shape = {probe->targets.sizes().begin() + 1, probe->targets.sizes().end()};
  l.num_classes = dataset.classes();
  const fs::path tmp = dir.parent_path() / fmt::format(".{}.tmp-{}", dir.filename().string(), ::getpid());
  fs::create_directory(tmp, ec);
  if (ec) return fail(ErrorCode::io, fmt::format("{}: cannot create: {}", tmp.string(), ec.message()));
  Expected<PackSummary> sum = fail(ErrorCode::io, "pack: not written");
  try {
    sum = write_shards(dataset, tmp, l, options);
  } catch (const detail::BatonException& e) {
    sum = tl::unexpected(e.error);
  }
  if (sum) {
    fs::rename(tmp, dir, ec);
    if (ec) sum = fail(ErrorCode::io, fmt::format("{}: cannot rename {} to it: {}", dir.string(), tmp.string(), ec.message()));
  }
  if (!sum) fs::remove_all(tmp, ec);  // ours, made above
  return sum;
}

Expected<Dataset> shards(const fs::path& dir, const ShardOptions& options) {
  auto ds = open_shards(dir, options);
  if (ds) ds->origin = {"shards", {{"dir", detail::absolute_path(dir)}, {"verify", options.verify}}};
  return ds;
}

}  // namespace baton::data
