#!/usr/bin/env bash
# Stop signals for real, through mpirun: the job finishes its step, checkpoints, every rank exits 75,
# and --resume auto completes the run with the losses of a run that was never stopped, bit for bit.
#   1. SIGUSR1 to mpirun (what Slurm's batch script forwards; mpirun passes it to every rank)
#   2. SIGTERM to the ranks themselves (a scheduler terminating the processes of a step)
#   3. SIGTERM to jobs/mpirun/train.sh (it forwards SIGUSR1: mpirun would SIGKILL ranks a second after a TERM)
source "$(dirname "$0")/lib.sh"
N=24
TINY=$(tiny_dir)
COMMON=(--topology 1-1 --max-steps $N --seed 7 --log-every 1)
FLAGS=(--target "$TINY/target" --data "$TINY/data.h5" --draft-layers 1 --token-budget 512 --peer-timeout 20)

run_job ref 2 120 "${COMMON[@]}"
expect_rc 0 ref

steps_in() { grep -c '^\[[0-9.smhd]*\] step=' "$1" 2>/dev/null || true; }
wait_steps() {  # wait_steps LOG K PID: until LOG shows K steps (fails if PID ends first or after 60 s)
  local t0=$SECONDS
  until [ "$(steps_in "$1")" -ge "$2" ]; do
    kill -0 "$3" 2>/dev/null || { tail -20 "$1" >&2; fail "the job ended before step $2"; }
    [ $((SECONDS - t0)) -lt 60 ] || fail "no step $2 in $1 after 60 s"
    sleep 0.2
  done
}
same_losses() {  # same_losses NAME: NAME's metrics.h5 holds steps 1..N with the reference's numbers
  "$PY" - "$WORK/ref/metrics.h5" "$WORK/$1/metrics.h5" $N <<'PYEOF' || fail "$1: losses differ from the uninterrupted run"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
n = int(sys.argv[3])
assert list(b['steps/step'][:]) == list(range(1, n + 1)), b['steps/step'][:]
for k in ('loss', 'acc', 'grad_norm', 'lr', 'tokens'):
    assert np.array_equal(a['steps/' + k][:], b['steps/' + k][:]), k
PYEOF
  cmp -s "$WORK/ref/drafter/model.safetensors" "$WORK/$1/drafter/model.safetensors" || fail "$1: exported drafter differs"
  note "$1: resumed run matches the uninterrupted one over $N steps"
}
checkpointed() {  # checkpointed NAME SIGNUM
  expect_log "$1" "stop signal ($2) received: checkpointed at step"
  expect_log "$1" "exit 75 for a requeue"
  ls "$WORK/$1"/checkpoints/step-*/manifest.json >/dev/null 2>&1 || fail "$1: no complete checkpoint"
}

# ---- 1. SIGUSR1 to mpirun ---------------------------------------------------------------------------
mpirun -np 2 --oversubscribe "$TRAIN" "${FLAGS[@]}" "${COMMON[@]}" --out "$WORK/usr1" --inject-delay-drafter-ms 150 \
  >"$WORK/usr1.log" 2>&1 &
pid=$!
wait_steps "$WORK/usr1.log" 3 $pid
kill -USR1 $pid
set +e; wait $pid; RC=$?; set -e
expect_rc 75 usr1
checkpointed usr1 10
run_job usr1 2 120 "${COMMON[@]}" --resume auto   # (run_job appends to usr1.log)
expect_rc 0 usr1
same_losses usr1

# ---- 2. SIGTERM to the ranks --------------------------------------------------------------------------
mpirun -np 2 --oversubscribe "$TRAIN" "${FLAGS[@]}" "${COMMON[@]}" --out "$WORK/term" --inject-delay-drafter-ms 150 \
  >"$WORK/term.log" 2>&1 &
pid=$!
wait_steps "$WORK/term.log" 3 $pid
ranks=$(pgrep -P $pid -f dflash-train) || fail "no dflash-train children of mpirun $pid"
kill -TERM $ranks
set +e; wait $pid; RC=$?; set -e
expect_rc 75 term
checkpointed term 15
run_job term 2 120 "${COMMON[@]}" --resume auto
expect_rc 0 term
same_losses term

# ---- 3. SIGTERM to the launcher script, then the same command again ----------------------------------
launch() {  # (exec: in `launch &`, $! is train.sh itself)
  NP=2 DFLASH_TRAIN="$TRAIN" DFLASH_BACKEND=cpu MPIRUN_ARGS=--oversubscribe \
    exec "$DFLASH_SRC/jobs/mpirun/train.sh" "${FLAGS[@]}" "${COMMON[@]}" --out "$WORK/launcher" "$@" >>"$WORK/launcher.log" 2>&1
}
launch --inject-delay-drafter-ms 150 &
pid=$!
wait_steps "$WORK/launcher.log" 3 $pid
kill -TERM $pid
set +e; wait $pid; RC=$?; set -e
expect_rc 75 launcher
checkpointed launcher 10
expect_log launcher "[train.sh] status=checkpointed rc=75"
set +e; (launch); RC=$?; set -e  # the same command again: train.sh adds --resume auto
expect_rc 0 launcher
expect_log launcher "--resume auto: resuming from"
expect_log launcher "[train.sh] status=completed rc=0"
same_losses launcher

# ---- 4. SIGTERM to the launcher at once: held until the ranks can take it, then a checkpoint -----------
# (forwarded at once, mpirun's SIGUSR1 killed ranks still loading their libraries: exit 138, nothing saved)
: >"$WORK/launcher.log"
rm -rf "$WORK/launcher"
launch --inject-delay-drafter-ms 150 &
pid=$!
sleep 0.05
kill -TERM $pid
set +e; wait $pid; RC=$?; set -e
expect_rc 75 launcher
expect_log launcher "[train.sh] SIGTERM received while the ranks start: held until they can take it"
expect_log launcher "[train.sh] status=checkpointed rc=75"
echo "PASS"
