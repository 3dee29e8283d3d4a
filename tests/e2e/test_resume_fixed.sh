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
"$PY" - "$WORK/straight/metrics.h5" "$WORK/resumed/metrics.h5" $N <<'PYEOF' || fail "resumed losses differ from the straight run"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
n = int(sys.argv[3])
assert list(b['steps/step'][:]) == list(range(n // 2 + 1, n + 1)), b['steps/step'][:]
for k in ('loss', 'acc', 'grad_norm', 'lr', 'tokens'):
    x, y = a['steps/' + k][n // 2:], b['steps/' + k][:]
    assert np.array_equal(x, y), (k, x, y)
print('2-1 fixed order: steps', n // 2 + 1, '..', n, 'identical; last loss', b['steps/loss'][-1])
PYEOF
cmp -s "$WORK/straight/drafter/model.safetensors" "$WORK/resumed/drafter/model.safetensors" ||
  fail "the drafter exported after resuming differs from the straight run's"

run_job refused 3 60 --topology 2-1 --batch-order arrival --max-steps $N --seed 5 --resume "$half"
expect_rc 2 refused
expect_log refused "--batch-order: saved 'fixed', now 'arrival'"
echo "PASS"
