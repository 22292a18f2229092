#pragma once
// The checkpoint header (JSON) and what it describes: encoding a state's header and tensor list,
// and decoding a header back, checked field by field and for sense. checkpoint.cpp frames the
// bytes around it (magic, lengths, tensor data, checksum); docs/checkpoint.md is the layout.

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/types.h>

#include "baton/checkpoint.hpp"

namespace baton::detail::ckpt {

using json = nlohmann::json;

/// Stable dtype names ("float32"): the file must not depend on c10's enum numbering.
std::optional<std::string_view> dtype_name(at::ScalarType t);
std::optional<at::ScalarType> dtype_of(std::string_view name);

/// The bytes a tensor is stored as: contiguous, on the CPU. Undefined stays undefined.
torch::Tensor host(const torch::Tensor& t);
std::uint64_t byte_size(const torch::Tensor& t);

[[noreturn]] void raise_data(const std::filesystem::path& path, const std::string& what);

/// Runs `f`, turning a header that lacks a field or holds the wrong type into a data error.
template <class F>
auto decode(const std::filesystem::path& path, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const json::exception& e) {
    raise_data(path, fmt::format("malformed header: {}", e.what()));
  } catch (const std::invalid_argument& e) {
    raise_data(path, fmt::format("malformed header: {}", e.what()));
  }
}

/// One stored tensor, in the order of the data section.
struct Entry {
  std::string group;  // "parameter", "buffer", "optimizer_slot", "rng" or "algorithm"
  std::string name;   // module name; for a slot, its parameter's name
  std::int64_t slot = 0;
  torch::Tensor tensor;  // host(): contiguous CPU, or undefined
  std::string owner{};   // "algorithm": the algorithm's name
};

std::vector<Entry> entries_of(const TrainState& s);

/// The tensors of the checkpoint at `path`, read and verified as `load_checkpoint` reads them
/// (framing, checksum, header), without a model. Throws baton's error (use inside detail::guard).
std::vector<Entry> read_entries(const std::filesystem::path& path);
std::string encode_header(const TrainState& s, const CheckpointMeta& meta, const std::vector<Entry>& entries);

/// Everything of the header but the tensor descriptors.
struct Header {
  CheckpointInfo info;
  Timestamp stage_start;
  std::vector<StageRecord> history;
  OptimizerState optimizer;  // steps and slot counts; the slot tensors come from the data section
  std::map<std::string, std::map<std::string, double>> callback_state;  // version 2
  std::optional<LossScaleState> loss_scale;  // version 3
};

/// The header of a file of format `version`: a data error naming the field when one is missing,
/// of the wrong type, or makes no sense (negative counters, an epoch beyond the batches, a stage
/// that starts after the state's time, a max duration that is not a positive count).
Header decode_header(const json& header, std::uint32_t version, const std::filesystem::path& path);

}  // namespace baton::detail::ckpt
