#!/usr/bin/env bash
# The Qwen3.5/3.6 hybrid in the pipeline on the CPU: dflash-make-tiny --hybrid writes a tiny Qwen3_5ForCausalLM
# target (Gated DeltaNet layers + a gated full-attention layer) and data sampled from it; a 2-1 job through
# real mpirun trains on it (the targets run the hybrid forward and capture its layers), the loss falls, the
# drafter is exported with the hybrid's layer ids.
source "$(dirname "$0")/lib.sh"
tiny="$WORK/hybrid"
"$DFLASH_BIN/dflash-make-tiny" "$tiny" --hybrid >"$WORK/make.log" 2>&1 || { cat "$WORK/make.log"; fail "dflash-make-tiny --hybrid"; }
grep -q '"model_type": "qwen3_5_text"' "$tiny/target/config.json" || fail "not a Qwen3.5 config"
grep -q '"linear_attention"' "$tiny/target/config.json" || fail "no Gated DeltaNet layer"
run_job hybrid 3 400 --topology 2-1 --target "$tiny/target" --data "$tiny/data.h5" --max-steps 40 --log-every 10 \
  --lr 0.02 --warmup-steps 5 --draft-layers 2 --epochs 3 --peer-timeout 120
expect_rc 0 hybrid
expect_log hybrid "drafter exported to"
h5check "$WORK/hybrid/metrics.h5" "len(f['steps/loss']) == 40 and np.all(np.isfinite(f['steps/loss'][:]))"
h5check "$WORK/hybrid/metrics.h5" "f['steps/loss'][-10:].mean() < f['steps/loss'][:10].mean() - 0.05"
"$PY" -c "import json,sys; c=json.load(open(sys.argv[1])); ids=c.get('dflash_config',c).get('target_layer_ids'); assert ids and max(ids) < 4, ids" \
  "$WORK/hybrid/drafter/config.json" || fail "exported drafter's target_layer_ids"
echo "PASS"
