#!/usr/bin/env bash
# The GPU pipeline on one GPU (issue "The GPU pipeline"): a Qwen3-8B-shape target with random bf16
# weights written as a real HF checkpoint, random-token data, --token-budget 16384; each role measured
# standalone by the same binary (--topology auto --measure-only, one rank owning the GPU), then the 1-1
# job with both ranks on the GPU; summarise.py compares the run with the one-GPU ceiling
# 1/(1/target rate + 1/drafter rate) and reports the drafter's data-plane wait.
# PLANES="host cuda-mpi" runs the 1-1 job once per data plane (default: host); cuda-mpi runs
# BUILD_DIR/cudampi/dflash-train under the CUDA-aware Open MPI (bench/planes/cuda_mpi_env.sh).
# Usage (GPU machine): bench/pipeline/run_h200_1gpu.sh BUILD_DIR OUT_DIR [STEPS]
set -euo pipefail
B=${1:?build dir}; OUT=${2:?out dir}; STEPS=${3:-60}
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_hwloc_base_binding_policy=none
W=${WORK_DIR:-/tmp/dflash-bench}
mkdir -p "$W" "$OUT"
nvidia-smi --query-gpu=name,memory.total,power.draw --format=csv | tee "$OUT/gpu.txt"
[ -f "$W/q8/data.h5" ] || (time "$B/dflash-make-random" "$W/q8" --preset qwen3-8b --records 600 --min-len 1024 --max-len 8192) 2>&1 | tail -4
COMMON=(--backend cuda --target "$W/q8/target" --data "$W/q8/data.h5" --token-budget 16384 --long-record cut
        --max-anchors 512 --loss ce --draft-layers 5 --lr 6e-4 --peer-timeout 300)
echo "# standalone roles: one rank, the whole GPU"
mpirun -np 1 "$B/dflash-train" "${COMMON[@]}" --topology auto --measure-only --out "$W/measure" 2>&1 | tee "$OUT/measure.txt"
TS=$(sed -n 's/.*auto: target \([0-9.]*\) s\/batch, drafter \([0-9.]*\) s\/batch.*/\1/p' "$OUT/measure.txt")
DS=$(sed -n 's/.*auto: target \([0-9.]*\) s\/batch, drafter \([0-9.]*\) s\/batch.*/\2/p' "$OUT/measure.txt")
for plane in ${PLANES:-host}; do
  echo "# the 1-1 pipeline, both ranks on the GPU, --data-plane $plane"
  rm -rf "$W/run-$plane"
  (
    bin=$B
    if [ "$plane" = cuda-mpi ]; then source "$(dirname "$0")/../planes/cuda_mpi_env.sh" "$B"; bin=$B/cudampi; fi
    mpirun -np 2 -x NCCL_NVLS_ENABLE "$bin/dflash-train" "${COMMON[@]}" --topology 1-1 --max-steps "$STEPS" --log-every 10 \
      --hs-queue-depth 4 --data-plane "$plane" --out "$W/run-$plane" 2>&1 | tee "$OUT/run-$plane.txt"
  )
  python3 "$(dirname "$0")/summarise.py" "$W/run-$plane/metrics.h5" --target-s "$TS" --drafter-s "$DS" | tee "$OUT/summary-$plane.txt"
done
