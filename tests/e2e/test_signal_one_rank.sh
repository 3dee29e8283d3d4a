#!/usr/bin/env bash
# A stop signal that reaches one rank only -- a scheduler or a container runtime signalling a single task --
# stops the whole job as SIGUSR1 to mpirun does: the first drafter hears of it (forward_stop_signal), the
# drafters checkpoint at the next step, and every rank exits 75. Before, a target or an idle rank kept the
# signal to itself and the job trained on. Topology 2-1 on 4 ranks: SIGTERM to target rank 1, then in a
# second job to the idle rank 3 (the pids come from the startup table, as an operator reads them).
source "$(dirname "$0")/lib.sh"
TINY=$(tiny_dir)
FLAGS=(--target "$TINY/target" --data "$TINY/data.h5" --draft-layers 1 --token-budget 512 --peer-timeout 20
       --topology 2-1 --max-steps 200 --epochs 20 --log-every 1 --inject-delay-drafter-ms 150)

steps_in() { local n; n=$(grep -c '^\[[0-9.smhd]*\] step=' "$1" 2>/dev/null); echo "${n:-0}"; }
signal_one() {  # signal_one NAME RANK: start the job, wait for 3 steps, SIGTERM world rank RANK only
  local name=$1 rank=$2
  mpirun -np 4 --oversubscribe "$TRAIN" "${FLAGS[@]}" --out "$WORK/$name" >"$WORK/$name.log" 2>&1 &
  local pid=$! t0=$SECONDS
  until [ "$(steps_in "$WORK/$name.log")" -ge 3 ]; do
    kill -0 $pid 2>/dev/null || { tail -20 "$WORK/$name.log" >&2; fail "$name: the job ended before step 3"; }
    [ $((SECONDS - t0)) -lt 90 ] || fail "$name: no step 3 after 90 s"
    sleep 0.2
  done
  # the startup table: "[dflash]   rank  role  host  device  pid  power"
  local target_pid
  target_pid=$(awk -v r="$rank" '$1 == "[dflash]" && $2 == r && ($3 == "target" || $3 == "drafter" || $3 == "idle") {print $6; exit}' "$WORK/$name.log")
  [ -n "$target_pid" ] || fail "$name: no pid for rank $rank in the startup table"
  note "$name: SIGTERM to rank $rank (pid $target_pid) only, after $(steps_in "$WORK/$name.log") steps"
  kill -TERM "$target_pid"
  set +e; wait $pid; RC=$?; set -e
  expect_rc 75 "$name"
  expect_log "$name" "stop signal (15) received: checkpointed at step"
  ls "$WORK/$name"/checkpoints/step-*/manifest.json >/dev/null 2>&1 || fail "$name: no complete checkpoint"
  local n; n=$(steps_in "$WORK/$name.log")
  [ "$n" -lt 200 ] || fail "$name: trained all $n steps: the signal was ignored"
}
signal_one target 1
expect_log target "  1  target"
signal_one idle 3
expect_log idle "  3  idle"
echo "PASS"
