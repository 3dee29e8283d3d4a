#!/usr/bin/env bash
# --eval-tau-every: during training the drafter ranks measure tau by dflash-eval's own speculative decoding
# (each with its own copy of the target) and keep the best drafter so far in OUT/drafter-best.
#  - 1-2 (the prompts split over two drafters), tau every 10 steps, the loss every 5: /eval has a row per
#    evaluation, tau in the rows at 10, 20, 30 (NaN in the others), tau= on their [eval] lines;
#  - the strong check: the tau written for the last step equals dflash-eval's tau on the same prompts and
#    limits with the exported final drafter, and OUT/drafter-best (which dflash-eval loads) has the tau
#    best.json records, the best of /eval/tau;
#  - a resume (--batch-order fixed: the straight run's numbers) remembers the best from its checkpoint:
#    the same /eval rows and the same OUT/drafter-best as the straight run;
#  - without --eval-tau-every the best is by eval loss, and a better one replaces the last (the swap);
#  - refusals: --eval-tau-every without --eval-data (exit 2); the dry run counts the target on the drafters.
source "$(dirname "$0")/lib.sh"
EVAL="$DFLASH_BIN/dflash-eval"
tiny=$(tiny_dir)
split_eval_set "$tiny/data.h5" "$WORK/train.h5" "$WORK/eval.h5" 40
P=6 NEW=24
TAU=(--data "$WORK/train.h5" --eval-data "$WORK/eval.h5" --eval-every 5 --eval-tau-every 10 --eval-tau-prompts $P
     --eval-tau-max-new-tokens $NEW --export-dtype f32 --lr 0.02 --warmup-steps 5 --epochs 0 --max-steps 30 --log-every 10
     --batch-order fixed --checkpoint-every 10)

run_job tau 3 300 --topology 1-2 "${TAU[@]}"
expect_rc 0 tau
expect_log tau "[dflash] eval tau: $P prompt(s) of $WORK/eval.h5"
expect_log tau "best drafter so far (by eval tau)"
grep -qE '^\[eval\] step=10 loss=[0-9.]+ acc=[0-9.]+ streak=[0-9.]+ tau=[0-9.]+ \(' "$WORK/tau.log" || fail "no [eval] line with tau for step 10"
grep -qE '^\[eval\] step=5 loss=[0-9.]+ acc=[0-9.]+ streak=[0-9.]+ \(' "$WORK/tau.log" || fail "the step-5 [eval] line (no tau)"
M="$WORK/tau/metrics.h5"
note "tau per evaluation: $(h5eval "$M" "list(zip(f['eval/step'][:], np.round(f['eval/tau'][:], 4)))")"
h5check "$M" "list(f['eval/step'][:]) == [5, 10, 15, 20, 25, 30]"
h5check "$M" "list(np.isfinite(f['eval/tau'][:])) == [False, True, False, True, False, True]"
h5check "$M" "list(f['eval/tau_prompts'][:]) == [0, $P, 0, $P, 0, $P] and all(f['eval/tau'][1::2] >= 1)"
h5check "$M" "all(f['eval/tau_new_tokens'][1::2] == $P * $NEW) and all(f['eval/tau_seconds'][1::2] > 0)"
h5check "$M" "f['eval/tau'].attrs['units'] == 'tokens'"

# The strong check: dflash-eval on the same prompts and limits (the job's line says them) with the export.
limits=$(sed -n 's/.*(dflash-eval \(--max-prompts [0-9]* --max-prompt-length [0-9]* --max-new-tokens [0-9]*\) measures the same).*/\1/p' "$WORK/tau.log")
[ -n "$limits" ] || fail "the eval tau line names no dflash-eval limits"
ev() {  # ev NAME DRAFTER
  timeout -k 5 300 "$EVAL" --target "$tiny/target" --prompts "$WORK/eval.h5" $limits --drafter "$2" \
    --json "$WORK/$1.json" >"$WORK/$1.log" 2>&1 || { tail -20 "$WORK/$1.log"; fail "dflash-eval $1"; }
}
ev final "$WORK/tau/drafter"
ev best "$WORK/tau/drafter-best"
$PY - "$M" "$WORK/final.json" "$WORK/best.json" "$WORK/tau/drafter-best/best.json" <<'PYEOF' || fail "tau in training differs from dflash-eval's"
import json, sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'r')
final, best, record = (json.load(open(p)) for p in sys.argv[2:5])
tau, steps = f['eval/tau'][:], f['eval/step'][:]
print(f"# last step: training {tau[-1]:.6f}, dflash-eval {final['tau']:.6f}; best.json {record}, dflash-eval {best['tau']:.6f}")
assert len(final['prompts']) == f['eval/tau_prompts'][-1]
assert abs(final['tau'] - tau[-1]) < 1e-9, (final['tau'], tau[-1])
assert sum(len(p['tokens']) for p in final['prompts']) == f['eval/tau_new_tokens'][-1]
b = int(np.nanargmax(tau))
assert record['by'] == 'tau' and record['step'] == steps[b] and abs(record['tau'] - tau[b]) < 1e-12, (record, steps[b], tau[b])
assert abs(best['tau'] - record['tau']) < 1e-9, (best['tau'], record['tau'])
PYEOF
[ ! -e "$WORK/tau/.drafter-best.tmp" ] || fail "a temporary drafter-best directory was left behind"

# Resume from the step-20 checkpoint: its manifest records the best so far; the rows and the best after it
# are the straight run's.
CK="$WORK/resumed/checkpoints/step-00000020"
cp -r "$WORK/tau" "$WORK/resumed"
$PY - "$CK/manifest.json" "$M" <<'PYEOF' || fail "the checkpoint does not record the best so far"
import json, sys, h5py, numpy as np
best = json.load(open(sys.argv[1]))['schedule']['best']
f = h5py.File(sys.argv[2], 'r')
steps, tau = f['eval/step'][:], f['eval/tau'][:]
upto = np.where(steps <= 20, tau, np.nan)
assert best['step'] == steps[int(np.nanargmax(upto))] and best['by'] == 'tau', (best, upto)
if not np.nanmax(tau[steps > 20]) < best['tau']:
    print("# note: tau after step 20 beats the checkpoint's best: the resume below does not show that it remembers")
PYEOF
run_job resumed 3 300 --topology 1-2 "${TAU[@]}" --resume "$CK"
expect_rc 0 resumed
$PY - "$M" "$WORK/resumed/metrics.h5" "$WORK/tau/drafter-best/best.json" "$WORK/resumed/drafter-best/best.json" <<'PYEOF' || fail "the resumed run's tau or best differ"
import json, sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], 'r')['eval'], h5py.File(sys.argv[2], 'r')['eval']
assert list(b['step'][:]) == list(a['step'][:]), b['step'][:]
assert np.array_equal(a['tau'][:], b['tau'][:], equal_nan=True), (a['tau'][:], b['tau'][:])
assert json.load(open(sys.argv[3])) == json.load(open(sys.argv[4]))
PYEOF
cmp -s "$WORK/tau/drafter-best/model.safetensors" "$WORK/resumed/drafter-best/model.safetensors" ||
  fail "the resumed run's drafter-best differs from the straight run's"

# Without --eval-tau-every the best is by eval loss; each better one replaces the last (the rename swap).
run_job byloss 2 200 --topology 1-1 --data "$WORK/train.h5" --eval-data "$WORK/eval.h5" --eval-every 4 --max-steps 12 \
  --epochs 0 --lr 0.02 --warmup-steps 2 --export-dtype f32
expect_rc 0 byloss
n=$(grep -c "best drafter so far (by eval loss)" "$WORK/byloss.log" || true)
[ "$n" -ge 2 ] || fail "byloss: $n best drafters written, expected the first and at least one replacement"
$PY - "$WORK/byloss/metrics.h5" "$WORK/byloss/drafter-best/best.json" <<'PYEOF' || fail "byloss: drafter-best is not the lowest eval loss's"
import json, sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'r')
rec = json.load(open(sys.argv[2]))
b = int(np.argmin(f['eval/loss'][:]))
assert rec['by'] == 'loss' and rec['step'] == f['eval/step'][b] and rec['tau'] is None, rec
assert not np.isfinite(f['eval/tau'][:]).any()
PYEOF
[ -z "$(ls -A "$WORK/byloss" | grep -F .drafter-best)" ] || fail "byloss: a temporary drafter-best directory was left behind"

# Refusals and the plan.
run_job notau 2 60 --topology 1-1 --eval-tau-every 5
expect_rc 2 notau
expect_log notau "--eval-tau-every without --eval-data"
run_job dry 3 60 --topology 1-2 "${TAU[@]}" --dry-run
expect_rc 0 dry
expect_log dry "[dflash] eval tau: the first $P prompts, $NEW new tokens each, every 10 step(s)"
expect_log dry "the target's weights for --eval-tau-every"
echo "PASS"
