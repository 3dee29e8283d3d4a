#!/usr/bin/env bash
# --rebalance auto (issue 30, docs/checkpoint.md "Re-splitting live"): a 2-1 run whose drafter is made slow
# (--inject-delay-drafter-ms: the drafter side is certainly the bottleneck, so the model predicts 1-2 about
# twice as fast) re-splits itself at its first checkpoint without leaving mpirun: "[rebalance] 2-1 -> 1-2 at
# step 10", every rank takes its new role in place (rank 1, a target, becomes a drafter), and the run ends
# in the same mpirun with exit 0 and an export. Every record of the epoch is trained once across the two
# splits (--inject-trace-dir), metrics.h5 holds every step once and a /segments row of kind 3 (rebalance),
# and dflash-report shows the segments. The new split is not left again (1-2 stays the best prediction).
# --rebalance-min-gain above the predicted gain keeps the split; --rebalance without --checkpoint-every is
# refused.
source "$(dirname "$0")/lib.sh"
COMMON=(--batch-order fixed --seed 5 --epochs 1 --log-every 2 --lr 3e-3 --inject-delay-drafter-ms 150)
DATA="$(tiny_dir)/data.h5"
mkdir -p "$WORK/trace"
run_job live 3 300 --topology 2-1 "${COMMON[@]}" --rebalance auto --checkpoint-every 10 --inject-trace-dir "$WORK/trace"
expect_rc 0 live
expect_log live "[rebalance] 2-1 -> 1-2 at step 10: predicted +"
expect_log live "[rebalance] every rank takes its role on 1-2 in place, from $WORK/live/checkpoints/step-00000010"
expect_log live "resuming on another split: the checkpoint's 2-1 on 3 rank(s) (2 target(s), 1 drafter(s)) -> 1-2"
expect_log live "drafter exported to $WORK/live/drafter"
n=$(grep -c "^\[rebalance\] [0-9]-[0-9] -> " "$WORK/live.log" || true)
[ "$n" = 1 ] || fail "the split changed $n time(s), expected once (2-1 -> 1-2)"
grep -q "^\[rebalance\] step 20: 1-2 predicted" "$WORK/live.log" || fail "the new split's checkpoint at step 20 did not decide (keep 1-2)"
"$PY" "$DFLASH_SRC/tests/e2e/check_trace.py" "$WORK/trace" "$DATA" --segments 2 || fail "the records trained across the re-split"
"$PY" - "$WORK/live/metrics.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    steps = list(f["steps/step"][:])
    if steps != list(range(1, len(steps) + 1)):
        sys.exit(f"FAIL: /steps/step is not 1..N: {steps}")
    kinds, first = list(f["segments/kind"][:]), list(f["segments/first_step"][:])
    if kinds != [0, 3] or first != [0, 10]:
        sys.exit(f"FAIL: /segments kind {kinds} first_step {first}, expected [0, 3] [0, 10]")
    if [int(f["segments/targets_per_node"][i]) for i in range(2)] != [2, 1]:
        sys.exit("FAIL: /segments/targets_per_node is not [2, 1]")
PY
"$DFLASH_SRC/tools/dflash-report" "$WORK/live/metrics.h5" >"$WORK/report.txt" 2>&1 || { cat "$WORK/report.txt" >&2; fail "dflash-report failed"; }
grep -q "rebalance  *1-2" "$WORK/report.txt" || { cat "$WORK/report.txt" >&2; fail "the report does not list the rebalance segment"; }

run_job keep 3 300 --topology 2-1 "${COMMON[@]}" --max-steps 12 --rebalance auto --rebalance-min-gain 500 --checkpoint-every 10
expect_rc 0 keep
expect_log keep "(+"
grep -q "the bar is +500.0 %): keep it" "$WORK/keep.log" || { grep rebalance "$WORK/keep.log" >&2; fail "--rebalance-min-gain 500 did not keep the split"; }

run_job refused 3 60 --topology 2-1 --max-steps 4 --rebalance auto
expect_rc 2 refused
expect_log refused "add --checkpoint-every"
echo "PASS"
