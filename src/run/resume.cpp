// Resuming a run directory and starting it over (internal.hpp).
#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <torch/torch.h>

#include "baton/checkpoint.hpp"
#include "run/internal.hpp"

namespace baton::detail {
namespace fs = std::filesystem;

namespace {
/// Lines of one text not in the other, for "the config changed" messages.
std::string config_diff(const std::string& before, const std::string& after) {
  auto lines = [](const std::string& t) {
    std::vector<std::string> v;
    std::stringstream ss(t);
    for (std::string l; std::getline(ss, l);) v.push_back(l);
    return v;
  };
  const auto a = lines(before), b = lines(after);
  std::string out;
  for (const auto& l : a)
    if (std::find(b.begin(), b.end(), l) == b.end()) out += "  - " + l + "\n";
  for (const auto& l : b)
    if (std::find(a.begin(), a.end(), l) == a.end()) out += "  + " + l + "\n";
  return out;
}
}  // namespace

Expected<std::optional<Resume>> find_resume(const fs::path& dir, const std::string& fingerprint, const std::string& config,
                                            const ModelFactory& factory) {
  for (const auto& path : list_checkpoints(dir / "checkpoints")) {
    auto info = read_checkpoint_info(path);
    if (!info) {
      fmt::print(stderr, "baton: skipping checkpoint {}: {}\n", path.string(), info.error().message);
      continue;
    }
    if (info->meta.config_fingerprint != fingerprint) {
      std::string before;
      if (std::ifstream old(dir / "config.toml"); old) before.assign(std::istreambuf_iterator<char>(old), {});
      return fail(ErrorCode::invalid_spec,
                  fmt::format("{} holds a run of another configuration (its checkpoint {} has fingerprint {}, this "
                              "one {}); resuming would not train what the file says. Changes:\n{}Run with --fresh to "
                              "start over (its checkpoints and metrics are removed), or use another --run-dir",
                              dir.string(), path.filename().string(), info->meta.config_fingerprint.substr(0, 12),
                              fingerprint.substr(0, 12), config_diff(before, config)));
    }
    auto state = load_checkpoint(path, factory);
    if (!state) {
      fmt::print(stderr, "baton: skipping checkpoint {}: {}\n", path.string(), state.error().message);
      continue;
    }
    const auto done = info->meta.extra.find("stage_done");
    return std::optional<Resume>(
        Resume{std::move(*state), info->meta.stage_index, done != info->meta.extra.end() && done->second == "1", path});
  }
  return std::optional<Resume>{};
}

void remove_unfinished_writes(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir / "checkpoints", ec))
    if (const auto f = e.path().filename().string(); f.rfind(".ckpt-", 0) == 0 && f.find(".tmp-") != std::string::npos) {
      fmt::print(stderr, "baton: removing {} (an unfinished checkpoint write of an earlier run)\n", e.path().string());
      fs::remove(e.path(), ec);
    }
}

void remove_run_files(const fs::path& dir) {
  std::error_code ec;
  for (const char* f : {"metrics.jsonl", "metrics.csv", "final.baton", "report.html", "config.toml"}) fs::remove(dir / f, ec);
  for (const auto& p : list_checkpoints(dir / "checkpoints")) fs::remove(p, ec);
  // Unfinished writes of a killed run (`.<name>.tmp-<pid>`) and TensorBoard files of baton's.
  for (const fs::path& sub : {dir, dir / "checkpoints", dir / "tensorboard"})
    for (const auto& e : fs::directory_iterator(sub, ec)) {
      const auto f = e.path().filename().string();
      if ((f.front() == '.' && f.find(".tmp-") != std::string::npos) ||
          (f.rfind("events.out.tfevents.", 0) == 0 && f.ends_with(".baton")))
        fs::remove(e.path(), ec);
    }
  for (const char* sub : {"checkpoints", "tensorboard"})
    if (fs::is_empty(dir / sub, ec)) fs::remove(dir / sub, ec);
}

}  // namespace baton::detail
