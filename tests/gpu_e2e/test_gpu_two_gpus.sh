#!/usr/bin/env bash
# Two GPUs (skipped, with the reason, on fewer; runs on the nvidia-h200-x2 machine): the 1-1 job with the
# target on GPU 0 and the drafter on GPU 1 moves its hidden states by the nccl plane and trains what the
# CPU backend trains (test_gpu_pipeline.sh's loss check); two drafter ranks alone, one per GPU, summing
# their gradients through NCCL in buckets during the backward, hold identical weights after every step,
# and their summed step equals one trainer's step over the union of their batches.
source "$(dirname "$0")/gpu_lib.sh"
n=$(nvidia-smi -L | grep -c '^GPU')
if [ "$n" -lt 2 ]; then
  echo "SKIPPED: needs 2 GPUs, $n visible (the nvidia-h200-x2 machine runs it)"
  exit 77
fi
DFLASH_TEST_PLANE=nccl bash "$(dirname "$0")/test_gpu_pipeline.sh" || fail "the 1-1 job on the nccl plane"
set +e
timeout -k 5 300 mpirun -np 2 --oversubscribe "$DFLASH_BIN/dflash-drafters-bench" \
  --target "$DFLASH_TEST_DATA/golden/qwen3-tiny-a/target" --draft-layers 2 --tokens 512 --seq-len 128 --anchors 16 \
  --warmup 1 --steps 4 --bucket-mb 0.01 --union-check >"$WORK/drafters.log" 2>&1
RC=$?
set -e
cat "$WORK/drafters.log"
[ $RC -eq 0 ] || fail "dflash-drafters-bench: exit $RC"
grep -q "gradient sum by nccl" "$WORK/drafters.log" || fail "the drafters did not sum through NCCL"
grep -q "^# union check .* ok$" "$WORK/drafters.log" || fail "the union check did not pass"
grep -q "# all checks passed" "$WORK/drafters.log" || fail "a check failed"
echo "PASS"
