#!/usr/bin/env bash
# A DFlash2 drafter through the GPU job (docs/dflash2.md): 1-1 on the tiny target, --backend cuda, block 8,
# the selector objective with a softcap. With --batch-order fixed it trains on exactly the CPU run's batches:
# its loss (unary + alpha * selector) tracks the CPU one within bf16 tolerance (per step <= 6 % relative,
# mean <= 2 %) and falls; candidate recall and selector accuracy are finite; the export is a DFlash2 release
# directory, and dflash-eval decodes it on CUDA with the target's own greedy tokens.
source "$(dirname "$0")/gpu_lib.sh"
common=(--topology 1-1 --batch-order fixed --max-steps 30 --log-every 10 --seed 5 --lr 0.01 --warmup-steps 3
        --draft-arch dflash2 --block-size 8 --selector-top-k 8 --selector-rank 16 --selector-loss-alpha 0.5
        --logit-softcap 30)
run_job cpu 2 300 "${common[@]}" --backend cpu
expect_rc 0 cpu
run_job gpu 2 300 "${common[@]}" --backend cuda
expect_rc 0 gpu
"$PY" - "$WORK/cpu/metrics.h5" "$WORK/gpu/metrics.h5" "$WORK/gpu/drafter/config.json" <<'PYEOF' || fail "the GPU DFlash2 run does not track the CPU run"
import sys, json, h5py, numpy as np
c, g = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
lc, lg = c['steps/loss'][:], g['steps/loss'][:]
assert len(lc) == len(lg) == 30, (len(lc), len(lg))
assert np.array_equal(c['steps/tokens'][:], g['steps/tokens'][:]), 'the runs trained on different batches'
rel = np.abs(lg - lc) / np.abs(lc)
print('loss cpu %.4f -> %.4f, gpu %.4f -> %.4f; rel diff max %.4f mean %.4f' % (lc[0], lc[-5:].mean(), lg[0], lg[-5:].mean(), rel.max(), rel.mean()))
assert rel.max() <= 0.06 and rel.mean() <= 0.02, rel
assert lg[-5:].mean() < lg[:5].mean() - 0.05, 'GPU loss did not fall'
for k in ('loss_sel', 'candidate_recall', 'selector_acc'):
    v = g['steps/' + k][:]
    assert np.all(np.isfinite(v)), (k, v)
    print(k, 'cpu', c['steps/' + k][-1], 'gpu', v[-1])
assert json.load(open(sys.argv[3]))['architectures'] == ['DFlash2DraftModel']
PYEOF
# The bf16 optimizer state (--optimizer-state bf16: the conv base kernels and codebooks read through fp32
# copies refreshed after every update): the CUDA run tracks the CPU run of the same mode within the same bounds.
run_job cpu_bf16 2 300 "${common[@]}" --backend cpu --optimizer-state bf16
expect_rc 0 cpu_bf16
run_job gpu_bf16 2 300 "${common[@]}" --backend cuda --optimizer-state bf16
expect_rc 0 gpu_bf16
"$PY" - "$WORK/cpu_bf16/metrics.h5" "$WORK/gpu_bf16/metrics.h5" <<'PYEOF' || fail "the GPU DFlash2 run with the bf16 state does not track the CPU run"
import sys, h5py, numpy as np
c, g = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
lc, lg = c['steps/loss'][:], g['steps/loss'][:]
assert len(lc) == len(lg) == 30, (len(lc), len(lg))
rel = np.abs(lg - lc) / np.abs(lc)
print('bf16 state: loss cpu %.4f -> %.4f, gpu %.4f -> %.4f; rel diff max %.4f mean %.4f' % (lc[0], lc[-5:].mean(), lg[0], lg[-5:].mean(), rel.max(), rel.mean()))
assert rel.max() <= 0.06 and rel.mean() <= 0.02, rel
assert lg[-5:].mean() < lg[:5].mean() - 0.05, 'GPU loss did not fall'
PYEOF
grep -q "optimizer state: bf16" "$WORK/gpu_bf16.log" || fail "the bf16 run does not say its optimizer state"
"$DFLASH_BIN/dflash-eval" --target "$(tiny_dir)/target" --drafter "$WORK/gpu/drafter" --prompts "$(tiny_dir)/data.h5" \
  --max-prompts 4 --max-new-tokens 24 --backend cuda --check-greedy >"$WORK/eval.log" 2>&1 ||
  { tail -20 "$WORK/eval.log"; fail "dflash-eval on the DFlash2 export (CUDA)"; }
grep "tau" "$WORK/eval.log" | head -2
# Sampled decoding on CUDA (the official rejection sampling): the DFlash2 export (the selector's sampled walk)
# and an untrained DFlash drafter (its logits through the target's lm_head) run to the end.
for d in "--drafter $WORK/gpu/drafter" "--fresh-drafter"; do
  "$DFLASH_BIN/dflash-eval" --target "$(tiny_dir)/target" $d --prompts "$(tiny_dir)/data.h5" --max-prompts 4 \
    --max-new-tokens 24 --backend cuda --temperature 0.8 --top-k 20 --seed 5 >"$WORK/eval_t.log" 2>&1 ||
    { tail -20 "$WORK/eval_t.log"; fail "dflash-eval --temperature 0.8 ($d, CUDA)"; }
  grep -q "# sampling temperature 0.8" "$WORK/eval_t.log" || fail "the sampled run does not say so"
  grep "^tau" "$WORK/eval_t.log"
done
echo "PASS"
