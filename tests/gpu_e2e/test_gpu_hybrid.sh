#!/usr/bin/env bash
# The Qwen3.5/3.6 hybrid target on the GPU: the tiny hybrid of dflash-make-tiny --hybrid, a 1-1 job with
# --backend cuda and --batch-order fixed trains on the same batches as the CPU backend's run, so its loss
# curve must track the CPU one within bf16 tolerance (per step <= 8% relative, mean <= 3%) and fall.
source "$(dirname "$0")/gpu_lib.sh"
tiny="$WORK/hybrid"
"$DFLASH_BIN/dflash-make-tiny" "$tiny" --hybrid >"$WORK/make.log" 2>&1 || { cat "$WORK/make.log"; fail "dflash-make-tiny --hybrid"; }
common=(--topology 1-1 --target "$tiny/target" --data "$tiny/data.h5" --batch-order fixed --max-steps 30 --log-every 10
        --seed 5 --lr 0.02 --warmup-steps 5 --hs-queue-depth 2 --draft-layers 2)
run_job cpu 2 300 "${common[@]}" --backend cpu
expect_rc 0 cpu
run_job gpu 2 300 "${common[@]}" --backend cuda
expect_rc 0 gpu
"$PY" - "$WORK/cpu/metrics.h5" "$WORK/gpu/metrics.h5" <<'PYEOF' || fail "the GPU hybrid run's losses do not track the CPU run's"
import sys, h5py, numpy as np
c, g = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
lc, lg = c['steps/loss'][:], g['steps/loss'][:]
assert len(lc) == len(lg) == 30, (len(lc), len(lg))
assert np.array_equal(c['steps/tokens'][:], g['steps/tokens'][:]), 'the runs trained on different batches'
rel = np.abs(lg - lc) / np.abs(lc)
print('hybrid loss cpu first/last %.4f/%.4f gpu %.4f/%.4f; rel diff max %.4f mean %.4f' % (lc[0], lc[-10:].mean(), lg[0], lg[-10:].mean(), rel.max(), rel.mean()))
assert rel.max() <= 0.08 and rel.mean() <= 0.03, rel
assert lg[-10:].mean() < lg[:10].mean() - 0.05, 'GPU loss did not fall'
PYEOF
echo "PASS"
