#!/usr/bin/env bash
# Checkpoint -> resume on the GPU: the step-20 checkpoint of a 40-step run is resumed to step 40; the
# resumed run starts at step 21 from the checkpoint's weights, optimizer state and data position, so it
# trains the straight run's batches (same token counts). With --batch-order fixed, --deterministic auto
# turns the fixed-order kernels on: its losses and its exported drafter equal the straight run's bit for
# bit. With --deterministic off (atomic sums: not bit-reproducible) the losses stay within bf16
# run-to-run tolerance.
source "$(dirname "$0")/gpu_lib.sh"
common=(--backend cuda --topology 1-1 --batch-order fixed --max-steps 40 --checkpoint-every 20 --seed 2 --lr 0.02)
run_job straight 2 300 "${common[@]}" --log-every 5
expect_rc 0 straight
expect_log straight "backend cuda (deterministic kernels)"
half="$WORK/straight/checkpoints/step-00000020"
[ -f "$half/manifest.json" ] || fail "no checkpoint at step 20 in $WORK/straight/checkpoints"
run_job resumed 2 300 "${common[@]}" --log-every 4 --resume "$half"
expect_rc 0 resumed
expect_log resumed "resuming from $half"
"$PY" - "$WORK/straight/metrics.h5" "$WORK/resumed/metrics.h5" <<'PYEOF' || fail "the resumed GPU run does not continue the straight run"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
assert list(b['steps/step'][:]) == list(range(21, 41)), b['steps/step'][:]
assert np.array_equal(a['steps/tokens'][20:], b['steps/tokens'][:]), 'resumed run trained other batches'
la, lb = a['steps/loss'][20:], b['steps/loss'][:]
rel = np.abs(la - lb) / np.abs(la)
print('steps 21..40: loss rel diff max %.4f; lr equal: %s' % (rel.max(), np.allclose(a['steps/lr'][20:], b['steps/lr'][:])))
assert rel.max() < 0.03 and np.allclose(a['steps/lr'][20:], b['steps/lr'][:]), rel
assert np.array_equal(la, lb), 'deterministic kernels, yet the resumed losses differ: %s' % (la - lb)
PYEOF
cmp "$WORK/straight/drafter/model.safetensors" "$WORK/resumed/drafter/model.safetensors" ||
  fail "the resumed run's exported drafter is not the straight run's, bit for bit"
note "deterministic: the resumed run's losses and exported drafter equal the straight run's bit for bit"
# Without the mode: the same resume, within bf16 run-to-run tolerance.
run_job straight_nd 2 300 "${common[@]}" --log-every 5 --deterministic off
expect_rc 0 straight_nd
expect_log straight_nd "backend cuda (fastest kernels, not bit-reproducible)"
run_job resumed_nd 2 300 "${common[@]}" --log-every 4 --deterministic off --resume "$WORK/straight_nd/checkpoints/step-00000020"
expect_rc 0 resumed_nd
"$PY" - "$WORK/straight_nd/metrics.h5" "$WORK/resumed_nd/metrics.h5" <<'PYEOF' || fail "the resumed GPU run (--deterministic off) does not continue the straight run"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
la, lb = a['steps/loss'][20:], b['steps/loss'][:]
rel = np.abs(la - lb) / np.abs(la)
print('--deterministic off, steps 21..40: loss rel diff max %.4f' % rel.max())
assert rel.max() < 0.03, rel
PYEOF
echo "PASS"
