#!/usr/bin/env bash
# A live rebalance is remembered (issue 48 item 5; docs/checkpoint.md "The remembered split"): a 2-1 run with a
# slow drafter re-splits to 1-2 at its checkpoint of step 10 and writes 1-2 into OUT/next-topology; stopped
# for requeue at step 14 (--inject-stop-step: exit 75, the checkpoint on 1-2), the same command (--topology
# 2-1 --resume auto, plain mpirun: no launch script) resumes on 1-2 and says the file won; with the file
# deleted it goes back to the command's 2-1; a malformed file stops the resume (exit 2) naming it.
source "$(dirname "$0")/lib.sh"
COMMON=(--topology 2-1 --batch-order fixed --seed 5 --epochs 3 --log-every 2 --lr 3e-3 --inject-delay-drafter-ms 150
  --rebalance auto --rebalance-min-gain 500 --checkpoint-every 10 --resume auto)
out="$WORK/run"

# --rebalance-min-gain 0 for the first segment only: it re-splits at step 10, then stops at 14.
run_job run 3 300 "${COMMON[@]}" --rebalance-min-gain 0 --inject-stop-step 14
expect_rc 75 run
expect_log run "[rebalance] 2-1 -> 1-2 at step 10"
expect_log run "[rebalance] $out/next-topology now holds 1-2: a kill or requeue resumes on it"
[ "$(cat "$out/next-topology")" = "1-2" ] || fail "OUT/next-topology holds '$(cat "$out/next-topology")', expected 1-2"

# The same command again: the remembered split wins over --topology 2-1.
run_job run 3 300 "${COMMON[@]}" --max-steps 18
expect_rc 0 run
expect_log run "[dflash] split: 1-2 from $out/next-topology, the run's remembered split"
expect_log run "it wins over the command's --topology 2-1"
expect_log run "topology 1-2 on 1 node(s)"
grep -q "resuming on another split" "$WORK/run.log" && fail "the resume changed the split (the checkpoint of step 14 is on 1-2)"
h5check "$out/metrics.h5" "list(f['segments/targets_per_node'][:]) == [2, 1, 1] and list(f['segments/kind'][:]) == [0, 3, 1]"
h5check "$out/metrics.h5" "list(f['steps/step'][:]) == list(range(1, 19))"

# The command given the same split: said, nothing overridden.
run_job run 3 300 "${COMMON[@]}" --topology 1-2 --max-steps 20
expect_rc 0 run
expect_log run "[dflash] split: 1-2, as $out/next-topology remembers it"

# The file deleted: the command's split again (a resume on another split).
rm "$out/next-topology"
run_job run 3 300 "${COMMON[@]}" --max-steps 22
expect_rc 0 run
expect_log run "topology 2-1 on 1 node(s)"
expect_log run "resuming on another split: the checkpoint's 1-2 on 3 rank(s)"

# A malformed file stops the resume before any rank trains, as it stops the launch scripts.
printf '6_2\n' >"$out/next-topology"
run_job run 3 120 "${COMMON[@]}" --max-steps 24
expect_rc 2 run
expect_log run "$out/next-topology holds \"6_2\": it should hold one line T-D (e.g. 6-2), colocated or auto"
echo "PASS"
