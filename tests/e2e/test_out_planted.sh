#!/usr/bin/env bash
# A shared --out that no one can turn against the job (issue 48 items 1 and 2; include/dflash/safe_dir.h,
# docs/checkpoint.md "The run directory"). As root (CI), where a write through a link lands anywhere:
#   1. before the start, a symbolic link at every fixed name under OUT, a hard link at every file the job
#      opens again, a FIFO at every file it opens: refused (exit 2) naming the name, within seconds (the
#      `timeout` of run_job turns a hang into exit 124), the file outside never written;
#   2. a FIFO as --data or --eval-data, also under --dry-run: refused naming it, no hang;
#   3. mid-run, OUT/drafter planted as a link before the export and OUT/checkpoints swapped for a link between
#      two checkpoints: the write is refused (exit 2) when it happens, nothing lands in the link's target;
#   4. a run directory given as a link is refused; a resume with metrics.h5 hard-linked elsewhere is refused.
#   5. dflash-report's exports with a link at OUT/csv or OUT/tensorboard: refused, nothing written or deleted
#      where the link points; two exports in a row keep the newest earlier event file.
source "$(dirname "$0")/lib.sh"
victim="$WORK/victim"
printf 'precious\n' >"$victim"
mkdir -p "$WORK/victim_dir"
check_victims() {
  [ "$(cat "$victim")" = precious ] || fail "$1: the file outside --out was written: $(head -c 64 "$victim" | od -c | head -2)"
  [ -z "$(ls -A "$WORK/victim_dir")" ] || fail "$1: something was written into the directory outside --out: $(ls -A "$WORK/victim_dir")"
}
refused() {  # refused NAME "text" [RC]: exit RC (2 by default; not a hang: 124), the log says text, the victims untouched
  expect_rc "${3:-2}" "$1"
  expect_log "$1" "$2"
  check_victims "$1"
}

# ---- 1. planted before the start ---------------------------------------------------------------------------
REPORT=(--report-to csv,tensorboard)  # the report's names are the job's too when --report-to names them
i=0
for name in train.log metrics.h5 report-to.log .dflash-complete .dflash.lock drafter drafter-best checkpoints \
  csv tensorboard wandb; do
  i=$((i + 1))
  mkdir -p "$WORK/link$i"
  case $name in
    drafter* | checkpoints | csv | tensorboard | wandb) ln -s "$WORK/victim_dir" "$WORK/link$i/$name" ;;
    *) ln -s "$victim" "$WORK/link$i/$name" ;;
  esac
  extra=()
  [ "$name" != wandb ] || extra=(--report-to csv)  # (wandb itself needs the package: its name is checked all the same)
  run_job "link$i" 2 60 --topology 1-1 --max-steps 2 "${REPORT[@]}" "${extra[@]}"
  refused "link$i" "symbolic link"
  expect_log "link$i" "$WORK/link$i/$name"
done

for name in train.log metrics.h5 report-to.log .dflash-complete .dflash.lock; do
  i=$((i + 1))
  mkdir -p "$WORK/hard$i"
  ln "$victim" "$WORK/hard$i/$name"
  run_job "hard$i" 2 60 --topology 1-1 --max-steps 2 "${REPORT[@]}"
  refused "hard$i" "more than one hard link"
  expect_log "hard$i" "$WORK/hard$i/$name"
done

for name in train.log metrics.h5 report-to.log .dflash.lock; do
  i=$((i + 1))
  mkdir -p "$WORK/fifo$i"
  mkfifo "$WORK/fifo$i/$name"
  run_job "fifo$i" 2 60 --topology 1-1 --max-steps 2 "${REPORT[@]}"
  refused "fifo$i" "not a regular file"
  expect_log "fifo$i" "$WORK/fifo$i/$name"
  [ "$SECS" -lt 30 ] || fail "fifo$i: the refusal of a FIFO at $name took ${SECS}s"
done

# The run directory itself given as a link (its own name is not followed: O_NOFOLLOW).
ln -s "$WORK/victim_dir" "$WORK/outlink"
run_job outlink 2 60 --topology 1-1 --max-steps 2
refused outlink "is a symbolic link: refused (the run directory is held by its own name)"

# ---- 2. a FIFO as a dataset ---------------------------------------------------------------------------------
mkfifo "$WORK/data.fifo"
run_job fifo_data 2 60 --topology 1-1 --max-steps 2 --data "$WORK/data.fifo"
refused fifo_data "--data $WORK/data.fifo is not a regular file" 3  # bad input
run_job fifo_eval 2 60 --topology 1-1 --max-steps 2 --eval-data "$WORK/data.fifo"
refused fifo_eval "--eval-data $WORK/data.fifo is not a regular file" 3
tiny=$(tiny_dir)
for opt in --data --eval-data; do
  name=dry_fifo${opt//-/_}
  args=(--target "$tiny/target" --draft-layers 1 --token-budget 512 --topology 1-1 --ranks 2)
  [ "$opt" = --data ] || args+=(--data "$tiny/data.h5")
  args+=("$opt" "$WORK/data.fifo")
  dry "$name" "${args[@]}"
  refused "$name" "$opt $WORK/data.fifo is not a regular file" 3
done

# ---- 3. planted mid-run -------------------------------------------------------------------------------------
steps_in() { grep -c '^\[[0-9.smhd]*\] step=' "$1" 2>/dev/null || true; }
wait_steps() {  # wait_steps NAME K: until NAME's log shows K steps (fails after 60 s)
  local t0=$SECONDS
  until [ "$(steps_in "$WORK/$1.log")" -ge "$2" ] 2>/dev/null; do
    [ $((SECONDS - t0)) -lt 60 ] || { tail -20 "$WORK/$1.log" >&2; fail "$1: no step $2 after 60 s"; }
    sleep 0.2
  done
}
# A slowed drafter (--inject-delay-drafter-ms) leaves seconds between the plant and the write.
(run_job mid_drafter 2 600 --topology 1-1 --max-steps 16 --log-every 1 --inject-delay-drafter-ms 150 &&
  echo "$RC" >"$WORK/mid_drafter.rc") &
wait_steps mid_drafter 2
[ ! -e "$WORK/mid_drafter/drafter" ] || fail "mid_drafter: OUT/drafter exists before the export"
ln -s "$WORK/victim_dir" "$WORK/mid_drafter/drafter"
wait
RC=$(cat "$WORK/mid_drafter.rc")
refused mid_drafter "is a symbolic link"

(run_job mid_ckpt 2 600 --topology 1-1 --max-steps 16 --log-every 1 --checkpoint-every 4 --inject-delay-drafter-ms 150 &&
  echo "$RC" >"$WORK/mid_ckpt.rc") &
t0=$SECONDS
until ls "$WORK"/mid_ckpt/checkpoints/step-*/manifest.json >/dev/null 2>&1; do
  [ $((SECONDS - t0)) -lt 60 ] || fail "mid_ckpt: no checkpoint after 60 s"
  sleep 0.1
done
mv "$WORK/mid_ckpt/checkpoints" "$WORK/mid_ckpt/checkpoints.real"
ln -s "$WORK/victim_dir" "$WORK/mid_ckpt/checkpoints"
wait
RC=$(cat "$WORK/mid_ckpt.rc")
refused mid_ckpt "is a symbolic link"

# ---- 4. a resume whose metrics.h5 was hard-linked to a file elsewhere -------------------------------------------
run_job resume 2 300 --topology 1-1 --max-steps 4 --checkpoint-every 2
expect_rc 0 resume
ln "$WORK/resume/metrics.h5" "$WORK/metrics-elsewhere.h5"
cp "$WORK/metrics-elsewhere.h5" "$WORK/metrics-before.h5"
run_job resume 2 300 --topology 1-1 --max-steps 6 --checkpoint-every 2 --resume auto
expect_rc 2 resume
expect_log resume "metrics.h5 has more than one hard link"
cmp -s "$WORK/metrics-elsewhere.h5" "$WORK/metrics-before.h5" || fail "resume: metrics.h5 was written through its hard link"

# ---- 5. dflash-report's exports (tools/dflash_report/safe_out.py) ---------------------------------------------
if "$PY" -c "import h5py, numpy" 2>/dev/null; then
  rep() { set +e; "$PY" "$DFLASH_SRC/tools/dflash-report" "$WORK/resume/metrics.h5" "$@" >"$WORK/rep.log" 2>&1; RC=$?; set -e; }
  mkdir -p "$WORK/victim_tb"
  touch "$WORK/victim_tb/events.out.tfevents.0000000001.host.1.dflash-report" "$WORK/victim_tb/keep"
  for name in csv tensorboard; do
    rm -rf "${WORK:?}/resume/$name"
    ln -s "$WORK/victim_tb" "$WORK/resume/$name"
    rep "--$name" "$WORK/resume/$name"
    [ "$RC" -ne 0 ] || fail "dflash-report --$name through a link at OUT/$name: exit 0"
    grep -q "symbolic link" "$WORK/rep.log" || { cat "$WORK/rep.log" >&2; fail "report $name: no refusal naming the link"; }
    [ "$(ls "$WORK/victim_tb" | wc -l)" = 2 ] || fail "report $name: files changed where the link points: $(ls "$WORK/victim_tb")"
    rm "$WORK/resume/$name"
  done
  rep --tensorboard "$WORK/resume/tensorboard" --tensorboard-writer builtin
  [ "$RC" -eq 0 ] || { cat "$WORK/rep.log" >&2; fail "report: the export into a fresh tensorboard/ failed"; }
  sleep 1
  rep --tensorboard "$WORK/resume/tensorboard" --tensorboard-writer builtin
  [ "$RC" -eq 0 ] || { cat "$WORK/rep.log" >&2; fail "report: the second export failed"; }
  [ "$(ls "$WORK/resume/tensorboard" | grep -c tfevents)" = 2 ] || fail "report: not the newest earlier event file and the new one: $(ls -a "$WORK/resume/tensorboard")"
  rep --csv "$WORK/resume/csv"
  [ "$RC" -eq 0 ] && [ -s "$WORK/resume/csv/steps.csv" ] || { cat "$WORK/rep.log" >&2; fail "report: csv export"; }
  if ls -a "$WORK/resume" | grep -q '^\.\(csv\|tensorboard\)\.'; then fail "report: a staging directory was left: $(ls -a "$WORK/resume")"; fi
else
  note "no h5py for $PY: dflash-report's exports not tried"
fi
echo "PASS"
