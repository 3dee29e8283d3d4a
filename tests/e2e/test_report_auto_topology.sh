#!/usr/bin/env bash
# --topology auto on the CPU backend through mpirun: every rank times target forwards and drafter steps,
# the what-if table and the choice are printed and stored in metrics.h5 (attribute auto_topology), and the
# job then trains with the chosen split. With the tiny model the drafter is the slow role (auto picks 1-2 of
# 3 ranks); slowing the targets with the test hook (--inject-delay-target-ms) flips the choice to 2-1. The
# colocated row is timed too but made slow (--inject-delay-colocated-ms: the two roles contend for the device),
# so the splits decide here (tests/e2e/test_auto_colocated.sh has auto choosing colocated).
source "$(dirname "$0")/lib.sh"
REPORT="$DFLASH_SRC/tools/dflash-report"

check_auto() {  # check_auto NAME WANT_SPLIT
  local name=$1 want=$2
  expect_rc 0 "$name"
  expect_log "$name" "--topology auto: timing"
  expect_log "$name" "tgt cap b/s"
  expect_log "$name" "--topology auto chose $want"
  expect_log "$name" "topology $want on 1 node(s) x 3 rank(s)"
  expect_log "$name" "drafter exported to"
  h5check "$WORK/$name/metrics.h5" "f.attrs['topology'] in ('$want', b'$want')"
  h5check "$WORK/$name/metrics.h5" "__import__('json').loads(f.attrs['auto_topology'])['chosen'] == '$want'"
  h5check "$WORK/$name/metrics.h5" "[w['split'] for w in __import__('json').loads(f.attrs['auto_topology'])['whatif']] == ['2-1', '1-1', '1-2', 'colocated']"
  h5check "$WORK/$name/metrics.h5" "int(f.attrs['gpus_per_node']) == 3"
  "$REPORT" "$WORK/$name/metrics.h5" > "$WORK/$name.report" || fail "$name: dflash-report failed"
  grep -q "chosen by --topology auto ($want" "$WORK/$name.report" || { cat "$WORK/$name.report"; fail "$name: report lacks the auto choice"; }
}

run_job auto_fast_targets 3 300 --topology auto --max-steps 12 --log-every 4 --inject-delay-colocated-ms 3000
check_auto auto_fast_targets 1-2

run_job auto_slow_targets 3 300 --topology auto --max-steps 8 --log-every 4 --inject-delay-target-ms 2500 --power-budget-w 1000 \
  --inject-delay-colocated-ms 8000
check_auto auto_slow_targets 2-1
expect_log auto_slow_targets "--power-budget-w ignored: no power readings"

# Auto with a single rank per node cannot split: a topology error before any model loads.
run_job auto_one_rank 1 60 --topology auto --max-steps 2
expect_rc 4 auto_one_rank
expect_log auto_one_rank "needs at least 2 ranks per node"
echo "PASS"
