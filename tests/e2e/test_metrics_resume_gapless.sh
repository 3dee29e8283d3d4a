#!/usr/bin/env bash
# A run killed after a checkpoint and resumed from it leaves metrics.h5 without a gap: the rows up to a
# checkpoint's step are flushed before it commits, whatever --metrics-flush-every says (here: never on
# its own within the run). Before, the rows between the last flush and the checkpoint were lost for good.
source "$(dirname "$0")/lib.sh"
N=10
COMMON=(--topology 1-1 --max-steps $N --seed 3 --checkpoint-every 3 --metrics-flush-every 100000)
# Rank 1 (the drafter) kills itself during step 8, after the step-6 checkpoint.
run_job killed 2 120 "${COMMON[@]}" --out "$WORK/run" --inject-fail-rank 1 --inject-fail-step 7
[ "$RC" -ne 0 ] || fail "killed: exit 0"
[ -f "$WORK/run/checkpoints/step-00000006/manifest.json" ] || fail "no step-6 checkpoint before the kill"
h5check "$WORK/run/metrics.h5" "list(f['steps/step'][:6]) == [1, 2, 3, 4, 5, 6]"
run_job resumed 2 120 "${COMMON[@]}" --out "$WORK/run" --resume auto
expect_rc 0 resumed
expect_log resumed "resuming from $WORK/run/checkpoints/step-00000006"
h5check "$WORK/run/metrics.h5" "list(f['steps/step'][:]) == list(range(1, $N + 1))"
echo "PASS"
