#!/usr/bin/env bash
# --hs-dtype fp8 (docs/fp8.md "The FP8 wire"): hidden states travel as e4m3 codes with one float32 scale per
# token row, quantized by the target after its forward and dequantized by the drafter before its step.
#  - 1-1 over the host plane, with --eval-data (the kept eval batches are dequantized too): the run ends with
#    an exported drafter and finite losses, close to the bf16 wire's (float32 on the CPU backend) but not equal
#    to them (the features did go through e4m3);
#  - --loss kl: the final norm travels in fp8 too;
#  - colocated (the local plane) with --hs-dtype fp8 trains what 1-1 with fp8 trains, bit for bit, under
#    --batch-order fixed (as test_colocated.sh holds for the bf16 wire);
#  - the startup line names the wire; --dry-run counts the smaller slots;
#  - a resume may not change --hs-dtype (it changes what is trained).
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
split_eval_set "$tiny/data.h5" "$WORK/train.h5" "$WORK/eval.h5" 40
ONE=(--data "$WORK/train.h5" --eval-data "$WORK/eval.h5" --batch-order fixed --seed 5 --max-steps 6 --log-every 1
     --eval-every 3 --peer-timeout 120)

run_job bf16 2 300 --topology 1-1 "${ONE[@]}"
expect_rc 0 bf16
expect_log bf16 "F32 on the wire"
run_job fp8 2 300 --topology 1-1 "${ONE[@]}" --hs-dtype fp8 --checkpoint-every 3
expect_rc 0 fp8
expect_log fp8 "FP8 (e4m3, a float32 scale per token row) on the wire"
expect_log fp8 "drafter exported to"
run_job coloc 1 300 --topology colocated "${ONE[@]}" --hs-dtype fp8
expect_rc 0 coloc
expect_log coloc "local plane"
run_job kl 2 300 --topology 1-1 "${ONE[@]}" --hs-dtype fp8 --loss kl
expect_rc 0 kl
expect_log kl "drafter exported to"

"$PY" - "$WORK" <<'PYEOF' || fail "the fp8 wire's losses"
import sys, h5py, numpy as np
w = sys.argv[1]
def steps(name, k='loss'):
    return h5py.File(f'{w}/{name}/metrics.h5', 'r')['steps/' + k][:]
ref, got = steps('bf16'), steps('fp8')
assert len(got) == len(ref) == 6 and np.all(np.isfinite(got)), (ref, got)
rel = np.abs(got - ref) / np.abs(ref)
print(f'# fp8 wire: relative loss difference to the float32 wire per step {np.round(rel, 5)}')
assert rel.max() > 0, 'identical to the float32 wire: the features did not travel in fp8'
assert rel.max() < 0.02, 'the fp8 wire moved the losses too far'
for k in ('step', 'loss', 'acc', 'grad_norm', 'lr', 'tokens', 'anchors'):
    assert np.array_equal(steps('fp8', k), steps('coloc', k)), ('colocated fp8 differs from 1-1 fp8', k)
e1, e2 = (h5py.File(f'{w}/{n}/metrics.h5', 'r')['eval/loss'][:] for n in ('fp8', 'coloc'))
assert len(e1) >= 1 and np.all(np.isfinite(e1)) and np.array_equal(e1, e2), (e1, e2)
kl = steps('kl')
assert len(kl) == 6 and np.all(np.isfinite(kl)), kl
PYEOF
cmp -s "$WORK/fp8/drafter/model.safetensors" "$WORK/coloc/drafter/model.safetensors" ||
  fail "the drafter colocated fp8 exported differs from 1-1 fp8's"

# A resume on the other wire is refused: the features it trains on would change mid-run.
ckpt="$WORK/fp8/checkpoints/step-00000003"
[ -f "$ckpt/manifest.json" ] || fail "fp8 wrote no checkpoint at step 3"
run_job resumed_bf16 2 120 --topology 1-1 "${ONE[@]}" --resume "$ckpt"
expect_rc 2 resumed_bf16
expect_log resumed_bf16 "--hs-dtype: saved 'fp8', now 'bf16'"

# The dry run counts the fp8 slots: about half of the CUDA bf16 ones (one byte + 4 / H per value).
qwen3_8b_config "$WORK/qwen3-8b"
records_h5 "$WORK/records.h5" 151936 8 4096
Q8=(--ranks 2 --topology 1-1 --backend cuda --target "$WORK/qwen3-8b" --data "$WORK/records.h5" --token-budget 32768
    --draft-layers 5)
dry dry_bf16 "${Q8[@]}"
expect_rc 0 dry_bf16
dry dry_fp8 "${Q8[@]}" --hs-dtype fp8
expect_rc 0 dry_fp8
"$PY" - "$WORK/dry_bf16.log" "$WORK/dry_fp8.log" <<'PYEOF' || fail "the dry run's fp8 slots"
import re, sys
def send_buffer(path):
    m = re.search(r'2 send buffers of ([0-9.]+) (GiB|MiB) \((\w+) on the wire\)', open(path).read())
    assert m, f'{path}: no send buffer size'
    return float(m.group(1)) * (1024 if m.group(2) == 'GiB' else 1), m.group(3)
(b, bw), (f, fw) = send_buffer(sys.argv[1]), send_buffer(sys.argv[2])
print(f'# send buffer: bf16 {b:.1f} MiB, fp8 {f:.1f} MiB')
assert (bw, fw) == ('bf16', 'fp8'), (bw, fw)
assert 0.45 < f / b < 0.55, (b, f)
assert 'dequantize staging' in open(sys.argv[2]).read() and 'dequantize staging' not in open(sys.argv[1]).read()
PYEOF
echo "PASS"
