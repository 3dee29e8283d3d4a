#!/usr/bin/env bash
# --eval-tau-every on the GPU (tests/e2e/test_train_eval_tau.sh is the CPU twin): each drafter rank loads the
# CUDA target beside its CUDA trainer and decodes its share of the prompts with the bf16 drafter it trains.
# 1-2 with deterministic kernels: /eval/tau in the rows at 10, 20, 30; OUT/drafter-best holds the best; the
# tau written for the last step matches dflash-eval --backend cuda on the exported (bf16) drafter with the
# same prompts and limits (the same bf16 weights and kernels: equal up to a rare flipped near-tie, so within
# 0.05). That 30 steps raise tau is not asserted here: on the H200 (2026-12-02) the last row was not above 1.05
# (test_gpu_eval_tau.sh checks learning, after 320 steps). DFLASH_TEST_PLANE picks the plane (default auto).
source "$(dirname "$0")/gpu_lib.sh"
EVAL="$DFLASH_BIN/dflash-eval"
tiny=$(tiny_dir)
split_eval_set "$tiny/data.h5" "$WORK/train.h5" "$WORK/eval.h5" 40
P=8 NEW=32
run_job tau 3 600 --backend cuda --topology 1-2 --data "$WORK/train.h5" --eval-data "$WORK/eval.h5" \
  --data-plane "${DFLASH_TEST_PLANE:-auto}" --eval-every 10 --eval-tau-every 10 --eval-tau-prompts $P \
  --eval-tau-max-new-tokens $NEW --lr 0.02 --warmup-steps 5 --epochs 0 --max-steps 30 --log-every 10 \
  --batch-order fixed --deterministic on
expect_rc 0 tau
expect_log tau "best drafter so far (by eval tau)"
grep -qE '^\[eval\] step=30 .* tau=[0-9.]+ \(' "$WORK/tau.log" || fail "no [eval] line with tau for step 30"
M="$WORK/tau/metrics.h5"
h5check "$M" "list(f['eval/step'][:]) == [10, 20, 30] and all(np.isfinite(f['eval/tau'][:]))"
note "tau per evaluation: $(h5eval "$M" "list(zip(f['eval/step'][:], np.round(f['eval/tau'][:], 4), f['eval/tau_prompts'][:]))")"
h5check "$M" "all(f['eval/tau_prompts'][:] == $P) and all(f['eval/tau'][:] >= 1)"
limits=$(sed -n 's/.*(dflash-eval \(--max-prompts [0-9]* --max-prompt-length [0-9]* --max-new-tokens [0-9]*\) measures the same).*/\1/p' "$WORK/tau.log")
[ -n "$limits" ] || fail "the eval tau line names no dflash-eval limits"
for d in drafter drafter-best; do
  timeout -k 5 300 "$EVAL" --backend cuda --target "$tiny/target" --prompts "$WORK/eval.h5" $limits \
    --drafter "$WORK/tau/$d" --json "$WORK/$d.json" >"$WORK/$d.log" 2>&1 || { tail -20 "$WORK/$d.log"; fail "dflash-eval $d"; }
done
"$PY" - "$M" "$WORK/drafter.json" "$WORK/drafter-best.json" "$WORK/tau/drafter-best/best.json" <<'PYEOF' || fail "GPU tau in training vs dflash-eval"
import json, sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'r')
final, best, record = (json.load(open(p)) for p in sys.argv[2:5])
tau = f['eval/tau'][:]
print(f"# GPU tau: training {list(np.round(tau, 4))}; dflash-eval final {final['tau']:.4f}, best {best['tau']:.4f} ({record})")
assert abs(final['tau'] - tau[-1]) <= 0.05, (final['tau'], tau[-1])
assert abs(best['tau'] - record['tau']) <= 0.05 and abs(record['tau'] - np.nanmax(tau)) < 1e-12, (best['tau'], record)
PYEOF
echo "PASS"
