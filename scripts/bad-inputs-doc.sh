#!/usr/bin/env bash
# Regenerates docs/bad-inputs.md from the catalog in tests/bad_inputs/ (the table is the test
# data, so it cannot drift: the "[bad_inputs][docs]" test fails when the file is not current).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BATON_UPDATE_DOCS=1 "${BATON_BUILD_DIR:-$ROOT/build}/baton_tests" "[bad_inputs][docs]"
