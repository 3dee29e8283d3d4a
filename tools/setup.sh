#!/usr/bin/env bash
# Installs what dflash-train needs to build and run on Debian 12 / Ubuntu 22.04+ (idempotent); with --tests
# also what only the test suite needs (tools/test.sh passes it).
# Usage: tools/setup.sh [--tests]    (as root, or with sudo available)
set -euo pipefail
tests=0
case "${1:-}" in
  "") ;;
  --tests) tests=1 ;;
  *) echo "usage: tools/setup.sh [--tests]" >&2; exit 2 ;;
esac
# Building (GoogleTest too: the default build has the tests; -DDFLASH_BUILD_TESTS=OFF builds without it),
# running (mpirun) and dflash-report (python3-numpy/h5py/matplotlib = requirements.txt).
PKGS=(build-essential cmake ninja-build pkg-config
      libopenmpi-dev openmpi-bin
      libhdf5-dev hdf5-tools
      libboost-program-options-dev nlohmann-json3-dev libgtest-dev
      python3 python3-numpy python3-h5py python3-matplotlib)
# The tests' local Slurm cluster (tests/slurm, docs/checkpoint.md): daemons a user's machine does not need.
if [ $tests -eq 1 ]; then PKGS+=(slurm-wlm munge); fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "# installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "# all packages present$([ $tests -eq 1 ] && echo " (the tests' included)")"
fi
