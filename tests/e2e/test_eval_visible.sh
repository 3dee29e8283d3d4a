#!/usr/bin/env bash
# Evaluation is visible (issue 48 item 10): a tiny CPU run with --eval-every records each drafter's seconds
# of evaluation in /ranks/eval_s (not in compute_s, the fwd+bwd), its status lines' ETA counts the
# evaluations still due ("ETA=... (eval ...)"), and dflash-report gives the drafters' eval share, the rate
# of training alone, and a verdict that explains why the prediction is above the observed rate.
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
split_eval_set "$tiny/data.h5" "$WORK/train.h5" "$WORK/eval.h5" 40

run_job ev 2 300 --topology 1-1 --data "$WORK/train.h5" --eval-data "$WORK/eval.h5" --eval-every 2 --log-every 2 \
  --max-steps 16
expect_rc 0 ev
M="$WORK/ev/metrics.h5"
# Every status line after the first evaluation predicts the ones still due; the last (step 16) has none left.
grep -E '^\[[0-9]+[smhd]\] step=(4|6|8|10|12|14) .* ETA=[0-9]+[smhd] \(eval [0-9]+[smhd]\)$' "$WORK/ev.log" >/dev/null ||
  { grep '^\[' "$WORK/ev.log" | tail -8 >&2; fail "ev: no status line says the evaluation part of its ETA"; }
# The time split: the drafter's evaluation seconds apart from its fwd+bwd, matching the /eval rows' seconds
# up to the last report (the final evaluation runs after it); targets evaluate nothing.
h5check "$M" "'ranks/eval_s' in f"
h5check "$M" "f['ranks/eval_s'][f['ranks/role'][:] == 0].sum() == 0"
h5check "$M" "f['ranks/eval_s'][f['ranks/role'][:] == 1].sum() > 0"
h5check "$M" "abs(f['ranks/eval_s'][f['ranks/role'][:] == 1].sum() - f['eval/seconds'][:-1].sum()) <= 0.05 + 0.05 * f['eval/seconds'][:].sum()"
busy=$(h5eval "$M" "round(float(f['ranks/busy_s'][f['ranks/role'][:] == 1].sum()), 3)")
evs=$(h5eval "$M" "round(float(f['ranks/eval_s'][f['ranks/role'][:] == 1].sum()), 3)")
note "ev: drafter busy ${busy}s, eval ${evs}s"

if $PY -c "import h5py, numpy, matplotlib" 2>/dev/null; then
  REPORT="$DFLASH_SRC/tools/dflash-report"
  "$REPORT" "$M" --json >"$WORK/ev.json" || fail "dflash-report --json on ev"
  "$REPORT" "$M" --png "$WORK/ev.png" >"$WORK/ev.txt" || fail "dflash-report on ev"
  $PY - "$WORK/ev.json" <<'PYEOF' || fail "ev: report checks"
import json, sys
rep = json.load(open(sys.argv[1]))
obs = rep["observed"]
assert obs["eval_frac"] is not None and 0 < obs["eval_frac"] < 1, obs["eval_frac"]
assert obs["batches_per_s_without_eval"] > obs["batches_per_s"], obs
assert abs(obs["batches_per_s_without_eval"] * (1 - obs["eval_frac"]) - obs["batches_per_s"]) < 1e-9
assert rep["prediction_vs_training_frac"] < rep["prediction_vs_observed_frac"]
assert rep["service"]["drafter"]["eval_frac"] > 0, rep["service"]["drafter"]
if obs["eval_frac"] >= 0.02:
    assert "evaluating --eval-data: the observed rate includes that time" in rep["verdict"], rep["verdict"]
print(f"ok eval share {100 * obs['eval_frac']:.1f}%, observed {obs['batches_per_s']:.3f} b/s, "
      f"training alone {obs['batches_per_s_without_eval']:.3f} b/s")
PYEOF
  grep -q "^  evaluation           the drafters spent [0-9.]*% of the window evaluating --eval-data: training alone" "$WORK/ev.txt" ||
    { cat "$WORK/ev.txt" >&2; fail "ev: the text report does not give the eval share"; }
  grep -q "predictions and ETAs are of training alone: evaluation took" "$WORK/ev.txt" || fail "ev: the what-if does not say it"
fi
echo "PASS"
