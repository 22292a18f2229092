// Process runtime settings: threads, BLAS, malloc. Explicit, reported, never implicit.
#include <dlfcn.h>
#include <malloc.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/version.h>
#include <fmt/format.h>

#include "baton/runtime.hpp"

namespace baton {
namespace {
std::atomic<bool> g_configured{false};  // set once configure_runtime succeeded
}  // namespace

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}

namespace {
/// LibTorch's "CPU capability usage: AVX2" line of show_config (the kernels dispatched to).
std::string torch_cpu_capability() {
  const std::string config = at::show_config();
  const std::string key = "CPU capability usage: ";
  const auto at = config.find(key);
  if (at == std::string::npos) return "unknown";
  return config.substr(at + key.size(), config.find('\n', at) - (at + key.size()));
}
}  // namespace

CpuInfo cpu_info() {
  CpuInfo c{"unknown", torch_cpu_capability(), false};
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    const auto value = colon + 2 <= line.size() ? line.substr(colon + 2) : std::string();
    if (key == "model name" && c.model == "unknown") c.model = value;
    if (key == "flags") {
      const auto padded = " " + value + " ";
      c.native_bf16 = padded.find(" avx512_bf16 ") != std::string::npos || padded.find(" amx_bf16 ") != std::string::npos;
      break;  // the first processor's flags: every core of one machine has the same
    }
  }
  if (const char* v = std::getenv("BATON_CPU_BF16")) {
    if (std::string_view(v) == "native") c.native_bf16 = true;
    if (std::string_view(v) == "emulated") c.native_bf16 = false;
  }
  return c;
}

std::string CpuInfo::to_string() const {
  return fmt::format("{}, {}, bf16 {}", model, vector_isa, native_bf16 ? "native" : "emulated");
}

std::optional<std::string> bf16_cpu_warning() {
  const auto c = cpu_info();
  if (c.native_bf16) return std::nullopt;
  return fmt::format("this CPU ({}) has no native bf16 (neither avx512_bf16 nor amx_bf16): LibTorch emulates it, "
                     "and training in bf16 is several times slower than in fp32 (13x measured on an AVX2-only "
                     "EPYC, benchmarks/README.md); use precision = \"fp32\" on this machine",
                     c.to_string());
}

RuntimeReport inspect_runtime() {
  RuntimeReport r;
  r.cpu = cpu_info();
  r.wait_policy = thread_wait_policy();
  r.blas_wait = blas_wait_policy();
  r.threads = at::get_num_threads();
  std::string loaded_as;
  if (void* sym = dlsym(RTLD_DEFAULT, "sgemm_")) {
    Dl_info info{};
    if (dladdr(sym, &info) != 0 && info.dli_fname != nullptr) {
      loaded_as = info.dli_fname;
      std::error_code ec;  // libblas.so.3 is an alternatives link: report what it points to
      const auto real = std::filesystem::canonical(info.dli_fname, ec);
      r.blas_library = ec ? std::string(info.dli_fname) : real.string();
    }
  }
  // OpenBLAS exports openblas_get_config; the reference BLAS does not. The library that sgemm_
  // resolves to must be OpenBLAS itself (its path names it, or it exports the OpenBLAS API).
  using get_threads_fn = int (*)();
  void* handle = loaded_as.empty() ? nullptr : dlopen(loaded_as.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle != nullptr) {
    if (dlsym(handle, "openblas_get_config") != nullptr) r.openblas = true;
    dlclose(handle);
  }
  // PyTorch's own builds (the pip wheels' LibTorch) link their BLAS (MKL, OpenBLAS) into
  // libtorch_cpu: sgemm_ resolves there, and it is not the reference BLAS.
  r.blas_in_libtorch = std::filesystem::path(r.blas_library).filename().string().rfind("libtorch", 0) == 0;
  if (auto* get_threads = reinterpret_cast<get_threads_fn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads")))
    r.blas_threads = get_threads();
  return r;
}

Expected<RuntimeReport> configure_runtime(const RuntimeOptions& options) {
  RuntimeReport before = inspect_runtime();
  if (options.require_openblas && !before.openblas && !before.blas_in_libtorch)
    return fail(ErrorCode::runtime,
                fmt::format("BLAS is not OpenBLAS (sgemm_ comes from \"{}\"): LibTorch would run about "
                            "16x slower on reference BLAS. Install libopenblas0 (apt-get install "
                            "libopenblas0) or select it with update-alternatives --config "
                            "libblas.so.3-x86_64-linux-gnu",
                            before.blas_library.empty() ? "nowhere" : before.blas_library));
  if (options.threads < 0 || options.threads > 1024 || options.blas_threads > 1024)
    return fail(ErrorCode::invalid_argument,
                fmt::format("configure_runtime: threads must be 0 (the cores this process may use) to 1024, got "
                            "{} intra-op and {} BLAS threads", options.threads, options.blas_threads));
  const int threads = options.threads > 0 ? options.threads : available_cores();
  at::set_num_threads(threads);
  using set_threads_fn = void (*)(int);
  if (auto* set_blas = reinterpret_cast<set_threads_fn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    set_blas(options.blas_threads > 0 ? options.blas_threads : threads);
  bool tuned = false;
  if (options.tune_malloc) {
    // Serve activations (up to 32 MiB, glibc's ceiling) from the heap and never trim it, so
    // each step reuses memory instead of mmap/munmap plus page faults.
    tuned = mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) == 1;
    tuned = (mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024) == 1) && tuned;
  }
  RuntimeReport r = inspect_runtime();
  r.malloc_tuned = tuned;
  g_configured = true;
  return r;
}

std::string thread_wait_policy() {
  if (const char* v = std::getenv("GOMP_SPINCOUNT")) return fmt::format("GOMP_SPINCOUNT={}", v);
  if (const char* v = std::getenv("OMP_WAIT_POLICY")) return fmt::format("OMP_WAIT_POLICY={}", v);
  return "OpenMP default (spins before sleeping)";
}

std::string blas_wait_policy() {
  for (const char* name : {"OPENBLAS_THREAD_TIMEOUT", "GOTO_THREAD_TIMEOUT"})
    if (const char* v = std::getenv(name)) return fmt::format("{}={}", name, v);
  return "idle threads spin 2^28 cycles";
}

void relaunch_with_thread_policy(char** argv) {
  if (argv == nullptr || argv[0] == nullptr) return;
  std::vector<const char*> added;  // each setting is added only where the environment has neither of its names
  const auto add = [&](const char* name, const char* other, const char* value) {
    if (!std::getenv(name) && !std::getenv(other) && ::setenv(name, value, 1) == 0) added.push_back(name);
  };
  add("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "1000");
  add("OPENBLAS_THREAD_TIMEOUT", "GOTO_THREAD_TIMEOUT", "10");
  if (added.empty()) return;
  ::execv("/proc/self/exe", argv);
  for (const char* name : added) ::unsetenv(name);  // the exec failed: go on as before, saying so in the report
}

std::optional<std::string> runtime_note() {
  const int threads = at::get_num_threads(), cores = available_cores();
  if (g_configured || threads >= cores) return std::nullopt;
  return fmt::format("baton: note: LibTorch runs on {} intra-op thread{} of the {} cores this process may use, and "
                     "OpenBLAS and malloc are untuned; call baton::configure_runtime() once at start (runtime.hpp; "
                     "configure_runtime({{.threads = {}}}) keeps this thread count and silences this note)",
                     threads, threads == 1 ? "" : "s", cores, threads);
}

namespace detail {
void note_runtime_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (auto note = runtime_note()) fmt::print(stderr, "{}\n", *note);
  });
}

void warn_bf16_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (auto warning = bf16_cpu_warning()) fmt::print(stderr, "baton: warning: bf16: {}\n", *warning);
  });
}
}  // namespace detail

std::string RuntimeReport::to_string() const {
  return fmt::format("runtime: CPU {}; {} intra-op threads ({}), BLAS {} ({}{}), malloc {}", cpu.to_string(), threads, wait_policy,
                     openblas ? "OpenBLAS" : blas_in_libtorch ? "inside LibTorch" : "NOT OpenBLAS", blas_library,
                     blas_threads > 0 ? fmt::format(", {} threads{}", blas_threads, openblas && blas_threads > 1 ? ", " + blas_wait : "")
                                      : std::string(),
                     malloc_tuned ? "tuned (mmap threshold 32 MiB, no trim)" : "glibc defaults");
}

std::string numerics_environment() {
  const RuntimeReport r = inspect_runtime();
  const std::string cpu = torch_cpu_capability();
  // baton's own choices of kernels count too: kBatonKernels is raised whenever a change of baton
  // makes the same spec train other bits on the same machine, so that a run directory started
  // before it is not resumed silently on other kernels. 2: memory_format "auto" is channels_last
  // on the CPU, and tensors with one channel get NHWC strides (2026-12-05).
  constexpr int kBatonKernels = 2;
  return fmt::format("libtorch={}.{}.{}; cpu={}; threads={}; blas={}; blas_threads={}; baton_kernels={}", TORCH_VERSION_MAJOR,
                     TORCH_VERSION_MINOR, TORCH_VERSION_PATCH, cpu, r.threads,
                     r.blas_library.empty() ? "unknown" : std::filesystem::path(r.blas_library).filename().string(),
                     r.blas_threads, kBatonKernels);
}

}  // namespace baton
