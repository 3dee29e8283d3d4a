#!/usr/bin/env bash
# The GPU end-to-end checks of the cuda-mpi plane, under the CUDA-aware Open MPI: the planes' byte checks
# (cuda-mpi required), the GPU job tracking the CPU run's losses with --data-plane cuda-mpi, and a target
# lost mid-transfer (killed: 137; hung: exit 7 naming it).
# Usage (GPU machine, repository root): bench/planes/gpu_checks_cuda_mpi.sh BIN_DIR OUT_DIR
set -uo pipefail
B=$(cd "${1:?bin dir}" && pwd); OUT=${2:?out dir}
mkdir -p "$OUT"
source "$(dirname "$0")/cuda_mpi_env.sh" "$B"
export NCCL_NVLS_ENABLE=0 DFLASH_BIN="$B/cudampi" DFLASH_SRC="$PWD" DFLASH_TEST_DATA="$PWD/tests/data"
export DFLASH_TEST_PLANE=cuda-mpi DFLASH_REQUIRE_PLANES=host,cuda-mpi
rc=0
for t in test_gpu_planes test_gpu_pipeline test_gpu_lost_peer; do
  t0=$SECONDS
  bash "tests/gpu_e2e/$t.sh" >"$OUT/cudampi_$t.log" 2>&1; r=$?
  printf '%-28s rc=%-3d %4ds\n' "cudampi_$t" "$r" $((SECONDS - t0)) | tee -a "$OUT/summary.txt"
  [ $r -eq 0 ] || { rc=1; tail -25 "$OUT/cudampi_$t.log"; }
done
exit $rc
