#!/usr/bin/env bash
# A target lost during training costs the drafter nothing it applied: the drafters checkpoint the last
# applied step before the job ends with exit 7, and resuming from that checkpoint gives the straight run's
# losses and drafter bit for bit (--batch-order fixed makes the data order independent of timing):
#  - one micro-batch per step: target rank 1 goes silent (SIGSTOP) at its batch 4;
#  - --grad-accum 2: the step in progress when the target is lost is dropped (its batches are trained
#    again, its RNG draws undone on resume);
#  - two drafters: the one that did not lose a target checkpoints too and names the one that did.
source "$(dirname "$0")/lib.sh"
T=4  # --peer-timeout seconds

# latest_step DIR: the step of the newest checkpoint under DIR/checkpoints (fails when there is none)
latest_step() {
  local d
  d=$(ls -d "$1"/checkpoints/step-* 2>/dev/null | sort | tail -1)
  [ -n "$d" ] && [ -f "$d/manifest.json" ] || fail "no checkpoint in $1/checkpoints"
  echo $((10#${d##*/step-}))
}

# expect_resumed_from STRAIGHT RESUMED S N: RESUMED logged steps S+1..N with STRAIGHT's numbers bit for bit
# and exported the same drafter.
expect_resumed_from() {
  "$PY" - "$WORK/$1/metrics.h5" "$WORK/$2/metrics.h5" "$3" "$4" <<'PYEOF' || fail "$2 differs from $1"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
s, n = int(sys.argv[3]), int(sys.argv[4])
assert list(b['steps/step'][:]) == list(range(s + 1, n + 1)), b['steps/step'][:]
for k in ('loss', 'acc', 'grad_norm', 'lr', 'tokens'):
    x, y = a['steps/' + k][s:], b['steps/' + k][:]
    assert np.array_equal(x, y), (k, x, y)
print('steps', s + 1, '..', n, 'identical')
PYEOF
  cmp -s "$WORK/$1/drafter/model.safetensors" "$WORK/$2/drafter/model.safetensors" ||
    fail "the drafter exported by $2 differs from $1's"
}

# lost_and_resumed NAME N [args...]: straight run of N steps; the same run with target rank 1 silent at its
# batch 4 (exit 7, a checkpoint of an applied step); resumed from it to the straight run's end.
lost_and_resumed() {
  local name=$1 n=$2
  shift 2
  local common=(--topology 2-1 --batch-order fixed --max-steps "$n" --seed 5 --log-every 1 "$@")
  run_job "${name}_straight" 3 120 "${common[@]}"
  expect_rc 0 "${name}_straight"
  run_job "${name}_lost" 3 90 "${common[@]}" --peer-timeout $T \
    --inject-fail-rank 1 --inject-fail-step 4 --inject-fail-mode hang
  expect_rc 7 "${name}_lost"
  expect_log "${name}_lost" "lost peer: target rank 1"
  local s
  s=$(latest_step "$WORK/${name}_lost")
  [ "$s" -gt 0 ] && [ "$s" -lt "$n" ] || fail "${name}_lost: checkpoint at step $s, expected one in 1..$((n - 1))"
  expect_log "${name}_lost" "after step $s is checkpointed in"
  note "${name}_lost: checkpointed step $s before exit 7"
  run_job "${name}_resumed" 3 120 "${common[@]}" --resume "$WORK/${name}_lost/checkpoints/step-$(printf %08d "$s")"
  expect_rc 0 "${name}_resumed"
  expect_resumed_from "${name}_straight" "${name}_resumed" "$s" "$n"
}

lost_and_resumed k1 30
lost_and_resumed k2 14 --grad-accum 2
# the target went silent inside a step: that step's first micro-batch was dropped, not checkpointed
expect_log k2_lost "was cut short after 1 of 2 micro-batches"

# Two drafters, each fed by its own targets: target rank 1 goes silent; both drafters checkpoint the same
# step, the one that lost it names the target, the job ends with 7.
run_job two 5 90 --topology 3-2 --peer-timeout $T --max-steps 40 --seed 5 \
  --inject-fail-rank 1 --inject-fail-step 4 --inject-fail-mode hang
expect_rc 7 two
expect_log two "lost peer: target rank 1"
s=$(latest_step "$WORK/two")
[ "$s" -gt 0 ] || fail "two: no applied step checkpointed"
expect_log two "after step $s is checkpointed in"
sleep 1
if pgrep -f "$WORK/" >/dev/null; then fail "ranks survived: $(pgrep -af "$WORK/")"; fi
echo "PASS"
