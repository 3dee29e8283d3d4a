#!/usr/bin/env bash
# The GPU job end to end: 1-1 on the default tiny target, both ranks on one GPU, --backend cuda (CUDA
# target forward -> host-staged bf16 batches under credits -> CUDA drafter step). With --batch-order
# fixed it trains on exactly the batches of the CPU backend's run, so its loss curve must track the CPU
# one within bf16 tolerance (per step <= 6% relative, mean <= 2%), and fall. metrics.h5 must hold real
# NVML readings of the GPU (power > 0 W) and the status line its power. The plane: DFLASH_TEST_PLANE
# (default host; cuda-mpi under a CUDA-aware MPI).
source "$(dirname "$0")/gpu_lib.sh"
common=(--topology 1-1 --batch-order fixed --max-steps 40 --log-every 10 --seed 5 --lr 0.02 --warmup-steps 5 --hs-queue-depth 2)
run_job cpu 2 300 "${common[@]}" --backend cpu
expect_rc 0 cpu
plane=${DFLASH_TEST_PLANE:-host}
run_job gpu 2 300 "${common[@]}" --backend cuda --data-plane "$plane"
expect_rc 0 gpu
expect_log gpu "backend cuda"
expect_log gpu "hidden states: $plane plane (--data-plane $plane), BF16 on the wire"
grep -q "pwr=" "$WORK/gpu.log" || { tail -20 "$WORK/gpu.log"; fail "gpu: the status line shows no power (pwr=)"; }
"$PY" - "$WORK/cpu/metrics.h5" "$WORK/gpu/metrics.h5" <<'PYEOF' || fail "the GPU run's losses do not track the CPU run's"
import sys, h5py, numpy as np
c, g = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
lc, lg = c['steps/loss'][:], g['steps/loss'][:]
assert len(lc) == len(lg) == 40, (len(lc), len(lg))
assert np.array_equal(c['steps/tokens'][:], g['steps/tokens'][:]), 'the runs trained on different batches'
rel = np.abs(lg - lc) / np.abs(lc)
print('loss cpu first/last %.4f/%.4f gpu %.4f/%.4f; rel diff max %.4f mean %.4f' % (lc[0], lc[-10:].mean(), lg[0], lg[-10:].mean(), rel.max(), rel.mean()))
assert rel.max() <= 0.06 and rel.mean() <= 0.02, rel
assert lg[-10:].mean() < lg[:10].mean() - 0.05, 'GPU loss did not fall'
p = g['gpus/power_w'][:]
assert p.size > 0 and np.all(p[np.isfinite(p)] > 0) and np.isfinite(p).any(), p
print('GPU power readings: %d samples, mean %.0f W' % (p.shape[0], np.nanmean(p)))
# both ranks' cards name the one GPU by its PCI bus id (dflash-report groups ranks by it)
import json
cards = json.loads(g.attrs['ranks'])
assert all(c.get('gpu_bus') for c in cards) and len({c['gpu_bus'] for c in cards}) == 1, cards
PYEOF
# dflash-report: the two ranks took turns on one GPU: the what-if is DISTORTED, the power total one board's
"$DFLASH_SRC/tools/dflash-report" "$WORK/gpu/metrics.h5" > "$WORK/report.txt" 2>&1 || { cat "$WORK/report.txt"; fail "dflash-report failed"; }
grep -q "DISTORTED: 2 busy ranks shared 1 GPU(s)" "$WORK/report.txt" || { cat "$WORK/report.txt"; fail "the report does not flag the shared GPU"; }
test -f "$WORK/gpu/drafter/model.safetensors" || fail "gpu: no exported drafter"
echo "PASS"
