#include "run/run_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>

namespace baton::detail {

Expected<RunLock> RunLock::acquire(const std::filesystem::path& dir) {
  const auto path = dir / ".lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return tl::unexpected(Error{ErrorCode::io, fmt::format("{}: cannot open the run directory's lock file: {}",
                                                           path.string(), std::strerror(errno)), {}});
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder(32, '\0');
    const ssize_t n = ::pread(fd, holder.data(), holder.size(), 0);
    holder.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    ::close(fd);
    if (err == EWOULDBLOCK)
      return tl::unexpected(Error{
          ErrorCode::io,
          fmt::format("{}: the run directory is in use by another baton run (pid {}); wait for it to finish, stop it, "
                      "or use another --run-dir",
                      dir.string(), holder.empty() ? "unknown" : holder),
          {}});
    return tl::unexpected(Error{ErrorCode::io, fmt::format("{}: cannot lock: {}", path.string(), std::strerror(err)), {}});
  }
  // Who holds it, for the message of a second run (the lock itself is the flock, not this text).
  const std::string pid = fmt::format("{}\n", ::getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    // The lock holds all the same; only the message of a second run would lack the pid.
  }
  return RunLock(fd);
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace baton::detail
