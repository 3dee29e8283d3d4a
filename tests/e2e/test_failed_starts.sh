#!/usr/bin/env bash
# Failed starts never cost an earlier run's metrics: a bad input (--data pointing at a JSONL) ends the job
# before --out is touched, however often it is tried; a start that fails after training began to set up
# leaves a step-less metrics.h5 that the next run replaces; a file that holds steps is kept as
# metrics.N.h5, numbered in the order the runs ran (docs/checkpoint.md "Reruns in one --out").
source "$(dirname "$0")/lib.sh"
OUT="$WORK/run"
steps() { h5eval "$1" "[int(s) for s in f['steps/step'][:]]"; }
expect_steps() {  # expect_steps FILE "[1, 2, 3]"
  [ -f "$1" ] || fail "$1 is missing (ls: $(ls "$OUT"))"
  local got
  got=$(steps "$1")
  [ "$got" = "$2" ] || fail "$1 holds steps $got, expected $2"
}

run_job a 2 120 --topology 1-1 --out "$OUT" --max-steps 3 --seed 1
expect_rc 0 a
expect_steps "$OUT/metrics.h5" "[1, 2, 3]"
cp "$OUT/metrics.h5" "$WORK/a.h5"

# Two failed starts on a bad input: exit 3 naming the file, and run a's metrics.h5 untouched, byte for byte.
printf '{"input_ids": [1, 2, 3]}\n' >"$WORK/data.jsonl"
for i in 1 2; do
  run_job bad$i 2 60 --topology 1-1 --out "$OUT" --max-steps 3 --data "$WORK/data.jsonl"
  expect_rc 3 bad$i
  expect_log bad$i "dataset $WORK/data.jsonl is not an HDF5 file"
done
cmp -s "$OUT/metrics.h5" "$WORK/a.h5" || fail "two failed starts changed run a's metrics.h5"
ls "$OUT" | grep -Eq '^metrics\.[0-9]+\.h5$|\.prev$' && fail "failed starts rotated metrics files: $(ls "$OUT")"

# A start that fails after its metrics file exists (the drafter dies before its first step): run a's
# file is set aside as metrics.1.h5, the new one holds no step.
run_job killed 2 60 --topology 1-1 --out "$OUT" --max-steps 3 --inject-fail-rank 1 --inject-fail-step 0
[ "$RC" -ne 0 ] || fail "killed: exit 0 with a drafter killed at step 0"
cmp -s "$OUT/metrics.1.h5" "$WORK/a.h5" || fail "run a's metrics were not kept as metrics.1.h5 ($(ls "$OUT"))"
expect_steps "$OUT/metrics.h5" "[]"

# The next run replaces the step-less file (nothing to keep) and leaves metrics.1.h5 alone ...
run_job b 2 120 --topology 1-1 --out "$OUT" --max-steps 2 --seed 1
expect_rc 0 b
expect_steps "$OUT/metrics.h5" "[1, 2]"
cmp -s "$OUT/metrics.1.h5" "$WORK/a.h5" || fail "run b changed metrics.1.h5"
[ ! -e "$OUT/metrics.2.h5" ] || fail "run b kept the step-less file of the killed start as metrics.2.h5"
# ... and the one after it keeps b's as metrics.2.h5.
run_job c 2 120 --topology 1-1 --out "$OUT" --max-steps 1 --seed 1
expect_rc 0 c
expect_log c "is kept as $OUT/metrics.2.h5"
expect_steps "$OUT/metrics.2.h5" "[1, 2]"
expect_steps "$OUT/metrics.1.h5" "[1, 2, 3]"
expect_steps "$OUT/metrics.h5" "[1]"
echo "PASS"
