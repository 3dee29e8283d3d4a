#!/usr/bin/env bash
# FP8 targets through the job on the GPU (issue 46, docs/fp8.md): a random Qwen3 whose linears are all
# 128-aligned (hidden 256, 2 x 128 query heads, 1 KV head, intermediate 384: shapes both FP8 GEMMs take) in its
# two release formats (dflash-fp8-convert --format block / channel) and quantized on load
# (--target-precision fp8 / fp8-dynamic), each trained colocated (one process; --batch-order fixed, so
# deterministic kernels) for 12 steps to an exported drafter, beside the bf16 run:
#  - every run finishes and exports; the losses are finite, within 5 % of bf16's per step and not equal to them;
#  - a release and its on-load twin hold the same codes and scales, so they train the same losses and export the
#    same drafter, bit for bit (block = fp8, channel = fp8-dynamic);
#  - the block and per-token formats train different losses (another quantization of the activations).
# On sm_90 the linears run the FP8 GEMMs (block-scaled / per token), elsewhere dequantized per call.
source "$(dirname "$0")/gpu_lib.sh"
"$DFLASH_BIN/dflash-make-random" "$WORK/m" --preset tiny --hidden 256 --layers 2 --heads 2 --kv-heads 1 \
  --head-dim 128 --intermediate 384 --records 200 --min-len 200 --max-len 600 >"$WORK/make.log" 2>&1 ||
  { cat "$WORK/make.log"; fail "dflash-make-random"; }
for f in block channel; do
  "$DFLASH_BIN/dflash-fp8-convert" "$WORK/m/target" "$WORK/t-$f" --format "$f" >>"$WORK/make.log" 2>&1 ||
    { cat "$WORK/make.log"; fail "dflash-fp8-convert $f"; }
done
common=(--backend cuda --topology colocated --data "$WORK/m/data.h5" --batch-order fixed --max-steps 12 --seed 3
        --lr 0.01 --log-every 4 --token-budget 2048 --draft-layers 1)
run_job bf16 1 300 "${common[@]}" --target "$WORK/m/target"
expect_rc 0 bf16
for v in block channel; do
  run_job "$v" 1 300 "${common[@]}" --target "$WORK/t-$v"
  expect_rc 0 "$v"
  expect_log "$v" "drafter exported to"
done
run_job fp8 1 300 "${common[@]}" --target "$WORK/m/target" --target-precision fp8
expect_rc 0 fp8
run_job dynamic 1 300 "${common[@]}" --target "$WORK/m/target" --target-precision fp8-dynamic
expect_rc 0 dynamic
"$PY" - "$WORK" <<'PYEOF' || fail "FP8 targets on the GPU"
import sys, h5py, numpy as np
w = sys.argv[1]
def steps(name, k='loss'):
    return h5py.File(f'{w}/{name}/metrics.h5', 'r')['steps/' + k][:]
ref = steps('bf16')
for v in ('block', 'channel', 'fp8', 'dynamic'):
    got = steps(v)
    assert len(got) == len(ref) == 12 and np.all(np.isfinite(got)), (v, ref, got)
    assert np.array_equal(steps(v, 'tokens'), steps('bf16', 'tokens')), (v, 'trained on other batches')
    rel = np.abs(got - ref) / np.abs(ref)
    print(f'{v}: relative loss difference to bf16 max {rel.max():.5f} mean {rel.mean():.5f}')
    assert rel.max() > 0, (v, 'identical to bf16: the target did not run FP8')
    assert rel.max() < 0.05, (v, 'FP8 features too far from bf16')
assert np.array_equal(steps('block'), steps('fp8')), 'the block release and --target-precision fp8 differ'
assert np.array_equal(steps('channel'), steps('dynamic')), 'the channel release and fp8-dynamic differ'
assert not np.array_equal(steps('block'), steps('channel')), 'block and per-token scaling trained the same'
PYEOF
cmp -s "$WORK/block/drafter/model.safetensors" "$WORK/fp8/drafter/model.safetensors" ||
  fail "the block release and --target-precision fp8 exported different drafters"
cmp -s "$WORK/channel/drafter/model.safetensors" "$WORK/dynamic/drafter/model.safetensors" ||
  fail "the channel release and fp8-dynamic exported different drafters"
echo "PASS"
