#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, and runs every test with CTest.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ensure_packages
build
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 900 -j "$(nproc 2>/dev/null || echo 2)" "$@"
