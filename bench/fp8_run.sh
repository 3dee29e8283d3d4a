#!/usr/bin/env bash
# One call on the GPU machine, from the repository root: FP8 fidelity and speed (issue 46, docs/fp8.md).
#   bash bench/fp8_run.sh BUILD_DIR OUT_DIR
# Writes a random-weight Qwen3-8B checkpoint (dflash-make-random, ~16 GB on disk) and its FP8 release-format
# copy (dflash-fp8-convert --format block), then bench_fp8_fidelity at 4 x 4096 tokens: per-layer relative
# error of the captured features vs bf16 and both forward times, for --target-precision fp8 (blocks), for
# the release format, and for --target-precision fp8-dynamic (per token x per channel); the forwards run the
# FP8 GEMMs where the GPU has them (docs/fp8.md "Which FP8 GEMM"). Then the Qwen3.6-27B hybrid at 16 of its
# 64 layers (dflash-make-random --preset qwen36-27b --layers 16: 12 Gated DeltaNet + 4 gated attention layers,
# every per-layer shape of the 27B, ~17 GB on disk; 64 data records, unused here) through the same bench at
# 2 x 4096 tokens for --target-precision fp8 and fp8-dynamic (the hybrid's in_proj_a/b stay bf16). Disk: ~42 GB
# for the three checkpoints.
# MODELS=DIR keeps the checkpoints there (default OUT/models; the GPU tool brings OUT back, so keep them out of
# it there); WHICH="8b 27b" (default) picks the shapes, one per device call (bench/pending_gpu_runs.sh fidelity8,
# fidelity27).
set -u
B=$1; OUT=$2
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/smi.txt"
M=${MODELS:-$OUT/models}; mkdir -p "$M"
WHICH=${WHICH:-8b 27b}
prog() {  # prog NAME: the program wherever BUILD_DIR keeps it (a build tree, or flat)
  local p
  for p in "$B/$1" "$B/bench/$1" "$B/tests/$1"; do [ -x "$p" ] && { echo "$p"; return; }; done
  echo "missing program $1 in $B" >&2; echo false
}
if [[ " $WHICH " == *" 8b "* ]]; then
[ -d "$M/q8b/target" ] || "$(prog dflash-make-random)" "$M/q8b" --preset qwen3-8b 2>&1 | tee "$OUT/make.txt"
[ -d "$M/q8b-fp8" ] || "$(prog dflash-fp8-convert)" "$M/q8b/target" "$M/q8b-fp8" --format block 2>&1 | tee -a "$OUT/make.txt"
timeout 600 "$(prog bench_fp8_fidelity)" --target "$M/q8b/target" --capture 1,9,17,25,33 2>&1 | tee "$OUT/8b-quantized.txt"
timeout 600 "$(prog bench_fp8_fidelity)" --target "$M/q8b/target" --fp8-target "$M/q8b-fp8" --capture 1,9,17,25,33 2>&1 | tee "$OUT/8b-release.txt"
timeout 600 "$(prog bench_fp8_fidelity)" --target "$M/q8b/target" --precision fp8-dynamic --capture 1,9,17,25,33 2>&1 | tee "$OUT/8b-dynamic.txt"
fi
if [[ " $WHICH " == *" 27b "* ]]; then
# The 27B hybrid: layers 1, 5, 9, 13 are Gated DeltaNet, 15 (the last) gated full attention.
[ -d "$M/q27b/target" ] || "$(prog dflash-make-random)" "$M/q27b" --preset qwen36-27b --layers 16 --records 64 2>&1 | tee -a "$OUT/make.txt"
timeout 600 "$(prog bench_fp8_fidelity)" --target "$M/q27b/target" --precision fp8 --capture 1,5,9,13,15 --seqlens 4096,4096 2>&1 | tee "$OUT/27b-quantized.txt"
timeout 600 "$(prog bench_fp8_fidelity)" --target "$M/q27b/target" --precision fp8-dynamic --capture 1,5,9,13,15 --seqlens 4096,4096 2>&1 | tee "$OUT/27b-dynamic.txt"
fi
# The op alone: the CUDA FP8 GEMM against its CPU twin and timed at the 8B shapes (sm_90).
DFLASH_TEST_DATA=$PWD/tests/data DFLASH_SRC=$PWD "$(prog dflash_gpu_tests)" --gtest_filter='GpuFp8.*' 2>&1 | tee "$OUT/gpu-fp8.txt"
