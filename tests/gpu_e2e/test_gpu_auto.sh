#!/usr/bin/env bash
# --topology auto on the GPU: each rank times the target forward, releases it, then the drafter step (a
# rank never holds both models), with NVML power per role; the what-if table carries power, the choice
# respects --power-budget-w (a budget no split fits falls back to the fastest, and says so), and the job
# then trains with the chosen split.
source "$(dirname "$0")/gpu_lib.sh"
run_job auto 2 300 --backend cuda --topology auto --max-steps 6 --log-every 3
expect_rc 0 auto
expect_log auto "--topology auto: power (NVML, mean over ranks) idle"
expect_log auto "--topology auto chose 1-1"
expect_log auto "step=6 "
run_job auto_budget 2 300 --backend cuda --topology auto --power-budget-w 1 --max-steps 3 --log-every 3
expect_rc 0 auto_budget
expect_log auto_budget "no split fits --power-budget-w 1 W; the fastest is used"
echo "PASS"
