#!/usr/bin/env bash
# A resume that would silently train something else is refused before any model loads, naming what
# changed: the objective (--loss), the model (--draft-layers) (another --topology is a resume on another
# split: tests/e2e/test_resume_resplit.sh);
# and a checkpoint whose contents were damaged (same size, one flipped byte) is bad input (exit 3).
# --resume auto with no checkpoint starts fresh and says so.
source "$(dirname "$0")/lib.sh"
COMMON=(--max-steps 4 --seed 2 --checkpoint-every 4)
run_job base 2 120 --topology 1-1 "${COMMON[@]}" --resume auto --export-checkpoints --export-dtype bf16
expect_rc 0 base
expect_log base "no complete checkpoint in $WORK/base/checkpoints; starting fresh"
ck="$WORK/base/checkpoints/step-00000004"
[ -f "$ck/manifest.json" ] || fail "no checkpoint at step 4"
# --export-checkpoints: the checkpoint holds a release-format drafter, vouched for by its manifest.
grep -q '"drafter/model.safetensors"' "$ck/manifest.json" || fail "the manifest does not list drafter/model.safetensors"
cmp -s "$ck/drafter/model.safetensors" "$WORK/base/drafter/model.safetensors" ||
  fail "the step-4 checkpoint's export differs from the final export of the same 4-step run"

run_job loss 2 60 --topology 1-1 "${COMMON[@]}" --resume "$ck" --loss kl
expect_rc 2 loss
expect_log loss "--loss: saved 'ce', now 'kl'"
# Another split is not refused: the run continues on it (tests/e2e/test_resume_resplit.sh); here the
# checkpoint is the run's end, so nothing is left to train.
run_job topo 3 60 --topology 2-1 "${COMMON[@]}" --resume "$ck"
expect_rc 0 topo
expect_log topo "resuming on another split: the checkpoint's 1-1 on 2 rank(s)"
run_job model 2 60 --topology 1-1 "${COMMON[@]}" --resume "$ck" --draft-layers 2
expect_rc 2 model
expect_log model "--draft-layers: saved '1', now '2'"

# Allowed changes: log interval, checkpoint interval and count, output dir (resuming at the end: no step).
run_job allowed 2 60 --topology 1-1 --max-steps 4 --seed 2 --resume "$ck" --log-every 3 --checkpoint-every 2 --keep-checkpoints 1
expect_rc 0 allowed

# One flipped byte inside the weights: the size still matches, the content hash does not.
cp -r "$ck" "$WORK/corrupt"
"$PY" - "$WORK/corrupt/state.safetensors" <<'PYEOF'
import sys
p = sys.argv[1]
with open(p, 'r+b') as f:
    f.seek(-200, 2)
    b = f.read(1)
    f.seek(-200, 2)
    f.write(bytes([b[0] ^ 0x40]))
PYEOF
run_job corrupt 2 60 --topology 1-1 "${COMMON[@]}" --resume "$WORK/corrupt"
expect_rc 3 corrupt
expect_log corrupt "corrupt checkpoint"
echo "PASS"
