#!/usr/bin/env bash
# Two jobs on one --out would mix their checkpoints and metrics: the second is refused (exit 2) before it
# writes anything, naming the first (pid, host); so is a job that shares only --checkpoint-dir. The lock
# goes with the job that held it: the next job on that --out runs.
source "$(dirname "$0")/lib.sh"
OUT="$WORK/run"
# The first job: slow enough (a delayed drafter) to still be running while the others try.
(
  run_job first 2 120 --topology 1-1 --out "$OUT" --max-steps 20 --inject-delay-drafter-ms 200 \
    --checkpoint-dir "$WORK/ckpt" --checkpoint-every 10
  echo "$RC" >"$WORK/first.rc"
) &
first=$!
wait_for_log first "hidden states:"
holder=$(cat "$OUT/.dflash.lock")
case "$holder" in "pid "*" on host "*) ;; *) fail "the lock file names no holder: '$holder'" ;; esac

run_job second 2 60 --topology 1-1 --out "$OUT" --max-steps 3
expect_rc 2 second
expect_log second "--out $OUT is in use by another job (pid"
expect_log second "$(hostname)"
# Another --out, the same --checkpoint-dir: refused as well.
run_job shared_ckpt 2 60 --topology 1-1 --out "$WORK/other" --max-steps 3 --checkpoint-dir "$WORK/ckpt"
expect_rc 2 shared_ckpt
expect_log shared_ckpt "--checkpoint-dir $WORK/ckpt is in use by another job"
[ ! -e "$WORK/other/metrics.h5" ] || fail "the refused job wrote $WORK/other/metrics.h5"
# A --checkpoint-dir naming the first job's default checkpoints under its --out: refused as well (the --out
# lock alone would not see it). The "first2" job keeps its checkpoints in OUT2/checkpoints.
(
  run_job first2 2 120 --topology 1-1 --out "$WORK/run2" --max-steps 20 --inject-delay-drafter-ms 200 --checkpoint-every 10
  echo "$RC" >"$WORK/first2.rc"
) &
first2=$!
wait_for_log first2 "hidden states:"
run_job into_ckpt 2 60 --topology 1-1 --out "$WORK/other2" --max-steps 3 --checkpoint-dir "$WORK/run2/checkpoints"
expect_rc 2 into_ckpt
expect_log into_ckpt "--checkpoint-dir $WORK/run2/checkpoints is in use by another job"
wait "$first2"
RC=$(cat "$WORK/first2.rc")
expect_rc 0 first2

wait "$first"
RC=$(cat "$WORK/first.rc")
expect_rc 0 first
h5check "$OUT/metrics.h5" "list(f['steps/step'][:]) == list(range(1, 21))"
# Its lock ended with it.
run_job after 2 60 --topology 1-1 --out "$OUT" --max-steps 2 --checkpoint-dir "$WORK/ckpt"
expect_rc 0 after
echo "PASS"
