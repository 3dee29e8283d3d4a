#!/usr/bin/env bash
# Issues 44 and 45 on one GPU (docs/cost_model.md "Validation", docs/pipeline.md "The colocated layout"): the cost
# model's predictions against what the landed binaries measure on this GPU, and the layouts one GPU runs.
#
#   bash bench/plan/validate_one_gpu.sh BUILD OUT [sweep] [roles] [measure] [pipeline]   (default: sweep pipeline; each
#   fits one 10-minute call; DENSITIES="batch record", LAYOUTS="1-1 colocated" choose the pipeline's runs)
#
# sweep:    bench/calibrate_sweep.sh's target and drafter parts (8B dense and 27B hybrid forwards, 8B steps at two
#           anchor densities, 27B DFlash and DFlash2 steps): every median, to set beside the model's prediction
#           (src/plan/calibration_points.cpp holds them once they land; dflash_unit_tests CostModel* checks).
# roles:    dflash-roles-bench: the job's own target forward and drafter step on the job's own batches, each batch
#           twice in a row (a first-time cost of a shape shows as first - again), per density; the target also on
#           the colocated rank's second context.
# measure:  each role alone on the GPU through the job (--topology auto --measure-only on one rank), per density.
# pipeline: the layouts of one GPU through the real job on a random Qwen3-8B (records of 1024..8192 tokens,
#           16384-token batches, 5 drafter layers, CE): 1-1 (two ranks time-sharing the GPU, hidden states staged
#           through host memory) and colocated (one process, no mpirun), each at 512 anchors per batch and at 512
#           per record (at most 2048 a batch, to fit an 80 GB card with both roles); metrics.h5 keeps the plan's
#           prediction and dflash-report prints LAYOUT PLAN VS OBSERVED (report-*.txt), summary.txt the rates.
# PACK=1:   OUT keeps summary.txt and gpu.txt, the rest in one validate-rest.tar (the GPU tool brings back 8 files).
# Needs: BUILD/{bench_target_forward, bench_hybrid_forward, drafter_bench, dflash-train, dflash-make-random, dflash-roles-bench}
# (flat or in bench/) and python3 with h5py + numpy (tools/dflash-report).
set -u
B=${1:?usage: bench/plan/validate_one_gpu.sh BUILD OUT [sweep] [pipeline]}
OUT=${2:?usage: bench/plan/validate_one_gpu.sh BUILD OUT [sweep] [pipeline]}
shift 2
PARTS=${*:-sweep pipeline}
DENSITIES=${DENSITIES:-batch record}
LAYOUTS=${LAYOUTS:-1-1 colocated}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
# The GPU tool brings back 8 files of OUT at most: PACK=1 leaves summary.txt, gpu.txt and one tar of the rest.
pack_out() {
  (cd "$OUT" && tar -cf ../validate-rest.tar --exclude=./summary.txt --exclude=./gpu.txt . &&
     find . -mindepth 1 ! -path ./summary.txt ! -path ./gpu.txt ! -path ./validate-rest.tar -delete && mv ../validate-rest.tar .)
}
[ -z "${PACK:-}" ] || trap pack_out EXIT
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_hwloc_base_binding_policy=none
W=${WORK_DIR:-/tmp/dflash-plan}
mkdir -p "$W"
echo "# $(date -u +%FT%TZ) $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"

if [[ " $PARTS " == *" sweep "* ]]; then
  bash "$HERE/bench/calibrate_sweep.sh" "$B" "$OUT/sweep" target drafter > "$OUT/sweep.log" 2>&1
  echo "# sweep: $(grep -c '^## ' "$OUT/sweep/summary.txt" 2>/dev/null) runs"
fi
[[ " $PARTS " == *" pipeline "* || " $PARTS " == *" measure "* || " $PARTS " == *" roles "* ]] || exit 0

T=$B/dflash-train
[ -x "$T" ] || T=$B/../dflash-train
MR=$B/dflash-make-random
[ -x "$MR" ] || MR=$B/../dflash-make-random
[ -f "$W/q8/data.h5" ] || "$MR" "$W/q8" --preset qwen3-8b --records 600 --min-len 1024 --max-len 8192 > "$OUT/make-random.txt" 2>&1
COMMON=(--backend cuda --target "$W/q8/target" --data "$W/q8/data.h5" --token-budget 16384 --long-record cut
        --loss ce --draft-layers 5 --lr 6e-4 --peer-timeout 300 --log-every 10 --hs-queue-depth 4)
if [[ " $PARTS " == *" roles "* ]]; then  # the job's roles on the job's batches, first and again
  RB=$B/dflash-roles-bench
  [ -x "$RB" ] || RB=$B/../dflash-roles-bench
  "$RB" --batches 10 -- "${COMMON[@]}" --out "$W/roles" --max-anchors 512 > "$OUT/roles-batch.txt" 2>&1
  "$RB" --batches 6 --target-ctx colocated -- "${COMMON[@]}" --out "$W/roles" --max-anchors 512 > "$OUT/roles-batch-colocated-ctx.txt" 2>&1
  "$RB" --batches 6 -- "${COMMON[@]}" --out "$W/roles" --anchors-per-record 512 --max-anchors 2048 > "$OUT/roles-record.txt" 2>&1
  grep -h "median over" "$OUT"/roles-*.txt
fi
if [[ " $PARTS " == *" measure "* ]]; then  # each role alone on the GPU, through the job (--measure-only)
  "$T" "${COMMON[@]}" --max-anchors 512 --topology auto --measure-only --out "$W/measure" > "$OUT/measure-batch.txt" 2>&1
  "$T" "${COMMON[@]}" --anchors-per-record 512 --max-anchors 2048 --topology auto --measure-only --out "$W/measure" \
    > "$OUT/measure-record.txt" 2>&1
  grep -h "auto: target" "$OUT"/measure-*.txt
fi
[[ " $PARTS " == *" pipeline "* ]] || DENSITIES=""
for density in $DENSITIES; do
  case $density in
    batch) dens=(--max-anchors 512 --max-steps 50) ;;
    record) dens=(--anchors-per-record 512 --max-anchors 2048 --max-steps 25) ;;
  esac
  for layout in $LAYOUTS; do
    name=$layout-$density
    rm -rf "$W/run-$name"
    echo "# $layout on one GPU, 512 anchors per $density"
    if [ "$layout" = colocated ]; then
      "$T" "${COMMON[@]}" "${dens[@]}" --topology colocated --out "$W/run-$name" > "$OUT/run-$name.txt" 2>&1
    else
      mpirun -np 2 -x NCCL_NVLS_ENABLE "$T" "${COMMON[@]}" "${dens[@]}" --topology 1-1 --out "$W/run-$name" \
        > "$OUT/run-$name.txt" 2>&1
    fi
    echo "# exit $?"
    python3 "$HERE/tools/dflash-report" "$W/run-$name/metrics.h5" --calibration-out "$OUT/calibration-$name.json" \
      > "$OUT/report-$name.txt" 2>&1
    { echo "## $name"; grep -E "^  trained \(drafters\)|^  this run: " "$OUT/report-$name.txt"
      sed -n '/LAYOUT PLAN VS OBSERVED/,/^$/p' "$OUT/report-$name.txt"; } | tee -a "$OUT/summary.txt"
    cp "$W/run-$name/metrics.h5" "$OUT/metrics-$name.h5" 2>/dev/null
    rm -rf "$W/run-$name"  # its checkpoints and export (12 GB at this shape): the next run needs the disk
  done
done
