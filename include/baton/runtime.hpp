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
  int blas_threads = 1;          ///< OpenBLAS threads; 1 avoids oversubscription with OpenMP
  bool tune_malloc = true;       ///< keep freed large buffers (mallopt) instead of unmapping
  bool require_openblas = true;  ///< error if BLAS is not OpenBLAS (reference BLAS is ~16x slower)
};

struct RuntimeReport {
  int threads = 0;
  int blas_threads = 0;
  std::string blas_library;  ///< path of the library that provides sgemm_
  bool openblas = false;
  bool malloc_tuned = false;
  [[nodiscard]] std::string to_string() const;  ///< one line for a log
};

/// The cores this process may run on (sched_getaffinity), at least 1.
int available_cores();

/// Which BLAS the process resolved sgemm_ to, without changing anything.
RuntimeReport inspect_runtime();

/// What decides the bits of training besides the inputs and seeds, as "key=value" pairs joined
/// by "; ": the LibTorch version, the CPU kernels it dispatches to (cpu=AVX2), intra-op threads,
/// the BLAS library and its threads. A run directory records it in its checkpoints and refuses
/// to resume where it differs, unless told to accept that (run.hpp).
std::string numerics_environment();
/// Applies `options`; an error (code runtime) if OpenBLAS is required and absent.
Expected<RuntimeReport> configure_runtime(const RuntimeOptions& options = {});

/// The note the first `fit` of a process prints on stderr when configure_runtime() was never
/// called (successfully) and LibTorch runs on fewer intra-op threads than available_cores();
/// nothing otherwise. Calling configure_runtime, with any thread count, silences it.
std::optional<std::string> runtime_note();

}  // namespace baton
