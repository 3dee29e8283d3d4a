#!/usr/bin/env bash
# Issue 44's check on one GPU (docs/cost_model.md "Validation"): the cost model's predictions against what
# the landed binaries measure on this GPU, at the shapes issue 44 names, in one call.
#
#   bash bench/plan/validate_one_gpu.sh BUILD OUT
#
# 1. bench/calibrate_sweep.sh's target and drafter parts (8B dense and 27B hybrid forwards, 8B steps at two anchor
#    densities, 27B DFlash and DFlash2 steps): every median beside the model's prediction
#    (dflash_unit_tests' CostModelCalibration points, src/plan/calibration_points.cpp, once the numbers land there).
# 2. The layout one GPU runs, through the real job: 1-1 with both ranks on the GPU (a random Qwen3-8B, records of
#    1024..8192 tokens, 16384-token batches) at 512 anchors per batch and at 512 anchors per record; metrics.h5
#    keeps the plan's prediction (attribute layout_plan) and dflash-report prints LAYOUT PLAN VS OBSERVED.
# Needs: BUILD/{bench_target_forward, bench_hybrid_forward, drafter_bench, dflash-train, dflash-make-random}
# (flat or in bench/) and python3 with h5py + numpy (tools/dflash-report).
set -u
B=${1:?usage: bench/plan/validate_one_gpu.sh BUILD OUT}
OUT=${2:?usage: bench/plan/validate_one_gpu.sh BUILD OUT}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_hwloc_base_binding_policy=none
W=${WORK_DIR:-/tmp/dflash-plan}
mkdir -p "$W"
echo "# $(date -u +%FT%TZ) $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"

if [ "${SKIP_SWEEP:-0}" != 1 ]; then
  bash "$HERE/bench/calibrate_sweep.sh" "$B" "$OUT/sweep" target drafter > "$OUT/sweep.log" 2>&1
  echo "# sweep: $(grep -c '^## ' "$OUT/sweep/summary.txt" 2>/dev/null) runs"
fi

T=$B/dflash-train
[ -x "$T" ] || T=$B/../dflash-train
MR=$B/dflash-make-random
[ -x "$MR" ] || MR=$B/../dflash-make-random
[ -f "$W/q8/data.h5" ] || "$MR" "$W/q8" --preset qwen3-8b --records 600 --min-len 1024 --max-len 8192 > "$OUT/make-random.txt" 2>&1
COMMON=(--backend cuda --target "$W/q8/target" --data "$W/q8/data.h5" --token-budget 16384 --long-record cut
        --loss ce --draft-layers 5 --lr 6e-4 --peer-timeout 300 --topology 1-1 --log-every 10 --hs-queue-depth 4)
for density in batch record; do
  case $density in
    batch) extra=(--max-anchors 512 --anchors-per-record 0 --max-steps 50) ;;
    record) extra=(--anchors-per-record 512 --max-steps 25) ;;
  esac
  rm -rf "$W/run-$density"
  echo "# 1-1 on one GPU, 512 anchors per $density"
  mpirun -np 2 -x NCCL_NVLS_ENABLE "$T" "${COMMON[@]}" "${extra[@]}" --out "$W/run-$density" > "$OUT/run-$density.txt" 2>&1
  echo "# exit $?"
  python3 "$HERE/tools/dflash-report" "$W/run-$density/metrics.h5" --calibration-out "$OUT/calibration-$density.json" \
    > "$OUT/report-$density.txt" 2>&1
  sed -n '/LAYOUT PLAN VS OBSERVED/,/^$/p' "$OUT/report-$density.txt"
done
