#!/usr/bin/env bash
# A DFlash2 drafter trained here, exported, loaded by the official z-lab code (DFlash2DraftModel.from_pretrained)
# and decoded by the official dflash_generate: the same tokens as dflash-eval (both the target's greedy
# decoding) and the same acceptance length at every verification step, the last included (both draft the
# last block over the rows left before the token limit and count the tokens each step keeps, as the official
# loop does: docs/recipe.md section 6), for a drafter of full layers
# and one with a sliding layer under is_causal: false. Needs torch + transformers
# (DFLASH_TORCH_PY, a python with both) and the official dflash/model.py (DFLASH_OFFICIAL_MODEL: third-party
# code, not in this repository; docs/dflash2.md); skipped (77) without them. CPU, float32.
source "$(dirname "$0")/lib.sh"
: "${DFLASH_TORCH_PY:=python3}"
if [ -z "${DFLASH_OFFICIAL_MODEL:-}" ] || [ ! -f "$DFLASH_OFFICIAL_MODEL" ]; then
  echo "SKIP: set DFLASH_OFFICIAL_MODEL to z-lab/dflash's dflash/model.py (the DFlash2 version)"; exit 77
fi
"$DFLASH_TORCH_PY" -c "import torch, transformers" 2>/dev/null || { echo "SKIP: $DFLASH_TORCH_PY lacks torch/transformers"; exit 77; }
# two drafters: full-attention layers, and a sliding layer (window 12, shorter than the decoded sequences) beside
# a full one, with the releases' is_causal: false (the whole block visible, the window bounding the context)
check_one() {  # check_one NAME [dflash-train args...]
  local name=$1
  shift
  run_job "$name" 2 300 --topology 1-1 --draft-arch dflash2 --block-size 8 --draft-layers 2 --selector-top-k 8 \
    --selector-rank 16 --lr 0.003 --max-steps 40 --export-dtype f32 --log-every 10 "$@"
  expect_rc 0 "$name"
  local tiny
  tiny=$(tiny_dir)
  "$DFLASH_BIN/dflash-eval" --target "$tiny/target" --drafter "$WORK/$name/drafter" --prompts "$tiny/data.h5" \
    --max-prompts 8 --max-new-tokens 32 --check-greedy --json "$WORK/$name.eval.json" >"$WORK/$name.eval.log" 2>&1 ||
    { tail -20 "$WORK/$name.eval.log"; fail "dflash-eval ($name)"; }
  "$DFLASH_TORCH_PY" "$DFLASH_SRC/tests/gpu_e2e/dflash2_official_generate.py" --official-model "$DFLASH_OFFICIAL_MODEL" \
    --target "$tiny/target" --drafter "$WORK/$name/drafter" --prompts "$tiny/data.h5" --max-prompts 8 \
    --max-new-tokens 32 --out "$WORK/$name.official.jsonl" --compare "$WORK/$name.eval.json" --device cpu \
    --dtype float32 >"$WORK/$name.official.log" 2>&1 ||
    { tail -20 "$WORK/$name.official.log"; fail "the official dflash_generate differs (or failed) ($name)"; }
  "$PY" - "$WORK/$name.eval.json" "$WORK/$name.official.jsonl" <<'PYEOF' || fail "per-step acceptance differs from the official decoding ($name)"
import json, sys
ours = json.load(open(sys.argv[1]))['prompts']
theirs = [json.loads(l) for l in open(sys.argv[2])]
assert len(ours) == len(theirs) == 8, (len(ours), len(theirs))
steps = multi = 0
for a, b in zip(ours, theirs):
    n = len(a['acceptance'])
    assert a['acceptance'] == b['acceptance_lengths'], (a['record'], a['acceptance'], b['acceptance_lengths'])
    steps += n
    multi += sum(x > 1 for x in a['acceptance'][:n])
assert multi > 0, 'no step accepted a draft: the comparison would not test the selector walk'
print('acceptance identical over', steps, 'steps;', multi, 'of them accepted drafts')
PYEOF
}
check_one full --logit-softcap 30 --output-multiplier 1.5
check_one sliding --draft-layer-types sliding,full --draft-sliding-window 12
echo "PASS"
