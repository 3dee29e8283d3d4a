#!/usr/bin/env bash
# Sets up, builds and runs the test suite (the README's second command; CI runs this).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh --tests
# One CUDA architecture keeps CI's build time down (the default build covers 90a;100;120); the tests
# that run here are CPU tests anyway. Override with CUDA_ARCHS.
echo "# CUDA architectures for this build: ${CUDA_ARCHS:-90a} (the default build: 90a;100;120)"
# DFLASH_CUDA=AUTO given, not left to the cache: jobs/default/run.sh (the README's first command) configures
# the same build/ with -DDFLASH_CUDA=OFF where no GPU is visible, and a cached OFF would build the suite
# without the CUDA backend wherever a toolkit is installed. Arguments given here still win (e.g. OFF).
tools/build.sh -DDFLASH_CUDA=AUTO -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" "$@"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cd "${BUILD_DIR:-build}"
# The GPU-labelled tests first: where there is no GPU they are skipped (each with its reason), and the run
# that ends this script -- its summary is the last thing a log shows -- is the suite that ran here.
ctest --output-on-failure -L gpu
ctest --output-on-failure -j2 -LE gpu
