#!/usr/bin/env bash
# One device call: GPU tests, the target-forward benchmark (8B: 4 x 4096 and a mixed packing; 32B), the
# PyTorch/transformers reference on the same machine, and the cuBLASLt bf16 GEMM peak. Results go to $OUT
# (or ./out) and the table at the end goes to stdout. Build first, here:
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-gpu --target dflash_gpu_tests bench_target_forward
# then run this on the GPU machine from the repository root.
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
B=build-gpu/bench/bench_target_forward
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv,noheader | tee "$OUT/smi.txt"
timeout 200 build-gpu/tests/dflash_gpu_tests 2>&1 > "$OUT/tests.txt"
echo "tests (default): $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests.txt" | tr '\n' ' ')"
# Attention variants (kernels/attention.cu): tiling wide|narrow, exp2 ftz 1|0; the first is the default.
VARIANTS=${VARIANTS:-"wide:1 wide:0 narrow:1 narrow:0"}
for var in $VARIANTS; do
  export DFLASH_ATTN_TILING=${var%:*} DFLASH_ATTN_FTZ=${var#*:}
  timeout 100 build-gpu/tests/dflash_gpu_tests --gtest_filter='*Attention*:*Target*' > "$OUT/tests_${var/:/-}.txt" 2>&1
  echo "tests (attention $var): $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests_${var/:/-}.txt" | tr '\n' ' ')"
done
unset DFLASH_ATTN_TILING DFLASH_ATTN_FTZ
grep -E "rel err" "$OUT/tests.txt"
{
  $B --gemm-peak
  for var in $VARIANTS; do
    echo "## attention tiling=${var%:*} ftz=${var#*:}"
    export DFLASH_ATTN_TILING=${var%:*} DFLASH_ATTN_FTZ=${var#*:}
    timeout 120 $B --model 8b
    timeout 120 $B --model 8b --mixed
    timeout 150 $B --model 32b
  done
} 2>&1 | tee "$OUT/bench.txt"
unset DFLASH_ATTN_TILING DFLASH_ATTN_FTZ
timeout 200 python3 bench/ref_target_forward.py --model 8b 2>&1 | tee "$OUT/ref.txt" | tail -1
