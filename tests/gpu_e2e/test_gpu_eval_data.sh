#!/usr/bin/env bash
# --eval-data on the GPU (tests/e2e/test_eval_data.sh is the CPU twin): the targets' CUDA forwards of the
# eval set travel as bf16 batches on the job's plane at startup, each drafter keeps its share in host
# memory (DrafterEval::keep, a D2H copy_tensor) and uploads it into a device buffer before each evaluate
# (DrafterEval::evaluate). With weights frozen (--lr 1e-30) and deterministic kernels, 1-1 and 1-2 give
# the same /eval numbers (the sum over drafters), and both track the CPU backend's within bf16 tolerance;
# a real run's held-out loss falls. DFLASH_TEST_PLANE picks the plane (default auto: nccl with a GPU per
# rank on the two-GPU machine, else host).
source "$(dirname "$0")/gpu_lib.sh"
tiny=$(tiny_dir)
split_eval_set "$tiny/data.h5" "$WORK/train.h5" "$WORK/eval.h5" 40  # the last 40 records evaluate
DATA=(--data "$WORK/train.h5" --eval-data "$WORK/eval.h5")
PLANE=(--data-plane "${DFLASH_TEST_PLANE:-auto}")
FROZEN=(--lr 1e-30 --max-steps 4 --eval-every 2 --log-every 2 --deterministic on)
run_job cpu11 2 300 --backend cpu --topology 1-1 "${DATA[@]}" "${FROZEN[@]}"
expect_rc 0 cpu11
for t in 1-1:2 1-2:3; do
  run_job "gpu${t%%:*}" "${t##*:}" 300 --backend cuda --topology "${t%%:*}" "${DATA[@]}" "${PLANE[@]}" "${FROZEN[@]}"
  expect_rc 0 "gpu${t%%:*}"
  grep -q '^\[eval\] step=4 ' "$WORK/gpu${t%%:*}.log" || fail "gpu${t%%:*}: no [eval] line for step 4"
done
"$PY" - "$WORK/cpu11/metrics.h5" "$WORK/gpu1-1/metrics.h5" "$WORK/gpu1-2/metrics.h5" <<'PYEOF' || fail "the GPU /eval rows disagree"
import sys, h5py, numpy as np
c, g1, g2 = (h5py.File(p, 'r')['eval'] for p in sys.argv[1:4])
for e in (c, g1, g2):
    assert list(e['step'][:]) == [2, 4], e['step'][:]
for k in ('tokens', 'anchors', 'seqs'):
    assert np.array_equal(c[k][:], g1[k][:]) and np.array_equal(g1[k][:], g2[k][:]), k
# one drafter or two: the same sums (deterministic kernels; only the order of the sum over drafters differs)
for k in ('loss', 'acc', 'streak', 'acc_by_pos'):
    assert np.allclose(g1[k][:], g2[k][:], rtol=1e-9, atol=0, equal_nan=True), (k, g1[k][:], g2[k][:])
rel = abs(g1['loss'][-1] - c['loss'][-1]) / c['loss'][-1]
print('eval loss cpu %.5f gpu %.5f (rel %.4f); acc cpu %.4f gpu %.4f' % (c['loss'][-1], g1['loss'][-1], rel, c['acc'][-1], g1['acc'][-1]))
assert rel <= 0.02, rel
PYEOF
run_job learn 3 300 --backend cuda --topology 1-2 "${DATA[@]}" "${PLANE[@]}" --eval-every 5 --log-every 5 --lr 0.02 --warmup-steps 2
expect_rc 0 learn
h5check "$WORK/learn/metrics.h5" "len(f['eval/step']) >= 2 and f['eval/loss'][-1] < f['eval/loss'][0]"
echo "PASS"
