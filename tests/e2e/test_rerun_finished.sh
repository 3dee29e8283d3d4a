#!/usr/bin/env bash
# A finished run's command run again with --resume auto (jobs/mpirun/train.sh adds it) says "already
# complete at step N" and changes nothing: no second last /eval row, no empty segment, metrics.h5 and the
# export byte for byte as they were (issue 48 item 6). A fresh run into the same --out sets the earlier
# export aside as OUT/drafter.1, as it does metrics.h5, and says so (item 7). docs/checkpoint.md.
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
split_eval_set "$tiny/data.h5" "$WORK/train.h5" "$WORK/eval.h5" 4
RUN=(--topology 1-1 --max-steps 4 --seed 3 --data "$WORK/train.h5" --eval-data "$WORK/eval.h5" --eval-every 2
     --out "$WORK/run")
run_job first 2 180 "${RUN[@]}" --resume auto
expect_rc 0 first
expect_log first "4 steps; drafter exported to $WORK/run/drafter"
sums() { md5sum "$WORK/run/metrics.h5" "$WORK/run/drafter/"* | awk '{print $1}'; }
before=$(sums)
evals=$(h5eval "$WORK/run/metrics.h5" "len(f['eval/step'])")
ckpts=$(ls "$WORK/run/checkpoints")

for again in 1 2; do
  run_job again$again 2 120 "${RUN[@]}" --resume auto
  expect_rc 0 again$again
  expect_log again$again "already complete at step 4"
  grep -q "drafter exported" "$WORK/again$again.log" && fail "again$again: exported again"
  [ "$(sums)" = "$before" ] || fail "again$again: metrics.h5 or the export changed"
  [ "$(ls "$WORK/run/checkpoints")" = "$ckpts" ] || fail "again$again: the checkpoints changed"
done
[ "$(h5eval "$WORK/run/metrics.h5" "len(f['eval/step'])")" = "$evals" ] || fail "a second last /eval row"

# Extended, the run trains on (the record names step 4, the run now ends at 6).
run_job longer 2 180 "${RUN[@]}" --resume auto --max-steps 6
expect_rc 0 longer
expect_log longer "6 steps; drafter exported to $WORK/run/drafter"
longer=$(md5sum "$WORK/run/drafter/model.safetensors" | awk '{print $1}')

# A fresh run (no --resume) into the same --out: the earlier export is kept as drafter.1, as metrics.h5 is.
run_job fresh 2 180 --topology 1-1 --max-steps 2 --seed 4 --data "$WORK/train.h5" --out "$WORK/run" \
  --checkpoint-dir "$WORK/ck2"
expect_rc 0 fresh
expect_log fresh "the previous run's $WORK/run/drafter is kept as $WORK/run/drafter.1"
[ "$(md5sum "$WORK/run/drafter.1/model.safetensors" | awk '{print $1}')" = "$longer" ] ||
  fail "drafter.1 is not the earlier run's export"
[ -f "$WORK/run/drafter/model.safetensors" ] || fail "the fresh run exported nothing"
echo "PASS"
