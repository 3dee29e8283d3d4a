#!/usr/bin/env bash
# dflash-make-random's hybrid (the Qwen3.5/3.6 layout: Gated DeltaNet layers, every 4th layer gated full
# attention; apps/make_target_common.h) in the pipeline on the CPU: a small qwen36-27b (the preset's config,
# smaller widths and heads by the shape flags, 8 layers = 6 GDN + 2 attention) and its random-token data; a
# 1-1 job through real mpirun runs the hybrid target's forward over it and trains a few finite steps to an
# exported drafter whose target layers lie in the 8. (tests/unit/test_make_random.cpp checks the 27B's
# per-head shapes and the forward's numbers.)
source "$(dirname "$0")/lib.sh"
rand="$WORK/rand"
"$DFLASH_BIN/dflash-make-random" "$rand" --preset qwen36-27b --layers 8 --hidden 128 --intermediate 256 --vocab 512 \
  --heads 4 --kv-heads 2 --head-dim 64 --gdn-key-heads 2 --gdn-value-heads 4 --gdn-head-dim 32 \
  --records 48 --min-len 48 --max-len 96 --seed 4 --threads 2 >"$WORK/make.log" 2>&1 ||
  { cat "$WORK/make.log"; fail "dflash-make-random --preset qwen36-27b"; }
grep -q "8 layers (6 Gated DeltaNet: 2 key / 4 value heads x 32, conv 4; 2 attention)" "$WORK/make.log" ||
  { cat "$WORK/make.log"; fail "not the 6 + 2 hybrid"; }
"$PY" - "$rand/target/config.json" <<'PYEOF' || fail "config.json is not the hybrid's"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["architectures"] == ["Qwen3_5ForCausalLM"] and c["model_type"] == "qwen3_5_text", c
assert c["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"], c
assert (c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"]) == (2, 4, 32), c
assert c["rope_parameters"]["partial_rotary_factor"] == 0.25 and c["dflash_random"]["preset"] == "qwen36-27b", c
PYEOF
run_job rand 2 300 --topology 1-1 --target "$rand/target" --data "$rand/data.h5" --max-steps 6 --log-every 1 \
  --draft-layers 1 --seed 5
expect_rc 0 rand
expect_log rand "drafter exported to"
h5check "$WORK/rand/metrics.h5" "len(f['steps/loss']) == 6 and np.all(np.isfinite(f['steps/loss'][:]))"
"$PY" -c "import json,sys; c=json.load(open(sys.argv[1])); ids=c.get('dflash_config',c).get('target_layer_ids'); assert ids and max(ids) < 8, ids" \
  "$WORK/rand/drafter/config.json" || fail "exported drafter's target_layer_ids"
echo "PASS"
