// Checkpoints: a whole TrainState in one file, written atomically, verified on load.
// The byte layout is specified in docs/checkpoint.md; keep the two in step.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <nlohmann/json.hpp>
#include <openssl/evp.h>
#include <torch/torch.h>

#include "baton/checkpoint.hpp"
#include "detail.hpp"
#include "checkpoint_header.hpp"
#include "io.hpp"

namespace baton {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace detail::ckpt;

// Integers are written in host order and tensor bytes raw, so the host order must be the format's.
static_assert(std::endian::native == std::endian::little, "baton checkpoints are little-endian");

constexpr std::string_view kMagic = "BATONCKP";
using detail::AtomicFile;
using detail::hex;
using detail::Sha256;
constexpr std::size_t kDigestSize = detail::kSha256Size;

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// ------------------------------------------------------------------ writing
// ------------------------------------------------------------------ reading
std::string read_all(const fs::path& path) {
  auto fail_io = [&](const char* what) {
    const int err = errno;
    detail::raise(ErrorCode::io, fmt::format("cannot {} checkpoint \"{}\": {}", what, path.string(), std::strerror(err)));
  };
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail_io("open");
  std::unique_ptr<const int, void (*)(const int*)> closer(&fd, [](const int* f) { ::close(*f); });
  struct stat st{};
  if (::fstat(fd, &st) != 0) fail_io("stat");
  if (!S_ISREG(st.st_mode))
    detail::raise(ErrorCode::io, fmt::format("cannot read checkpoint \"{}\": not a regular file", path.string()));
  std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail_io("read");
    if (r == 0) break;  // shrank while reading: the checks below see a truncated file
    got += static_cast<std::size_t>(r);
  }
  bytes.resize(got);
  return bytes;
}

/// A checkpoint whose framing and checksum have been verified.
struct Verified {
  std::uint32_t version = 0;
  json header;
  std::string_view data;  // the tensor data section, inside `bytes`
  std::string bytes;
};


Verified read_verified(const fs::path& path) {
  Verified v;
  v.bytes = read_all(path);
  const std::string_view b = v.bytes;
  std::size_t at = 0;
  // Every length is checked against what remains before it is used.
  auto need = [&](std::uint64_t n, const char* part) {
    if (n > b.size() - at)
      raise_data(path, fmt::format("truncated: the file ends ({} bytes) inside the {} (an interrupted copy?)",
                                   b.size(), part));
  };
  auto take = [&]<class T>(T& out, const char* part) {
    need(sizeof out, part);
    std::memcpy(&out, b.data() + at, sizeof out);
    at += sizeof out;
  };
  const std::size_t magic_seen = std::min(b.size(), kMagic.size());
  if (b.substr(0, magic_seen) != kMagic.substr(0, magic_seen))
    raise_data(path, "not a baton checkpoint (it does not start with \"BATONCKP\")");
  need(kMagic.size(), "magic");
  at = kMagic.size();
  take(v.version, "format version");
  // Before the checksum: a newer version may frame its content differently.
  if (v.version > checkpoint_format_version)
    raise_data(path, fmt::format("format version {} is newer than this baton reads (version {}); upgrade baton to load it",
                                 v.version, checkpoint_format_version));
  if (v.version == 0) raise_data(path, "format version 0 is not valid: the file is corrupt");
  std::uint64_t header_size = 0, data_size = 0;
  take(header_size, "header length");
  need(header_size, "header");
  const std::string_view header = b.substr(at, header_size);
  at += header_size;
  take(data_size, "tensor data length");
  need(data_size, "tensor data");
  v.data = b.substr(at, data_size);
  at += data_size;
  need(kDigestSize, "checksum");
  if (b.size() - at > kDigestSize)
    raise_data(path, fmt::format("{} unexpected bytes after the checksum: the file is corrupt", b.size() - at - kDigestSize));
  Sha256 sha;
  sha.update(b.substr(0, at));
  const auto digest = sha.finish();
  if (std::memcmp(digest.data(), b.data() + at, kDigestSize) != 0)
    raise_data(path, "checksum mismatch: the file is corrupt");
  v.header = json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (!v.header.is_object()) raise_data(path, "the header is not a JSON object: the file is corrupt");
  return v;
}

/// The stored tensors, each checked against the data section before it is allocated (only the
/// checks when `!materialize`).
std::vector<Entry> tensors_of(const Verified& v, const fs::path& path, bool materialize) {
  return decode(path, [&] {
    std::vector<Entry> out;
    std::uint64_t offset = 0;
    for (const json& d : v.header.at("tensors")) {
      Entry e{d.at("group").get<std::string>(), d.at("name").get<std::string>(), d.at("slot").get<std::int64_t>(), {}};
      const bool algorithm = e.group == "algorithm" && v.version >= 2;
      if (e.group != "parameter" && e.group != "buffer" && e.group != "optimizer_slot" && e.group != "rng" && !algorithm)
        raise_data(path, fmt::format("unknown tensor group \"{}\"", e.group));
      if (algorithm) e.owner = d.at("owner").get<std::string>();
      if (d.at("defined").get<bool>()) {
        const auto what = fmt::format("{} \"{}\"", e.group, e.name);
        const auto dtype = dtype_of(d.at("dtype").get<std::string>());
        if (!dtype) raise_data(path, fmt::format("{}: unknown dtype {}", what, d.at("dtype").dump()));
        const auto shape = d.at("shape").get<std::vector<std::int64_t>>();
        const auto nbytes = d.at("nbytes").get<std::uint64_t>();
        std::uint64_t expected = c10::elementSize(*dtype);
        for (const auto n : shape) {
          if (n < 0) raise_data(path, fmt::format("{}: negative dimension {}", what, n));
          if (n > 0 && expected > v.data.size() / static_cast<std::uint64_t>(n))
            raise_data(path, fmt::format("{}: shape {} is larger than the tensor data", what, d.at("shape").dump()));
          expected *= static_cast<std::uint64_t>(n);
        }
        if (nbytes != expected || d.at("offset").get<std::uint64_t>() != offset || nbytes > v.data.size() - offset)
          raise_data(path, fmt::format("{}: its byte range does not fit its shape or the tensor data", what));
        if (materialize) {
          e.tensor = torch::empty(shape, torch::TensorOptions().dtype(*dtype));
          if (nbytes > 0) std::memcpy(e.tensor.data_ptr(), v.data.data() + offset, nbytes);
        }
        offset += nbytes;
      }
      out.push_back(std::move(e));
    }
    if (offset != v.data.size())
      raise_data(path, fmt::format("{} bytes of tensor data belong to no tensor", v.data.size() - offset));
    return out;
  });
}

/// Installs stored tensors into the module's by name; lists every disagreement at once.
void restore_module(const TrainState& s, const std::vector<Entry>& entries, const fs::path& path) {
  std::vector<std::string> problems;
  std::vector<std::pair<torch::Tensor, const torch::Tensor*>> installs;  // module tensor, stored one
  for (const std::string group : {"parameter", "buffer"}) {
    std::map<std::string, const torch::Tensor*> stored;
    for (const auto& e : entries)
      if (e.group == group && !stored.emplace(e.name, &e.tensor).second)
        raise_data(path, fmt::format("{} \"{}\" is stored twice", group, e.name));
    for (const auto& [name, t] : group == "parameter" ? s.named_parameters() : s.named_buffers()) {
      auto it = stored.find(name);
      if (it == stored.end()) {
        problems.push_back(fmt::format("{} {} {} is missing from the checkpoint", group, name, detail::shape_string(t)));
        continue;
      }
      const torch::Tensor& saved = *it->second;
      if (saved.defined() != t.defined() || (t.defined() && saved.sizes() != t.sizes()))
        problems.push_back(fmt::format("{} {} has shape {} in the checkpoint and {} in the model", group, name,
                                       detail::shape_string(saved), detail::shape_string(t)));
      else if (t.defined())
        installs.emplace_back(t, &saved);
      stored.erase(it);
    }
    for (const auto& [name, t] : stored)
      problems.push_back(fmt::format("{} {} {} is in the checkpoint but not in the model", group, name,
                                     detail::shape_string(*t)));
  }
  if (!problems.empty())
    detail::raise(ErrorCode::shape_mismatch,
                  fmt::format("checkpoint \"{}\" does not match the model the factory builds: {}", path.string(),
                              fmt::join(problems, "; ")));
  torch::NoGradGuard no_grad;
  for (auto& [t, saved] : installs) t.set_data(*saved);  // shares the module's tensor: replaces its data
}

}  // namespace

Expected<void> save_checkpoint(const TrainState& state, const fs::path& path, const CheckpointMeta& meta) {
  return detail::guard([&]() -> Expected<void> {
    if (!state.model.module) return fail(ErrorCode::invalid_argument, "save_checkpoint: the state has no model");
    const auto entries = entries_of(state);
    const std::string header = encode_header(state, meta, entries);
    std::uint64_t data_size = 0;
    for (const auto& e : entries) data_size += byte_size(e.tensor);
    std::string head(kMagic);
    // The oldest version that holds the state: readers of version 2 keep reading every run that
    // does not scale its loss.
    put(head, state.loss_scale ? checkpoint_format_version : std::uint32_t{2});
    put(head, static_cast<std::uint64_t>(header.size()));
    head += header;
    put(head, data_size);

    AtomicFile file(path, "checkpoint");
    Sha256 sha;
    auto emit = [&](const void* p, std::size_t n) { sha.update(p, n), file.write(p, n); };
    emit(head.data(), head.size());
    for (const auto& e : entries)
      if (const auto n = byte_size(e.tensor); n > 0) emit(e.tensor.data_ptr(), n);
    const auto digest = sha.finish();
    file.write(digest.data(), digest.size());
    file.commit();
    return {};
  });
}

Expected<TrainState> load_checkpoint(const fs::path& path, const ModelFactory& factory) {
  return detail::guard([&]() -> Expected<TrainState> {
    if (!factory) return fail(ErrorCode::invalid_argument, "load_checkpoint: no model factory given");
    const Verified v = read_verified(path);
    Header h = decode_header(v.header, v.version, path);
    const std::vector<Entry> entries = tensors_of(v, path, true);

    TrainState s;
    s.factory = factory;
    {
      // The factory may draw from the global generator to initialize: keep the caller's intact.
      detail::GlobalRngScope scope(detail::seeded_rng_state(0));
      s.model = factory();
    }
    if (!s.model.module || !s.model.forward)
      return fail(ErrorCode::invalid_argument, "load_checkpoint: the model factory returned no module or no forward");
    restore_module(s, entries, path);
    s.model.module->train(true);
    s.optimizer = std::move(h.optimizer);
    for (const auto& e : entries) {
      if (e.group == "rng") {
        s.rng = e.tensor;
      } else if (e.group == "optimizer_slot") {
        auto it = s.optimizer.params.find(e.name);
        if (it == s.optimizer.params.end() || e.slot < 0 || static_cast<std::size_t>(e.slot) >= it->second.slots.size())
          raise_data(path, fmt::format("optimizer slot {} of \"{}\" is not in the optimizer state", e.slot, e.name));
        it->second.slots[static_cast<std::size_t>(e.slot)] = e.tensor;
      } else if (e.group == "algorithm") {
        s.algorithm_state[e.owner][e.name] = e.tensor;
      }
    }
    s.time = h.info.time;
    s.stage = std::move(h.info.stage);
    s.stage_start = h.stage_start;
    s.seed = h.info.seed;
    s.max_duration = h.info.max_duration;
    s.history = std::move(h.history);
    s.callback_state = std::move(h.callback_state);
    s.loss_scale = h.loss_scale;
    return s;
  });
}

Expected<CheckpointInfo> read_checkpoint_info(const fs::path& path) {
  return detail::guard([&]() -> Expected<CheckpointInfo> {
    const Verified v = read_verified(path);
    Header h = decode_header(v.header, v.version, path);
    tensors_of(v, path, false);  // a header that load_checkpoint would refuse is refused here too
    return std::move(h.info);
  });
}

std::vector<detail::ckpt::Entry> detail::ckpt::read_entries(const fs::path& path) {
  const Verified v = read_verified(path);
  decode_header(v.header, v.version, path);  // a header load_checkpoint would refuse is refused here too
  return tensors_of(v, path, true);
}

std::string params_sha256(const TrainState& state) {
  try {
    Sha256 sha;
    auto add = [&](char kind, const std::string& name, const torch::Tensor& tensor) {
      const torch::Tensor t = host(tensor);
      const std::string dtype =
          !t.defined() ? "undefined" : std::string(dtype_name(t.scalar_type()).value_or(c10::toString(t.scalar_type())));
      std::string rec(1, kind);
      put(rec, static_cast<std::uint64_t>(name.size()));
      rec += name;
      put(rec, static_cast<std::uint64_t>(dtype.size()));
      rec += dtype;
      put(rec, static_cast<std::uint64_t>(t.defined() ? t.dim() : 0));
      if (t.defined())
        for (const auto n : t.sizes()) put(rec, static_cast<std::int64_t>(n));
      put(rec, byte_size(t));
      sha.update(rec);
      if (byte_size(t) > 0) sha.update(t.data_ptr(), byte_size(t));
    };
    for (const auto& [name, t] : state.named_parameters()) add('p', name, t);
    for (const auto& [name, t] : state.named_buffers()) add('b', name, t);
    return hex(sha.finish());
  } catch (const std::exception&) {
    return {};  // documented: the tensors could not be read (e.g. a device that is gone)
  }
}

}  // namespace baton
