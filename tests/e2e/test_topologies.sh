#!/usr/bin/env bash
# Topologies 1-1, 3-1, 2-2 and 2-1 + one idle rank each train a few steps and finish cleanly:
# status lines, metrics.h5 with every step, the exported drafter, every rank in the startup table.
source "$(dirname "$0")/lib.sh"
check_run() {  # check_run NAME STEPS TARGETS DRAFTERS IDLE
  local name=$1 steps=$2
  expect_rc 0 "$name"
  expect_log "$name" "step=$steps "
  expect_log "$name" "drafter exported to"
  [ "$(grep -c ' target ' "$WORK/$name.log")" -ge "$3" ] || fail "$name: startup table lacks targets"
  [ "$(grep -cE '^\[dflash\] +[0-9]+ +drafter ' "$WORK/$name.log")" -eq "$4" ] || fail "$name: startup table drafters"
  [ "$(grep -cE '^\[dflash\] +[0-9]+ +idle ' "$WORK/$name.log")" -eq "$5" ] || fail "$name: startup table idle ranks"
  [ -s "$WORK/$name/drafter/config.json" ] && [ -s "$WORK/$name/drafter/model.safetensors" ] || fail "$name: no export"
  h5check "$WORK/$name/metrics.h5" "len(f['steps/step']) == $steps and list(f['steps/step'][:]) == list(range(1, $steps + 1))"
  h5check "$WORK/$name/metrics.h5" "f['queues/q_pre'].shape[1] == $3 and f['queues/q_hs'].shape[1] == $4"
  h5check "$WORK/$name/metrics.h5" "np.all(np.isfinite(f['steps/loss'][:]))"
  h5check "$WORK/$name/metrics.h5" "f.attrs['topology'] in ('$3-$4', b'$3-$4')"
}
run_job t11 2 120 --topology 1-1 --max-steps 6 --log-every 3
check_run t11 6 1 1 0
run_job t31 4 120 --topology 3-1 --max-steps 6 --log-every 3
check_run t31 6 3 1 0
run_job t22 4 120 --topology 2-2 --max-steps 6 --log-every 3
check_run t22 6 2 2 0
h5check "$WORK/t22/metrics.h5" "set(f['ranks/role'][:]) == {0, 1}"
run_job t21 4 120 --topology 2-1 --max-steps 7 --log-every 3  # 7: the last, partial interval is reported too
check_run t21 7 2 1 1
h5check "$WORK/t21/metrics.h5" "2 in set(f['ranks/role'][:])"  # the idle rank has its timing rows
echo "PASS"
