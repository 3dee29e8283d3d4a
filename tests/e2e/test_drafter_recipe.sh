#!/usr/bin/env bash
# A fresh drafter made from the recipe options alone (the Qwen3.6-27B drafter's kind of shape, scaled to the
# tiny target): sliding layers with a window, a full last layer, chosen target layers, block size, mask
# token. The job trains it through mpirun, the export carries the shape, and dflash-eval decodes with it.
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
run_job recipe 2 240 --topology 1-1 --epochs 0 --max-steps 6 --draft-layers 2 --draft-layer-types sliding,full \
  --draft-sliding-window 8 --target-layers 0,2,3 --block-size 8 --mask-token 500 --export-dtype f32
expect_rc 0 recipe
expect_log recipe "drafter exported to"
$PY - "$WORK/recipe/drafter/config.json" <<'PYEOF' || fail "exported config does not carry the recipe"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["layer_types"] == ["sliding_attention", "full_attention"], c["layer_types"]
assert c["sliding_window"] == 8 and c["use_sliding_window"] is True, (c["sliding_window"], c["use_sliding_window"])
assert c["dflash_config"] == {"mask_token_id": 500, "target_layer_ids": [0, 2, 3]}, c["dflash_config"]
assert c["block_size"] == 8 and c["num_hidden_layers"] == 2
PYEOF
h5check "$WORK/recipe/metrics.h5" "len(f['steps/step']) == 6"
"$DFLASH_BIN/dflash-eval" --target "$tiny/target" --drafter "$WORK/recipe/drafter" --prompts "$tiny/data.h5" \
  --max-prompts 2 --max-new-tokens 12 --check-greedy >"$WORK/eval.log" 2>&1 || { cat "$WORK/eval.log"; fail "dflash-eval"; }
grep -q "block 8, mask token 500, target layers 0 2 3" "$WORK/eval.log" || { cat "$WORK/eval.log"; fail "eval header"; }
grep -q "greedy check: 0 of 2 prompts differ" "$WORK/eval.log" || fail "greedy check"

# With --drafter DIR the recipe options are refused: the directory brings its own config.
run_job clash 2 60 --drafter "$WORK/recipe/drafter" --block-size 16 --max-steps 2
expect_rc 2 clash
expect_log clash "--block-size describes a fresh drafter"
echo "PASS"
