#!/usr/bin/env bash
# One call on the GPU machine, from the repository root: the Qwen3.5/3.6 hybrid target forward benchmark,
# the tiny smoke shape first (every op, uneven packing; fails fast at an op without a CUDA twin), then the
# Qwen3.6-27B shape (8 x 4096 tokens, capture 1,16,31,46,61 + final). Output is tee'd to OUT_DIR.
#   bash bench/hybrid_run.sh BIN_DIR OUT_DIR [what...]
# BIN_DIR holds bench_hybrid_forward (e.g. build-gpu/bench); what: tiny 27b 27b-mixed (default: tiny 27b)
set -u
BIN=$1; OUT=$2; shift 2
WHAT=${*:-tiny 27b}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
B="$BIN/bench_hybrid_forward"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/smi.txt"
for w in $WHAT; do
  case $w in
    tiny) timeout 120 "$B" --model tiny-hybrid --mixed 2>&1 | tee "$OUT/tiny-hybrid-mixed.txt"
          timeout 120 "$B" --model tiny-hybrid 2>&1 | tee "$OUT/tiny-hybrid.txt" ;;
    27b) timeout 300 "$B" --model 27b 2>&1 | tee "$OUT/27b.txt" ;;
    27b-mixed) timeout 300 "$B" --model 27b --mixed 2>&1 | tee "$OUT/27b-mixed.txt" ;;
    *) echo "unknown: $w (tiny 27b 27b-mixed)" >&2 ;;
  esac
done
# the forwards side by side (bench/README.md, "Output format")
python3 "$(dirname "$0")/bench_rows.py" "$OUT"/*.txt --case forward
