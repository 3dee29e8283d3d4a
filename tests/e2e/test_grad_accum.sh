#!/usr/bin/env bash
# Gradient accumulation (--grad-accum, --global-batch-tokens; docs/pipeline.md "Gradient accumulation"),
# real mpirun on the CPU. With --batch-order fixed one target deals its batches to its drafters in turn, and
# at --max-anchors >= --token-budget every valid position is an anchor (no draw), so 2 drafters x K=2 and
# 1 drafter x K=4 train each optimizer step on the same 4 batches: the same losses, tokens and model up to
# fp32 reassociation of the sum (one normalisation over the 4 batches; the 2-drafter run allreduces once per
# step). The data ending mid-step trains the partial step and ends the run there (ceil(batches / K) steps,
# the lr schedule planned so). --global-batch-tokens picks K (dry run); it and --grad-accum together are
# refused (exit 2); a resume with another K is refused (exit 2, naming --grad-accum).
source "$(dirname "$0")/lib.sh"
common=(--batch-order fixed --max-anchors 512 --seed 3 --lr 0.01)
run_job d2k2 3 200 --topology 1-2 --grad-accum 2 --max-steps 3 --log-every 1 --checkpoint-every 2 "${common[@]}"
expect_rc 0 d2k2
expect_log d2k2 "[dflash] batch: 2 micro-batch(es) per optimizer step x 2 drafter(s) x <= 512 tokens = <= 2048 tokens per optimizer step (--grad-accum 2)"
expect_log d2k2 "step=3 (x2 mb)"
run_job d1k4 2 200 --topology 1-1 --grad-accum 4 --max-steps 3 --log-every 1 "${common[@]}"
expect_rc 0 d1k4
run_job d1k1 2 200 --topology 1-1 --max-steps 12 --log-every 4 "${common[@]}"
expect_rc 0 d1k1
"$PY" - "$WORK" <<'PYEOF' || fail "2 drafters x K=2 and 1 drafter x K=4 trained different steps"
import sys, h5py, numpy as np
w = sys.argv[1]
a, b, one = (h5py.File(f'{w}/{n}/metrics.h5', 'r') for n in ('d2k2', 'd1k4', 'd1k1'))
assert a.attrs['grad_accum'] == 2 and b.attrs['grad_accum'] == 4 and one.attrs['grad_accum'] == 1
assert list(a['steps/step'][:]) == [1, 2, 3] and list(b['steps/step'][:]) == [1, 2, 3]
for k in ('tokens', 'anchors'):
    assert np.array_equal(a['steps/' + k][:], b['steps/' + k][:]), (k, a['steps/' + k][:], b['steps/' + k][:])
# each optimizer step sums its 4 micro-batches: the K=1 run's batches 4s-3 .. 4s
t1 = one['steps/tokens'][:].reshape(3, 4).sum(axis=1)
assert np.array_equal(b['steps/tokens'][:], t1), (b['steps/tokens'][:], t1)
for k in ('loss', 'grad_norm', 'acc'):
    x, y = a['steps/' + k][:], b['steps/' + k][:]
    assert np.allclose(x, y, rtol=1e-4, atol=1e-6), (k, x, y)
# the first step's loss (the same initial weights) is the K=1 run's 4 batches normalised together
print('2x2 vs 1x4: tokens identical, losses', a['steps/loss'][:], b['steps/loss'][:])
PYEOF
"$PY" - "$WORK/d2k2/drafter/model.safetensors" "$WORK/d1k4/drafter/model.safetensors" <<'PYEOF' || fail "the two accumulations exported different drafters"
import sys, json, struct, numpy as np
def load(p):
    with open(p, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); base = 8 + n; data = open(p, 'rb').read()
    out = {}
    for k, v in h.items():
        if k == '__metadata__': continue
        s, e = v['data_offsets']
        raw = np.frombuffer(data[base + s: base + e], dtype=np.uint16).astype(np.uint32) << 16  # bf16
        out[k] = raw.view(np.float32)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys()
num = sum(float(((a[k] - b[k]) ** 2).sum()) for k in a); den = sum(float((b[k] ** 2).sum()) for k in b)
print('drafters rel diff %.2e' % (num / den) ** 0.5)
assert (num / den) ** 0.5 < 1e-2
PYEOF

# The data ends inside a step: ceil(batches / K) steps, the last one partial, every batch trained once.
run_job partial 2 200 --topology 1-1 --grad-accum 5 --epochs 1 --log-every 100 "${common[@]}"
expect_rc 0 partial
"$PY" - "$WORK" <<'PYEOF' || fail "the partial last step"
import sys, re, h5py, numpy as np
w = sys.argv[1]
p = h5py.File(f'{w}/partial/metrics.h5', 'r')
log = open(f'{w}/partial.log').read()
m = re.search(r'cosine to \S+ at step (\d+) \((\d+) batches over 1 epoch\(s\) / 1 drafter\(s\) / 5 micro-batches per step\)', log)
assert m, 'no planned schedule line'
steps, batches = int(m.group(1)), int(m.group(2))
assert batches % 5 != 0, 'pick another K: %d batches divide by 5' % batches
assert steps == (batches + 4) // 5 and len(p['steps/step']) == steps, (steps, batches, len(p['steps/step']))
total = int(p['steps/tokens'][:].sum())
assert total == int(p.attrs['dataset_tokens']), (total, p.attrs['dataset_tokens'])
print('%d batches -> %d steps, the last with %d of 5 micro-batches; all %d tokens trained' % (batches, steps, batches % 5, total))
PYEOF

# --global-batch-tokens: K from the drafters (dry run: nothing loaded)
run_job gbt 3 60 --topology 1-2 --global-batch-tokens 3000 --dry-run
expect_rc 0 gbt
expect_log gbt "[dflash] batch: 3 micro-batch(es) per optimizer step x 2 drafter(s) x <= 512 tokens = <= 3072 tokens per optimizer step (--global-batch-tokens 3000)"
expect_log gbt "gradient accumulator"
run_job both 1 30 --grad-accum 2 --global-batch-tokens 3000
expect_rc 2 both
expect_log both "--grad-accum and --global-batch-tokens both set the micro-batches per step"
# Another K on resume: refused before any model loads.
run_job otherk 3 60 --topology 1-2 --grad-accum 1 --max-steps 3 --resume "$WORK/d2k2/checkpoints/step-00000002" "${common[@]}"
expect_rc 2 otherk
expect_log otherk "--grad-accum: saved '2', now '1'"
echo "PASS"
