#pragma once
// Shared by the fuzz targets: a scratch file per process, and a registry whose loaders do not
// touch the disk or allocate what a fuzzed number asks for (the loaders have targets of their own).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "baton/hparams.hpp"

namespace baton::fuzz {

/// A directory of this process's own, removed at exit.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("baton-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] { std::error_code ec; std::filesystem::remove_all(scratch_dir(), ec); });
    return d;
  }();
  return dir;
}

/// Writes `bytes` to `name` in the scratch directory and returns its path.
inline std::filesystem::path write_file(const std::string& name, std::string_view bytes) {
  auto path = scratch_dir() / name;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

/// Stops the run with a message: the fuzzer records the input as a crash.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::abort();
}

/// The built-in registry with the same keys and checks, but every dataset a tiny synthetic set and
/// every model a tiny MLP: curriculum fuzzing exercises parsing and validation, not file loading
/// or allocations of a size the input chooses.
inline Registry offline_registry() {
  Registry r = Registry::builtin();
  const DatasetEntry tiny = r.datasets.at("synthetic");
  for (auto& [kind, entry] : r.datasets)
    entry.load = [load = tiny.load](const Params&) {
      return load({{"samples", 16.0}, {"features", 4.0}, {"classes", 3.0}});
    };
  for (auto& [name, entry] : r.models)
    entry.make = [make = entry.make](const Params& p) -> Expected<ModelFactory> {
      auto checked = make(p);  // the real checks of the parameters; the factory is not called
      if (!checked) return checked;
      return models::mlp({4, 3});
    };
  return r;
}

}  // namespace baton::fuzz
