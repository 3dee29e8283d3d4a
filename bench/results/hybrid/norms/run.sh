#!/bin/bash
# helper-norms, the one device call: (1) every variant of the four kernels timed side by side at the 27B
# shapes (0 = the previous kernel, first and last) with a check against the CPU twin; (2) the unit tests of
# the four ops under every variant; (3) the callers' tests and the timing tests under the fastest variants;
# (4) the 27B forward with the fastest variants, then (time permitting) with the previous kernels.
B=build-dev-norms
T=$B/dflash_gpu_tests
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv 2>&1 | tee $OUT/smi.txt
(time DFLASH_RMSNORM_VS=0,1,2,3,4,5,6,0 DFLASH_GATEDNORM_VS=0,1,2,3,4,0 DFLASH_HNR_VS=0,1,2,3,0 \
  DFLASH_SIGGATE_VS=0,1,2,3,4,5,0 timeout 70 $T --gtest_filter='*RmsNormTiming*:*HeadNormRopeTiming*:*SigmoidGateTiming*') > $OUT/timing.txt 2>&1
grep -E "timing\]|\[head_norm_rope|OK \]|FAILED|real|Failure|Expected|Which is" $OUT/timing.txt | head -70
pick() { grep "^\[$1 timing\] variant" $OUT/timing.txt | sed -E 's/.*variant ([0-9]+): median ([0-9.]+).*/\2 \1/' | sort -n | head -1 | awk '{print $2}'; }
RV=$(pick rmsnorm); GV=$(pick gated_rmsnorm); SV=$(pick sigmoid_gate)
HV=$(grep -E "^\[head_norm_rope [qk] timing\] variant" $OUT/timing.txt | sed -E 's/.*variant ([0-9]+): median ([0-9.]+).*/\1 \2/' \
  | awk '{s[$1]+=$2; n[$1]++} END {for (v in s) if (n[v]==2) print s[v], v}' | sort -n | head -1 | awk '{print $2}')
RV=${RV:-1}; GV=${GV:-2}; HV=${HV:-1}; SV=${SV:-2}
echo "fastest: rmsnorm $RV gated $GV hnr $HV sigmoid $SV" | tee $OUT/winners.txt
F='*GpuRmsNorm.*:*GpuHeadNormRope.*:*GpuHeadNormRopeHd256.*:*GpuGatedRmsNorm.*:*GpuSigmoidGate.*'
for combo in "1 1 1 1" "2 2 2 2" "3 3 3 3" "4 4 1 4" "5 1 1 5" "6 1 1 1" "0 0 0 0"; do
  set -- $combo
  echo "== RMS=$1 GATED=$2 HNR=$3 SIG=$4"
  DFLASH_RMSNORM_V=$1 DFLASH_GATEDNORM_V=$2 DFLASH_HNR_V=$3 DFLASH_SIGGATE_V=$4 timeout 30 $T --gtest_filter="$F" 2>&1 \
    | grep -E "FAILED|PASSED|Failure|Which is|element|Expected" | head -20
done 2>&1 | tee $OUT/tests_variants.txt
echo "elapsed ${SECONDS}s"
export DFLASH_RMSNORM_V=$RV DFLASH_GATEDNORM_V=$GV DFLASH_HNR_V=$HV DFLASH_SIGGATE_V=$SV
(time timeout 60 $T --gtest_filter="$F:GpuDrafterStep.*:GpuDrafterGolden.*:GpuTarget.*:GpuDeterministic.*:GpuDrafterBackwardOps.*:TrainerCuda.*") > $OUT/tests_winners.txt 2>&1
(time DFLASH_RMSNORM_VS=$RV DFLASH_GATEDNORM_VS=$GV DFLASH_HNR_VS=$HV DFLASH_SIGGATE_VS=$SV timeout 40 $T \
  --gtest_filter="*RmsNormTiming*:*HeadNormRopeTiming*:*SigmoidGateTiming*") >> $OUT/tests_winners.txt 2>&1
grep -E "timing\]|OK \]|FAILED|PASSED|real|Failure" $OUT/tests_winners.txt | head -80
echo "elapsed ${SECONDS}s"
(time timeout 80 $B/bench_hybrid_forward --model 27b --iters 3 --warmup 1) > $OUT/bench_new.txt 2>&1
grep -E "rmsnorm|gated_rmsnorm|head_norm_rope|sigmoid_gate|tokens_per_s|ms_per_forward_median|real|FATAL|RESULT" $OUT/bench_new.txt
echo "elapsed ${SECONDS}s"
if [ $SECONDS -lt 150 ]; then
  (time DFLASH_RMSNORM_V=0 DFLASH_GATEDNORM_V=0 DFLASH_HNR_V=0 DFLASH_SIGGATE_V=0 timeout $((225 - SECONDS)) \
    $B/bench_hybrid_forward --model 27b --iters 3 --warmup 1) > $OUT/bench_old.txt 2>&1
  grep -E "rmsnorm|gated_rmsnorm|head_norm_rope|sigmoid_gate|tokens_per_s|ms_per_forward_median|real|FATAL|RESULT" $OUT/bench_old.txt
fi
echo "elapsed ${SECONDS}s"
