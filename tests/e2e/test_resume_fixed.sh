#!/usr/bin/env bash
# --batch-order fixed makes resumes exact with several targets per drafter: topology 2-1, N steps
# straight (checkpointing at N/2) vs the N/2 checkpoint resumed for the other N/2 steps with other
# timings (slow targets, one credit): identical losses and exported weights. The same with --grad-accum 2
# (checkpoints fall on optimizer-step boundaries: 2 micro-batches per step). Changing --batch-order across a
# resume is refused (exit 2, naming it).
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

# --grad-accum 2: 6 optimizer steps of 2 micro-batches, the step-3 checkpoint resumed
K2=(--topology 2-1 --batch-order fixed --max-steps 6 --seed 5 --checkpoint-every 3 --grad-accum 2)
run_job straight_k2 3 120 "${K2[@]}" --log-every 1
expect_rc 0 straight_k2
run_job resumed_k2 3 120 "${K2[@]}" --log-every 2 --resume "$WORK/straight_k2/checkpoints/step-00000003" --hs-queue-depth 1
expect_rc 0 resumed_k2
expect_resumed_like_straight straight_k2 resumed_k2 6

run_job refused 3 60 --topology 2-1 --batch-order arrival --max-steps $N --seed 5 --resume "$half"
expect_rc 2 refused
expect_log refused "--batch-order: saved 'fixed', now 'arrival'"
echo "PASS"
