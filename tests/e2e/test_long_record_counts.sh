#!/usr/bin/env bash
# Records longer than --token-budget: how many, and how many tokens the loader drops from them each epoch,
# are printed at startup and stored in metrics.h5 (long_records_per_epoch,
# long_record_tokens_dropped_per_epoch) -- for --long-record cut (the tail of each) and skip (all of it).
# The expected numbers are computed here from the dataset's offsets.
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
B=64
read -r n cut skip < <($PY - "$tiny/data.h5" $B <<'PYEOF'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    lens = np.diff(f["offsets"][:])
b = int(sys.argv[2])
long = lens[lens > b]
print(len(long), int((long - b).sum()), int(long.sum()))
PYEOF
)
[ "$n" -gt 0 ] || fail "the tiny dataset has no record longer than $B (test needs some)"
note "$n records longer than $B: $cut tokens cut, $skip tokens in them"
for policy in cut skip; do
  run_job $policy 2 120 --topology 1-1 --token-budget $B --long-record $policy --max-steps 3
  expect_rc 0 $policy
  want=$([ $policy = cut ] && echo $cut || echo $skip)
  expect_log $policy "[dflash] data: $n record(s) longer than --token-budget $B, every epoch:"
  expect_log $policy "($want tokens dropped per epoch)"
  h5check "$WORK/$policy/metrics.h5" "f.attrs['long_records_per_epoch'] == $n and f.attrs['long_record_tokens_dropped_per_epoch'] == $want"
done
expect_log cut "cut to their first --token-budget tokens (--long-record cut)"
expect_log skip "left out (--long-record skip)"
echo "PASS"
