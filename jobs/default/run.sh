#!/usr/bin/env bash
# The default job: a tiny generated Qwen3 target and dataset, the CPU backend, real mpirun with 4 ranks:
# 2 targets, 1 drafter, 1 idle (--topology 2-1). A few minutes on 2 cores. Writes RUN_DIR:
#   tiny/target, tiny/data.h5   the generated target checkpoint and dataset (made once)
#   metrics.h5                  per-step loss/acc/streak, per-rank time split, queue depths (docs/metrics.md)
#   drafter/                    the trained drafter, release format (config.json + model.safetensors)
#   train.log                   status lines, startup table, resolved options
#
# Usage: jobs/default/run.sh [extra dflash-train options, e.g. --epochs 2]
# env:   BUILD_DIR (default build; built with tools/build.sh when missing), RUN_DIR (default runs/default)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$repo/build}
RUN_DIR=${RUN_DIR:-$repo/runs/default}

# ---- build if needed ----------------------------------------------------------------------------
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  # Only the two programs this job runs, so the first run stays short. The job itself runs on the CPU: with
  # no GPU visible no CUDA code is compiled at all (-DDFLASH_CUDA=OFF, even where a toolkit is installed);
  # with one, CUDA code (when a toolkit is present) only for this machine's GPU instead of the default
  # Hopper+Blackwell list. A build for other GPUs: tools/build.sh (the default architectures) or
  # -DCMAKE_CUDA_ARCHITECTURES.
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    cuda=(-DCMAKE_CUDA_ARCHITECTURES=native)
    echo "[default job] building dflash-train and dflash-make-tiny (a GPU is visible: CUDA code for it too)"
  else
    cuda=(-DDFLASH_CUDA=OFF)
    echo "[default job] building dflash-train and dflash-make-tiny (no GPU visible: the CPU backend only)"
  fi
  BUILD_DIR="$BUILD_DIR" TARGETS="dflash-train dflash-make-tiny" "$repo/tools/build.sh" "${cuda[@]}"
else
  cmake --build "$BUILD_DIR" -j"${JOBS:-2}" --target dflash-train dflash-make-tiny
fi

# ---- the tiny target + dataset (seconds; kept for later runs) ----------------------------------------
mkdir -p "$RUN_DIR"
if [ ! -f "$RUN_DIR/tiny/data.h5" ]; then
  rm -rf "$RUN_DIR/tiny.tmp"
  "$BUILD_DIR/dflash-make-tiny" "$RUN_DIR/tiny.tmp"
  rm -rf "$RUN_DIR/tiny" && mv "$RUN_DIR/tiny.tmp" "$RUN_DIR/tiny"
fi

# ---- the job -------------------------------------------------------------------------------------
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# 4 ranks on however many cores: --oversubscribe, no core binding (each rank also runs a loader thread).
set +e
mpirun -np 4 --oversubscribe --bind-to none "$BUILD_DIR/dflash-train" --config "$here/train.cfg" \
  --target "$RUN_DIR/tiny/target" --data "$RUN_DIR/tiny/data.h5" --out "$RUN_DIR" "$@"
rc=$?  # (dflash-train writes RUN_DIR/train.log itself)
set -e
[ "$rc" -eq 0 ] || { echo "[default job] dflash-train failed with exit code $rc (README \"Exit codes\")" >&2; exit "$rc"; }

# ---- what it learned: first vs last logged values (h5py, when installed) ------------------------------
if /usr/bin/python3 -c 'import h5py' 2>/dev/null; then
  /usr/bin/python3 - "$RUN_DIR/metrics.h5" <<'PYEOF'
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'r')
s = {k: f['steps/' + k][:] for k in ('step', 'loss', 'acc', 'streak')}
n = max(1, len(s['step']) // 10)  # average the first and last tenth of the steps: single steps are noisy
for k in ('loss', 'acc', 'streak'):
    print(f"[default job] {k:6s} first {n} steps {np.mean(s[k][:n]):.4f} -> last {n} steps {np.mean(s[k][-n:]):.4f}")
PYEOF
fi
echo "[default job] done: $RUN_DIR/metrics.h5, $RUN_DIR/drafter/"
