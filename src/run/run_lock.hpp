#pragma once
// One run directory, one writer: a run (`baton::run`, `baton run`) holds an exclusive lock on RUN_DIR/.lock while it
// writes there. The lock is an flock(2) on an open file, so the kernel releases it when the
// process ends in any way (exit, crash, kill -9): a crashed run never leaves the directory locked.
#include <filesystem>

#include "baton/error.hpp"

namespace baton::detail {

class RunLock {
 public:
  /// Takes the lock of `dir` (which must exist) without waiting. If another process holds it:
  /// an io error naming the directory and that process's pid.
  static Expected<RunLock> acquire(const std::filesystem::path& dir);

  RunLock(RunLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  RunLock& operator=(RunLock&&) = delete;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  ~RunLock();

 private:
  explicit RunLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace baton::detail
