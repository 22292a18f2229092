// `baton`: a launcher of a few dozen lines, linked against libc only, that starts the real program
// (`baton-core`, beside it) the moment it starts, so that two things happen before LibTorch loads:
//   - SIGINT and SIGTERM are held (blocked: one that arrives stays pending across the exec), until
//     `baton run` installs its handler and takes it as a stop (exit 3 with a checkpoint), or the
//     command releases them. Without this, a signal during the dynamic loader's work on LibTorch's
//     ~290 libraries and its static initialization (0.1 to 2 s) ended the process by the signal.
//   - The OpenMP thread policy (GOMP_SPINCOUNT=1000, runtime.hpp) is in the environment from the
//     start, so `baton-core` does not re-execute itself to get it (which loaded LibTorch twice).
// argv is passed on as it is, so the program names itself as typed ("Resume with: baton run ...").
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  sigset_t hold;
  sigemptyset(&hold);
  sigaddset(&hold, SIGINT);
  sigaddset(&hold, SIGTERM);
  sigprocmask(SIG_BLOCK, &hold, nullptr);
  if (!std::getenv("GOMP_SPINCOUNT") && !std::getenv("OMP_WAIT_POLICY")) ::setenv("GOMP_SPINCOUNT", "1000", 1);
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = n > 0 ? std::string(self, static_cast<std::size_t>(n)) : std::string(argc > 0 ? argv[0] : "");
  dir = dir.substr(0, dir.find_last_of('/') + 1);
  const std::string core = dir + "baton-core";
  (void)argc;
  ::execv(core.c_str(), argv);
  std::fprintf(stderr, "baton: cannot start %s: %s (it is installed beside baton)\n", core.c_str(), std::strerror(errno));
  return 2;
}
