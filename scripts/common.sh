# Shared by scripts/main.sh and scripts/test.sh: installs what baton needs, configures, builds.
# Safe to run again: it installs only missing packages and rebuilds only what changed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BATON_BUILD_DIR:-$ROOT/build}"

# Debian bookworm packages: toolchain, LibTorch (CPU) with OpenBLAS, the libraries baton uses,
# Catch2 for tests and the Fashion-MNIST data set.
PACKAGES=(g++ cmake ninja-build ccache git
          libtorch-dev libopenblas0 libexpected-dev librange-v3-dev libtomlplusplus-dev
          libfmt-dev zlib1g-dev libssl-dev libcli11-dev nlohmann-json3-dev catch2 dataset-fashion-mnist
          clang-14 libclang-rt-14-dev llvm-14)  # clang/libFuzzer/llvm-symbolizer: scripts/fuzz.sh
# The report's browser test (tests/report_test.cpp, tag [browser]) opens reports in headless Chromium.
PACKAGES+=(chromium)
# Gloo's headers, for c10d's ProcessGroupGloo (data-parallel training, src/distributed.cpp).
PACKAGES+=(libgloo-dev)
# PyTorch for Python (Debian's /usr/bin/python3): tests/interop_test.cpp loads baton's exported
# weights in Python and baton loads what Python saved.
PACKAGES+=(python3-torch)
# scikit-learn for Python: tests/metrics_test.cpp checks the regression metrics against its own.
PACKAGES+=(python3-sklearn)
# SentencePiece: trained tokenizers for text (src/tokenizer.cpp, baton tokenize).
PACKAGES+=(libsentencepiece-dev)
# Text: the fortune-cookie databases (English and five other languages), the corpus of the
# language models (include/baton/text.hpp, examples/fortunes_gpt.toml).
PACKAGES+=(fortunes fortunes-de fortunes-es fortunes-it fortunes-ru fortunes-pl)
# stb_image decodes PNG/JPEG/BMP/PGM images for `baton predict` (src/inference/inputs.cpp).
PACKAGES+=(libstb-dev)

ensure_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "baton: installing ${missing[*]}"
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

build() {
  # ccache across rebuilds; the sloppiness settings let it cache precompiled-header users.
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  # Paths under the checkout hash as relative ones: a fresh clone elsewhere reuses the cache.
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
  local jobs
  jobs="$(nproc 2>/dev/null || echo 2)"
  # A unity build (8 sources per translation unit) compiles the suite in about half the time of
  # one unit per source on 2 cores: most of a unit's time is LibTorch's templates, instantiated
  # once per unit. BATON_UNITY_BUILD=OFF builds one unit per source (what catches a missing include).
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_UNITY_BUILD="${BATON_UNITY_BUILD:-ON}" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache "$@" >/dev/null
  cmake --build "$BUILD_DIR" -j "$jobs"
}
