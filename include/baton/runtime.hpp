#pragma once
/// \file runtime.hpp
/// Process settings that decide training speed on CPU, made explicit. Measured on 2-core
/// machines: Debian's LibTorch starts with 1 intra-op thread (its cpuinfo miscounts cores);
/// OpenBLAS's own threads fight OpenMP's; glibc returns large buffers to the OS after each step
/// and the page faults cost up to several times the CNN epoch. One call fixes all three, and
/// says what it did:
///
/// ```cpp
/// auto rt = baton::configure_runtime();   // Expected<RuntimeReport>
/// if (rt) std::cout << rt->to_string() << '\n';
/// ```
///
/// These are process-wide settings: baton never makes this call on its own. A process that never
/// makes it and whose LibTorch runs on fewer threads than its cores gets one note on stderr at its
/// first `fit` (runtime_note()), so a slow run is never silent about why.

#include <optional>
#include <string>

#include "baton/error.hpp"

namespace baton {

struct RuntimeOptions {
  int threads = 0;               ///< intra-op threads; 0 = the cores this process may run on
  /// OpenBLAS threads; 0 = as many as intra-op threads. One matrix product runs in BLAS alone,
  /// so with 1 a GPT or an MLP multiplies on one core (measured 1.5x and 1.6x slower on 2 cores:
  /// benchmarks/README.md). BLAS threads that spin when idle fight OpenMP's in a CNN step;
  /// relaunch_with_thread_policy makes them sleep at once (OPENBLAS_THREAD_TIMEOUT).
  int blas_threads = 0;
  bool tune_malloc = true;       ///< keep freed large buffers (mallopt) instead of unmapping
  bool require_openblas = true;  ///< error if BLAS is the reference one (~16x slower): not OpenBLAS, not LibTorch's own
};

/// What this CPU computes in hardware: for speed decisions, and named with every speed figure.
struct CpuInfo {
  std::string model{};       ///< /proc/cpuinfo's "model name", e.g. "AMD EPYC 7B13" ("unknown" elsewhere)
  std::string vector_isa{};  ///< the kernels LibTorch dispatches to: "AVX2", "AVX512", "DEFAULT", ...
  bool native_bf16 = false;  ///< avx512_bf16 or amx_bf16: bf16 arithmetic in hardware, not emulated
  [[nodiscard]] std::string to_string() const;  ///< "AMD EPYC 7B13, AVX2, bf16 emulated"
};

/// This machine's CPU. The environment variable BATON_CPU_BF16=native or =emulated overrides the
/// bf16 detection (to test both behaviours on one machine, or for a CPU whose flags are wrong).
CpuInfo cpu_info();

/// The warning a bf16 stage on the CPU gets where bf16 is emulated (no avx512_bf16/amx_bf16):
/// LibTorch then converts in software and trains several times slower than fp32 (measured 13x
/// on an AVX2 EPYC: benchmarks/README.md). None where bf16 is native. `baton validate` prints it
/// for each such stage, and a fit in bf16 on the CPU prints it once per process.
std::optional<std::string> bf16_cpu_warning();

struct RuntimeReport {
  int threads = 0;
  int blas_threads = 0;
  std::string blas_library{};  ///< path of the library that provides sgemm_
  bool openblas = false;
  bool blas_in_libtorch = false;  ///< LibTorch carries its own BLAS (PyTorch's wheels): not the slow reference one
  bool malloc_tuned = false;
  std::string wait_policy{}; ///< how OpenMP's idle threads wait (thread_wait_policy())
  std::string blas_wait{};   ///< how OpenBLAS's idle threads wait (blas_wait_policy())
  CpuInfo cpu{};             ///< the CPU, its vector ISA and whether bf16 is native
  [[nodiscard]] std::string to_string() const;  ///< one line for a log
};

/// The cores this process may run on (sched_getaffinity), at least 1.
int available_cores();

/// Which BLAS the process resolved sgemm_ to, without changing anything.
RuntimeReport inspect_runtime();

/// What decides the bits of training besides the inputs and seeds, as "key=value" pairs joined
/// by "; ": the LibTorch version, the CPU kernels it dispatches to (cpu=AVX2), intra-op threads,
/// the BLAS library and its threads, and the generation of baton's own kernel choices
/// (baton_kernels=N, raised when baton trains the same spec to other bits). A run directory
/// records it in its checkpoints and refuses to resume where it differs, unless told to accept
/// that (run.hpp).
std::string numerics_environment();
/// Applies `options`; an error (code runtime) if OpenBLAS is required and absent.
Expected<RuntimeReport> configure_runtime(const RuntimeOptions& options = {});

/// How LibTorch's OpenMP threads wait between parallel regions. GNU OpenMP (Debian's LibTorch)
/// spins 300,000 times by default before sleeping, which keeps each waiting thread on its core:
/// with another process busy on one of 2 cores, a 2-thread CNN step then waits for its
/// descheduled peer and trains at about a third of its idle speed. With GOMP_SPINCOUNT=1000 the
/// waiting thread sleeps almost at once, the scheduler moves the peer to the free core, and the
/// step keeps about 0.6 of its idle speed, with no loss on an idle machine (measured:
/// benchmarks/README.md, `cnn_loaded`). OpenMP reads the setting once, when the process
/// starts, so it cannot be changed from inside: `relaunch_with_thread_policy` re-executes the
/// program with it.
///
/// "GOMP_SPINCOUNT=1000", "OMP_WAIT_POLICY=passive" (what the environment sets), or "OpenMP
/// default (spins before sleeping)".
std::string thread_wait_policy();

/// How OpenBLAS's idle threads wait: "OPENBLAS_THREAD_TIMEOUT=10" (what the environment sets)
/// or "idle threads spin 2^28 cycles" (OpenBLAS's default).
std::string blas_wait_policy();

/// Called first in `main`, before any thread starts: re-executes this program (/proc/self/exe,
/// the same arguments and process id) with GOMP_SPINCOUNT=1000 added where the environment sets
/// neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY, and OPENBLAS_THREAD_TIMEOUT=10 (idle OpenBLAS
/// threads sleep after 2^10 cycles, not 2^28) where it sets neither that nor
/// GOTO_THREAD_TIMEOUT. OpenBLAS, too, reads its setting only when it is loaded. When the
/// environment has both already, or the exec fails, returns and nothing changes. The `baton`
/// command and baton's benchmarks call it; a user's own program may call it, or set the
/// variables in its environment.
void relaunch_with_thread_policy(char** argv);

/// The note the first `fit` of a process prints on stderr when configure_runtime() was never
/// called (successfully) and LibTorch runs on fewer intra-op threads than available_cores();
/// nothing otherwise. Calling configure_runtime, with any thread count, silences it.
std::optional<std::string> runtime_note();

}  // namespace baton
