#!/usr/bin/env bash
# A final export that fails does not lose the trained drafter: the end of training writes a checkpoint
# first, the fatal message's HINT says where it is, the job ends with the export's own code (8), and
# `--resume auto` from it exports the same drafter a run without the failure exported, training nothing
# again. The export is made to fail by a full disk: a 16 KiB tmpfs mounted on OUT/drafter (root only; that case
# is skipped otherwise, with a note). A regular file where OUT/drafter/ goes is refused at startup instead.
source "$(dirname "$0")/lib.sh"
ARGS=(--topology 1-1 --max-steps 4)

run_job straight 2 90 "${ARGS[@]}"
expect_rc 0 straight
ls "$WORK"/straight/checkpoints/step-00000004/manifest.json >/dev/null || fail "straight: no final checkpoint"
[ ! -e "$WORK/straight/.metrics.h5.reserve" ] || fail "straight: metrics.h5's reserve is left behind"

# A regular file where OUT/drafter/ goes is refused at startup, before any training (the run directory's
# check, docs/checkpoint.md "The run directory"): nothing to lose yet.
mkdir -p "$WORK/blocked" && echo "in the way" >"$WORK/blocked/drafter"
run_job blocked 2 90 "${ARGS[@]}"
expect_rc 2 blocked
expect_log blocked "--out's entry $WORK/blocked/drafter is not a directory"
if grep -qE '^\[[0-9.smhd]*\] step=' "$WORK/blocked.log"; then fail "blocked: trained before refusing"; fi
[ ! -e "$WORK/blocked/checkpoints" ] || fail "blocked: wrote checkpoints before refusing"
rm "$WORK/blocked/drafter"
run_job blocked 2 90 "${ARGS[@]}"
expect_rc 0 blocked
cmp "$WORK/straight/drafter/model.safetensors" "$WORK/blocked/drafter/model.safetensors" ||
  fail "blocked: the drafter differs from the straight run's"

mkdir -p "$WORK/full/drafter"
if mount -t tmpfs -o size=16k tmpfs "$WORK/full/drafter" 2>/dev/null; then
  trap 'umount "$WORK/full/drafter" 2>/dev/null || true; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
  run_job full 2 90 "${ARGS[@]}"
  expect_rc 8 full
  expect_log full "No space left on device"
  expect_log full "HINT: the trained drafter is safe in the checkpoint $WORK/full/checkpoints/step-00000004"
  umount "$WORK/full/drafter"
  run_job full 2 90 "${ARGS[@]}" --resume auto
  expect_rc 0 full
  cmp "$WORK/straight/drafter/model.safetensors" "$WORK/full/drafter/model.safetensors" ||
    fail "full: the drafter exported from the final checkpoint differs from the straight run's"
else
  note "the disk-full case is skipped: cannot mount a tmpfs (needs root)"
fi
echo "PASS"
