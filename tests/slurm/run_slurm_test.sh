#!/usr/bin/env bash
# The Slurm requeue cycle for real: a one-node Slurm cluster on localhost runs jobs/slurm/train-1node.sbatch
# in its CPU form (topology 1-1, 2 ranks, the tiny model); the test sends the time-limit signal
# (scancel --signal=USR1 --batch), and checks that the job checkpointed, exited 75, requeued itself,
# resumed (--resume auto) and finished with the losses of an uninterrupted run, bit for bit.
#
#   tests/slurm/run_slurm_test.sh [BUILD_DIR]      (env DFLASH_BIN works too; default ./build)
# DFLASH_SBATCH picks the job script (default train-1node.sbatch, mpirun; train-1node-srun.sbatch: srun
# --mpi=pmix, which test_slurm_requeue_srun.sh runs); DFLASH_SLURM_EXPECT_LAUNCH_RETRY=1 also checks that the
# job script retried a failed srun launch (test_slurm_requeue_srun.sh injects one). DFLASH_SLURM_EARLY_SIGNAL=1
# sends the signal as soon as the batch shell has printed its first line, long before the ranks can take one
# (test_slurm_early_signal*.sh): the job script must hold it until they are ready (jobs/stop-signal.sh), then
# the same checkpoint, requeue and resume.
#
# Needs root (it installs slurm-wlm + munge with apt-get when missing and runs the daemons as root);
# otherwise it exits 77 (skipped). The daemons are stopped by their pid files on every exit path.
# Takes about a minute. ctest: `ctest -L slurm`.
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=$(cd "${1:-${DFLASH_BIN:-$SRC/build}}" && pwd)
PY=/usr/bin/python3
# shellcheck source=tests/slurm/slurm_cluster.sh
source "$SRC/tests/slurm/slurm_cluster.sh"

skip() { echo "SKIPPED: $*"; exit 77; }
fail() {
  echo "FAIL: $*" >&2
  [ -f "${WORK:-}/job.out" ] && { echo "---- job.out (tail) ----" >&2; tail -40 "$WORK/job.out" >&2; }
  exit 1
}
note() { echo "# $*"; }

[ "$(id -u)" -eq 0 ] || skip "needs root (installs and runs a local Slurm)"
[ -x "$BIN/dflash-train" ] && [ -x "$BIN/dflash-make-tiny" ] || fail "no dflash-train / dflash-make-tiny in $BIN"
slurm_cluster_install || skip "cannot install slurm-wlm/munge"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/dflash-slurm.XXXXXX")
cleanup() {
  slurm_cluster_stop "$WORK/slurm"
  rm -rf "$WORK"
}
trap cleanup EXIT
slurm_cluster_start "$WORK/slurm" || fail "the local Slurm cluster did not start"
note "slurm up: $(sinfo -h -o '%P %a %D %t %N')"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$BIN/dflash-make-tiny" "$WORK/tiny" >/dev/null 2>&1 || fail "dflash-make-tiny failed"
STEPS=30
ARGS=(--target "$WORK/tiny/target" --data "$WORK/tiny/data.h5" --draft-layers 1 --token-budget 512
      --peer-timeout 30 --max-steps $STEPS --log-every 1 --checkpoint-every 10)

# ---- the reference: the same job, uninterrupted, under plain mpirun ------------------------------------
timeout -k 5 300 mpirun -np 2 --bind-to none "$BIN/dflash-train" "${ARGS[@]}" --topology 1-1 --out "$WORK/ref" \
  >"$WORK/ref.log" 2>&1 || { tail -30 "$WORK/ref.log" >&2; fail "reference run failed"; }

# ---- the Slurm job: slowed down (a test hook that changes no number) so the signal lands mid-run --------
jid=$(DFLASH_HOME="$SRC" DFLASH_TRAIN="$BIN/dflash-train" DFLASH_BACKEND=cpu DFLASH_TOPOLOGY=1-1 \
  sbatch --parsable --ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1 --time=15 \
  --output="$WORK/job.out" "$SRC/jobs/slurm/${DFLASH_SBATCH:-train-1node.sbatch}" \
  "${ARGS[@]}" --out "$WORK/run" --inject-delay-drafter-ms 150)
note "submitted job $jid"

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND... (COMMAND re-run every second: pass a function)
  local limit=$1 what=$2
  shift 2
  local t0=$SECONDS
  until "$@"; do
    [ $((SECONDS - t0)) -lt "$limit" ] || fail "timed out after ${limit}s waiting for $what"
    sleep 1
  done
}
job_state() { scontrol show job "$jid" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
job_restarts() { scontrol show job "$jid" 2>/dev/null | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p'; }
trained_steps() {  # 0 before the job's log exists (grep -c prints nothing for a missing file)
  local n
  n=$(grep -c '^\[[0-9.smhd]*\] step=' "$WORK/job.out" 2>/dev/null)
  echo "${n:-0}"
}
trained_3_steps() { [ "$(trained_steps)" -ge 3 ]; }
requeued() { [ "$(job_restarts)" = 1 ] && [ "$(job_state)" = PENDING ]; }
completed() { [ "$(job_state)" = COMPLETED ]; }

if [ "${DFLASH_SLURM_EARLY_SIGNAL:-0}" = 1 ]; then
  # The batch shell's first line comes before the world check and the launch: the ranks start a second or
  # more later. (Before the hold, the shell had no trap yet and died of the signal: the job failed.)
  started() { grep -q "^\[sbatch\] job=$jid restart=0 " "$WORK/job.out" 2>/dev/null; }
  t0=$SECONDS
  until started; do
    [ $((SECONDS - t0)) -lt 120 ] || fail "timed out after 120s waiting for the job to start"
    sleep 0.02
  done
  scancel --signal=USR1 --batch "$jid"
  note "sent USR1 to the batch shell of job $jid as it started ($(trained_steps) steps trained)"
else
  wait_for 120 "the job to train 3 steps" trained_3_steps
  scancel --signal=USR1 --batch "$jid"
  note "sent USR1 to the batch shell of job $jid after $(trained_steps) step(s)"
fi

# Requeued jobs wait out a begin time (the credential lifetime, 120 s); the test starts it at once.
wait_for 120 "the job to be requeued" requeued
# slurmd revokes the first run's credential, to the second, when it has ended that run's steps: a restart
# within that same second is refused ("Job credential revoked"; under srun a step that never launches). The
# node is idle once slurmd is done with the old run (under load that can be seconds after the requeue); then
# let the clock move on.
node_idle() { [ "$(sinfo -h -N -o %t 2>/dev/null | head -1)" = idle ]; }
wait_for 120 "the node to finish the first run's cleanup" node_idle
sleep 2
scontrol update JobId="$jid" StartTime=now
wait_for 300 "the requeued job to finish" completed

# ---- checks ---------------------------------------------------------------------------------------------
grep -q "status=requeued rc=75" "$WORK/job.out" || fail "the first run did not end with status=requeued rc=75"
grep -q "restart=1 status=completed" "$WORK/job.out" || fail "the requeued run did not complete"
grep -q "stop signal (10) received: checkpointed at step" "$WORK/job.out" || fail "no checkpoint on SIGUSR1"
grep -q -- "--resume auto: resuming from" "$WORK/job.out" || fail "the requeued run did not resume"
if [ "${DFLASH_SLURM_EARLY_SIGNAL:-0}" = 1 ]; then
  grep -q "^\[sbatch\] SIGUSR1 received while the ranks start: held until they can take it" "$WORK/job.out" ||
    fail "the job script did not hold the early signal"
  grep -q "^\[sbatch\] the ranks are ready: asking dflash-train to checkpoint and stop" "$WORK/job.out" ||
    fail "the job script did not forward the held signal once the ranks were ready"
  note "the early signal was held until the ranks were ready, then forwarded"
fi
if [ "${DFLASH_SLURM_EXPECT_LAUNCH_RETRY:-0}" = 1 ]; then
  grep -q "srun could not start the tasks (rc=0); trying once more" "$WORK/job.out" ||
    fail "the job script did not notice the injected launch failure"
  note "the injected launch failure was retried"
fi
saved=$(sed -n 's/.*checkpointed at step \([0-9]*\).*/\1/p' "$WORK/job.out" | head -1)
[ "$saved" -lt $STEPS ] || fail "the checkpoint was at step $saved: the signal came after the run ended"
note "checkpointed at step $saved, requeued, resumed, completed"
"$PY" - "$WORK/ref/metrics.h5" "$WORK/run/metrics.h5" "$STEPS" <<'PYEOF' || fail "losses differ from the uninterrupted run"
import sys, h5py, numpy as np
ref, run = (h5py.File(p, 'r') for p in sys.argv[1:3])
n = int(sys.argv[3])
assert list(run['steps/step'][:]) == list(range(1, n + 1)), run['steps/step'][:]
for k in ('loss', 'acc', 'grad_norm', 'tokens', 'lr'):
    a, b = ref['steps/' + k][:], run['steps/' + k][:]
    assert np.array_equal(a, b), (k, a, b)
print('identical losses over', n, 'steps; last', run['steps/loss'][-1])
PYEOF
cmp -s "$WORK/ref/drafter/model.safetensors" "$WORK/run/drafter/model.safetensors" ||
  fail "the exported drafters differ"
echo "PASS"
