#!/usr/bin/env bash
# Builds baton against a CUDA LibTorch -- the one inside a pip-installed PyTorch -- and runs the
# CUDA paths: the [cuda] tests, the main job on the GPU and the GPU benchmark lines.
#
#   bash scripts/cuda-check.sh prepare   # here (Debian): copies the header-only dependencies and
#                                        # the data into .cuda-deps/ (ignored by git)
#   bash scripts/cuda-check.sh run OUT   # on the CUDA machine (no package registry there): builds
#                                        # in build-cuda/, logs and results into OUT
#
# The CUDA machine has python3 with a CUDA PyTorch, nvcc, g++, CMake and Ninja but none of our
# Debian -dev packages: `prepare` carries their headers (tl::expected, toml++, CLI11, nlohmann-json,
# Catch2, OpenSSL, zlib; fmt and Gloo only where the wheel has none of its own), and small CMake
# package files stand in for theirs. Libraries that are compiled (zlib, libcrypto) are the
# machine's own runtime ones.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="$ROOT/.cuda-deps"

prepare() {
  rm -rf "$DEPS"; mkdir -p "$DEPS/include" "$DEPS/fmt9" "$DEPS/gloo" "$DEPS/cmake" "$DEPS/data"
  cp -r /usr/include/tl /usr/include/toml++ /usr/include/CLI /usr/include/nlohmann /usr/include/catch2 \
        /usr/include/openssl /usr/include/zlib.h /usr/include/zconf.h "$DEPS/include/"
  cp /usr/include/x86_64-linux-gnu/openssl/*.h "$DEPS/include/openssl/"
  cp -r /usr/include/fmt "$DEPS/fmt9/"
  cp -r /usr/include/gloo "$DEPS/gloo/"
  cp /usr/lib/cmake/Catch2/Catch.cmake /usr/lib/cmake/Catch2/CatchAddTests.cmake "$DEPS/cmake/"
  cp /usr/share/datasets/fashion-mnist/*.gz "$DEPS/data/"
  local inc='${CMAKE_CURRENT_LIST_DIR}/../include'
  cat > "$DEPS/cmake/tl-expected-config.cmake" <<CM
add_library(tl::expected INTERFACE IMPORTED)
set_target_properties(tl::expected PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "$inc")
CM
  cat > "$DEPS/cmake/nlohmann_jsonConfig.cmake" <<CM
add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
set_target_properties(nlohmann_json::nlohmann_json PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "$inc")
CM
  cat > "$DEPS/cmake/Catch2Config.cmake" <<CM
add_library(Catch2::Catch2 INTERFACE IMPORTED)
set_target_properties(Catch2::Catch2 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "$inc")
list(APPEND CMAKE_MODULE_PATH "\${CMAKE_CURRENT_LIST_DIR}")
CM
  # fmt header-only: the wheel's own copy when it has one (it must win over ours), else Debian's.
  cat > "$DEPS/cmake/fmtConfig.cmake" <<'CM'
add_library(fmt::fmt INTERFACE IMPORTED)
set(_inc "${CMAKE_CURRENT_LIST_DIR}/../include")
if(NOT BATON_TORCH_HAS_FMT)
  list(APPEND _inc "${CMAKE_CURRENT_LIST_DIR}/../fmt9")
endif()
set_target_properties(fmt::fmt PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_inc}"
                      INTERFACE_COMPILE_DEFINITIONS "FMT_HEADER_ONLY=1")
CM
  du -sh "$DEPS"
}

run() {
  local out="${1:?OUT folder}"; mkdir -p "$out"
  local log="$out/cuda-check.log"; : > "$log"
  say() { echo "== $*" | tee -a "$log"; }
  say "machine"; { nvidia-smi -L; g++ --version | head -1; cmake --version | head -1; nproc; } 2>&1 | tee -a "$log"
  local torch; torch="$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')"
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' | tee -a "$log"
  local has_fmt=OFF; [ -d "$torch/include/fmt" ] && has_fmt=ON
  local gloo_inc=""; [ -d "$torch/include/gloo" ] || gloo_inc="$DEPS/gloo"
  say "wheel has fmt: $has_fmt, gloo headers: $([ -z "$gloo_inc" ] && echo yes || echo no)"
  mkdir -p /usr/share/datasets/fashion-mnist && cp "$DEPS"/data/*.gz /usr/share/datasets/fashion-mnist/
  local lib=/usr/lib/x86_64-linux-gnu
  say "configure"
  cmake -S "$ROOT" -B "$ROOT/build-cuda" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH="$torch/share/cmake;$DEPS/cmake" -DBATON_TORCH_HAS_FMT=$has_fmt \
        -Dtl-expected_DIR="$DEPS/cmake" -DCatch2_DIR="$DEPS/cmake" -Dfmt_DIR="$DEPS/cmake" -Dnlohmann_json_DIR="$DEPS/cmake" \
        -DZLIB_INCLUDE_DIR="$DEPS/include" -DZLIB_LIBRARY="$lib/libz.so.1" \
        -DOPENSSL_INCLUDE_DIR="$DEPS/include" -DOPENSSL_CRYPTO_LIBRARY="$(ls $lib/libcrypto.so.3)" \
        -DOPENSSL_SSL_LIBRARY="$(ls $lib/libssl.so.3)" -DBATON_TOMLPP_INCLUDE_DIR="$DEPS/include" \
        -DCMAKE_CXX_FLAGS="-isystem $DEPS/include ${gloo_inc:+-isystem $gloo_inc}" \
        -DCMAKE_CUDA_ARCHITECTURES=90 2>&1 | tee -a "$log" | tail -30
  say "build"
  local rc=0 b="$ROOT/build-cuda"
  cmake --build "$b" -j "$(nproc)" -- -k 0 ${BATON_CUDA_TARGETS:-baton_exe baton_tests bench_fit} >"$out/build.log" 2>&1 || rc=$?
  grep -E 'error|Error' "$out/build.log" | head -60 | tee -a "$log" || true
  say "build rc=$rc"
  export CUBLAS_WORKSPACE_CONFIG=:4096:8  # deterministic cuBLAS, for the [cuda] tests' deterministic mode
  if [ -x "$b/baton_tests" ]; then
    say "cuda tests"
    local trc=0
    (cd "$b" && timeout 240 ./baton_tests '[cuda]' >"$out/cuda-tests.log" 2>&1) || trc=$?
    tail -60 "$out/cuda-tests.log" | tee -a "$log"
    if [ "$trc" -ge 128 ] && command -v cuda-gdb >/dev/null; then
      say "cuda tests crashed ($trc): backtrace"
      (cd "$b" && timeout 200 cuda-gdb -batch -ex "set pagination off" -ex run -ex bt --args ./baton_tests '[cuda]' 2>&1 \
         | grep -E '^#|signal|cuda_test' | head -40) | tee -a "$log" || true
    fi
  fi
  if [ -x "$b/baton" ]; then
    local run; run="$(mktemp -d)"
    for p in fp32 bf16; do
      say "main job on the GPU, precision $p"
      local t0=$SECONDS
      (cd "$b" && timeout 200 ./baton run "$ROOT/examples/fashion_mnist.toml" \
         --set run.run_dir="$run/$p" --set run.device=cuda --set defaults.precision=$p 2>&1 | tail -6) | tee -a "$log" || true
      say "wall $((SECONDS - t0)) s"
    done
  fi
  if [ -x "$b/bench_fit" ]; then
    say "bench (GPU)"
    for c in cnn cnn_channels_last cnn_bf16 mlp; do
      (cd "$b" && timeout 120 ./bench_fit --device cuda --case $c --reps 3 2>&1 | grep -v '^#' | tail -2) | tee -a "$log" || true
    done
  fi
  return "$rc"
}

case "${1:-}" in
  prepare) prepare ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 prepare | run OUT" >&2; exit 2 ;;
esac
