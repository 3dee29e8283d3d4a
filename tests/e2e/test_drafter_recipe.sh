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
# vLLM's numbering of the same layers (id j = the output of layer j-1), for its releases that read it first
assert c["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4], c.get("eagle_aux_hidden_state_layer_ids")
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
# The recipe files (jobs/recipes/*.cfg) parse and resolve: the 8B one on the tiny target (the CPU backend and
# the tiny shapes on the command line win), and the 27B one is applied far enough to be refused for its
# target layers, which the 4-layer tiny target does not have.
recipe_dry() {  # recipe_dry NAME CFG
  set +e
  timeout -k 5 60 mpirun -np 2 --oversubscribe "$TRAIN" --config "$DFLASH_SRC/jobs/recipes/$2" --backend cpu \
    --topology 1-1 --target "$tiny/target" --data "$tiny/data.h5" --out "$WORK/$1" --token-budget 512 \
    --draft-layers "$3" --dry-run >"$WORK/$1.log" 2>&1
  RC=$?
  set -e
}
recipe_dry r8b qwen3-8b.cfg 4  # (a dry run refuses more drafter layers than the 4-layer target has, as the job)
expect_rc 0 r8b
for kv in --lr=0.0006 --warmup-ratio=0.04 --epochs=6 --block-size=16 --anchors-per-record=0 --max-anchors=2048 --gamma=7 --draft-sliding-window=0; do
  expect_log r8b "$kv"
done
# one anchor per 8 tokens, drawn over the batch (docs/recipe.md "Anchor density")
expect_log r8b "[dflash] anchors: up to 2048 per packed batch (--max-anchors), uniformly among its valid positions"
recipe_dry r27b qwen36-27b.cfg 5
expect_rc 2 r27b
expect_log r27b "--target-layers: layer 16 is not one of the target's 4 layers"
recipe_dry r27b2 qwen38-27b-dflash2.cfg 5
expect_rc 2 r27b2
expect_log r27b2 "--target-layers: layer 5 is not one of the target's 4 layers"
echo "PASS"
