#!/usr/bin/env bash
# Checkpoints of a colocated run (docs/pipeline.md "The colocated layout"):
#  - a colocated run killed (SIGKILL, --inject-fail-*) and resumed from its last checkpoint ends with the
#    uninterrupted run's losses and drafter bit for bit;
#  - colocated on 2 ranks -> 2-1 on 3 -> colocated on 2 (each stopped at a checkpoint, --inject-stop-step,
#    and resumed with --resume auto on the other layout): every record of every epoch trained exactly once,
#    as in a straight colocated run (tests/e2e/check_trace.py), metrics.h5 holding every step once.
source "$(dirname "$0")/lib.sh"
DATA="$(tiny_dir)/data.h5"
N=12
FIXED=(--topology colocated --batch-order fixed --seed 5 --max-steps $N --checkpoint-every 4 --log-every 1)
run_job straight 2 300 "${FIXED[@]}"
expect_rc 0 straight
# Killed in its step 7 (after the step-4 checkpoint), then resumed from it with another credit window.
run_job killed 2 300 "${FIXED[@]}" --inject-fail-rank 1 --inject-fail-step 6
[ "$RC" -ne 0 ] || fail "killed: the SIGKILLed colocated run exited 0"
[ -f "$WORK/killed/checkpoints/step-00000004/manifest.json" ] || fail "killed: no step-4 checkpoint"
run_job resumed 2 300 "${FIXED[@]}" --resume "$WORK/killed/checkpoints/step-00000004" --hs-queue-depth 1
expect_rc 0 resumed
"$PY" - "$WORK/straight/metrics.h5" "$WORK/resumed/metrics.h5" <<'PYEOF' || fail "the resumed colocated run differs from the straight one"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
assert list(b['steps/step'][:]) == list(range(5, 13)), b['steps/step'][:]
for k in ('loss', 'acc', 'grad_norm', 'lr', 'tokens'):
    assert np.array_equal(a['steps/' + k][4:], b['steps/' + k][:]), k
PYEOF
cmp -s "$WORK/straight/drafter/model.safetensors" "$WORK/resumed/drafter/model.safetensors" ||
  fail "the drafter exported after the resume differs from the straight run's"

# Across layouts: colocated -> 2-1 -> colocated, 2 epochs.
COMMON=(--batch-order fixed --seed 5 --epochs 2 --log-every 1 --lr 3e-3)
mkdir -p "$WORK/trace_straight" "$WORK/trace_x"
run_job lstraight 2 300 --topology colocated "${COMMON[@]}" --inject-trace-dir "$WORK/trace_straight"
expect_rc 0 lstraight
run_job x 2 300 --topology colocated "${COMMON[@]}" --inject-trace-dir "$WORK/trace_x" --inject-stop-step 10
expect_rc 75 x
run_job x 3 300 --topology 2-1 "${COMMON[@]}" --inject-trace-dir "$WORK/trace_x" --resume auto --inject-stop-step 25
expect_rc 75 x
expect_log x "resuming on another split: the checkpoint's colocated on 2 rank(s) (2 target(s), 2 drafter(s)) -> 2-1 on 3 rank(s)"
run_job x 2 300 --topology colocated "${COMMON[@]}" --inject-trace-dir "$WORK/trace_x" --resume auto
expect_rc 0 x
expect_log x "resuming on another split: the checkpoint's 2-1 on 3 rank(s) (2 target(s), 1 drafter(s)) -> colocated on 2 rank(s)"
"$PY" "$DFLASH_SRC/tests/e2e/check_trace.py" "$WORK/trace_x" "$DATA" --straight "$WORK/trace_straight" --segments 3 ||
  fail "records across colocated -> 2-1 -> colocated"
h5check "$WORK/x/metrics.h5" "list(f['steps/step'][:]) == list(range(1, len(f['steps/step']) + 1))"
echo "PASS"
