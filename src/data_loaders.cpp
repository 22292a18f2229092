// Datasets from CSV tables and synthetic Gaussian blobs (include/baton/data.hpp). The curriculum's
// `csv` and `synthetic` kinds read their keys in src/hparams/registry.cpp and call these.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in <fmt/format.h> only before fmt 11)
#include <torch/torch.h>

#include "baton/data.hpp"
#include "data_internal.hpp"
#include "detail.hpp"
#include "io.hpp"

namespace baton::data {
namespace {

std::vector<std::string> split_cells(std::string line) {
  if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF line ends (files from Windows)
  std::vector<std::string> cells;
  std::stringstream ss(line);
  for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
  return cells;
}

/// One cell as a number: finite, and for a feature (`as_float`) within float's range. inf and
/// nan parse as numbers but cannot be trained on; a feature beyond float's range would overflow
/// the float conversion (undefined behaviour). Errors name the file, line and column.
Expected<double> parse_cell(const std::string& path, std::size_t lineno, const std::string& column, const std::string& cell,
                            bool as_float) {
  char* end = nullptr;
  const double v = std::strtod(cell.c_str(), &end);
  if (end == cell.c_str() || *end != '\0')
    return fail(ErrorCode::data, fmt::format("{}:{}: column \"{}\": \"{}\" is not a number", path, lineno, column, cell));
  if (!std::isfinite(v) || (as_float && std::abs(v) > std::numeric_limits<float>::max()))
    return fail(ErrorCode::data, fmt::format("{}:{}: column \"{}\": {} is not {}", path, lineno, column, cell,
                                             as_float ? "a finite 32-bit float" : "a finite number"));
  return v;
}

/// A CSV file's numbers: features row by row, targets, and the header they came with.
struct Table {
  std::vector<std::string> header;
  std::size_t target_col = 0;
  std::vector<float> xs;
  std::vector<double> ys;
  std::size_t rows = 0;
};

/// Reads the header and the data rows, checking every cell.
Expected<Table> read_table(const std::string& path, const std::string& target) {
  if (auto ok = detail::check_regular_file(path, "CSV file"); !ok) return tl::unexpected(ok.error());
  std::ifstream in(path);
  if (!in) return fail(ErrorCode::io, fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::string line;
  if (!std::getline(in, line)) return fail(ErrorCode::data, fmt::format("{}: empty file", path));
  Table t;
  t.header = split_cells(line);
  const auto& header = t.header;
  t.target_col = header.size() - 1;
  if (!target.empty()) {
    auto it = std::find(header.begin(), header.end(), target);
    if (it == header.end())
      return fail(ErrorCode::data, fmt::format("{}: no column \"{}\" in the header ({})", path, target, fmt::join(header, ", ")));
    t.target_col = static_cast<std::size_t>(it - header.begin());
  }
  for (std::size_t lineno = 2; std::getline(in, line); ++lineno) {
    if (line.empty() || line == "\r") continue;
    const auto cells = split_cells(line);
    if (cells.size() != header.size())
      return fail(ErrorCode::data, fmt::format("{}:{}: {} cells, the header has {}", path, lineno, cells.size(), header.size()));
    for (std::size_t c = 0; c < cells.size(); ++c) {
      auto v = parse_cell(path, lineno, header[c], cells[c], c != t.target_col);
      if (!v) return tl::unexpected(v.error());
      if (c == t.target_col) t.ys.push_back(*v);
      else t.xs.push_back(static_cast<float>(*v));
    }
    ++t.rows;
  }
  if (t.rows == 0) return fail(ErrorCode::data, fmt::format("{}: no data rows", path));
  return t;
}

}  // namespace

Expected<Dataset> csv(const CsvOptions& options) {
  return detail::guard([&]() -> Expected<Dataset> {
    const std::string path = options.path.string();
    auto table = read_table(path, options.target);
    if (!table) return tl::unexpected(table.error());
    auto& t = *table;
    const auto rows = static_cast<std::int64_t>(t.rows);
    const auto features = static_cast<std::int64_t>(t.header.size() - 1);
    auto x = torch::from_blob(t.xs.data(), {rows, features}, torch::kFloat32).clone();
    auto y = torch::from_blob(t.ys.data(), {rows}, torch::kFloat64).clone();
    if (options.classification) {
      // The upper bound keeps the conversion to int64 exact (and defined).
      if (!y.eq(y.round()).all().item<bool>() || y.min().item<double>() < 0 || y.max().item<double>() > 9.0e15)
        return fail(ErrorCode::data, fmt::format("{}: target \"{}\" must hold class indices (integers >= 0) "
                                                 "for classification; set classification = false for regression",
                                                 path, t.header[t.target_col]));
      y = y.to(torch::kLong);
    } else {
      y = y.to(torch::kFloat32).unsqueeze(1);
    }
    auto ds = make_dataset(x, y, path);
    if (ds)
      ds->origin = {"csv", {{"path", detail::absolute_path(options.path)}, {"target", t.header[t.target_col]},
                            {"classification", options.classification}}};
    return ds;
  });
}

Expected<Dataset> synthetic(const SyntheticOptions& options) {
  const auto n = options.samples, features = options.features, classes = options.classes;
  const auto seed = options.seed, sample_seed = options.sample_seed.value_or(seed + 1);
  if (n < 1 || features < 1 || classes < 2)
    return fail(ErrorCode::invalid_argument, "synthetic dataset: needs samples >= 1, features >= 1, classes >= 2");
  // Checked one by one first, so that the products cannot overflow.
  constexpr std::int64_t floats = std::int64_t{1} << 31, width = std::int64_t{1} << 20;
  if (n > floats || features > width || classes > width || n * features > floats || classes * features > floats)
    return fail(ErrorCode::invalid_argument, fmt::format("synthetic dataset: {} samples x {} features ({} classes) is too "
                                                         "large (at most 2^31 floats)", n, features, classes));
  return detail::guard([&]() -> Expected<Dataset> {
    // `seed` fixes the task (the class centers); `sample_seed` the samples drawn from it, so a
    // train and a test set of one task differ only in their sample_seed.
    auto task = at::detail::createCPUGenerator(seed);
    auto centers = torch::randn({classes, features}, task) * 2.0;
    auto gen = at::detail::createCPUGenerator(sample_seed);
    auto y = torch::randint(0, classes, {n}, gen, torch::kLong);
    auto x = centers.index_select(0, y) + torch::randn({n, features}, gen);
    auto ds = make_dataset(x, y, fmt::format("synthetic(seed {}, sample_seed {})", seed, sample_seed));
    auto whole = [](auto v) { return static_cast<double>(v); };
    if (ds)
      ds->origin = {"synthetic", {{"samples", whole(n)}, {"features", whole(features)}, {"classes", whole(classes)},
                                  {"seed", whole(seed)}, {"sample_seed", whole(sample_seed)}}};
    return ds;
  });
}

}  // namespace baton::data

namespace baton::detail {

Expected<std::vector<std::string>> csv_header(const std::filesystem::path& path) {
  if (auto ok = check_regular_file(path.string(), "CSV file"); !ok) return tl::unexpected(ok.error());
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return fail(ErrorCode::data, fmt::format("{}: empty or unreadable file", path.string()));
  return data::split_cells(line);
}

Expected<torch::Tensor> csv_columns(const std::filesystem::path& path, const std::vector<std::string>& columns) {
  return guard([&]() -> Expected<torch::Tensor> {
    const std::string file = path.string();
    auto header = csv_header(path);
    if (!header) return tl::unexpected(header.error());
    std::vector<std::size_t> take;  // header positions, in the order asked
    for (const auto& name : columns) {
      const auto it = std::find(header->begin(), header->end(), name);
      if (it == header->end())
        return fail(ErrorCode::data, fmt::format("{}: no column \"{}\" (the model takes {}); the header has {}", file, name,
                                                 fmt::join(columns, ", "), fmt::join(*header, ", ")));
      take.push_back(static_cast<std::size_t>(it - header->begin()));
    }
    if (columns.empty())
      for (std::size_t c = 0; c < header->size(); ++c) take.push_back(c);
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    std::vector<float> xs;
    std::int64_t rows = 0;
    for (std::size_t lineno = 2; std::getline(in, line); ++lineno) {
      if (line.empty() || line == "\r") continue;
      const auto cells = data::split_cells(line);
      if (cells.size() != header->size())
        return fail(ErrorCode::data, fmt::format("{}:{}: {} cells, the header has {}", file, lineno, cells.size(), header->size()));
      for (const auto c : take) {
        auto v = data::parse_cell(file, lineno, (*header)[c], cells[c], /*as_float=*/true);
        if (!v) return tl::unexpected(v.error());
        xs.push_back(static_cast<float>(*v));
      }
      ++rows;
    }
    if (rows == 0) return fail(ErrorCode::data, fmt::format("{}: no data rows", file));
    return torch::from_blob(xs.data(), {rows, static_cast<std::int64_t>(take.size())}, torch::kFloat32).clone();
  });
}

}  // namespace baton::detail
