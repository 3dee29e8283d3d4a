#!/usr/bin/env bash
# A dataset truncated under a running job stops it with exit 3 naming the file, instead of training on
# the zeros HDF5 reads past the end of the file (the loss fell from 6.1 to 1.8 on garbage).
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
cp "$tiny/data.h5" "$WORK/data.h5"
(
  run_job trunc 2 120 --topology 1-1 --data "$WORK/data.h5" --epochs 20 --max-steps 400 --log-every 5 \
    --inject-delay-drafter-ms 50
  echo "$RC" >"$WORK/trunc.rc"
) &
job=$!
wait_for_log trunc "step=5 "
truncate -s 40000 "$WORK/data.h5"
wait "$job"
RC=$(cat "$WORK/trunc.rc")
expect_rc 3 trunc
grep -q "dataset $WORK/data.h5 changed size from [0-9]* to 40000 bytes while this job reads it" "$WORK/trunc.log" ||
  fail "no dataset-changed error (log: $(tail -15 "$WORK/trunc.log"))"
grep -q "drafter exported" "$WORK/trunc.log" && fail "the job exported a drafter after its dataset was truncated"
echo "PASS"
