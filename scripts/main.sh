#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the shipped Fashion-MNIST curriculum
# with the baton command line. Extra arguments go to `baton run` (e.g. --set run.seed=7, --fresh).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ensure_packages
build
cd "$ROOT"
exec "$BUILD_DIR/baton" run examples/fashion_mnist.toml "$@"
