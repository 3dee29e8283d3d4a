#!/usr/bin/env bash
# --batch-order fixed makes resumes exact with several targets per drafter: topology 2-1, N steps
# straight (checkpointing at N/2) vs the N/2 checkpoint resumed for the other N/2 steps with other
# timings (slow targets, one credit): identical losses and exported weights. Changing --batch-order
# across a resume is refused (exit 2, naming it).
source "$(dirname "$0")/lib.sh"
N=12
COMMON=(--topology 2-1 --batch-order fixed --max-steps $N --seed 5 --checkpoint-every $((N / 2)))
run_job straight 3 120 "${COMMON[@]}" --log-every 1
expect_rc 0 straight
half="$WORK/straight/checkpoints/step-0000000$((N / 2))"
[ -f "$half/manifest.json" ] || fail "no checkpoint at step $((N / 2)) in $WORK/straight/checkpoints"

run_job resumed 3 120 "${COMMON[@]}" --log-every 4 --resume "$half" --inject-delay-target-ms 30 --hs-queue-depth 1
expect_rc 0 resumed
expect_log resumed "resuming from $half"
expect_resumed_like_straight straight resumed $N

run_job refused 3 60 --topology 2-1 --batch-order arrival --max-steps $N --seed 5 --resume "$half"
expect_rc 2 refused
expect_log refused "--batch-order: saved 'fixed', now 'arrival'"
echo "PASS"
