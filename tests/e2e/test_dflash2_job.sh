#!/usr/bin/env bash
# DFlash2 drafters through real mpirun on the CPU (docs/dflash2.md): a fresh DFlash2 drafter (--draft-arch
# dflash2, block 8, the selector objective) trains on 2 drafters, its loss falls, metrics.h5 has the
# selector's numbers, the export is in the release format (architectures DFlash2DraftModel, dflash_config's
# DFlash2 fields, the codebooks without ".weight"); a resume from the half-way checkpoint is bit-identical to
# the straight run (--batch-order fixed); another --selector-loss-alpha on resume is refused (exit 2); the
# export continues as a --drafter (its architecture from its config.json), and --draft-arch beside --drafter
# is refused (exit 2).
source "$(dirname "$0")/lib.sh"
N=8
D2=(--draft-arch dflash2 --block-size 8 --conv-group-size 16 --selector-top-k 8 --selector-rank 16
    --selector-loss-alpha 0.5 --logit-softcap 30 --lr 0.003 --batch-order fixed --seed 7 --max-steps $N)
run_job straight 3 200 --topology 1-2 "${D2[@]}" --checkpoint-every $((N / 2)) --log-every 1
expect_rc 0 straight
expect_log straight "dflash2"
"$PY" - "$WORK/straight" <<'PYEOF' || fail "the DFlash2 run's metrics or export"
import sys, json, struct, h5py, numpy as np
w = sys.argv[1]
m = h5py.File(w + '/metrics.h5', 'r')
loss = m['steps/loss'][:]
assert len(loss) == 8 and np.all(np.isfinite(loss)), loss
assert loss[-3:].mean() < loss[:3].mean(), ('the loss did not fall', loss)
for k in ('loss_sel', 'candidate_recall', 'selector_acc'):
    v = m['steps/' + k][:]
    assert len(v) == 8 and np.all(np.isfinite(v)), (k, v)
assert np.all((m['steps/candidate_recall'][:] >= 0) & (m['steps/candidate_recall'][:] <= 1))
cfg = json.load(open(w + '/drafter/config.json'))
assert cfg['architectures'] == ['DFlash2DraftModel'], cfg['architectures']
dc = cfg['dflash_config']
for k, v in dict(block_size=8, conv_group_size=16, conv_kernel_size=2, selector_top_k=8, selector_rank=16,
                 final_logit_softcapping=30.0, output_multiplier=1.0).items():
    assert dc[k] == v, (k, dc.get(k), v)
assert 'block_size' not in cfg, 'DFlash2 releases keep block_size in dflash_config only'
with open(w + '/drafter/model.safetensors', 'rb') as f:
    n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
names = set(h) - {'__metadata__'}
for t in ('candidate_selector.predecessor_codebook', 'candidate_selector.successor_codebook',
          'candidate_selector.hidden_projection.weight', 'layers.0.attention_conv.base_kernel',
          'layers.0.attention_conv.kernel_projection.weight', 'layers.0.mlp_conv.base_kernel',
          'layers.0.mlp_conv.kernel_projection.weight'):
    assert t in names, (t, sorted(names))
assert h['candidate_selector.predecessor_codebook']['shape'] == [512, 16]
assert h['layers.0.attention_conv.base_kernel']['shape'] == [2, 2, 64]
assert h['layers.0.attention_conv.kernel_projection.weight']['shape'] == [16, 64]   # 2 k G, G = 64 / 16
print('loss', loss[0], '->', loss[-1], 'recall', m['steps/candidate_recall'][-1], 'sel_acc', m['steps/selector_acc'][-1])
PYEOF

run_job resumed 3 200 --topology 1-2 "${D2[@]}" --log-every 1 --resume "$WORK/straight/checkpoints/step-0000000$((N / 2))"
expect_rc 0 resumed
expect_resumed_like_straight straight resumed $N

run_job alpha 3 120 --topology 1-2 "${D2[@]/0.5/0.25}" --resume "$WORK/straight/checkpoints/step-0000000$((N / 2))"
expect_rc 2 alpha
expect_log alpha "--selector-loss-alpha: saved '0.5', now '0.25'"

run_job cont 2 120 --topology 1-1 --drafter "$WORK/straight/drafter" --max-steps 2 --batch-order fixed --selector-loss-alpha 0.5
expect_rc 0 cont
run_job both 2 60 --topology 1-1 --drafter "$WORK/straight/drafter" --draft-arch dflash2 --max-steps 2
expect_rc 2 both
expect_log both "--draft-arch describes a fresh drafter"
echo "PASS"
