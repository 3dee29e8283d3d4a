#!/usr/bin/env bash
# Files of the wrong type at the run directory's fixed names, before the start and swapped in mid-run (issue
# 48 items 1-2; docs/checkpoint.md "The run directory" has the table of names). As root (CI):
#   1. before the start: a directory where the job writes a file, a file or a FIFO where it makes a directory,
#      a FIFO at .dflash-complete, a link at the checkpoint directory's lock: refused (exit 2) naming the name,
#      within seconds; a link at .metrics.h5.reserve is replaced, never written through;
#   2. mid-run, between two checkpoints: a link and a FIFO at the next checkpoints' step directories, a hard
#      link swapped in at train.log, a link at metrics.h5 and .dflash-complete, a FIFO at report-to.log: the
#      run ends normally, nothing outside --out is written, the FIFO is named and never blocks; a link at
#      drafter-best after the first evaluation is swapped out by the next better drafter, never written into;
#   3. dflash-report's calibration.json at a link: refused; at a FIFO: replaced, no hang; a FIFO given as the
#      metrics file it reads: refused naming it, no hang.
# (tests/e2e/test_out_planted.sh: links, hard links and FIFOs at the files; test_out_planted_resume.sh: a
# resume's reads.)
source "$(dirname "$0")/lib.sh"
victim="$WORK/victim"
printf 'precious\n' >"$victim"
mkdir -p "$WORK/victim_dir"
check_victims() {
  [ "$(cat "$victim")" = precious ] || fail "$1: the file outside --out was written"
  [ -z "$(ls -A "$WORK/victim_dir")" ] || fail "$1: something was written into the directory outside --out: $(ls -A "$WORK/victim_dir")"
}
refused() {  # refused NAME "text" PATH: exit 2 (not 124: a hang), the log says text and names PATH, quickly
  expect_rc 2 "$1"
  expect_log "$1" "$2"
  expect_log "$1" "$3"
  [ "$SECS" -lt 60 ] || fail "$1: the refusal took ${SECS}s"
  check_victims "$1"
}
short() { run_job "$1" 2 60 --topology 1-1 --max-steps 2 --report-to csv; }

# ---- 1. planted before the start -------------------------------------------------------------------------
i=0
for name in train.log metrics.h5 report-to.log .dflash-complete .dflash.lock; do
  i=$((i + 1))
  mkdir -p "$WORK/dir$i/$name"
  short "dir$i"
  refused "dir$i" "is a directory" "$WORK/dir$i/$name"
done
for name in drafter drafter-best checkpoints csv tensorboard wandb; do
  i=$((i + 1))
  mkdir -p "$WORK/file$i"
  printf 'x\n' >"$WORK/file$i/$name"
  short "file$i"
  refused "file$i" "is not a directory" "$WORK/file$i/$name"
done
for name in drafter checkpoints; do
  i=$((i + 1))
  mkdir -p "$WORK/fifo$i"
  mkfifo "$WORK/fifo$i/$name"
  short "fifo$i"
  refused "fifo$i" "is not a directory" "$WORK/fifo$i/$name"
done
mkdir -p "$WORK/fifo_complete"
mkfifo "$WORK/fifo_complete/.dflash-complete"
short fifo_complete
refused fifo_complete "not a regular file" "$WORK/fifo_complete/.dflash-complete"
mkdir -p "$WORK/ckptlock/checkpoints"
ln -s "$victim" "$WORK/ckptlock/checkpoints/.dflash.lock"
short ckptlock
refused ckptlock "symbolic link" "$WORK/ckptlock/checkpoints/.dflash.lock"
# The metrics reserve is unlinked and made anew (O_EXCL): a link there is removed as a link.
mkdir -p "$WORK/reserve"
ln -s "$victim" "$WORK/reserve/.metrics.h5.reserve"
run_job reserve 2 60 --topology 1-1 --max-steps 2
expect_rc 0 reserve
check_victims reserve

# ---- 2. swapped in mid-run, between two checkpoints ------------------------------------------------------
mid="$WORK/mid"
(run_job mid 2 600 --topology 1-1 --max-steps 12 --log-every 1 --checkpoint-every 4 --inject-delay-drafter-ms 150 \
  --report-to csv && echo "$RC" >"$WORK/mid.rc") &
t0=$SECONDS
until [ -f "$mid/checkpoints/step-00000004/manifest.json" ]; do
  [ $((SECONDS - t0)) -lt 60 ] || fail "mid: no checkpoint after 60 s"
  sleep 0.1
done
[ ! -e "$mid/checkpoints/step-00000008" ] || fail "mid: step 8 was written before the plant (the run is too fast)"
ln -s "$WORK/victim_dir" "$mid/checkpoints/step-00000008"
mkfifo "$mid/checkpoints/step-00000012"
mv "$mid/train.log" "$mid/train.log.moved" && ln "$victim" "$mid/train.log"
mv "$mid/metrics.h5" "$mid/metrics.h5.moved" && ln -s "$victim" "$mid/metrics.h5"
ln -sfn "$victim" "$mid/.dflash-complete"
rm -f "$mid/report-to.log" && mkfifo "$mid/report-to.log"
wait
RC=$(cat "$WORK/mid.rc")
expect_rc 0 mid
[ "$SECS" -lt 120 ] || fail "mid: the run took ${SECS}s (blocked on a FIFO?)"
check_victims mid
expect_log mid "$mid/report-to.log: it is not a regular file"
expect_log mid "the last export was not started"
if grep -q -- "--report-to: exported to" "$WORK/mid.log"; then fail "mid: says exported although the export never started"; fi
for s in 8 12; do
  d=$(printf '%s/checkpoints/step-%08d' "$mid" "$s")
  [ -f "$d/manifest.json" ] && [ ! -L "$d" ] || fail "mid: no real checkpoint at $d: $(ls -la "$mid/checkpoints")"
  [ -L "$d.incomplete" ] || [ -p "$d.incomplete" ] || fail "mid: what was planted at $d was not set aside as it was"
done
[ -f "$mid/.dflash-complete" ] && [ ! -L "$mid/.dflash-complete" ] || fail "mid: .dflash-complete is not the job's own file"
grep -q "step=12" "$mid/train.log.moved" || fail "mid: the job's log did not go on in its own file"

# OUT/drafter-best swapped for a link after the first evaluation wrote it: the next better drafter swaps the
# link out (RENAME_EXCHANGE) and removes it as a link; nothing lands where it pointed.
if "$PY" -c "import h5py, numpy" 2>/dev/null; then
  tiny=$(tiny_dir)
  split_eval_set "$tiny/data.h5" "$WORK/train.h5" "$WORK/eval.h5" 16
  best="$WORK/mid_best"
  (run_job mid_best 2 600 --topology 1-1 --max-steps 12 --log-every 1 --data "$WORK/train.h5" --eval-data "$WORK/eval.h5" \
    --eval-every 2 --inject-delay-drafter-ms 150 && echo "$RC" >"$WORK/mid_best.rc") &
  t0=$SECONDS
  until [ -f "$best/drafter-best/best.json" ]; do
    [ $((SECONDS - t0)) -lt 60 ] || fail "mid_best: no drafter-best after 60 s"
    sleep 0.1
  done
  rm -rf "${best:?}/drafter-best" && ln -s "$WORK/victim_dir" "$best/drafter-best"
  planted_at=$(grep -c "best drafter so far" "$WORK/mid_best.log" || true)
  wait
  RC=$(cat "$WORK/mid_best.rc")
  expect_rc 0 mid_best
  check_victims mid_best
  if [ "$(grep -c "best drafter so far" "$WORK/mid_best.log")" -gt "$planted_at" ]; then
    [ -d "$best/drafter-best" ] && [ ! -L "$best/drafter-best" ] && [ -f "$best/drafter-best/best.json" ] ||
      fail "mid_best: a better drafter came, yet drafter-best is not the job's own directory"
  else
    note "mid_best: no better evaluation after the plant (the link was left alone)"
  fi
fi

# ---- 3. dflash-report's calibration.json (tools/dflash_report/forecast.py) ------------------------------
if "$PY" -c "import h5py, numpy" 2>/dev/null; then
  cal() {  # cal KIND: write_calibration at a planted KIND; prints the outcome
    PYTHONPATH="$DFLASH_SRC/tools" timeout 20 "$PY" -c "
import sys
from dflash_report import forecast
try:
    forecast.write_calibration(sys.argv[1], {'version': 1, 'gpus': []})
    print('written')
except OSError as e:
    print('refused:', e)
" "$1"
  }
  ln -s "$victim" "$WORK/cal_link.json"
  out=$(cal "$WORK/cal_link.json")
  case $out in refused:*symbolic\ link*) ;; *) fail "calibration.json at a link: $out" ;; esac
  check_victims cal_link
  mkfifo "$WORK/cal_fifo.json"
  out=$(cal "$WORK/cal_fifo.json") || fail "calibration.json at a FIFO: no answer in 20 s"
  [ "$out" = written ] && [ -f "$WORK/cal_fifo.json" ] && [ ! -p "$WORK/cal_fifo.json" ] ||
    fail "calibration.json at a FIFO: $out"
  # A FIFO at OUT/metrics.h5 (what the job's --report-to export reads): refused, no hang in HDF5's open.
  mkfifo "$WORK/fifo_metrics.h5"
  set +e
  out=$(timeout 20 "$PY" "$DFLASH_SRC/tools/dflash-report" "$WORK/fifo_metrics.h5" 2>&1)
  rc=$?
  set -e
  [ "$rc" -ne 124 ] || fail "dflash-report on a FIFO: hung"
  [ "$rc" -ne 0 ] && case $out in *"fifo_metrics.h5: not a regular file"*) true ;; *) false ;; esac ||
    fail "dflash-report on a FIFO: exit $rc, $out"
else
  note "no h5py for $PY: dflash-report's calibration.json not tried"
fi
echo "PASS"
