#pragma once
// The one place baton writes files and hashes bytes: atomic writes (a temporary file beside the
// target, fsync'ed, renamed over it, the directory fsync'ed; any failure, a full disk or the
// file-size limit included, is an io error and leaves the previous file intact), SHA-256, the
// check of names that become part of a path (stage names, run names), and the words for a child
// process's end (the launcher's ranks and a sweep's nodes).

#include <array>
#include <filesystem>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>

#include <openssl/evp.h>

#include "baton/error.hpp"

namespace baton::detail {

inline constexpr std::size_t kSha256Size = 32;

/// Streaming SHA-256 (OpenSSL).
class Sha256 {
 public:
  Sha256();
  void update(const void* data, std::size_t n);
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::array<unsigned char, kSha256Size> finish();

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_;
};

/// Lower-case hex of a digest.
std::string hex(const std::array<unsigned char, kSha256Size>& digest);

/// SHA-256 of `bytes`, in hex.
std::string sha256_hex(std::string_view bytes);

/// A temporary file `.<name>.tmp-<pid>` beside `target` that becomes the target on `commit`
/// and is removed otherwise (including when an exception leaves the scope). Errors throw
/// (BatonException, code io): "cannot save <label> "<target>": <what>: <reason>".
class AtomicFile {
 public:
  AtomicFile(std::filesystem::path target, std::string label);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();
  void write(const void* data, std::size_t n);
  void commit();

 private:
  void pause_once_for_tests();
  std::filesystem::path target_, tmp_;
  std::string label_;
  int fd_ = -1;
  bool committed_ = false;
  bool paused_ = false;
  int written_ = 0;
};

/// An io error unless `path` is (a link to) a regular file: "no such file", "a loop of symbolic
/// links", "is a directory", "is a FIFO" ... never a read that blocks forever. `what` names it
/// in the message ("curriculum", "data file").
Expected<void> check_regular_file(const std::filesystem::path& path, std::string_view what);

/// The whole of a regular file (check_regular_file first), or an io error naming the file and
/// `what` it is ("tokenizer", "fortune file").
Expected<std::string> read_file(const std::filesystem::path& path, std::string_view what);

/// Names that become one component of a path baton writes (a stage's "best-<stage>.baton", a
/// sweep node's directory, "runs/<run name>"): what is wrong with `name` as such a component, or
/// "" when nothing is. Refused: empty, "." and "..", '/' and '\\', control characters (NUL
/// included), more than kMaxNameBytes bytes. Every place that joins a name into a path checks it
/// with this one function, at validate, before anything trains or is written.
std::string path_component_problem(std::string_view name);
inline constexpr std::size_t kMaxNameBytes = 100;

/// The message for a name that path_component_problem refuses, or "" for a usable one:
/// `<field>: "<name>" <what is wrong>; <becomes>, so a name may hold ...` (`becomes`: what the
/// name is part of, e.g. "a stage's name is part of file names in the run directory").
std::string name_problem(std::string_view field, std::string_view name, std::string_view becomes);
/// `name` for a one-line message: control characters as \xNN, at most 200 bytes shown.
std::string printable(std::string_view name);
/// `becomes` for a stage's name (TrainingSpec::name, [[stages]] name).
inline constexpr std::string_view kStageNameUse =
    "a stage's name is part of file names in the run directory (best-<stage>.baton) and of a sweep's node directories";

/// Why a write failed (`strerror(err)`), and where a file system refuses more bytes (a full
/// disk, the file-size limit of ulimit -f) what to do.
std::string write_failure(int err);

/// For files written as streams (logs that append): throws an io error, "cannot write the
/// <label> "<path>": <why>", once `out` has failed, so a full disk or the file-size limit does
/// not lose lines without a word.
void check_written(const std::ostream& out, const std::filesystem::path& path, std::string_view label);

/// The whole of `bytes` written to `path` through an AtomicFile; an io error on failure.
Expected<void> write_file_atomic(const std::filesystem::path& path, std::string_view bytes, const std::string& label = "file");

/// A child's wait status in words: "exit code 2 (invalid input)" for baton's own codes
/// (exit_codes.hpp), "exit code 7", "killed by signal 9 (SIGKILL)".
std::string exit_status_text(int status);

}  // namespace baton::detail
