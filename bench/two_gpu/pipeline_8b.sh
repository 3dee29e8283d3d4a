#!/usr/bin/env bash
# Issue "Two-GPU measurements", device call 2 of 2 (nvidia-h200-x2), from the repository root: the 1-1 job
# at the Qwen3-8B shape (random bf16 weights written as a real HF checkpoint, --token-budget 16384), the
# target on GPU 0 and the drafter on GPU 1, once per data plane, in two configurations:
#   A  the pipeline defaults of bench/pipeline (5 draft layers, 512 anchors): the target is the slower role;
#   B  a drafter-bound variant (DRAFT_B, default 8 draft layers): the drafter is the slower role, so its data
#      wait shows what the plane costs it.
# Each configuration's roles are first measured standalone by the same binary (--topology auto
# --measure-only: one rank, one GPU); summarise.py compares each run with min(target, drafter) rate and
# reports the drafter's steady data wait and both GPUs' NVML power; dflash-report gives its prediction of the
# run's own split. Then the drafters alone at the 8B shape (dflash-drafters-bench: identical weights, union
# check, the bucketed sum's exposed time against one bucket after the backward).
# Usage: bench/two_gpu/pipeline_8b.sh BIN_DIR OUT_DIR [STEPS]   (env WHAT="A B drafters" to pick parts)
set -uo pipefail
B=$(cd "${1:?bin dir}" && pwd); OUT=${2:?out dir}; STEPS=${3:-40}
WHAT=${WHAT:-A B drafters}
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_hwloc_base_binding_policy=none
W=${WORK_DIR:-/tmp/dflash-bench}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$W" "$OUT"
nvidia-smi --query-gpu=index,name,memory.total,power.draw --format=csv | tee "$OUT/gpus.txt"
[ -f "$W/q8/data.h5" ] || (time "$B/dflash-make-random" "$W/q8" --preset qwen3-8b --records 600 --min-len 1024 --max-len 8192) 2>&1 | tail -4
COMMON=(--backend cuda --target "$W/q8/target" --data "$W/q8/data.h5" --token-budget 16384 --long-record cut
        --max-anchors 512 --loss ce --lr 6e-4 --peer-timeout 300)
REPORT="python3 $PWD/tools/dflash-report"
config() {  # config NAME DRAFT_LAYERS
  local name=$1 layers=$2
  echo "# configuration $name: --draft-layers $layers; standalone roles (one rank, one GPU)"
  timeout 240 mpirun -np 1 "$B/dflash-train" "${COMMON[@]}" --draft-layers "$layers" --topology auto --measure-only \
    --out "$W/measure-$name" >"$OUT/measure-$name.txt" 2>&1
  grep "auto:" "$OUT/measure-$name.txt"
  local ts ds
  ts=$(sed -n 's/.*auto: target \([0-9.]*\) s\/batch, drafter \([0-9.]*\) s\/batch.*/\1/p' "$OUT/measure-$name.txt")
  ds=$(sed -n 's/.*auto: target \([0-9.]*\) s\/batch, drafter \([0-9.]*\) s\/batch.*/\2/p' "$OUT/measure-$name.txt")
  for plane in ${PLANES:-nccl cuda-mpi host}; do
    echo "# configuration $name, 1-1 on two GPUs, --data-plane $plane"
    rm -rf "$W/run-$name-$plane"
    (
      bin=$B
      if [ "$plane" = cuda-mpi ]; then source "$HERE/../planes/cuda_mpi_env.sh" "$B" >/dev/null; bin=$B/cudampi; fi
      timeout 240 mpirun -np 2 -x NCCL_NVLS_ENABLE "$bin/dflash-train" "${COMMON[@]}" --draft-layers "$layers" \
        --topology 1-1 --max-steps "$STEPS" --log-every 10 --hs-queue-depth 4 --data-plane "$plane" \
        --out "$W/run-$name-$plane" >"$OUT/run-$name-$plane.txt" 2>&1
    )
    grep -h "hidden states\|step=$STEPS \|done in" "$OUT/run-$name-$plane.txt"
    python3 "$HERE/../pipeline/summarise.py" "$W/run-$name-$plane/metrics.h5" --target-s "$ts" --drafter-s "$ds" \
      --separate-gpus 2>&1 | tee "$OUT/summary-$name-$plane.txt"
    $REPORT "$W/run-$name-$plane/metrics.h5" >"$OUT/report-$name-$plane.txt" 2>&1
    grep -h "model predicts\|Keep\|Switch" "$OUT/report-$name-$plane.txt"
  done
}
for w in $WHAT; do
  case $w in
    A) config A 5 ;;
    B) config B "${DRAFT_B:-8}" ;;
    drafters)
      echo "# the drafters alone, 8B shape"
      timeout 420 mpirun -np 2 "$B/dflash-drafters-bench" --target "$W/q8/target" --draft-layers 5 --tokens 16384 \
        --seq-len 4096 --anchors 512 --warmup 1 --steps 4 --bucket-mb 25 --union-check 2>&1 | tee "$OUT/drafters-8b.txt" ;;
  esac
done
