#pragma once
/// \file checkpoint.hpp
/// A checkpoint is a whole TrainState on disk: parameters and buffers, optimizer state, timestamp,
/// RNG state, the stage in progress and the history, plus metadata the caller chooses (the run's
/// name, its position in a curriculum, a fingerprint of the resolved config). The format is
/// documented in docs/checkpoint.md.
///
/// Writing is atomic: a temporary file in the same directory, flushed and fsync'ed, renamed over
/// the target, then the directory fsync'ed; a failed write leaves any previous file intact. A
/// checksum over the content is verified on load.
///
/// ```cpp
/// if (auto ok = baton::save_checkpoint(state, "run/ckpt-000469.baton", {.run_name = "fashion"}); !ok) ...
/// auto state = baton::load_checkpoint("run/ckpt-000469.baton", baton::models::small_cnn());
/// ```

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "baton/error.hpp"
#include "baton/model.hpp"
#include "baton/state.hpp"

namespace baton {

/// The newest checkpoint format version this build reads and writes.
inline constexpr std::uint32_t checkpoint_format_version = 3;  // 2 adds algorithm and callback state, 3 the loss scale

/// What a checkpoint says about itself, besides the state.
struct CheckpointMeta {
  std::string run_name{};                     ///< e.g. the curriculum's run name
  std::string config_fingerprint{};           ///< e.g. a hash of the resolved config
  std::int64_t stage_index = -1;              ///< position in a curriculum (-1: none)
  std::map<std::string, std::string> extra{}; ///< anything else, as text
};

/// A checkpoint's header: readable without building the model.
struct CheckpointInfo {
  std::uint32_t format_version = 0;
  CheckpointMeta meta{};
  Timestamp time{};
  std::string stage{};
  std::uint64_t seed = 0;
  Time max_duration{};
  std::string params_sha256{};  ///< as `params_sha256(state)` of the saved state
};

/// Writes `state` to `path` atomically (see the file comment) through the temporary file
/// `.<file name>.tmp-<pid>` beside it, so one process must not save to one path from two threads
/// at once. Errors (code io) name the path and the system's reason; the previous file at `path`,
/// if any, is untouched on failure.
Expected<void> save_checkpoint(const TrainState& state, const std::filesystem::path& path,
                               const CheckpointMeta& meta = {});

/// Reads a checkpoint, verifying its checksum, and rebuilds the state with `factory`. Errors:
/// missing file (io), truncated or corrupt (data, "checksum mismatch"), newer format version
/// (data, naming both versions), a model that does not match (shape_mismatch, listing every
/// missing, unexpected or differently shaped parameter and buffer).
Expected<TrainState> load_checkpoint(const std::filesystem::path& path, const ModelFactory& factory);

/// Reads and verifies a checkpoint's header and checksum without building a model.
Expected<CheckpointInfo> read_checkpoint_info(const std::filesystem::path& path);

/// The file name of a checkpoint that a fit writes at run batch `batch`: "ckpt-<batch, 10 digits>.baton",
/// "ckpt-<batch>-end.baton" at a stage's end (CheckpointPolicy).
std::string checkpoint_name(std::int64_t batch, bool stage_end);

/// The checkpoints of `dir` named by `checkpoint_name`, newest first (at the same batch, an
/// interval or interrupt one, written by the next stage, before a stage end). Other files are not listed.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& dir);

/// Keeps the newest `keep` interval checkpoints of `dir` and removes older ones; stage-end
/// checkpoints and every other file are never touched (`keep <= 0`: keep all).
void prune_checkpoints(const std::filesystem::path& dir, int keep);

/// SHA-256 (hex) over every parameter and buffer of the state: names, dtypes, shapes and bytes,
/// in module order (encoding in docs/checkpoint.md). Two states with the same value have the
/// same hash. Empty if a tensor cannot be read (e.g. on a device that has failed).
std::string params_sha256(const TrainState& state);

}  // namespace baton
