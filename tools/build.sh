#!/usr/bin/env bash
# Configures and builds into ./build (CPU backend; the CUDA backend too when a toolkit is found).
# Usage: tools/build.sh [extra cmake args]     env: BUILD_DIR (default build), JOBS (default 2), TARGETS
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
# TARGETS (optional): build only these targets (space-separated), e.g. the default job's two programs.
targets=(); for t in ${TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j"${JOBS:-2}" "${targets[@]}"
