#!/usr/bin/env bash
# Installs what dflash-train needs to build and test on Debian 12 / Ubuntu 22.04+ (idempotent).
# Usage: tools/setup.sh            (as root, or with sudo available)
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config
      libopenmpi-dev openmpi-bin
      libhdf5-dev hdf5-tools
      libboost-program-options-dev nlohmann-json3-dev libgtest-dev
      python3 python3-numpy python3-h5py python3-matplotlib
      slurm-wlm munge)  # slurm-wlm, munge: the local Slurm cluster of tests/slurm (docs/checkpoint.md)
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
  echo "# all build/test packages present"
fi
