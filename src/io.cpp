// Atomic file writes and SHA-256 (io.hpp).
#include "io.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "baton/exit_codes.hpp"
#include "detail.hpp"

namespace baton::detail {
namespace fs = std::filesystem;

Sha256::Sha256() : ctx_(EVP_MD_CTX_new(), &EVP_MD_CTX_free) {
  if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
    raise(ErrorCode::runtime, "OpenSSL could not initialize SHA-256");
}

void Sha256::update(const void* data, std::size_t n) {
  if (n > 0 && EVP_DigestUpdate(ctx_.get(), data, n) != 1) raise(ErrorCode::runtime, "OpenSSL SHA-256 failed");
}

std::array<unsigned char, kSha256Size> Sha256::finish() {
  std::array<unsigned char, kSha256Size> out{};
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(ctx_.get(), out.data(), &n) != 1 || n != kSha256Size)
    raise(ErrorCode::runtime, "OpenSSL SHA-256 failed");
  return out;
}

std::string hex(const std::array<unsigned char, kSha256Size>& d) {
  std::string s;
  for (unsigned char c : d) s += fmt::format("{:02x}", c);
  return s;
}

std::string sha256_hex(std::string_view bytes) {
  Sha256 h;
  h.update(bytes);
  return hex(h.finish());
}

std::string path_component_problem(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name == "." || name == "..") return fmt::format("is \"{}\", which a path reads as a directory", name);
  if (name.size() > kMaxNameBytes) return fmt::format("is {} bytes long, more than {}", name.size(), kMaxNameBytes);
  for (const char c : name) {
    if (c == '/' || c == '\\') return fmt::format("contains '{}', which would make it a path", c);
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return fmt::format("contains a control character (0x{:02x})", static_cast<int>(c));
  }
  return "";
}

std::string printable(std::string_view name) {
  std::string shown;
  for (const char c : name.substr(0, 2 * kMaxNameBytes))
    shown += static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? fmt::format("\\x{:02x}", static_cast<int>(c)) : std::string(1, c);
  if (name.size() > 2 * kMaxNameBytes) shown += "...";
  return shown;
}

std::string name_problem(std::string_view field, std::string_view name, std::string_view becomes) {
  const auto problem = path_component_problem(name);
  if (problem.empty()) return "";
  const auto shown = printable(name);
  return fmt::format("{}: \"{}\" {}; {}, so a name may hold any text but '/', '\\' and control characters, at most {} "
                     "bytes, and may not be \".\" or \"..\"",
                     field, shown, problem, becomes, kMaxNameBytes);
}

std::string write_failure(int err) {
  if (err == EFBIG) {
    rlimit limit{};
    if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
      return fmt::format("{} (the file-size limit, ulimit -f, is {} bytes: raise it, e.g. ulimit -f unlimited)",
                         std::strerror(err), limit.rlim_cur);
    return fmt::format("{} (larger than the file system takes, or than the file-size limit, ulimit -f)", std::strerror(err));
  }
  if (err == ENOSPC || err == EDQUOT)
    return fmt::format("{} (free some space on that file system, or write elsewhere)", std::strerror(err));
  return std::strerror(err);
}

void check_written(const std::ostream& out, const fs::path& path, std::string_view label) {
  if (out) return;
  const int err = errno;  // of the write that failed, as the stream leaves it
  raise(ErrorCode::io, fmt::format("cannot write the {} \"{}\": {}", label, path.string(),
                                   err != 0 ? write_failure(err) : std::string("the write failed")));
}

namespace {
/// `what` is a callable so that errno is read before building the message can change it.
template <class What>
[[noreturn]] void raise_io(const std::string& label, const fs::path& path, What&& what) {
  const int err = errno;
  raise(ErrorCode::io, fmt::format("cannot save {} \"{}\": {}: {}", label, path.string(), what(), write_failure(err)));
}

/// While alive, this thread holds SIGXFSZ back: a write past the file-size limit (ulimit -f)
/// then fails with EFBIG, an error like a full disk, instead of the signal's default ending the
/// process without a word and leaving the temporary file. Only this thread's signal mask
/// changes; a SIGXFSZ the write raised is taken off before the mask is restored.
class HoldFileSizeSignal {
 public:
  HoldFileSizeSignal() {
    sigemptyset(&xfsz_);
    sigaddset(&xfsz_, SIGXFSZ);
    ::pthread_sigmask(SIG_BLOCK, &xfsz_, &before_);
  }
  HoldFileSizeSignal(const HoldFileSizeSignal&) = delete;
  HoldFileSizeSignal& operator=(const HoldFileSizeSignal&) = delete;
  ~HoldFileSizeSignal() {
    const int err = errno;
    if (raised_ && !sigismember(&before_, SIGXFSZ)) {
      const timespec now{0, 0};
      ::sigtimedwait(&xfsz_, nullptr, &now);
    }
    ::pthread_sigmask(SIG_SETMASK, &before_, nullptr);
    errno = err;
  }
  /// The write failed with EFBIG: the kernel raised SIGXFSZ for this thread.
  void raised() { raised_ = true; }

 private:
  sigset_t xfsz_{}, before_{};
  bool raised_ = false;
};
}  // namespace

AtomicFile::AtomicFile(fs::path target, std::string label) : target_(std::move(target)), label_(std::move(label)) {
  const fs::path dir = target_.parent_path().empty() ? fs::path(".") : target_.parent_path();
  tmp_ = dir / fmt::format(".{}.tmp-{}", target_.filename().string(), ::getpid());
  // O_NOFOLLOW: a stale link left at the temporary name must not redirect the write.
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) raise_io(label_, target_, [&] { return fmt::format("cannot create the temporary file \"{}\"", tmp_.string()); });
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, std::size_t n) {
  pause_once_for_tests();
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = 0;
    {
      HoldFileSizeSignal hold;
      w = ::write(fd_, p, n);
      if (w < 0 && errno == EFBIG) hold.raised();
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) raise_io(label_, target_, [&] { return fmt::format("cannot write \"{}\"", tmp_.string()); });
    p += w, n -= static_cast<std::size_t>(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) raise_io(label_, target_, [&] { return fmt::format("cannot sync \"{}\"", tmp_.string()); });
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) raise_io(label_, target_, [&] { return fmt::format("cannot close \"{}\"", tmp_.string()); });
  if (::rename(tmp_.c_str(), target_.c_str()) != 0)
    raise_io(label_, target_, [&] { return fmt::format("cannot rename \"{}\" over it", tmp_.string()); });
  committed_ = true;
  // The rename is durable only once the directory entry is.
  const fs::path dir = tmp_.parent_path();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0)
    raise_io(label_, target_, [&] { return fmt::format("written, but cannot open directory \"{}\" to sync it", dir.string()); });
  const int rc = ::fsync(dfd), err = errno;
  ::close(dfd);
  errno = err;
  if (rc != 0 && err != EINVAL)  // EINVAL: the file system cannot sync directories
    raise_io(label_, target_, [&] { return fmt::format("written, but cannot sync directory \"{}\"", dir.string()); });
}

/// Test hook: with BATON_TEST_CHECKPOINT_PAUSE_MS set, the write pauses that long once the
/// temporary file holds its first bytes, so a test can kill the process in the middle of a
/// checkpoint write (tests/cli_test.cpp). Unset, it costs one getenv per file.
void AtomicFile::pause_once_for_tests() {
  if (paused_ || written_ == 0) {
    if (written_ == 0) written_ = 1;
    return;
  }
  paused_ = true;
  if (const char* ms = std::getenv("BATON_TEST_CHECKPOINT_PAUSE_MS"))
    ::usleep(static_cast<useconds_t>(std::strtoul(ms, nullptr, 10) * 1000));
}

Expected<void> write_file_atomic(const fs::path& path, std::string_view bytes, const std::string& label) {
  return guard([&]() -> Expected<void> {
    AtomicFile f(path, label);
    f.write(bytes.data(), bytes.size());
    f.commit();
    return {};
  });
}

Expected<void> check_regular_file(const std::filesystem::path& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const char* why = err == ENOENT  ? "no such file"
                      : err == ELOOP ? "a loop of symbolic links"
                                     : std::strerror(err);
    return fail(ErrorCode::io, fmt::format("{}: {} (the {})", path.string(), why, what));
  }
  if (S_ISREG(st.st_mode)) return {};
  const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                     : S_ISFIFO(st.st_mode) ? "a FIFO (named pipe)"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a regular file";
  return fail(ErrorCode::io, fmt::format("{}: is {}, not a regular file (the {})", path.string(), kind, what));
}

Expected<std::string> read_file(const std::filesystem::path& path, std::string_view what) {
  if (auto ok = check_regular_file(path, what); !ok) return tl::unexpected(ok.error());
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(ErrorCode::io, fmt::format("{}: cannot open the {} for reading", path.string(), what));
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return fail(ErrorCode::io, fmt::format("{}: cannot read the {}", path.string(), what));
  return out;
}

std::string exit_status_text(int status) {
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    const char* meaning = code == cli::exit_training_failed ? " (training failed)"
                          : code == cli::exit_invalid_input ? " (invalid input)"
                          : code == cli::exit_interrupted   ? " (interrupted)"
                                                            : "";
    return fmt::format("exit code {}{}", code, meaning);
  }
  if (WIFSIGNALED(status)) {
    const char* name = ::sigabbrev_np(WTERMSIG(status));
    return fmt::format("killed by signal {}{}", WTERMSIG(status), name ? fmt::format(" (SIG{})", name) : "");
  }
  return fmt::format("status {}", status);
}

}  // namespace baton::detail
