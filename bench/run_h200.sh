#!/usr/bin/env bash
# One device call: GPU tests, the target-forward benchmark (Qwen3-8B shape: 4 x 4096 and a mixed packing;
# Qwen3-32B shape), the cuBLASLt bf16 GEMM peak, and the PyTorch/transformers reference on the same machine.
# Results go to $OUT (or ./out); a short summary goes to stdout. Build first, on the build machine:
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-gpu --target dflash_gpu_tests bench_target_forward
# then run this on the GPU machine from the repository root (build-gpu carried along).
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
B=build-gpu/bench/bench_target_forward
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv,noheader | tee "$OUT/smi.txt"
timeout 200 build-gpu/tests/dflash_gpu_tests > "$OUT/tests.txt" 2>&1
echo "tests: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests.txt" | tr '\n' ' ')"
grep -E "rel err" "$OUT/tests.txt"
{
  $B --gemm-peak
  timeout 120 $B --model 8b
  timeout 120 $B --model 8b --mixed
  timeout 150 $B --model 32b
} 2>&1 | tee "$OUT/bench.txt"
timeout 200 python3 bench/ref_target_forward.py --model 8b 2>&1 | tee "$OUT/ref.txt" | tail -1
# ours and the reference side by side (bench/README.md, "Output format")
python3 bench/bench_rows.py "$OUT/bench.txt" "$OUT/ref.txt" --case forward --case gemm_peak
