#!/usr/bin/env bash
# Issue 47 through real mpirun on the CPU: a fresh DFlash2 drafter with heads other than the tiny target's
# (--draft-heads 8 --draft-head-dim 8 --draft-kv-heads 2; the target has 4 x 32, 2 KV heads) trains with the
# strict selector candidates (the default) and the selector schedule (8 steps, warmup 0.25 = 2 steps of 0,
# ramp 0.25 = 2 steps: alpha 0.5 x [0, 0, 1/2, 1, 1, ...]); metrics.h5 /steps/selector_alpha says so, the
# loss falls, and the export's config.json and tensors have the drafter's heads.
source "$(dirname "$0")/lib.sh"
run_job heads 2 200 --topology 1-1 --draft-arch dflash2 --block-size 8 --conv-group-size 16 --selector-top-k 8 \
  --selector-rank 16 --selector-loss-alpha 0.5 --selector-warmup-ratio 0.25 --selector-ramp-ratio 0.25 \
  --draft-heads 8 --draft-head-dim 8 --draft-kv-heads 2 --lr 0.003 --seed 7 --max-steps 8 --log-every 1
expect_rc 0 heads
"$PY" - "$WORK/heads" <<'PYEOF' || fail "the run's metrics or export"
import sys, json, struct, h5py, numpy as np
w = sys.argv[1]
m = h5py.File(w + '/metrics.h5', 'r')
loss = m['steps/loss'][:]
assert len(loss) == 8 and np.all(np.isfinite(loss)), loss
assert loss[-3:].mean() < loss[:3].mean(), ('the loss did not fall', loss)
alpha = m['steps/selector_alpha'][:]
assert np.allclose(alpha, [0, 0, 0.25, 0.5, 0.5, 0.5, 0.5, 0.5]), alpha
cfg = json.load(open(w + '/drafter/config.json'))
for k, v in dict(num_attention_heads=8, head_dim=8, num_key_value_heads=2).items():
    assert cfg[k] == v, (k, cfg.get(k), v)
with open(w + '/drafter/model.safetensors', 'rb') as f:
    n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
assert h['layers.0.self_attn.q_proj.weight']['shape'] == [64, 64], h['layers.0.self_attn.q_proj.weight']
assert h['layers.0.self_attn.k_proj.weight']['shape'] == [16, 64], h['layers.0.self_attn.k_proj.weight']
assert h['layers.0.self_attn.q_norm.weight']['shape'] == [8]
print('loss', loss[0], '->', loss[-1], 'alpha', list(alpha))
PYEOF
echo "PASS"
