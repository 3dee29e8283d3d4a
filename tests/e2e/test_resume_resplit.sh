#!/usr/bin/env bash
# Resume on another split (issue 30, docs/checkpoint.md "Changing the split"): a 2-1 run stopped at a
# checkpoint (--inject-stop-step: exit 75) continues as 1-2 with --resume auto, the other way round, and
# 2-1 on 3 ranks continues as 2-2 on 4.
# Every record of every epoch is trained exactly once across the two splits -- the same set as a straight
# run's -- (the --inject-trace-dir records of what the drafters' applied steps trained), the loss goes on
# from the trained state (no jump back towards a fresh drafter's), the lr schedule is re-planned and
# printed, metrics.h5 holds every step once and two /segments rows (start, resplit), and the
# earlier split's /queues moved to /segments/0/. A model change on the resume is still refused.
source "$(dirname "$0")/lib.sh"
COMMON=(--batch-order fixed --seed 5 --epochs 3 --log-every 1 --lr 3e-3)
DATA="$(tiny_dir)/data.h5"

# Per epoch, the records the applied steps trained: all once, as the straight run (tests/e2e/check_trace.py).
trace_check() { "$PY" "$DFLASH_SRC/tests/e2e/check_trace.py" "$1" "$DATA" --straight "$2" --segments 2; }

# check_lineage NAME STRAIGHT STOP: metrics continuous, loss continuing from the trained state.
check_lineage() {
  "$PY" - "$WORK/$1/metrics.h5" "$WORK/$2/metrics.h5" "$3" <<'PY'
import sys, h5py, numpy as np
run, straight, stop = sys.argv[1], sys.argv[2], int(sys.argv[3])
with h5py.File(run, "r") as f, h5py.File(straight, "r") as g:
    steps = f["steps/step"][:]
    if list(steps) != list(range(1, len(steps) + 1)):
        sys.exit(f"FAIL: {run}: /steps/step is not 1..N once each: {list(steps)[:60]}")
    kinds = list(f["segments/kind"][:]); first = list(f["segments/first_step"][:])
    if kinds != [0, 2] or first != [0, stop]:
        sys.exit(f"FAIL: {run}: /segments kind {kinds} first_step {first}, expected [0, 2] [0, {stop}]")
    if "segments/0/queues/q_pre" not in f:
        sys.exit(f"FAIL: {run}: the first split's /queues did not move to /segments/0/queues")
    seg = f["ranks/segment"][:]
    if set(seg.tolist()) != {0, 1}:
        sys.exit(f"FAIL: {run}: /ranks/segment holds {sorted(set(seg.tolist()))}, expected 0 and 1")
    loss, ref = f["steps/loss"][:], g["steps/loss"][:]
    fresh = ref[:3].mean()                   # a drafter that lost its state starts near here
    before = loss[stop - 3:stop].mean()      # the last steps before the change
    after = loss[stop:stop + 3].mean()       # the first steps after it
    print(f"# loss: fresh {fresh:.3f}, before the change {before:.3f}, after {after:.3f} (straight there {ref[stop:stop+3].mean():.3f})")
    if not after < before + 0.25 * (fresh - before):
        sys.exit(f"FAIL: {run}: the loss jumped at the change of split ({before:.3f} -> {after:.3f}; fresh {fresh:.3f})")
PY
}

mkdir -p "$WORK/trace_straight" "$WORK/trace_a" "$WORK/trace_b" "$WORK/trace_c"
run_job straight 3 300 --topology 2-1 "${COMMON[@]}" --inject-trace-dir "$WORK/trace_straight"
expect_rc 0 straight

# A: 2-1 for 25 steps (inside epoch 0), then 1-2 to the end.
run_job a 3 300 --topology 2-1 "${COMMON[@]}" --inject-trace-dir "$WORK/trace_a" --inject-stop-step 25
expect_rc 75 a
expect_log a "test hook --inject-stop-step 25: checkpointed at step 25"
cp "$WORK/a.log" "$WORK/a1.log"
run_job a 3 300 --topology 1-2 "${COMMON[@]}" --inject-trace-dir "$WORK/trace_a" --resume auto
expect_rc 0 a
expect_log a "resuming on another split: the checkpoint's 2-1 on 3 rank(s) (2 target(s), 1 drafter(s)) -> 1-2 on 3 rank(s) (1 target(s), 2 drafter(s)) at step 25; data re-partitioned from 2 to 1 target(s): epoch 0 goes on with its"
expect_log a "lr schedule: peak 0.003, warmup"
expect_log a "re-planned for the new split: 25 step(s) done + "
trace_check "$WORK/trace_a" "$WORK/trace_straight"
check_lineage a straight 25

# B: 1-2 for 30 steps (into epoch 1: the two drafters take two batches a step), then 2-1 to the end.
run_job b 3 300 --topology 1-2 "${COMMON[@]}" --inject-trace-dir "$WORK/trace_b" --inject-stop-step 30
expect_rc 75 b
run_job b 3 300 --topology 2-1 "${COMMON[@]}" --inject-trace-dir "$WORK/trace_b" --resume auto
expect_rc 0 b
expect_log b "data re-partitioned from 1 to 2 target(s): epoch 1 goes on with its"
trace_check "$WORK/trace_b" "$WORK/trace_straight"
check_lineage b straight 30

# C: another world size with the same targets: 2-1 on 3 ranks for 20 steps, then 2-2 on 4 ranks (the data
# positions go on as saved, the second drafter starts from the same weights and optimizer state).
run_job c 3 300 --topology 2-1 "${COMMON[@]}" --epochs 1 --inject-trace-dir "$WORK/trace_c" --inject-stop-step 20
expect_rc 75 c
run_job c 4 300 --topology 2-2 "${COMMON[@]}" --epochs 1 --inject-trace-dir "$WORK/trace_c" --resume auto
expect_rc 0 c
expect_log c "resuming on another split: the checkpoint's 2-1 on 3 rank(s) (2 target(s), 1 drafter(s)) -> 2-2 on 4 rank(s) (2 target(s), 2 drafter(s)) at step 20"
"$PY" "$DFLASH_SRC/tests/e2e/check_trace.py" "$WORK/trace_c" "$DATA" --segments 2 || fail "records across 2-1 -> 2-2"

# Still refused on a change of split: the model, the objective, the data.
run_job b 3 60 --topology 1-2 "${COMMON[@]}" --resume auto --loss kl
expect_rc 2 b
expect_log b "--loss: saved 'ce', now 'kl'"
echo "PASS"
