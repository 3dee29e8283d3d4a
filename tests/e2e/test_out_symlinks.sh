#!/usr/bin/env bash
# Links planted in a shared --out never redirect the job's writes (include/dflash/safe_file.h): a linked lock
# file or metrics.h5 is refused (exit 2) with the victim untouched; a linked metrics reserve is replaced, not
# written through; new files take the umask's mode; dflash-prep refuses to overwrite its own input. As root
# (CI) this is the case that matters: the job may write anywhere.
source "$(dirname "$0")/lib.sh"
victim="$WORK/victim"
printf 'precious\n' >"$victim"
check_victim() { [ "$(cat "$victim")" = precious ] || fail "$1: the file outside --out was written: $(head -c 64 "$victim" | od -c | head -2)"; }

mkdir -p "$WORK/lock"
ln -s "$victim" "$WORK/lock/.dflash.lock"
run_job lock 2 60 --topology 1-1 --max-steps 2
expect_rc 2 lock
expect_log lock "it is a symbolic link"
check_victim lock

mkdir -p "$WORK/metrics"
ln -s "$victim" "$WORK/metrics/metrics.h5"
run_job metrics 2 60 --topology 1-1 --max-steps 2
expect_rc 2 metrics
expect_log metrics "metrics.h5 is a symbolic link: refused"
check_victim metrics

mkdir -p "$WORK/drafter_link"
ln -s "$WORK" "$WORK/drafter_link/drafter"
run_job drafter_link 2 60 --topology 1-1 --max-steps 2
expect_rc 2 drafter_link
expect_log drafter_link "drafter is a symbolic link: refused"
[ ! -e "$WORK/model.safetensors" ] || fail "the export went through the link"

mkdir -p "$WORK/reserve/drafter" "$WORK/reserve/.drafter-best.tmp"
ln -s "$victim" "$WORK/reserve/.metrics.h5.reserve"
# Leftovers of an export killed half-way: removed at start (the job holds the lock); other names stay.
echo partial >"$WORK/reserve/drafter/model.safetensors.tmp.Ab3xQ9"
echo mine >"$WORK/reserve/drafter/notes.tmp.keep"
(umask 027 && run_job reserve 2 120 --topology 1-1 --max-steps 2 && echo "$RC" >"$WORK/reserve.rc")
RC=$(cat "$WORK/reserve.rc")
expect_rc 0 reserve
check_victim reserve
[ ! -L "$WORK/reserve/.metrics.h5.reserve" ] || fail "the planted reserve link is still there"
[ ! -e "$WORK/reserve/drafter/model.safetensors.tmp.Ab3xQ9" ] || fail "a stale export temp file is still there"
[ ! -e "$WORK/reserve/.drafter-best.tmp" ] || fail "a stale best-drafter staging directory is still there"
[ -e "$WORK/reserve/drafter.1/notes.tmp.keep" ] ||
  fail "a file not of mkstemp's pattern was removed (it goes aside with the earlier OUT/drafter, as drafter.1)"
expect_log reserve "removed 2 stale temp file(s) of an interrupted write"
for f in drafter/model.safetensors drafter/config.json metrics.h5; do
  mode=$(stat -c %a "$WORK/reserve/$f")
  [ "$mode" = 640 ] || fail "$f has mode $mode under umask 027 (want 640)"
done

printf '{"input_ids": [1, 2, 3, 4]}\n' >"$WORK/in.jsonl"
cp "$WORK/in.jsonl" "$WORK/in.orig"
set +e
"$DFLASH_BIN/dflash-prep" "$WORK/in.jsonl" "$WORK/in.jsonl" --vocab-size 10 >"$WORK/prep.log" 2>&1
RC=$?
set -e
expect_rc 2 prep
expect_log prep "it would overwrite its own input"
cmp -s "$WORK/in.jsonl" "$WORK/in.orig" || fail "dflash-prep changed its input"
echo "PASS"
