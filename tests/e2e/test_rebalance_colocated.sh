#!/usr/bin/env bash
# --rebalance auto to and from the colocated layout (docs/checkpoint.md "Re-splitting live", docs/pipeline.md
# "The colocated layout"): a colocated run on 2 ranks whose two roles contend for the device
# (--inject-delay-colocated-ms: each batch's wall time grows, neither role's busy time does, so the run measures
# a negative overlap) is predicted far slower than 1-1; at its first checkpoint every rank ends both its
# threads and takes its 1-1 role in place, and the run ends in the same mpirun with exit 0 and an export.
# Every record of the epoch is trained once across the two layouts (--inject-trace-dir), metrics.h5 holds every
# step once and /segments kinds start, rebalance, OUT/next-topology remembers 1-1, and the 1-1 segment keeps its
# layout (its colocated overlap is not measured: not a candidate).
source "$(dirname "$0")/lib.sh"
DATA="$(tiny_dir)/data.h5"
mkdir -p "$WORK/trace"
run_job live 2 300 --topology colocated --batch-order fixed --seed 5 --epochs 1 --log-every 2 --lr 3e-3 \
  --rebalance auto --checkpoint-every 6 --inject-delay-colocated-ms 2000 --inject-trace-dir "$WORK/trace"
expect_rc 0 live
expect_log live "[rebalance] colocated -> 1-1 at step 6: predicted +"
expect_log live "[rebalance] $WORK/live/next-topology now holds 1-1"
expect_log live "[rebalance] every rank takes its role on 1-1 in place, from $WORK/live/checkpoints/step-00000006"
expect_log live "drafter exported to $WORK/live/drafter"
n=$(grep -c "^\[rebalance\] [a-z0-9-]* -> " "$WORK/live.log" || true)
[ "$n" = 1 ] || fail "the layout changed $n time(s), expected once (colocated -> 1-1)"
grep -qE "^\[rebalance\] step 1[0-9]: 1-1 predicted .*keep it" "$WORK/live.log" || { grep rebalance "$WORK/live.log" >&2; fail "the 1-1 segment's checkpoint did not keep 1-1"; }
[ "$(cat "$WORK/live/next-topology")" = 1-1 ] || fail "OUT/next-topology does not hold 1-1"
"$PY" "$DFLASH_SRC/tests/e2e/check_trace.py" "$WORK/trace" "$DATA" --segments 2 || fail "the records trained across the change of layout"
"$PY" - "$WORK/live/metrics.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    steps = list(f["steps/step"][:])
    if steps != list(range(1, len(steps) + 1)):
        sys.exit(f"FAIL: /steps/step is not 1..N: {steps}")
    kinds, first = list(f["segments/kind"][:]), list(f["segments/first_step"][:])
    if kinds != [0, 3] or first != [0, 6]:
        sys.exit(f"FAIL: /segments kind {kinds} first_step {first}, expected [0, 3] [0, 6]")
    if [int(f["segments/targets_per_node"][i]) for i in range(2)] != [2, 1]:
        sys.exit("FAIL: /segments/targets_per_node is not [2, 1] (colocated: every rank a target)")
PY
echo "PASS"
