// The commands on a curriculum that train nothing themselves or hand the training to the library's
// sweep: baton sweep, baton sweep-node (one node of a sweep or tree in a child process) and
// baton validate.
#include <chrono>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "baton/runtime.hpp"
#include "baton/sweep.hpp"
#include "baton/time.hpp"
#include "commands.hpp"
#include "launch.hpp"

namespace baton::cli {

// ---------------------------------------------------------------- sweep

/// `baton sweep`: the points of --grid (else the file's [sweep] table) through `baton::sweep`
/// (sweep.hpp), stages shared by points trained once.
int sweep(const SweepArgs& a, const Registry& registry) {
  auto o = sweep_options(a.file, a.sets, registry);
  if (!o) return report(o.error());
  if (!a.grid.empty()) {
    auto points = sweep_grid(a.grid);
    if (!points) return report(points.error());
    o->points = *points;
  }
  if (o->points.empty())
    return report(Error{ErrorCode::invalid_argument, fmt::format("{}: no sweep points; give --grid path=[v1, v2, ...] or "
                                                                 "a [sweep] table in the file (docs/sweep.md)", a.file), {}});
  if (!a.dir.empty()) o->dir = a.dir;
  if (!a.metric.empty()) o->metric = a.metric;
  if (a.minimize) o->maximize = false;
  if (a.jobs > 0) o->jobs = a.jobs;
  o->executable = self_executable();
  auto runtime = configure_runtime({.threads = o->threads});
  if (!runtime) return report(runtime.error());
  fmt::print("{}\n", runtime->to_string());
  fmt::print("sweep of {} points, directory {}{}\n", o->points.size(), o->dir.string(),
             o->jobs > 1 ? fmt::format(", {} jobs at once", o->jobs) : "");
  const auto started = std::chrono::steady_clock::now();
  auto r = baton::sweep(a.file, *o);
  if (!r) return report(r.error());
  std::string again = a.program + " sweep " + a.file;
  for (const auto& g : a.grid) again += " --grid '" + g + "'";
  for (const auto& s : a.sets) again += " --set " + s;
  if (!a.dir.empty()) again += " --run-dir " + a.dir;
  if (a.jobs > 0) again += fmt::format(" --jobs {}", a.jobs);
  if (r->interrupted) {
    fmt::print(stderr, "baton: sweep interrupted; every finished stage run is kept. Go on with: {}\n", again);
    return exit_interrupted;
  }
  print_closing(*r, started);
  return exit_ok;
}

void print_closing(const SweepResult& r, std::chrono::steady_clock::time_point started) {
  fmt::print("\n{}", r.table());
  fmt::print("total time {}{}{}\n", duration_text(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()),
             r.summary_file.empty() ? "" : "; summary " + r.summary_file.string(),
             r.report_file.empty() ? "" : "; report " + r.report_file.string());
}

/// `baton sweep-node` (not listed): one node of a sweep with jobs > 1, started by the sweep.

int sweep_node(const SweepNodeArgs& a, const Registry& registry) {
  auto runtime = configure_runtime({.threads = a.threads});
  if (!runtime) return report(runtime.error());
  auto done = baton::sweep_node(a.file, {.dir = a.dir, .sets = a.sets, .progress = false, .registry = registry,
                                         .fresh = a.fresh, .by_stage = a.by_stage, .branch = a.branch}, a.stage);
  if (!done) return report(done.error());
  return *done ? exit_ok : exit_interrupted;
}

int validate(const std::string& file, const std::vector<std::string>& sets, const Registry& registry) {
  auto cur = load_curriculum(file, sets, registry);
  if (!cur) return report(cur.error());
  if (auto ok = cur->validate(); !ok) return report(ok.error());
  std::vector<Curriculum> chains;  // a tree's branches, or the curriculum itself
  if (cur->is_tree())
    for (const auto& b : cur->branches()) chains.push_back(*b.curriculum);
  else
    chains.push_back(*cur);
  std::set<std::string> warned;
  for (const auto& chain : chains)
    if (auto specs = chain.specs())
      for (const auto& spec : *specs)
        if (spec.precision == Precision::bf16 && spec.device.is_cpu() && warned.insert(spec.name).second)
          if (auto warning = bf16_cpu_warning())
            fmt::print(stderr, "{}: warning: stage \"{}\" trains in bf16, but {}\n", file, spec.name, *warning);
  fmt::print("{}: valid: run \"{}\", {}{} stage{}, max duration {}{}, fingerprint {}\n", file, cur->run().name,
             cur->is_tree() ? "a tree of " : "", cur->stages().size(), cur->stages().size() == 1 ? "" : "s",
             cur->run().max_duration.to_string(), cur->is_tree() ? " per branch" : "", cur->fingerprint().substr(0, 16));
  for (const auto& b : cur->branches())
    fmt::print("  branch {}{}: {}\n", b.name, b.baseline ? " (scratch baseline)" : "", fmt::join(b.stages, " > "));
  return exit_ok;
}

}  // namespace baton::cli
