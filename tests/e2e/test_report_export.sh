#!/usr/bin/env bash
# dflash-report's exports to the user's own tools (docs/report.md "Experiment tracking"): TensorBoard event
# files, CSV, Weights & Biases offline; and several runs on the same axes (--png).
#  1. tests/report/test_export.py under the python that has the optional packages (the project venv:
#     tools/setup.sh --tests installs tensorboard, tensorboardX and wandb from requirements-tests.txt), else
#     under Debian's python3: the built-in event writer is tested either way, the library tests skip naming
#     what is missing;
#  2. a real CPU job (2-1, --eval-data) exported while it runs (metrics.h5 read while the job writes it) and
#     again when it is done: the second export supersedes the first, and every /steps and /eval value is in the
#     event file (read back by test_export.py's own parser, CRCs checked) and in the CSV; with wandb, the
#     finished run logged offline without network; it and a synthetic run overlaid in one PNG.
source "$(dirname "$0")/lib.sh"
VENV=${DFLASH_VENV:-${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.local/share/dflash-train/venv}
XPY=
for py in "$VENV/bin/python3" /usr/bin/python3 python3; do
  command -v "$py" >/dev/null 2>&1 || continue
  if "$py" -c "import h5py, numpy, matplotlib, tensorboard, tensorboardX, wandb" >/dev/null 2>&1; then XPY=$py; break; fi
done
if [ -z "$XPY" ]; then
  $PY -c "import h5py, numpy, matplotlib" 2>/dev/null || { echo "SKIPPED: needs python3-h5py python3-numpy python3-matplotlib (tools/setup.sh)"; exit 77; }
  XPY=$PY
  note "no python3 here has tensorboard, tensorboardX and wandb (tools/setup.sh --tests installs them into $VENV):" \
       "the built-in event writer and CSV are tested, the library and W&B tests skip"
fi
note "python: $XPY ($("$XPY" -c 'import importlib.util as u; print(", ".join(m for m in ("tensorboard", "tensorboardX", "wandb", "torch") if u.find_spec(m)) or "no optional packages")'))"
# by module name from its directory: unittest takes a file path only relative to the working directory
(cd "$DFLASH_SRC/tests/report" && "$XPY" -m unittest -v test_export) 2>&1 | tee "$WORK/unittest.log" | tail -40
grep -q "^OK" "$WORK/unittest.log" || fail "tests/report/test_export.py"

REPORT=("$XPY" "$DFLASH_SRC/tools/dflash-report")
tiny=$(tiny_dir)
split_eval_set "$tiny/data.h5" "$WORK/train.h5" "$WORK/eval.h5" 40
run_job live 3 300 --topology 2-1 --data "$WORK/train.h5" --eval-data "$WORK/eval.h5" --eval-every 5 \
  --epochs 0 --max-steps 30 --log-every 3 --metrics-flush-every 1 --inject-delay-drafter-ms 300 &
JOB=$!
M="$WORK/live/metrics.h5"
steps_now() { "$PY" -c "
import os, sys, h5py
os.environ['HDF5_USE_FILE_LOCKING'] = 'FALSE'
try:
    with h5py.File(sys.argv[1], 'r') as f:
        print(len(f['steps/step']) if 'eval' in f else 0)
except Exception:
    print(0)" "$M"; }
for _ in $(seq 1 600); do
  [ "$(steps_now)" -ge 8 ] && break
  kill -0 $JOB 2>/dev/null || break
  sleep 0.1
done
kill -0 $JOB 2>/dev/null || fail "the job ended before it could be exported while running"
"${REPORT[@]}" "$M" --tensorboard "$WORK/tb" --csv "$WORK/early.csv" > "$WORK/early.out" 2> "$WORK/early.err" ||
  { cat "$WORK/early.err"; fail "export while the job runs"; }
kill -0 $JOB 2>/dev/null || note "(the job ended while it was exported)"
cat "$WORK/early.out" "$WORK/early.err"
early_file=$(ls "$WORK"/tb/events.out.tfevents.*)
wait $JOB || true  # run_job ran in a subshell: its exit code stays there; the file says whether it trained
"$PY" -c "import h5py, sys; n = len(h5py.File(sys.argv[1], 'r')['steps/step']); assert n == 30, n" "$M" ||
  { tail -30 "$WORK/live.log"; fail "the job did not train its 30 steps"; }

WANDB=()
"$XPY" -c "import wandb" 2>/dev/null && WANDB=(--wandb --wandb-project e2e --wandb-dir "$WORK/wb")
NONET=()
unshare -n true 2>/dev/null && NONET=(unshare -n)
WANDB_MODE=offline WANDB_SILENT=true WANDB_BASE_URL=http://127.0.0.1:9 \
  "${NONET[@]}" "${REPORT[@]}" "$M" --tensorboard "$WORK/tb" --csv "$WORK/csv" "${WANDB[@]}" > "$WORK/final.out" 2>&1 ||
  { cat "$WORK/final.out"; fail "export of the finished run"; }
cat "$WORK/final.out"
grep -q "VERDICT" "$WORK/final.out" || fail "the finished run's report has no verdict"

"$XPY" - "$DFLASH_SRC" "$WORK" "$early_file" "${#WANDB[@]}" <<'PYEOF' || fail "exported values"
import csv, glob, os, sys
import h5py, numpy as np
src, work, early_file, wandb = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, os.path.join(src, "tests", "report"))
from test_export import read_events, read_wandb  # the independent readers
ok = True
def check(cond, msg):
    global ok
    print(("ok   " if cond else "FAIL ") + msg)
    ok = ok and bool(cond)
files = sorted(glob.glob(os.path.join(work, "tb", "events.out.tfevents.*")))
check(len(files) == 2 and files[0] == early_file, f"the second export follows the first, which stays for a TensorBoard "
      f"still reading it ({[os.path.basename(f) for f in files]})")
ev = read_events(files[-1])["scalars"]
f = h5py.File(os.path.join(work, "live", "metrics.h5"), "r")
steps = f["steps/step"][()]
for k in ("loss", "acc", "streak", "lr", "grad_norm"):
    pts = ev.get(f"train/{k}", [])
    check([p[0] for p in pts] == list(steps) and
          np.array_equal([p[1] for p in pts], f[f"steps/{k}"][()].astype(np.float32).astype(float)),
          f"train/{k}: all {len(steps)} steps, the file's values (float32)")
e = f["eval"]
check([p[0] for p in ev.get("eval/loss", [])] == list(e["step"][()]), f"eval/loss at steps {list(e['step'][()])}")
for k in ("throughput/trained_ktok_per_s", "throughput/trained_batches_per_s", "queues/q_hs_mean", "queues/q_pre_min"):
    check(len(ev.get(k, [])) > 0, f"{k}: {len(ev.get(k, []))} points")
check(not any(t.startswith("power/") for t in ev), "no power series on the CPU backend")
start = f.attrs["start_utc"]
check(abs(ev["train/loss"][0][2] - (np.datetime64(start.rstrip("Z")).astype("datetime64[ms]").astype(float) / 1000
                                    + f["steps/time_s"][0])) < 1e-3, "wall time = start_utc + time_s")
try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(os.path.join(work, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    check([e.step for e in acc.Scalars("train/loss")] == list(steps),
          "TensorBoard reads the directory as the second export alone (its START event drops the first's)")
except ImportError:
    print("skip TensorBoard's reader: no tensorboard in this python")
rows = list(csv.DictReader(open(os.path.join(work, "csv", "steps.csv"))))
check([int(r["step"]) for r in rows] == list(steps) and [float(r["loss"]) for r in rows] == list(f["steps/loss"][()]),
      "steps.csv: every step, the exact loss")
check(sorted(os.listdir(os.path.join(work, "csv"))) == ["eval.csv", "intervals.csv", "queues.csv", "steps.csv"],
      f"csv tables {sorted(os.listdir(os.path.join(work, 'csv')))}")
early_rows = list(csv.DictReader(open(os.path.join(work, "early.csv"))))
check(8 <= len(early_rows) <= len(steps) and [float(r["loss"]) for r in early_rows] ==
      list(f["steps/loss"][: len(early_rows)]), f"early.csv (during the run): {len(early_rows)} steps, as the file has them")
if wandb:
    runs = glob.glob(os.path.join(work, "wb", "wandb", "offline-run-*", "run-*.wandb"))
    check(len(runs) == 1, f"one offline W&B run ({runs})")
    hist, config = read_wandb(runs[0])
    check(config.get("topology") == "2-1" and config.get("backend") == "cpu", "W&B config: topology, backend")
    check([s for s in sorted(hist) if "train/loss" in hist[s]] == list(steps) and
          [hist[s]["train/loss"] for s in steps] == list(f["steps/loss"][()]), "W&B history: every step's loss, exact")
    check([s for s in sorted(hist) if "eval/loss" in hist[s]] == list(e["step"][()]), "W&B history: eval/loss")
else:
    print("skip W&B: no wandb in this python")
sys.exit(0 if ok else 1)
PYEOF

# The real run and a synthetic 2-1 CPU run (tests/report/scenario3) on the same axes.
"$DFLASH_BIN/dflash-synth-metrics" "$DFLASH_SRC/tests/report/scenario3_cpu_2-1.json" "$WORK/synth.h5" > /dev/null
"${REPORT[@]}" "$WORK/synth.h5" "$M" --png "$WORK/both.png" > "$WORK/both.out" 2>&1 || { cat "$WORK/both.out"; fail "overlay"; }
grep -q "^overlay: $WORK/both.png" "$WORK/both.out" || { cat "$WORK/both.out"; fail "no overlay line"; }
head -c 8 "$WORK/both.png" | od -An -c | grep -q "P   N   G" || fail "both.png is not a PNG"
echo "PASS"
