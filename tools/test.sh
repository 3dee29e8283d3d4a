#!/usr/bin/env bash
# Sets up, builds and runs the test suite (the README's second command; CI runs this).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
tools/build.sh "$@"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j2 -LE gpu
ctest --output-on-failure -L gpu   # skipped (with the reason) where there is no GPU
