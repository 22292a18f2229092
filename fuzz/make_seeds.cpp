// Writes the checkpoint seeds of fuzz/corpus/fuzz_checkpoint: a real checkpoint of a tiny MLP, in
// both framings fuzz_checkpoint.cpp reads (byte 0: as-is; byte 1: without its checksum).
// Usage: fuzz_make_seeds <corpus/fuzz_checkpoint directory>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

#include "baton/checkpoint.hpp"
#include "baton/model.hpp"
#include "baton/state.hpp"

int main(int argc, char** argv) {
  if (argc != 2) { std::cerr << "usage: fuzz_make_seeds DIR\n"; return 2; }
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
