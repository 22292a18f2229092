// Checkpoint file names in a directory: naming, listing, pruning (checkpoint.hpp). One place
// for the rule, used by fit's checkpoint policy and by run directories.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "baton/checkpoint.hpp"

namespace baton {
namespace fs = std::filesystem;
namespace {
/// "ckpt-" + 10 digits, then ".baton" (interval) or "-end.baton" (stage end).
bool checkpoint_file(const std::string& f, bool* stage_end) {
  if (f.rfind("ckpt-", 0) != 0 || f.size() < 21) return false;
  if (!std::all_of(f.begin() + 5, f.begin() + 15, [](char c) { return c >= '0' && c <= '9'; })) return false;
  const std::string rest = f.substr(15);
  if (rest != ".baton" && rest != "-end.baton") return false;
  if (stage_end) *stage_end = rest == "-end.baton";
  return true;
}
}  // namespace

std::string checkpoint_name(std::int64_t batch, bool stage_end) {
  return fmt::format("ckpt-{:010}{}.baton", batch, stage_end ? "-end" : "");
}

std::vector<fs::path> list_checkpoints(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (checkpoint_file(e.path().filename().string(), nullptr)) out.push_back(e.path());
  // At one batch an interval (or interrupt) checkpoint is newer than a stage-end one: it was
  // written by the next stage, before its first step.
  auto key = [](const fs::path& p) {
    bool end = false;
    checkpoint_file(p.filename().string(), &end);
    return std::pair(p.filename().string().substr(5, 10), !end);
  };
  std::sort(out.begin(), out.end(), [&](const fs::path& a, const fs::path& b) { return key(a) > key(b); });
  return out;
}

void prune_checkpoints(const fs::path& dir, int keep) {
  if (keep <= 0) return;
  std::vector<fs::path> interval;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (bool end = false; checkpoint_file(e.path().filename().string(), &end) && !end) interval.push_back(e.path());
  std::sort(interval.begin(), interval.end());
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < interval.size(); ++i) fs::remove(interval[i], ec);
}

}  // namespace baton
