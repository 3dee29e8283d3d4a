#!/usr/bin/env bash
# A full disk does not leave an unreadable metrics.h5 and a HINT about permissions: the writer keeps a
# reserve of allocated space next to the file (OUT/.metrics.h5.reserve, about 0.8 MiB), flushes into its
# room when the disk is low, and stops with exit 8 naming the cause (errno: "No space left on device",
# "the disk is full: N KiB free on the filesystem of OUT") once it cannot allocate the reserve again; the
# file on disk is whole. A disk without room for the reserve at all is refused at startup. Before, the first periodic flush on a full disk left a file h5py could not open
# ("addr overflow") and said "check that the path is writable". --out on a small tmpfs (root; skipped,
# exit 77, otherwise), checkpoints elsewhere so the startup space check passes.
source "$(dirname "$0")/lib.sh"
SMALL="$WORK/small"
mkdir -p "$SMALL"
mount -t tmpfs -o size=232k tmpfs "$SMALL" 2>/dev/null || { echo "SKIPPED: cannot mount a tmpfs (needs root)"; exit 77; }
# A job that ended by MPI_Abort can leave a rank process holding a file there for a moment after mpirun
# returns ("target is busy"): retry, then detach it lazily (it goes when the last user does).
release_small() {
  for _ in $(seq 20); do umount "$SMALL" 2>/dev/null && return 0; sleep 0.5; done
  umount -l "$SMALL" 2>/dev/null || true
}
trap 'release_small; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK" 2>/dev/null || true' EXIT
ARGS=(--topology 1-1 --max-steps 20 --metrics-flush-every 3 --log-every 1 --checkpoint-dir "$WORK/ckpt")

# 232 KiB: room for the final export but not for the metrics file's reserve: refused at startup, before any
# model loads, naming the reserve (the startup check counts it: issue 48), not a full disk found mid-run.
run_job tiny 2 90 "${ARGS[@]}" --out "$SMALL/run"
expect_rc 8 tiny
expect_log tiny "not enough free space on --out $SMALL/run: "
expect_log tiny "the metrics reserve (--metrics-flush-every 3)"
if grep -q "check that the path is writable" "$WORK/tiny.log"; then fail "tiny: a permissions hint for a full disk"; fi
[ ! -e "$SMALL/run/metrics.h5" ] || fail "tiny: refused at startup, yet metrics.h5 was written"

# 1050 KiB: the export, the file and its reserve fit (the startup check); the first flushes with rows use up
# the room, the reserve cannot be allocated again: exit 8 with every row so far in a readable file, and no
# reserve left behind.
release_small
mount -t tmpfs -o size=1050k tmpfs "$SMALL"
run_job low 2 90 "${ARGS[@]}" --out "$SMALL/run"
expect_rc 8 low
expect_log low "cannot write $SMALL/run/metrics.h5 (flushing): No space left on device"
expect_log low "every row recorded so far is in the file, which is closed and readable"
expect_log low "HINT: the disk is full: "
h5check "$SMALL/run/metrics.h5" "len(f['steps/step']) >= 1 and list(f['steps/step'][:]) == list(range(1, len(f['steps/step']) + 1))"
h5check "$SMALL/run/metrics.h5" "np.all(np.isfinite(f['steps/loss'][:]))"
[ ! -e "$SMALL/run/.metrics.h5.reserve" ] || fail "low: the reserve is left behind"
echo "PASS"
