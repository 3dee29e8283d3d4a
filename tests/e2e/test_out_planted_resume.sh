#!/usr/bin/env bash
# A resume reads only the run directory's own files (issue 48 item 1; src/checkpoint/checkpoint_io.cpp,
# include/dflash/safe_file.h, docs/checkpoint.md "The run directory"). As root (CI), with a link, a FIFO, a
# directory or a hard link planted under OUT/checkpoints or at OUT/next-topology before `--resume auto`:
#   - a step directory that is a link is skipped, named, never read (the resume takes the previous one);
#   - a link, FIFO or directory at a checkpoint's manifest.json or state.safetensors is damage (exit 3),
#     named, within seconds (no hang on the FIFO);
#   - OUT/checkpoints as a link is refused (exit 2) naming it;
#   - a hard-linked state.safetensors (a `cp -al` snapshot) resumes, the other link's file untouched;
#   - OUT/next-topology as a link, hard link or FIFO is refused (exit 2) without printing what it holds.
# Every case checks that the copy outside --out is byte for byte what it was.
source "$(dirname "$0")/lib.sh"
victim="$WORK/victim"
printf 'precious\n' >"$victim"
outside="$WORK/outside"  # a copy of the checkpoints, outside every --out
sum_outside() { (cd "$outside" && find . -type f -print0 | sort -z | xargs -0 sha256sum) }

run_job base 2 300 --topology 1-1 --max-steps 4 --checkpoint-every 2
expect_rc 0 base
step2=checkpoints/step-00000002 step4=checkpoints/step-00000004
[ -f "$WORK/base/$step4/manifest.json" ] || fail "base: no step-4 checkpoint"
cp -a "$WORK/base/checkpoints" "$outside"
before=$(sum_outside)

# case NAME: a fresh copy of the base run as $WORK/NAME (a resume's own --out).
case_dir() { rm -rf "${WORK:?}/$1"; cp -a "$WORK/base" "$WORK/$1"; rm -f "$WORK/$1/.dflash-complete"; }
resume() {  # resume NAME [args]: --resume auto to step 6
  local name=$1
  shift
  run_job "$name" 2 120 --topology 1-1 --max-steps 6 --checkpoint-every 2 --resume auto "$@"
}
untouched() {  # untouched NAME: the outside copy and the victim file are as they were
  [ "$(sum_outside)" = "$before" ] || fail "$1: the checkpoint copy outside --out changed"
  [ "$(cat "$victim")" = precious ] || fail "$1: the file outside --out was written"
}
refused() {  # refused NAME RC "text" FILE: exit RC (not 124: a hang), the log says text and names FILE
  expect_rc "$2" "$1"
  expect_log "$1" "$3"
  expect_log "$1" "$4"
  [ "$SECS" -lt 60 ] || fail "$1: the refusal took ${SECS}s"
  untouched "$1"
}

# ---- a step directory that is a link: skipped, named; the resume takes step 2 -------------------------------
case_dir steplink
rm -rf "${WORK:?}/steplink/$step4"
ln -s "$outside/step-00000004" "$WORK/steplink/$step4"
resume steplink
expect_rc 0 steplink
expect_log steplink "skipping $WORK/steplink/$step4: it is a symbolic link"
expect_log steplink "resuming from $WORK/steplink/$step2"
[ -L "$WORK/steplink/$step4.incomplete" ] || fail "steplink: the link at step 4 was not set aside as a link: $(ls -la "$WORK/steplink/checkpoints")"
untouched steplink

# ---- a link, FIFO or directory at a checkpoint's files: damage (exit 3), named ---------------------------------
for file in manifest.json state.safetensors; do
  for kind in link fifo dir; do
    name=${kind}_${file%%.*}
    case_dir "$name"
    rm -f "$WORK/$name/$step4/$file"
    case $kind in
      link) ln -s "$outside/step-00000004/$file" "$WORK/$name/$step4/$file"; text="symbolic link" ;;
      fifo) mkfifo "$WORK/$name/$step4/$file"; text="not a regular file" ;;
      dir) mkdir "$WORK/$name/$step4/$file"; text="not a regular file" ;;
    esac
    resume "$name"
    refused "$name" 3 "$text" "$WORK/$name/$step4/$file"
  done
done

# ---- OUT/checkpoints itself a link: refused, named --------------------------------------------------------------
case_dir ckptlink
rm -rf "${WORK:?}/ckptlink/checkpoints"
ln -s "$outside" "$WORK/ckptlink/checkpoints"
resume ckptlink
refused ckptlink 2 "symbolic link" "$WORK/ckptlink/checkpoints"

# ---- a hard-linked state file (cp -al): read, never written through -------------------------------------------
case_dir hardstate
rm -f "$WORK/hardstate/$step4/state.safetensors"
ln "$outside/step-00000004/state.safetensors" "$WORK/hardstate/$step4/state.safetensors"
resume hardstate --keep-checkpoints 1
expect_rc 0 hardstate
expect_log hardstate "resuming from $WORK/hardstate/$step4"
[ ! -e "$WORK/hardstate/$step4" ] || fail "hardstate: step 4 was not pruned (--keep-checkpoints 1)"
untouched hardstate

# ---- OUT/next-topology: a link, a hard link, a FIFO: refused, its text never shown -----------------------------
for kind in link hard fifo; do
  name=nt_$kind
  case_dir "$name"
  case $kind in
    link) ln -s "$victim" "$WORK/$name/next-topology"; text="symbolic link" ;;
    hard) ln "$victim" "$WORK/$name/next-topology"; text="more than one hard link" ;;
    fifo) mkfifo "$WORK/$name/next-topology"; text="not a regular file" ;;
  esac
  resume "$name"
  refused "$name" 2 "$text" "$WORK/$name/next-topology"
  if grep -q precious "$WORK/$name.log"; then fail "$name: the log shows the text of the file the link names"; fi
done
echo "PASS"
