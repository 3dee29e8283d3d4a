#!/usr/bin/env bash
# --topology auto on the GPU: each rank times the target forward, then the drafter step, with NVML power per
# role, and (a colocated rank fits the GPU: the tiny model) a forward on the second stream and a step at once,
# the colocated overlap; the what-if table carries power and the colocated row, the choice respects
# --power-budget-w (a budget no layout fits falls back to the fastest, and says so), and the job then trains
# with the chosen layout.
source "$(dirname "$0")/gpu_lib.sh"
run_job auto 2 300 --backend cuda --topology auto --max-steps 6 --log-every 3
expect_rc 0 auto
expect_log auto "--topology auto: power (NVML, mean over ranks) idle"
expect_log auto "--topology auto: colocated (a forward and a step at once)"
grep -qE -- "--topology auto chose (1-1|colocated) " "$WORK/auto.log" || fail "auto chose neither 1-1 nor colocated"
expect_log auto "step=6 "
run_job auto_budget 2 300 --backend cuda --topology auto --power-budget-w 1 --max-steps 3 --log-every 3
expect_rc 0 auto_budget
expect_log auto_budget "no layout fits --power-budget-w 1 W; the fastest is used"
echo "PASS"
