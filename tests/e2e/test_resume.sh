#!/usr/bin/env bash
# Resume gives the losses of a run that never stopped, bit for bit: N steps straight (checkpointing at
# N/2) vs the N/2 checkpoint resumed for the other N/2 steps, with a different --log-every (allowed to
# change). The exported drafters must be byte-identical too. Then discovery: a half-written newer
# checkpoint (no manifest) is skipped by --resume auto; a committed one truncated afterwards is refused
# (exit 3: skipping it would silently lose the steps since the previous one) until it is moved away,
# and the run that then resumes deletes neither it nor anything else it did not write.
source "$(dirname "$0")/lib.sh"
N=12
COMMON=(--topology 1-1 --max-steps $N --seed 5 --checkpoint-every $((N / 2)))
run_job straight 2 120 "${COMMON[@]}" --log-every 1 --keep-checkpoints 5
expect_rc 0 straight
half="$WORK/straight/checkpoints/step-0000000$((N / 2))"
[ -f "$half/manifest.json" ] || fail "no checkpoint at step $((N / 2)) in $WORK/straight/checkpoints"
[ -f "$WORK/straight/checkpoints/step-000000$N/manifest.json" ] || fail "no checkpoint at step $N"

run_job resumed 2 120 "${COMMON[@]}" --log-every 4 --resume "$half"
expect_rc 0 resumed
expect_log resumed "resuming from $half"
expect_resumed_like_straight straight resumed $N

# ---- discovery: never a half-written or truncated checkpoint ----------------------------------------
ck="$WORK/picked/checkpoints"
mkdir -p "$ck"
cp -r "$half" "$ck/"
cp -r "$WORK/straight/checkpoints/step-000000$N" "$ck/"
truncate -s -64 "$ck/step-000000$N/state.safetensors"   # committed, then truncated
mkdir -p "$ck/step-00000011" && cp "$half/state.safetensors" "$ck/step-00000011/"  # no manifest: never committed
cp -r "$ck/step-000000$N" "$WORK/truncated"
run_job refused 2 60 "${COMMON[@]}" --out "$WORK/picked" --resume auto
expect_rc 3 refused
expect_log refused "damaged checkpoint $ck/step-000000$N"
expect_log refused "HINT: the checkpoint is damaged"
[ -d "$ck/step-000000$N" ] && [ -f "$ck/step-0000000$((N / 2))/manifest.json" ] || fail "the refused start changed $ck"
[ ! -e "$WORK/picked/metrics.h5" ] || fail "the refused start wrote metrics"
mv "$ck/step-000000$N" "$ck/step-000000$N.damaged"  # as the hint says
run_job picked 2 120 "${COMMON[@]}" --log-every 4 --resume auto
expect_rc 0 picked
expect_log picked "--resume auto: resuming from $ck/step-0000000$((N / 2))"
expect_log picked "skipping $ck/step-00000011"
[ -d "$ck/step-000000$N.damaged" ] || fail "the resumed run deleted the damaged checkpoint it did not write"
"$PY" - "$WORK/straight/metrics.h5" "$WORK/picked/metrics.h5" $N <<'PYEOF' || fail "losses after resuming past damaged checkpoints differ"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
n = int(sys.argv[3])
assert np.array_equal(a['steps/loss'][n // 2:], b['steps/loss'][:])
PYEOF
# An explicit --resume of the truncated one is refused as bad input (exit 3).
run_job explicit 2 60 "${COMMON[@]}" --resume "$WORK/truncated"
expect_rc 3 explicit
expect_log explicit "truncated"
echo "PASS"
