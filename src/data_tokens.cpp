// Token shards (text.hpp: pack_tokens, token_shards): a language model's token stream on disk as
// little-endian uint16 files with a manifest and the tokenizer beside them.
#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <zlib.h>

#include "baton/text.hpp"
#include "data_internal.hpp"
#include "detail.hpp"
#include "io.hpp"
#include "text_internal.hpp"

namespace baton::text {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
constexpr int kTokensVersion = 1;

std::string token_shard_name(std::int64_t k) { return fmt::format("tokens-{:05d}.bin", k); }

std::uint32_t crc_of(const unsigned char* p, std::size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (std::size_t at = 0; at < n;) {  // zlib takes uInt lengths
    const auto step = std::min<std::size_t>(n - at, std::size_t{1} << 30);
    crc = crc32(crc, p + at, static_cast<uInt>(step));
    at += step;
  }
  return static_cast<std::uint32_t>(crc);
}

/// The shards, manifest and tokenizer of `tokens` into `tmp` (an empty directory of ours).
Expected<TokenPackSummary> write_tokens(const torch::Tensor& tokens, const Tokenizer& tokenizer, const fs::path& tmp,
                                        const TokenPackOptions& o) {
  TokenPackSummary sum;
  json list = json::array();
  const auto* ids = tokens.data_ptr<std::int64_t>();
  const auto n = tokens.numel();
  for (std::int64_t first = 0; first < n; first += o.tokens_per_shard) {
    const auto count = std::min(o.tokens_per_shard, n - first);
    std::vector<unsigned char> bytes(static_cast<std::size_t>(count) * 2);
    for (std::int64_t i = 0; i < count; ++i) {
      const auto v = static_cast<std::uint16_t>(ids[first + i]);
      bytes[static_cast<std::size_t>(2 * i)] = static_cast<unsigned char>(v & 0xFF);
      bytes[static_cast<std::size_t>(2 * i + 1)] = static_cast<unsigned char>(v >> 8);
    }
    const auto name = token_shard_name(sum.shards);
    if (auto ok = baton::detail::write_file_atomic(tmp / name, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                                                   "token shard");
        !ok)
      return tl::unexpected(ok.error());
    list.push_back({{"file", name}, {"tokens", count}, {"crc32", crc_of(bytes.data(), bytes.size())}});
    sum.tokens += count, sum.bytes += static_cast<std::int64_t>(bytes.size());
    ++sum.shards;
  }
  if (!tokenizer.bytes()) {
    if (auto ok = tokenizer.save(tmp / "tokenizer.model"); !ok) return tl::unexpected(ok.error());
    sum.bytes += static_cast<std::int64_t>(tokenizer.model().size());
  }
  const json manifest = {{"format", "baton-tokens"},      {"version", kTokensVersion},        {"tokenizer", tokenizer.identity()},
                         {"vocab_size", tokenizer.vocab_size()}, {"end_of_text", tokenizer.end_of_text()}, {"tokens", sum.tokens},
                         {"dtype", "uint16-le"},            {"shards", list},
                         {"byte_lengths", tokenizer.byte_lengths()}};  // for bits per byte without the tokenizer
  const auto text = manifest.dump(2) + "\n";
  if (auto ok = baton::detail::write_file_atomic(tmp / "tokens.json", text, "manifest"); !ok) return tl::unexpected(ok.error());
  sum.bytes += static_cast<std::int64_t>(text.size());
  return sum;
}

}  // namespace

Expected<TokenPackSummary> pack_tokens(const Dataset& lm, const fs::path& dir, const TokenPackOptions& o) {
  const auto stream = lm_internal::stream_of(lm);
  if (!stream && (lm.origin.kind == "fortunes_lm" || lm.origin.kind == "token_shards"))
    return fail(ErrorCode::invalid_argument, fmt::format("pack_tokens: \"{}\" is a part of a language-model dataset (`limit`, a "
                                                         "slice or a hold-out); token shards hold a whole stream: pack the "
                                                         "dataset without its limit", lm.name));
  if (!stream)
    return fail(ErrorCode::invalid_argument, fmt::format("pack_tokens: \"{}\" is not a language-model dataset (lm_windows, "
                                                         "fortunes_lm, token_shards); data::pack writes any dataset", lm.name));
  if (o.tokens_per_shard < 1)
    return fail(ErrorCode::invalid_argument, fmt::format("pack_tokens: tokens_per_shard must be at least 1, got {}", o.tokens_per_shard));
  if (stream->tokenizer.vocab_size() > 65536)
    return fail(ErrorCode::invalid_argument, fmt::format("pack_tokens: a vocabulary of {} tokens does not fit 16 bits",
                                                         stream->tokenizer.vocab_size()));
  std::error_code ec;
  if (fs::exists(dir, ec)) return fail(ErrorCode::io, fmt::format("{}: exists; token shards go to a new directory", dir.string()));
  const auto parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
  const fs::path tmp = parent / fmt::format(".{}.tmp-{}", dir.filename().string(), ::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return fail(ErrorCode::io, fmt::format("{}: cannot create: {}", tmp.string(), ec.message()));
  auto sum = baton::detail::guard([&] { return write_tokens(stream->tokens.contiguous(), stream->tokenizer, tmp, o); });
  if (sum) fs::rename(tmp, dir, ec);
  if (!sum || ec) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    if (!sum) return sum;
    return fail(ErrorCode::io, fmt::format("{}: cannot move the shards into place: {}", dir.string(), ec.message()));
  }
  return sum;
}

Expected<Dataset> token_shards(const fs::path& dir, const TokenShardOptions& o) {
  if (o.block_size < 1) return fail(ErrorCode::invalid_argument, fmt::format("token_shards: block_size must be at least 1, got {}", o.block_size));
  const auto mf = dir / "tokens.json";
  auto text = baton::detail::read_file(mf, "token shards' manifest (baton pack of a language-model dataset)");
  if (!text) return tl::unexpected(text.error());
  return baton::detail::guard([&]() -> Expected<Dataset> {
    json m;
    try {
      m = json::parse(*text);
      if (m.value("format", "") != "baton-tokens" || m.value("version", 0) != kTokensVersion)
        return fail(ErrorCode::data, fmt::format("{}: not a baton token-shard manifest of version {}", mf.string(), kTokensVersion));
      Tokenizer tokenizer;
      const auto identity = m.at("tokenizer").get<std::string>();
      if (identity != tokenizer.identity()) {
        auto model = baton::detail::read_file(dir / "tokenizer.model", "tokenizer");
        if (!model) return tl::unexpected(model.error());
        auto t = Tokenizer::from_model(std::move(*model), (dir / "tokenizer.model").string());
        if (!t) return tl::unexpected(t.error());
        if (t->identity() != identity)
          return fail(ErrorCode::data, fmt::format("{}: is {}, but the manifest names {}: they do not belong together",
                                                   (dir / "tokenizer.model").string(), t->identity(), identity));
        tokenizer = *t;
      }
      const auto total = m.at("tokens").get<std::int64_t>();
      if (total < o.block_size + 1)
        return fail(ErrorCode::invalid_argument, fmt::format("{}: {} tokens, fewer than block_size + 1 = {}", mf.string(), total,
                                                             o.block_size + 1));
      auto stream = torch::empty({total}, torch::kLong);
      auto* out = stream.data_ptr<std::int64_t>();
      std::int64_t at = 0;
      for (const auto& s : m.at("shards")) {
        const auto file = dir / s.at("file").get<std::string>();
        const auto count = s.at("tokens").get<std::int64_t>();
        auto bytes = baton::detail::read_file(file, "token shard");
        if (!bytes) return tl::unexpected(bytes.error());
        if (static_cast<std::int64_t>(bytes->size()) != 2 * count || at + count > total)
          return fail(ErrorCode::data, fmt::format("{}: {} bytes, but the manifest says {} tokens ({} bytes): truncated or not "
                                                   "this manifest's", file.string(), bytes->size(), count, 2 * count));
        const auto* p = reinterpret_cast<const unsigned char*>(bytes->data());
        if (o.verify && crc_of(p, bytes->size()) != s.at("crc32").get<std::uint32_t>())
          return fail(ErrorCode::data, fmt::format("{}: wrong checksum (damaged)", file.string()));
        for (std::int64_t i = 0; i < count; ++i) {
          const std::int64_t id = p[2 * i] | (p[2 * i + 1] << 8);
          if (id >= tokenizer.vocab_size())
            return fail(ErrorCode::data, fmt::format("{}: token {} at {} is beyond the vocabulary of {} ({})", file.string(), id, i,
                                                     tokenizer.vocab_size(), tokenizer.identity()));
          out[at + i] = id;
        }
        at += count;
      }
      if (at != total)
        return fail(ErrorCode::data, fmt::format("{}: its shards hold {} tokens, but it says {}", mf.string(), at, total));
      auto ds = lm_internal::lm_over(std::move(stream), tokenizer, o.block_size, o.name);
      if (!ds) return ds;
      ds->origin = {"token_shards", {{"dir", baton::detail::absolute_path(dir)}, {"block_size", static_cast<double>(o.block_size)}}};
      if (!tokenizer.bytes()) ds->origin.keys["tokenizer"] = baton::detail::absolute_path(dir / "tokenizer.model");
      return ds;
    } catch (const json::exception& e) {
      return fail(ErrorCode::data, fmt::format("{}: damaged manifest: {}", mf.string(), e.what()));
    }
  });
}

}  // namespace baton::text
