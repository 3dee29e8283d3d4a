#!/usr/bin/env bash
# The data planes on one H200, both ranks on its GPU, at the Qwen3.6-27B batch shape (5 captured layers x
# 32768 tokens x 5120 hidden, bf16 = 1.68 GB, plus tokens and mask), each against a device-to-device copy
# of the same size in the same run: host under the system Open MPI (not CUDA-aware: cuda-mpi is listed as
# skipped), then host and cuda-mpi under the CUDA-aware Open MPI of tools/build_cuda_openmpi.sh.
# Usage (GPU machine, repository root): bench/planes/run_h200_1gpu.sh BIN_DIR OUT_DIR
#   BIN_DIR/dflash-plane-bench           built against the system MPI
#   BIN_DIR/cudampi/dflash-plane-bench   built against the CUDA-aware prefix (tools/build_cuda_openmpi.sh)
#   BIN_DIR/openmpi-cuda.tar.xz          that prefix, packed (unpacked to /tmp/ompi-cuda here)
set -uo pipefail
B=$(cd "${1:?bin dir}" && pwd); OUT=${2:?out dir}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
shape=(--layers 5 --tokens 32768 --hidden 5120 --iters 10 --warmup 3 --depth 2)
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/# /'
mpirun -np 2 "$B/dflash-plane-bench" --planes host,cuda-mpi,nccl --require host "${shape[@]}" 2>&1 | tee "$OUT/planes-system-mpi.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
source "$(dirname "$0")/cuda_mpi_env.sh" "$B"
mpirun -np 2 "$B/cudampi/dflash-plane-bench" --planes host,cuda-mpi --require host,cuda-mpi "${shape[@]}" 2>&1 | tee "$OUT/planes-cuda-mpi.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
exit $rc
