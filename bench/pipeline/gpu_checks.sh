#!/usr/bin/env bash
# One device call that runs every GPU check of the GPU pipeline (GPU unit tests, the CUDA selftest, the
# GPU end-to-end tests) from a carried build directory holding only the programs.
# Usage (GPU machine, repository root): bench/pipeline/gpu_checks.sh BIN_DIR OUT_DIR
set -uo pipefail
B=$(cd "${1:?bin dir}" && pwd); OUT=${2:?out dir}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 DFLASH_BIN="$B" DFLASH_SRC="$PWD" DFLASH_TEST_DATA="$PWD/tests/data"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
nvidia-smi --query-gpu=name,driver_version,memory.total,power.draw --format=csv
rc=0
step() {  # step NAME CMD...: runs it, keeps its log, records failures (77 = skipped, with its reason)
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1; local r=$?
  local why=""; [ $r -eq 77 ] && why="skipped: $(grep -m1 SKIPPED "$OUT/$name.log")"
  printf '%-28s rc=%-3d %4ds %s\n' "$name" "$r" $((SECONDS - t0)) "$why" | tee -a "$OUT/summary.txt"
  [ $r -eq 0 ] || [ $r -eq 77 ] || { rc=1; tail -25 "$OUT/$name.log"; }
}
[ -n "${SKIP_UNIT:-}" ] || step gpu_unit "$B/dflash_gpu_tests" --gtest_brief=1
# The same suite and the target selftests under an RTX PRO 6000 Blackwell's limits (kernels/device_limits.cuh)
[ -n "${SKIP_SM120:-}" ] || step gpu_unit_sm120_limits env DFLASH_DEVICE_LIMITS=sm_120 "$B/dflash_gpu_tests" --gtest_brief=1
[ -n "${SKIP_SM120:-}" ] || step selftest_cuda_hybrid_sm120 env DFLASH_DEVICE_LIMITS=sm_120 "$B/dflash-selftest" tests/data/golden/qwen35-tiny-a --backend cuda
[ -n "${SKIP_SM120:-}" ] || step selftest_cuda_qwen38_sm120 env DFLASH_DEVICE_LIMITS=sm_120 "$B/dflash-selftest" tests/data/golden/qwen38-tiny-a --backend cuda
[ -n "${SKIP_UNIT:-}" ] || step selftest_cuda "$B/dflash-selftest" tests/data/golden/qwen3-tiny-a --backend cuda
[ -n "${SKIP_UNIT:-}" ] || step selftest_cuda_hybrid "$B/dflash-selftest" tests/data/golden/qwen35-tiny-a --backend cuda
[ -n "${SKIP_UNIT:-}" ] || step selftest_cuda_qwen38 "$B/dflash-selftest" tests/data/golden/qwen38-tiny-a --backend cuda
[ -n "${SKIP_UNIT:-}" ] || [ ! -x "$B/dflash_gpu_mpi_tests" ] || step gpu_mpi_np2 mpirun -np 2 --oversubscribe "$B/dflash_gpu_mpi_tests"
# GPU_E2E="planes pipeline" runs only those (default: every tests/gpu_e2e/test_*.sh)
for t in tests/gpu_e2e/test_*.sh; do
  n=$(basename "$t" .sh)
  [ -z "${GPU_E2E:-}" ] || [[ " $GPU_E2E " == *" ${n#test_gpu_} "* ]] || continue
  step "$n" bash "$t"
done
exit $rc
