// Checkpoint files. The first input byte picks the framing: even, the rest is the file as-is
// (framing, truncation, checksum); odd, the harness appends the correct SHA-256, so the header
// JSON and tensor descriptors behind the checksum get fuzzed too.
#include <openssl/evp.h>

#include <array>
#include <cstdint>
#include <string>

#include "baton/checkpoint.hpp"
#include "baton/model.hpp"
#include "fuzz_common.hpp"

namespace {
std::string sha256(std::string_view bytes) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), md.data(), &n, EVP_sha256(), nullptr);
  return {reinterpret_cast<const char*>(md.data()), n};
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) bytes += sha256(bytes);
  const auto path = baton::fuzz::write_file("in.baton", bytes);
  static const baton::ModelFactory factory = baton::models::mlp({2, 3, 2});
  auto info = baton::read_checkpoint_info(path);
  if (!info && info.error().message.empty()) baton::fuzz::fail("an error without a message");
  auto state = baton::load_checkpoint(path, factory);
  if (!state && state.error().message.empty()) baton::fuzz::fail("an error without a message");
  return 0;
}
