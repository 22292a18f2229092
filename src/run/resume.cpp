// Resuming a run directory and starting it over (internal.hpp).
#include <algorithm>
#include <array>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join
#include <torch/torch.h>

#include "baton/checkpoint.hpp"
#include "run/internal.hpp"
#include "weights.hpp"

namespace baton::detail {
namespace fs = std::filesystem;

namespace {
/// The key lines of a TOML text, each with the table it is in ("run", "stages[1]",
/// "stages[1].optimizer"), so that the same line in two stages is two lines.
std::vector<std::string> keyed_lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string table;
  int stage = -1;
  for (std::string l; std::getline(ss, l);) {
    if (l.empty() || l[0] == '#') continue;
    if (l.rfind("[[stages]]", 0) == 0) {
      table = fmt::format("stages[{}]", ++stage);
    } else if (l[0] == '[') {
      const std::string name = l.substr(1, l.find(']') - 1);
      table = name.rfind("stages.", 0) == 0 && stage >= 0 ? fmt::format("stages[{}]{}", stage, name.substr(6)) : name;
    } else {
      out.push_back(table.empty() ? l : table + ": " + l);
    }
  }
  return out;
}

/// Lines of one configuration not in the other, with their tables, for "the config changed".
std::string config_diff(const std::string& before, const std::string& after) {
  const auto a = keyed_lines(before), b = keyed_lines(after);
  std::string out;
  for (const auto& l : a)
    if (std::find(b.begin(), b.end(), l) == b.end()) out += "  - " + l + "\n";
  for (const auto& l : b)
    if (std::find(a.begin(), a.end(), l) == a.end()) out += "  + " + l + "\n";
  return out;
}
}  // namespace

std::string numerics_changes(const std::string& before, const std::string& now) {
  auto pairs = [](const std::string& text) {
    std::map<std::string, std::string> out;
    std::istringstream in(text);
    for (std::string item; std::getline(in, item, ';');) {
      const auto b = item.find_first_not_of(' ');
      const auto eq = item.find('=');
      if (b == std::string::npos || eq == std::string::npos) continue;
      out[item.substr(b, eq - b)] = item.substr(eq + 1);
    }
    return out;
  };
  const auto a = pairs(before), b = pairs(now);
  std::string out;
  for (const auto& [key, value] : b) {
    const auto it = a.find(key);
    const std::string old = it == a.end() ? "(none)" : it->second;
    if (old != value) out += fmt::format("{}{} {} -> {}", out.empty() ? "" : ", ", key, old, value);
  }
  for (const auto& [key, value] : a)
    if (!b.count(key)) out += fmt::format("{}{} {} -> (none)", out.empty() ? "" : ", ", key, value);
  return out;
}

/// Why a checkpoint that reads back whole cannot be a point of this run: its stage index, stage
/// name or position in the stage's data do not fit. Empty when it fits.
std::string misplaced(const CheckpointInfo& info, const std::vector<TrainingSpec>& stages) {
  const auto index = info.meta.stage_index;
  if (index < 0 || static_cast<std::size_t>(index) >= stages.size())
    return fmt::format("it was written in stage {} (counting from 0), but the run has {} stages", index, stages.size());
  const TrainingSpec& spec = stages[static_cast<std::size_t>(index)];
  if (!info.stage.empty() && info.stage != spec.name)
    return fmt::format("it was written in stage \"{}\", but stage {} of the run is \"{}\"", info.stage, index, spec.name);
  const auto n = spec.data.train.size();
  if (n > 0 && info.time.sample_in_epoch > n)
    return fmt::format("it is {} samples into an epoch of stage \"{}\", whose data has {}", info.time.sample_in_epoch,
                       spec.name, n);
  return {};
}

Expected<std::optional<Resume>> find_resume(const fs::path& dir, const ResumeCheck& check, const ModelFactory& factory) {
  const std::string& fingerprint = check.fingerprint;
  const std::string& config = check.config;
  for (const auto& path : list_checkpoints(dir / "checkpoints")) {
    auto info = read_checkpoint_info(path);
    if (!info) {
      fmt::print(stderr, "baton: skipping checkpoint {}: {}\n", path.string(), info.error().message);
      continue;
    }
    if (info->meta.config_fingerprint != fingerprint) {
      std::string before;
      if (std::ifstream old(dir / "config.toml"); old) before.assign(std::istreambuf_iterator<char>(old), {});
      auto changes = config_diff(before, config);
      if (changes.empty())
        changes = "  (none in the text: the checkpoint was written by a baton whose fingerprint covered other "
                  "settings, or config.toml was edited)\n";
      return fail(ErrorCode::invalid_spec,
                  fmt::format("{} holds a run of another configuration (its checkpoint {} has fingerprint {}, this "
                              "one {}); resuming would not train what the file says. Changes:\n{}Run with --fresh to "
                              "start over (its checkpoints and metrics are removed), or use another --run-dir",
                              dir.string(), path.filename().string(), info->meta.config_fingerprint.substr(0, 12),
                              fingerprint.substr(0, 12), changes));
    }
    if (check.stages)
      if (const auto why = misplaced(*info, *check.stages); !why.empty()) {
        fmt::print(stderr, "baton: skipping checkpoint {}: {}\n", path.string(), why);
        continue;
      }
    std::string not_bit_exact;
    if (const auto nb = info->meta.extra.find("not_bit_exact"); nb != info->meta.extra.end()) not_bit_exact = nb->second;
    // Checkpoints from before the record existed (no "numerics") resume as they always did.
    if (const auto num = info->meta.extra.find("numerics"); num != info->meta.extra.end()) {
      if (const auto changes = numerics_changes(num->second, check.numerics); !changes.empty()) {
        if (!check.accept_runtime_change) {
          // How to get the same settings back, for what changed ("threads 2 -> 1, ranks 2 -> 1").
          std::vector<std::string> how;
          auto changed = [&](std::string_view key) { return (", " + changes).find(fmt::format(", {} ", key)) != std::string::npos; };
          if (changed("threads")) how.emplace_back("the same threads ([run] threads, or --set run.threads=N)");
          if (changed("ranks")) how.emplace_back("as many processes as before (baton run --nproc N, or WORLD_SIZE)");
          if (how.empty()) how.emplace_back("the same LibTorch, CPU kernels and BLAS (another machine or build changed them)");
          return fail(ErrorCode::invalid_spec,
                      fmt::format("{} was written where the numerics differ from this process's ({}): resuming here "
                                  "would not give the bits of an uninterrupted run. Resume with {}, or accept the "
                                  "change (baton run --accept-runtime-change; in C++, RunOptions::accept_runtime_change): "
                                  "the run then records that it is no longer bit-exact",
                                  path.string(), changes, fmt::join(how, " and ")));
        }
        not_bit_exact += fmt::format("{}resumed from {} with {}", not_bit_exact.empty() ? "" : "; ",
                                     path.filename().string(), changes);
      }
    }
    // The model of the checkpoint's stage: a stage may have built one of its own (a new head).
    const auto stage = static_cast<std::size_t>(std::max<std::int64_t>(0, info->meta.stage_index));
    auto state = load_checkpoint(path, check.stages ? factory_after(*check.stages, stage, factory) : factory);
    if (!state) {
      fmt::print(stderr, "baton: skipping checkpoint {}: {}\n", path.string(), state.error().message);
      continue;
    }
    const auto done = info->meta.extra.find("stage_done");
    return std::optional<Resume>(
        Resume{std::move(*state), info->meta.stage_index, done != info->meta.extra.end() && done->second == "1", path,
               std::move(not_bit_exact)});
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

namespace {
/// The files a run writes at the top of its directory.
constexpr std::array<const char*, 6> kRunFiles = {"metrics.jsonl", "metrics.csv", "final.baton", "report.html", "config.toml",
                                                   "tools.toml"};

std::string_view kind_of(fs::file_type t) {
  switch (t) {
    case fs::file_type::directory: return "a directory";
    case fs::file_type::regular: return "a regular file";
    case fs::file_type::fifo: return "a FIFO";
    case fs::file_type::socket: return "a socket";
    case fs::file_type::block:
    case fs::file_type::character: return "a device";
    default: return "not a regular file";
  }
}
}  // namespace

Expected<void> make_run_directory(const fs::path& dir) {
  std::error_code ec;
  // What stands in the way, named: create_directories says only "File exists" or "Not a directory".
  for (const fs::path& p : {dir, dir / "checkpoints"}) {
    const auto st = fs::symlink_status(p, ec);
    if (ec || !fs::exists(st)) continue;
    if (fs::is_symlink(st) && !fs::exists(p, ec))
      return fail(ErrorCode::io, fmt::format("{}: is a symbolic link to {}, which does not exist; create that directory, "
                                             "remove the link, or use another run directory", p.string(),
                                             fs::read_symlink(p, ec).string()));
    if (!fs::is_directory(p, ec))
      return fail(ErrorCode::io, fmt::format("{}: is {}, where baton keeps {}; move it away or use another run directory "
                                             "(nothing was trained)", p.string(), kind_of(fs::status(p, ec).type()),
                                             p == dir ? "the run directory" : "the run's checkpoints"));
  }
  fs::create_directories(dir / "checkpoints", ec);
  if (ec) return fail(ErrorCode::io, fmt::format("{}: cannot create the run directory: {}", dir.string(), ec.message()));
  return {};
}

Expected<void> check_run_files(const fs::path& dir) {
  // Checkpoints, the final state, the config and the report are written by rename, which replaces
  // any file but a directory; the metrics files are opened to append, which needs a regular file
  // (a FIFO would block). A non-regular *checkpoint* is otherwise skipped when resuming.
  std::vector<std::pair<fs::path, bool>> paths;  // (path, appended to)
  for (const auto& p : list_checkpoints(dir / "checkpoints")) paths.emplace_back(p, false);
  for (const char* f : kRunFiles) paths.emplace_back(dir / f, std::string_view(f).starts_with("metrics."));
  for (const auto& [p, appended] : paths) {
    std::error_code ec;
    const auto st = fs::status(p, ec);
    if (ec && ec != std::errc::no_such_file_or_directory && appended)
      return fail(ErrorCode::io, fmt::format("{}: cannot be opened: {}; baton appends to a file by that name: remove "
                                             "it or use another run directory (nothing was trained)", p.string(), ec.message()));
    if (ec || !fs::exists(st) || fs::is_regular_file(st) || (!appended && !fs::is_directory(st))) continue;
    return fail(ErrorCode::io, fmt::format("{}: is {}, where baton writes a file by that name; move it away or use "
                                           "another run directory (nothing was trained)", p.string(), kind_of(st.type())));
  }
  return {};
}

void remove_run_files(const fs::path& dir) {
  std::error_code ec;
  for (const char* f : kRunFiles) fs::remove(dir / f, ec);
  for (const auto& p : list_checkpoints(dir / "checkpoints")) fs::remove(p, ec);
  // Unfinished writes of a killed run (`.<name>.tmp-<pid>`) and TensorBoard files of baton's.
  for (const fs::path& sub : {dir, dir / "checkpoints", dir / "tensorboard"})
    for (const auto& e : fs::directory_iterator(sub, ec)) {
      const auto f = e.path().filename().string();
      if ((f.front() == '.' && f.find(".tmp-") != std::string::npos) ||
          (f.rfind("events.out.tfevents.", 0) == 0 && f.ends_with(".baton")) ||
          (sub == dir && f.rfind("best", 0) == 0 && f.ends_with(".baton")))  // KeepBest's best.baton, best-<stage>.baton
        fs::remove(e.path(), ec);
    }
  for (const char* sub : {"checkpoints", "tensorboard"})
    if (fs::is_empty(dir / sub, ec)) fs::remove(dir / sub, ec);
}

}  // namespace baton::detail
