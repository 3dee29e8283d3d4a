#!/usr/bin/env bash
# --eval-data: the held-out set's features are computed once at startup (the targets forward it, each
# drafter keeps its share), and every --eval-every steps and after the last the drafters evaluate their
# shares on fixed anchors and sum the counts: an /eval row in metrics.h5 and an [eval] line.
#  - 1-2 and 2-1 (one target feeding two drafters, two targets sharing the forwards): rows at the expected
#    steps, the eval loss lower at the end than at the first evaluation;
#  - with a learning rate too small to move the weights, 1-1, 1-2, 2-1 (also --batch-order fixed) and 2-3
#    (one slot per drafter) give the same /eval numbers: the shares and their sum over the drafters are
#    those of one drafter evaluating everything;
#  - a resume drops the rows after its checkpoint and evaluates on the same schedule (the straight run's
#    numbers again);
#  - a bad eval file is refused (exit 3, naming it) before --out is touched; --dry-run shows the set.
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
# A held-out split of the tiny dataset: the last 40 records evaluate, the others train.
split_eval_set "$tiny/data.h5" "$WORK/train.h5" "$WORK/eval.h5" 40
DATA=(--data "$WORK/train.h5" --eval-data "$WORK/eval.h5")

# ---- 1-2: every 5 steps and after the last -----------------------------------------------------------
run_job ev12 3 300 --topology 1-2 "${DATA[@]}" --eval-every 5 --log-every 5
expect_rc 0 ev12
expect_log ev12 "[dflash] eval: $WORK/eval.h5: 40 records"
expect_log ev12 "every 5 step(s) and after the last"
grep -qE '^\[eval\] step=5 loss=[0-9.]+ acc=[0-9.]+ streak=[0-9.]+ \(40 seqs, [0-9.]+K? tok, [0-9.]+ s\)$' "$WORK/ev12.log" ||
  fail "ev12: no [eval] status line for step 5"
M=$(h5eval "$WORK/ev12/metrics.h5" "int(f['steps/step'][-1])")
note "ev12: $M steps; eval loss $(h5eval "$WORK/ev12/metrics.h5" "list(np.round(f['eval/loss'][:], 4))")"
h5check "$WORK/ev12/metrics.h5" "list(f['eval/step'][:]) == list(range(5, $M, 5)) + [$M]"
h5check "$WORK/ev12/metrics.h5" "f['eval/loss'][-1] < f['eval/loss'][0]"
h5check "$WORK/ev12/metrics.h5" "f['eval/acc_by_pos'].shape == (len(f['eval/step']), 15) and all(f['eval/seqs'][:] == 40)"
h5check "$WORK/ev12/metrics.h5" "len(set(f['eval/anchors'][:])) == 1 and len(set(f['eval/tokens'][:])) == 1"  # a fixed set
if $PY -c "import h5py, numpy, matplotlib" 2>/dev/null; then  # dflash-report: the last row, and the curve
  "$DFLASH_SRC/tools/dflash-report" "$WORK/ev12/metrics.h5" --png "$WORK/ev12.png" >"$WORK/ev12.txt" || fail "dflash-report on ev12"
  grep -q "^held-out eval (40 seqs, [0-9]* evaluations): step $M loss " "$WORK/ev12.txt" || fail "dflash-report: no held-out eval line"
fi

# ---- 2-1: two targets share the forwards; the default interval is a tenth of the planned steps -------
run_job ev21 3 300 --topology 2-1 "${DATA[@]}" --log-every 10
expect_rc 0 ev21
E=$(sed -n 's/^\[dflash\] eval: .*every \([0-9]*\) step(s) and after the last$/\1/p' "$WORK/ev21.log")
P=$(sed -n 's/.*cosine to [0-9.e-]* at step \([0-9]*\) (.*/\1/p' "$WORK/ev21.log")
[ -n "$E" ] && [ -n "$P" ] || fail "ev21: no eval interval or planned steps in the log"
[ "$E" -eq $(((P + 5) / 10)) ] || fail "ev21: eval every $E steps, expected a tenth of the $P planned"
M=$(h5eval "$WORK/ev21/metrics.h5" "int(f['steps/step'][-1])")
h5check "$WORK/ev21/metrics.h5" "list(f['eval/step'][:]) == list(range($E, $M, $E)) + [$M]"
h5check "$WORK/ev21/metrics.h5" "f['eval/loss'][-1] < f['eval/loss'][0]"

# ---- the split and the sum: the same numbers from one drafter or two, one target or two --------------
FROZEN=(--lr 1e-30 --max-steps 4 --eval-every 2 --log-every 2)
run_job same11 2 200 --topology 1-1 "${DATA[@]}" "${FROZEN[@]}"
expect_rc 0 same11
# (2-3 with one slot per drafter: the eval credits must be granted in batch order or the targets, each
# feeding all three drafters, could wait on each other; 2-1 fixed: the eval phase before a fixed order)
for t in 1-2:3: 2-1:3: 2-3:5:--hs-queue-depth=1 2-1:3:--batch-order=fixed; do
  IFS=: read -r topo np extra <<<"$t"
  name="same$topo${extra:+f}"
  run_job "$name" "$np" 200 --topology "$topo" "${DATA[@]}" "${FROZEN[@]}" ${extra:+"$extra"}
  expect_rc 0 "$name"
  "$PY" - "$WORK/same11/metrics.h5" "$WORK/$name/metrics.h5" <<'PYEOF' || fail "/eval of $name differs from 1-1's"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], 'r')['eval'], h5py.File(sys.argv[2], 'r')['eval']
assert list(a['step'][:]) == list(b['step'][:]) == [2, 4], (a['step'][:], b['step'][:])
for k in ('tokens', 'anchors', 'seqs'):
    assert np.array_equal(a[k][:], b[k][:]), (k, a[k][:], b[k][:])
for k in ('loss', 'acc', 'streak', 'acc_by_pos'):
    assert np.allclose(a[k][:], b[k][:], rtol=1e-12, atol=0, equal_nan=True), (k, a[k][:], b[k][:])
print('eval rows identical: loss', b['loss'][:])
PYEOF
done

# ---- resume: rows after the checkpoint are dropped, the schedule goes on (--checkpoint-every's) -----
RES=(--topology 1-1 "${DATA[@]}" --max-steps 8 --checkpoint-every 4)
run_job straight 2 200 "${RES[@]}"
expect_rc 0 straight
h5check "$WORK/straight/metrics.h5" "list(f['eval/step'][:]) == [4, 8]"
cp -r "$WORK/straight" "$WORK/resumed"
run_job resumed 2 200 "${RES[@]}" --resume "$WORK/resumed/checkpoints/step-00000004"
expect_rc 0 resumed
"$PY" - "$WORK/straight/metrics.h5" "$WORK/resumed/metrics.h5" <<'PYEOF' || fail "the resumed run's /eval differs from the straight run's"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], 'r')['eval'], h5py.File(sys.argv[2], 'r')['eval']
assert list(b['step'][:]) == [4, 8], b['step'][:]
assert np.array_equal(a['loss'][:], b['loss'][:]), (a['loss'][:], b['loss'][:])
PYEOF

# ---- refusals, before --out is touched; the dry run -------------------------------------------------
echo "not an HDF5 file" >"$WORK/bad.h5"
run_job bad 3 60 --topology 1-2 "${DATA[@]}" --eval-data "$WORK/bad.h5"
expect_rc 3 bad
expect_log bad "$WORK/bad.h5"
[ ! -e "$WORK/bad" ] || fail "bad: the refused start created --out"
run_job nodata 2 60 --topology 1-1 --eval-every 5
expect_rc 2 nodata
expect_log nodata "--eval-every without --eval-data"
run_job dry 3 60 --topology 1-2 "${DATA[@]}" --dry-run
expect_rc 0 dry
expect_log dry "[dflash] eval: $WORK/eval.h5: 40 records"
expect_log dry "batch(es) per drafter"
echo "PASS"
