#!/usr/bin/env bash
# The main job: installs what is missing, builds, and trains the Fashion-MNIST curriculum.
# Extra arguments go to the program (e.g. --threads 2, --seed 7).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ensure_packages
build
exec "$BUILD_DIR/fashion_mnist_curriculum" "$@"
