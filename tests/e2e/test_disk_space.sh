#!/usr/bin/env bash
# A disk too small for the final export (and one checkpoint) is refused at startup (exit 8) naming the
# free and needed space, instead of a run that trains and then loses its weights when the export fails;
# room for one checkpoint but not for all --keep-checkpoints is a warning. Needs root for a small tmpfs
# (skipped, exit 77, otherwise).
source "$(dirname "$0")/lib.sh"
SMALL="$WORK/small"
mkdir -p "$SMALL"
mount -t tmpfs -o size=300k tmpfs "$SMALL" 2>/dev/null || { echo "SKIPPED: cannot mount a tmpfs (needs root)"; exit 77; }
trap 'umount "$SMALL" 2>/dev/null; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT

run_job full 2 60 --topology 1-1 --max-steps 2 --out "$SMALL/run"
expect_rc 8 full
expect_log full "not enough free space on --out $SMALL/run"
expect_log full "the final drafter export needs"
[ ! -e "$SMALL/run/metrics.h5" ] || fail "the refused job wrote metrics"

# Room for the export and a checkpoint, not for metrics.h5's reserve (64 MiB with a flush every 100000
# steps): refused at startup too, naming the reserve, not after the models loaded.
umount "$SMALL"
mount -t tmpfs -o size=3m tmpfs "$SMALL"
run_job reserve 2 60 --topology 1-1 --max-steps 2 --out "$SMALL/run" --metrics-flush-every 100000
expect_rc 8 reserve
expect_log reserve "not enough free space on --out $SMALL/run"
expect_log reserve "the metrics reserve (--metrics-flush-every 100000) 64.0 MiB"
[ ! -e "$SMALL/run/metrics.h5" ] || fail "the refused job wrote metrics"
rm -rf "$SMALL/run"

# 3 MiB: room for the export and a checkpoint (0.8 MiB on the tiny drafter), not for the 4 that
# --keep-checkpoints 3 can hold at once: a warning, and the run completes.
umount "$SMALL"
mount -t tmpfs -o size=3m tmpfs "$SMALL"
run_job some 2 60 --topology 1-1 --max-steps 2 --out "$SMALL/run" --checkpoint-every 1
expect_rc 0 some
expect_log some "warning: 3.0 MiB free on the checkpoint filesystem"
expect_log some "drafter exported to $SMALL/run/drafter"
echo "PASS"
