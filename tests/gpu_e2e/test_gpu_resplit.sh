#!/usr/bin/env bash
# Changing the split on the GPU (issue 30; docs/checkpoint.md "Changing the split", "Re-splitting live"),
# three ranks sharing the one GPU:
# 1. Resume on another split: 2-1 stopped at step 15 (--inject-stop-step: checkpoint, exit 75), resumed as
#    1-2 with --resume auto: every record of each epoch trained once (--inject-trace-dir), the loss goes on
#    from the trained state, /segments start + resplit.
# 2. Live: 2-1 with a slow drafter (--inject-delay-drafter-ms) and --rebalance auto re-splits to 1-2 at its
#    first checkpoint in the same mpirun (rank 1 turns from a target with its model on the GPU into a
#    drafter), ends with exit 0 and an export; every record once; /segments start + rebalance.
source "$(dirname "$0")/gpu_lib.sh"
DATA="$(tiny_dir)/data.h5"
common=(--backend cuda --batch-order fixed --seed 5 --epochs 2 --log-every 2 --lr 0.003)
mkdir -p "$WORK/trace_a" "$WORK/trace_b"

run_job a 3 300 --topology 2-1 "${common[@]}" --inject-trace-dir "$WORK/trace_a" --inject-stop-step 15
expect_rc 75 a
run_job a 3 300 --topology 1-2 "${common[@]}" --inject-trace-dir "$WORK/trace_a" --resume auto
expect_rc 0 a
expect_log a "resuming on another split: the checkpoint's 2-1 on 3 rank(s) (2 target(s), 1 drafter(s)) -> 1-2"
"$PY" "$DFLASH_SRC/tests/e2e/check_trace.py" "$WORK/trace_a" "$DATA" --segments 2 || fail "records across the resume on another split"
"$PY" - "$WORK/a/metrics.h5" <<'PY' || fail "the resumed run's metrics"
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    steps, loss = list(f["steps/step"][:]), f["steps/loss"][:]
    assert steps == list(range(1, len(steps) + 1)), steps
    assert list(f["segments/kind"][:]) == [0, 2] and list(f["segments/first_step"][:]) == [0, 15], list(f["segments/kind"][:])
    fresh, before, after = loss[:3].mean(), loss[12:15].mean(), loss[15:18].mean()
    print(f"# loss: fresh {fresh:.3f}, before the change {before:.3f}, after {after:.3f}")
    assert after < before + 0.25 * (fresh - before), "the loss jumped at the change of split"
PY

run_job b 3 300 --topology 2-1 "${common[@]}" --epochs 1 --inject-trace-dir "$WORK/trace_b" --rebalance auto \
  --checkpoint-every 10 --inject-delay-drafter-ms 100
expect_rc 0 b
expect_log b "[rebalance] 2-1 -> 1-2 at step 10: predicted +"
expect_log b "[rebalance] every rank takes its role on 1-2 in place"
expect_log b "drafter exported to $WORK/b/drafter"
"$PY" "$DFLASH_SRC/tests/e2e/check_trace.py" "$WORK/trace_b" "$DATA" --segments 2 || fail "records across the live re-split"
"$PY" - "$WORK/b/metrics.h5" <<'PY' || fail "the re-split run's metrics"
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    steps = list(f["steps/step"][:])
    assert steps == list(range(1, len(steps) + 1)), steps
    assert list(f["segments/kind"][:]) == [0, 3] and list(f["segments/first_step"][:]) == [0, 10], list(f["segments/kind"][:])
    print("# /segments:", list(f["segments/kind"][:]), "first steps", list(f["segments/first_step"][:]))
PY
echo "PASS"
