#!/usr/bin/env bash
# Gradient accumulation on the GPU (--grad-accum; docs/pipeline.md "Gradient accumulation"): a 1-1 CUDA job
# of 12 optimizer steps x 2 micro-batches trains (finite losses, tokens of 2 batches per row, the accumulator
# and its fold on the device); its step-6 checkpoint resumed to step 12 reproduces the straight run bit for
# bit (--batch-order fixed turns the deterministic kernels on; checkpoints fall on step boundaries). Then
# 2 drafters x K=2 (host-MPI sums on one GPU, NCCL with a GPU each) and 1 drafter x K=4 train each step on
# the same 4 batches (fixed order deals them in turn; --max-anchors 512 >= the batch: no anchor draw): equal
# tokens, losses within 1e-2 (fp32 sums in another order, then bf16 weight copies).
source "$(dirname "$0")/gpu_lib.sh"
common=(--backend cuda --topology 1-1 --batch-order fixed --max-steps 12 --checkpoint-every 6 --seed 2 --lr 0.02 --grad-accum 2)
run_job straight 2 300 "${common[@]}" --log-every 3
expect_rc 0 straight
expect_log straight "[dflash] batch: 2 micro-batch(es) per optimizer step"
expect_log straight "(x2 mb)"
run_job resumed 2 300 "${common[@]}" --log-every 3 --resume "$WORK/straight/checkpoints/step-00000006"
expect_rc 0 resumed
expect_resumed_like_straight straight resumed 12
h5check "$WORK/straight/metrics.h5" "f.attrs['grad_accum'] == 2 and np.isfinite(f['steps/loss'][:]).all() and len(f['steps/step']) == 12"
acc=(--backend cuda --batch-order fixed --max-anchors 512 --max-steps 3 --seed 3 --lr 0.01 --log-every 1)
run_job d2k2 3 300 "${acc[@]}" --topology 1-2 --grad-accum 2
expect_rc 0 d2k2
run_job d1k4 2 300 "${acc[@]}" --topology 1-1 --grad-accum 4
expect_rc 0 d1k4
"$PY" - "$WORK/d2k2/metrics.h5" "$WORK/d1k4/metrics.h5" <<'PYEOF' || fail "2 drafters x K=2 and 1 drafter x K=4 trained different steps on the GPU"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
assert np.array_equal(a['steps/tokens'][:], b['steps/tokens'][:]), (a['steps/tokens'][:], b['steps/tokens'][:])
la, lb = a['steps/loss'][:], b['steps/loss'][:]
print('2x2 vs 1x4 on the GPU: losses', la, lb)
assert np.allclose(la, lb, rtol=1e-2), (la, lb)
PYEOF
echo "PASS"
