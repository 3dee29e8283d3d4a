#!/usr/bin/env bash
# One call on the GPU machine: the drafter GPU tests, then our step and the PyTorch reference side by side.
#   bash bench/drafter_run.sh <dir with dflash_gpu_tests and drafter_bench> <out dir> [what...]
# what: tests peak probe 8b-ce 8b-kl 27b 8b-det (default: all but probe and 8b-det)
# 8b-det: our 8B CE step with and without --deterministic, one after the other (the mode's cost)
# final: ours (fp32 and bf16 optimizer state) beside PyTorch's fastest that fits: 8B, 27B, 27B DFlash2
# strongest: ours beside PyTorch's flex_attention path with and without the loss chunks' recompute, 8B and 27B
#   (without it the logits of every chunk stay for the backward: faster, and it fits on an H200)
set -u
BIN=$1; OUT=$2; shift 2
WHAT=${*:-tests peak 8b-ce 8b-kl 27b}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee -a "$OUT/bench.txt"
for w in $WHAT; do
  case $w in
    tests) "$BIN/dflash_gpu_tests" --gtest_filter='GpuDrafter*' 2>&1 | tee "$OUT/tests.txt" | grep -E "OK|FAILED|PASSED|Failure|error|rel|Expected|Which|actual" ;;
    peak) "$BIN/drafter_bench" --gemm-peak 2>&1 | tee -a "$OUT/bench.txt" ;;
    probe) "$BIN/drafter_bench" --attention-probe 2>&1 | tee -a "$OUT/bench.txt" ;;
    8b-ce) "$BIN/drafter_bench" --model 8b --objective ce 2>&1 | tee -a "$OUT/bench.txt"
           python3 "$here/ref_drafter_step.py" --model 8b --objective ce 2>&1 | tee -a "$OUT/bench.txt"
           python3 "$here/ref_drafter_step.py" --model 8b --objective ce --attention flex 2>&1 | tee -a "$OUT/bench.txt" ;;
    8b-kl) "$BIN/drafter_bench" --model 8b --objective kl 2>&1 | tee -a "$OUT/bench.txt"
           python3 "$here/ref_drafter_step.py" --model 8b --objective kl 2>&1 | tee -a "$OUT/bench.txt" ;;
    8b-det) "$BIN/drafter_bench" --model 8b --objective ce 2>&1 | tee -a "$OUT/bench.txt"
            "$BIN/drafter_bench" --model 8b --objective ce --deterministic 2>&1 | tee -a "$OUT/bench.txt" ;;
    strongest) for m in "8b --context 3072" "27b --context 4096"; do
           "$BIN/drafter_bench" --model $m 2>&1 | tee -a "$OUT/bench.txt"
           for r in on off; do
             python3 "$here/ref_drafter_step.py" --model $m --attention flex --recompute-loss-chunks $r 2>&1 | tee -a "$OUT/bench.txt"
           done
         done ;;
    final) # ours with fp32 and with bf16 optimizer state beside PyTorch's fastest configuration that fits (flex,
           # loss chunks not recomputed; DFlash2: compiled convs too), 8B and 27B DFlash, 27B DFlash2 block 8
           for m in "8b --context 3072" "27b --context 4096"; do
             for s in fp32 bf16; do "$BIN/drafter_bench" --model $m --optimizer-state $s 2>&1 | tee -a "$OUT/bench.txt"; done
             python3 "$here/ref_drafter_step.py" --model $m --attention flex --recompute-loss-chunks off 2>&1 | tee -a "$OUT/bench.txt"
           done
           for s in fp32 bf16; do
             "$BIN/drafter_bench" --model 27b --context 4096 --draft-arch dflash2 --optimizer-state $s 2>&1 | tee -a "$OUT/bench.txt"
           done
           python3 "$here/ref_dflash2_step.py" --model 27b --context 4096 --attention flex --recompute-loss-chunks off \
             --compile-conv on 2>&1 | tee -a "$OUT/bench.txt" ;;
    27b) "$BIN/drafter_bench" --model 27b --context 4096 2>&1 | tee -a "$OUT/bench.txt"
         python3 "$here/ref_drafter_step.py" --model 27b --context 4096 2>&1 | tee -a "$OUT/bench.txt"
         python3 "$here/ref_drafter_step.py" --model 27b --context 4096 --attention flex 2>&1 | tee -a "$OUT/bench.txt" ;;
  esac
done
# every step of the file side by side, ours and the references' (bench/README.md, "Output format")
python3 "$here/bench_rows.py" "$OUT/bench.txt" --case step
