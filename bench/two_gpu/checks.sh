#!/usr/bin/env bash
# Issue "Two-GPU measurements", device call 1 of 2 (nvidia-h200-x2), from the repository root:
#  1. every GPU check on two GPUs: GPU unit tests, CUDA selftest, gpu_mpi np2 (the NCCL gradient reducer
#     now runs), every gpu_e2e test (auto picks the nccl plane; 1-2 sums gradients through NCCL);
#  2. the tiny 1-1 job per plane, each tracking the CPU backend's run with --batch-order fixed
#     (tests/gpu_e2e/test_gpu_pipeline.sh with DFLASH_TEST_PLANE = nccl, host; cuda-mpi under the
#     CUDA-aware Open MPI);
#  3. the transport at the Qwen3.6-27B batch shape (1.68 GB) per plane against raw ncclSend/ncclRecv;
#  4. the drafters alone (dflash-drafters-bench) on the tiny golden target: weights identical after every
#     step, the union check, the exposed sum.
# Usage: bench/two_gpu/checks.sh BIN_DIR OUT_DIR   (BIN_DIR as bench/planes/README.md describes)
set -uo pipefail
B=$(cd "${1:?bin dir}" && pwd); OUT=${2:?out dir}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export DFLASH_SRC="$PWD" DFLASH_TEST_DATA="$PWD/tests/data"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,power.draw --format=csv | tee "$OUT/gpus.txt"
nvidia-smi topo -m >>"$OUT/gpus.txt" 2>&1
rc=0
step() {  # step NAME CMD...: runs it, keeps its log, records failures
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1; local r=$?
  printf '%-34s rc=%-3d %4ds\n' "$name" "$r" $((SECONDS - t0)) | tee -a "$OUT/summary.txt"
  [ $r -eq 0 ] || { rc=1; tail -25 "$OUT/$name.log"; }
}
# PARTS="unit tiny planes drafters" picks parts (default: all)
want() { [ -z "${PARTS:-}" ] || [[ " $PARTS " == *" $1 "* ]]; }
# 1.
want unit && DFLASH_BIN=$B step gpu_checks bash bench/pipeline/gpu_checks.sh "$B" "$OUT/gpu_checks"
# 2. (test_gpu_pipeline runs the CPU job and the GPU job; DFLASH_TEST_PLANE picks the plane)
want tiny && for plane in nccl host; do
  DFLASH_BIN=$B DFLASH_TEST_PLANE=$plane step "tiny_1-1_$plane" bash tests/gpu_e2e/test_gpu_pipeline.sh
done
have_cudampi() { [ -x "$B/cudampi/dflash-train" ] && [ -f "$B/openmpi-cuda.tar.xz" ] || { echo "# cuda-mpi parts skipped: no $B/cudampi build"; false; }; }
if want tiny && have_cudampi; then (
  source bench/planes/cuda_mpi_env.sh "$B"
  DFLASH_BIN=$B/cudampi DFLASH_TEST_PLANE=cuda-mpi step tiny_1-1_cuda-mpi bash tests/gpu_e2e/test_gpu_pipeline.sh
  DFLASH_BIN=$B/cudampi DFLASH_REQUIRE_PLANES=host,cuda-mpi step cudampi_planes bash tests/gpu_e2e/test_gpu_planes.sh
  exit $rc
) || rc=1; fi
# 3.
shape=(--layers 5 --tokens 32768 --hidden 5120 --iters 10 --warmup 3 --depth 2)
want planes && step planes_27b_system_mpi mpirun -np 2 "$B/dflash-plane-bench" --planes host,cuda-mpi,nccl --require host,nccl "${shape[@]}"
if want planes && have_cudampi; then (
  source bench/planes/cuda_mpi_env.sh "$B"
  step planes_27b_cuda_mpi mpirun -np 2 "$B/cudampi/dflash-plane-bench" --planes host,cuda-mpi,nccl \
    --require host,cuda-mpi,nccl "${shape[@]}"
  exit $rc
) || rc=1; fi
# 4.
want drafters && step drafters_tiny mpirun -np 2 "$B/dflash-drafters-bench" --target tests/data/golden/qwen3-tiny-a/target \
  --draft-layers 2 --tokens 512 --seq-len 128 --anchors 16 --warmup 2 --steps 10 --bucket-mb 0.01 --union-check
grep -h "^  \|^# case\|^# union\|^# all\|FAILED" "$OUT"/planes_27b_*.log "$OUT"/drafters_tiny.log 2>/dev/null
grep -h "rel diff" "$OUT"/tiny_1-1_*.log
exit $rc
