// Writes the checkpoint seeds of fuzz/corpus/fuzz_checkpoint: a real checkpoint of a tiny MLP, in
// both framings fuzz_checkpoint.cpp reads (byte 0: as-is; byte 1: without its checksum); and,
// given a second directory, the seeds of fuzz_shards: tiny real packs (8-bit pixels with classes,
// float32 inputs with float32 targets) in its framing, with and without CRC verification.
// Usage: fuzz_make_seeds <corpus/fuzz_checkpoint directory> [<corpus/fuzz_shards directory>]
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

#include "baton/checkpoint.hpp"
#include "baton/data.hpp"
#include "baton/model.hpp"
#include "baton/state.hpp"

#include <torch/torch.h>

namespace {
std::string slurp(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Packs `ds` and writes it as fuzz_shards reads it: mode byte, manifest length, manifest, shard.
int shard_seeds(const baton::Dataset& ds, const baton::data::PackOptions& options, const std::filesystem::path& dir,
                const std::string& name) {
  const auto packed = dir / ("tmp-" + name);
  if (auto ok = baton::data::pack(ds, packed, options); !ok) {
    std::cerr << ok.error() << '\n';
    return 1;
  }
  const std::string manifest = slurp(packed / "shards.json"), shard = slurp(packed / "shard-00000.bin");
  std::filesystem::remove_all(packed);
  for (const char mode : {'\0', '\1'}) {
    std::ofstream out(dir / (name + (mode ? "-verified" : "-unverified")), std::ios::binary);
    out << mode << static_cast<char>(manifest.size() & 0xff) << static_cast<char>(manifest.size() >> 8) << manifest << shard;
  }
  return 0;
}

int all_shard_seeds(const std::filesystem::path& dir) {
  auto pixels = baton::make_dataset(torch::arange(5 * 16, torch::kFloat).div(255).reshape({5, 1, 4, 4}),
                                    torch::tensor({0, 1, 2, 1, 0}, torch::kLong), "pixels");
  auto values = baton::make_dataset(torch::linspace(-1, 1, 6).reshape({3, 2}), torch::linspace(0, 1, 3).reshape({3, 1}), "values");
  if (!pixels || !values) {
    std::cerr << (pixels ? values.error() : pixels.error()) << '\n';
    return 1;
  }
  if (int rc = shard_seeds(*pixels, {.records_per_shard = 8, .pixels = baton::data::ImageOptions{.normalize = false}}, dir, "pixels-classes")) return rc;
  return shard_seeds(*values, {.records_per_shard = 8}, dir, "float-values");
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) { std::cerr << "usage: fuzz_make_seeds CHECKPOINT_DIR [SHARDS_DIR]\n"; return 2; }
  if (argc == 3)
    if (int rc = all_shard_seeds(argv[2])) return rc;
  const std::filesystem::path dir = argv[1];
  auto state = baton::init_state(baton::models::mlp({2, 3, 2}), {.seed = 1, .max_duration = baton::Time::epochs(2)});
  if (!state) { std::cerr << state.error() << '\n'; return 1; }
  const auto file = dir / "tmp.baton";
  if (auto ok = baton::save_checkpoint(*state, file, {.run_name = "seed", .stage_index = 0}); !ok) {
    std::cerr << ok.error() << '\n';
    return 1;
  }
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::filesystem::remove(file);
  std::ofstream(dir / "mlp-as-is", std::ios::binary) << '\0' << bytes;
  std::ofstream(dir / "mlp-checksummed", std::ios::binary) << '\1' << bytes.substr(0, bytes.size() - 32);
  return 0;
}
