#!/usr/bin/env bash
# FP8 targets through the whole pipeline on the CPU (docs/fp8.md; the CPU backend emulates FP8 linears:
# dequantized weights, activations quantized -> dequantized per token). dflash-fp8-convert writes the tiny
# target in both release formats (transformers' fine-grained blocks, compressed-tensors channels); jobs train
# on each, and on the bf16 target with --target-precision fp8 and fp8-dynamic, to an exported drafter. With the same seed
# and data the first steps' losses differ from the bf16 run's (the features changed) by a few percent at
# most (they changed little).
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
"$DFLASH_BIN/dflash-fp8-convert" "$tiny/target" "$WORK/t-block" --format block >"$WORK/convert.log" 2>&1 ||
  { cat "$WORK/convert.log"; fail "dflash-fp8-convert block"; }
"$DFLASH_BIN/dflash-fp8-convert" "$tiny/target" "$WORK/t-channel" --format channel --ignore 're:.*o_proj$' \
  >>"$WORK/convert.log" 2>&1 || { cat "$WORK/convert.log"; fail "dflash-fp8-convert channel"; }
grep -q '"quant_method": "fp8"' "$WORK/t-block/config.json" || fail "block: no fine-grained quantization_config"
grep -q '"F8_E4M3"' "$WORK/t-block/"model-*.safetensors || fail "block: no F8_E4M3 tensor"
grep -q 'o_proj.weight_scale"' "$WORK/t-channel/"model-*.safetensors && fail "channel: the ignored o_proj was quantized"

steps="--max-steps 6 --log-every 1 --seed 5"
run_job bf16 2 300 --topology 1-1 $steps
expect_rc 0 bf16
for v in block channel; do
  run_job "$v" 2 300 --topology 1-1 $steps --target "$WORK/t-$v"
  expect_rc 0 "$v"
  expect_log "$v" "drafter exported to"
done
run_job quantized 2 300 --topology 1-1 $steps --target-precision fp8
expect_rc 0 quantized
expect_log quantized "drafter exported to"
# llm-compressor's FP8-Dynamic made on load: a scale per output channel, one per token
run_job dynamic 2 300 --topology 1-1 $steps --target-precision fp8-dynamic
expect_rc 0 dynamic
expect_log dynamic "drafter exported to"

for v in block channel quantized dynamic; do
  "$PY" - "$WORK/bf16/metrics.h5" "$WORK/$v/metrics.h5" "$v" <<'PYEOF' || fail "$v: losses against bf16's"
import sys, h5py, numpy as np
ref = h5py.File(sys.argv[1], "r")["steps/loss"][:]
got = h5py.File(sys.argv[2], "r")["steps/loss"][:]
assert len(got) == len(ref) == 6 and np.all(np.isfinite(got)), (ref, got)
rel = np.abs(got - ref) / np.abs(ref)
print(f"# {sys.argv[3]}: relative loss difference to bf16 per step {np.round(rel, 5)}")
assert rel.max() > 0, "identical to bf16: the target did not run FP8"
assert rel.max() < 0.05, "FP8 features too far from bf16's"
PYEOF
done
echo "PASS"
