#pragma once
/// \file report.hpp
/// `baton report`: one self-contained HTML page (inline SVG, no network fetches) from one or more
/// run directories written by `baton::run` or `baton run`. It only reads the run's files
/// (metrics.jsonl, config.toml); no LibTorch.

#include <filesystem>
#include <string>
#include <vector>

#include "baton/error.hpp"

namespace baton::report {

/// A unicode sparkline (▁▂▃▄▅▆▇█) of `values`, at most `width` characters: the values are averaged
/// into `width` buckets and scaled between their minimum and maximum. Non-finite values are
/// skipped; no finite value gives "". Used by the `baton run` summary table.
std::string sparkline(const std::vector<double>& values, std::size_t width = 16);

/// Exponential moving average with bias correction (as TensorBoard's smoothing): the first
/// values are not pulled towards 0. `weight` in [0, 1): 0 returns `values`.
std::vector<double> smooth(const std::vector<double>& values, double weight);

/// The report of `run_dirs` as one HTML document: training loss (raw and smoothed), every eval
/// metric, learning rate and throughput against samples seen, stage boundaries marked and named,
/// a table per stage and the resolved config. Several directories overlay in the same plots.
/// Errors (code io or data) name the directory or file and line, and what to give instead.
Expected<std::string> render(const std::vector<std::filesystem::path>& run_dirs);

/// `render` written to `out` atomically (a temporary file renamed over it): a failure never
/// leaves half a report. Returns `out`.
Expected<std::filesystem::path> write(const std::vector<std::filesystem::path>& run_dirs,
                                      const std::filesystem::path& out);

}  // namespace baton::report
