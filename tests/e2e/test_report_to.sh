#!/usr/bin/env bash
# --report-to (issue 31; src/runtime/report_sidecar.h): a CPU job with --report-to tensorboard,csv exports its
# series while it runs (every --report-every minutes: a slowed drafter makes the run outlast two periods) and
# once at its end: OUT/tensorboard holds an event file whose loss is the run's /steps/loss at every step (read
# back with the tests' own event reader, tests/report/test_export.py), OUT/csv/steps.csv one row per step with
# the same losses; with the wandb package, a W&B offline run under OUT/wandb. A bad --report-to word is
# refused (exit 2).
source "$(dirname "$0")/lib.sh"
targets=tensorboard,csv
wandb_py=$("$PY" -c 'import wandb' 2>/dev/null && echo yes || true)
[ -n "$wandb_py" ] && targets=$targets,wandb
run_job live 3 300 --topology 2-1 --seed 3 --log-every 2 --max-steps 40 --inject-delay-drafter-ms 150 \
  --report-to "$targets" --report-every 0.05
expect_rc 0 live
expect_log live "[dflash] --report-to: exported to $WORK/live"
[ -f "$WORK/live/report-to.log" ] || fail "no report-to.log"
n_exports=$(grep -c "^tensorboard: " "$WORK/live/report-to.log" || true)
[ "$n_exports" -ge 2 ] || { cat "$WORK/live/report-to.log" >&2; fail "$n_exports export(s) in report-to.log, expected periodic ones and the last"; }
"$PY" - "$WORK/live" "$DFLASH_SRC" "$wandb_py" <<'PY' || fail "the exported series do not read back as the run's"
import csv, glob, os, sys
import h5py, numpy as np
run, src, wandb_py = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path[:0] = [os.path.join(src, "tools"), os.path.join(src, "tests", "report")]
from test_export import read_events, event_file
with h5py.File(os.path.join(run, "metrics.h5"), "r") as f:
    steps, loss = f["steps/step"][:], f["steps/loss"][:]
ev = read_events(event_file(os.path.join(run, "tensorboard")))
got = {s: v for s, v, _ in ev["scalars"]["train/loss"]} if "train/loss" in ev["scalars"] else None
if got is None:
    sys.exit(f"no train/loss in the event file: {sorted(ev['scalars'])[:10]}")
assert sorted(got) == list(steps), (sorted(got)[:5], list(steps)[:5])
assert np.allclose([got[s] for s in steps], loss.astype(np.float32), rtol=1e-6), "tensorboard loss differs"
rows = list(csv.DictReader(open(os.path.join(run, "csv", "steps.csv"))))
assert [int(r["step"]) for r in rows] == list(steps)
assert np.array_equal([float(r["loss"]) for r in rows], loss), "csv loss differs"
print(f"# tensorboard and csv: {len(steps)} steps read back, losses equal")
if wandb_py:
    runs = glob.glob(os.path.join(run, "wandb", "offline-run-*"))
    assert runs, "no W&B offline run under OUT/wandb"
    print(f"# wandb: {runs[0]}")
PY
# An export that fails is never reported as exported (issue 48 item 11): a stand-in dflash-report exits 4.
printf '#!/bin/sh\necho "dflash-report: error: --wandb: the W&B export of x failed" >&2\nexit 4\n' >"$WORK/failing-report"
chmod +x "$WORK/failing-report"
DFLASH_REPORT="$WORK/failing-report" run_job failing 3 120 --topology 2-1 --max-steps 4 --report-to csv
expect_rc 0 failing
expect_log failing "[dflash] --report-to: the last export failed (exit 4): nothing new was exported to $WORK/failing"
grep -q -- "--report-to: exported to" "$WORK/failing.log" && fail "failing: a failed export was reported as exported"
run_job bad 3 60 --topology 2-1 --max-steps 4 --report-to tensorbord
expect_rc 2 bad
expect_log bad "bad value 'tensorbord' in --report-to"
echo "PASS"
