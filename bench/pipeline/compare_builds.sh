#!/usr/bin/env bash
# Two builds' speed in one call on one GPU: the same bench drivers of an earlier build (OLD) and of this one
# (NEW), alternated case by case so clock and thermal drift fall on both alike (a refactor's "numbers within
# noise", issue 43). Each driver times with CUDA events after a warm-up and prints its median.
# Usage (GPU machine, repository root): bench/pipeline/compare_builds.sh OLD_BIN NEW_BIN OUT_DIR
set -uo pipefail
OLD=$(cd "${1:?old bin dir}" && pwd); NEW=$(cd "${2:?new bin dir}" && pwd); OUT=${3:?out dir}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/smi.txt"
cases=(
  "drafter-8b|drafter_bench --model 8b --context 3072"
  "drafter-27b|drafter_bench --model 27b --context 4096"
  "drafter-27b-dflash2|drafter_bench --model 27b --context 4096 --draft-arch dflash2"
  "target-8b|bench_target_forward"
  "hybrid-27b|bench_hybrid_forward --model 27b"
)
for c in "${cases[@]}"; do
  name=${c%%|*}; cmd=${c#*|}
  for which in old new; do
    bin=$OLD; [ $which = new ] && bin=$NEW
    echo "### $name $which: $cmd" | tee -a "$OUT/compare.txt"
    timeout 300 "$bin/"$cmd >"$OUT/$name-$which.txt" 2>&1; echo "# rc=$?" >>"$OUT/$name-$which.txt"
    # the old drivers' RESULT / "forward median" lines, the new writer's timed row (bench/README.md "Output format")
    grep -E "^RESULT|forward median|^  (step|forward) " "$OUT/$name-$which.txt" | tee -a "$OUT/compare.txt"
  done
done
