#!/usr/bin/env bash
# The metrics writer (the first drafter) is SIGKILLed mid-run: metrics.h5 still opens with h5py and holds
# every step up to the last flush (--metrics-flush-every), in order, with finite values.
source "$(dirname "$0")/lib.sh"
run_job killed 4 90 --topology 2-1 --epochs 5 --log-every 2 --metrics-flush-every 2 \
  --inject-fail-rank 2 --inject-fail-step 12 --inject-fail-mode kill
expect_rc 137 killed  # mpirun reports the SIGKILLed rank: 128 + 9
expect_log killed "killing myself"
m="$WORK/killed/metrics.h5"
[ -s "$m" ] || fail "no metrics.h5"
h5eval "$m" "'steps in the file:', len(f['steps/step'])"
# 12 steps were done when it died (flushes happen every 2 appends; rank rows count as appends too)
h5check "$m" "8 <= len(f['steps/step']) <= 12"
h5check "$m" "list(f['steps/step'][:]) == list(range(1, len(f['steps/step']) + 1))"
h5check "$m" "np.all(np.isfinite(f['steps/loss'][:])) and len(f['ranks/rank']) > 0"
echo "PASS"
