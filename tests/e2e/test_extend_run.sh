#!/usr/bin/env bash
# --max-steps and --epochs (issue 31; docs/pipeline.md, docs/checkpoint.md "Extending a run"):
# 1. --max-steps without --epochs repeats the data until --max-steps (HF Trainer's convention): 60 steps on a
#    tiny dataset of ~40 batches; with --epochs 1 too, the data's end comes first and the startup says so.
# 2. A finished run resumed with a larger --max-steps trains on from its final checkpoint: /steps 1..60 once
#    each, the lr schedule re-planned and printed (the lr after the extension above the finished run's last).
# 3. A finished run resumed with a larger --epochs goes on into the next epoch.
# Other changes are still refused.
source "$(dirname "$0")/lib.sh"
COMMON=(--topology 1-1 --seed 3 --log-every 5 --lr 3e-3)

run_job repeat 2 300 "${COMMON[@]}" --max-steps 60
expect_rc 0 repeat
expect_log repeat "[dflash] 60 steps; drafter exported"
grep -q "note: the data" "$WORK/repeat.log" && fail "repeat: a note about the data's end, but the data repeats"

run_job both 2 300 "${COMMON[@]}" --max-steps 60 --epochs 1
expect_rc 0 both
expect_log both "[dflash] note: the data (--epochs 1) ends at step"
grep -q "^\[dflash\] 60 steps" "$WORK/both.log" && fail "both: --epochs 1 should end the run before step 60"

run_job ext 2 300 "${COMMON[@]}" --max-steps 30
expect_rc 0 ext
run_job ext 2 300 "${COMMON[@]}" --max-steps 60 --resume auto
expect_rc 0 ext
expect_log ext "[dflash] the run goes on from step 30 with --max-steps 30 -> 60"
expect_log ext "re-planned for --max-steps 30 -> 60"
expect_log ext "[dflash] 60 steps; drafter exported"
"$PY" - "$WORK/ext/metrics.h5" <<'PY' || fail "ext: the extended run's metrics"
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    steps, lr = list(f["steps/step"][:]), f["steps/lr"][:]
    assert steps == list(range(1, 61)), steps
    print(f"# lr at step 30 {lr[29]:.3g}, at step 31 {lr[30]:.3g}, at step 60 {lr[59]:.3g}")
    assert lr[30] > lr[29] and lr[59] < lr[30], "the re-planned cosine does not go on from step 31"
PY

run_job epochs 2 300 "${COMMON[@]}" --epochs 1
expect_rc 0 epochs
n1=$(grep -o "^\[dflash\] [0-9]* steps" "$WORK/epochs.log" | grep -o "[0-9]*")
run_job epochs 2 300 "${COMMON[@]}" --epochs 2 --resume auto
expect_rc 0 epochs
expect_log epochs "with --epochs 1 -> 2"
n2=$(grep -o "^\[dflash\] [0-9]* steps" "$WORK/epochs.log" | grep -o "[0-9]*")
[ "$n2" -ge $((2 * n1 - 1)) ] || fail "epochs: --epochs 2 ended at step $n2, one epoch is $n1 steps"
note "one epoch: $n1 steps; extended to two: $n2"

run_job refused 2 60 "${COMMON[@]}" --max-steps 90 --resume auto --out "$WORK/ext" --lr 1e-3
expect_rc 2 refused
expect_log refused "--lr: saved '0.003', now '0.001'"
echo "PASS"
