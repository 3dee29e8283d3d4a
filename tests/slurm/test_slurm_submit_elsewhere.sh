#!/usr/bin/env bash
# ctest entry (label slurm): the sbatch scripts find their repository wherever the job is submitted from
# (docs/checkpoint.md "Finding the repository"). On a one-node Slurm cluster on localhost (slurm_cluster.sh):
#   - submitted from another directory with no DFLASH_HOME, train-1node.sbatch (mpirun) and
#     train-1node-srun.sbatch (srun) find the repository through Slurm's Command= and train (CPU, 1-1);
#   - a copy of the script outside the repository, submitted from outside it, fails at once with
#     status=failed rc=8 naming every place tried, before the world-size probe;
#   - DFLASH_HOME naming no repository fails the same way in all three scripts (the multinode one too).
# Needs root (slurm_cluster.sh); exit 77 (skipped) otherwise.
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=$(cd "${DFLASH_BIN:?set DFLASH_BIN to the build directory}" && pwd)
# shellcheck source=tests/slurm/slurm_cluster.sh
source "$SRC/tests/slurm/slurm_cluster.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }
note() { echo "# $*"; }

[ "$(id -u)" -eq 0 ] || { echo "SKIPPED: needs root (installs and runs a local Slurm)"; exit 77; }
slurm_cluster_install || { echo "SKIPPED: cannot install slurm-wlm/munge"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dflash-slurm-elsewhere.XXXXXX")
trap 'slurm_cluster_stop "$WORK/slurm"; rm -rf "$WORK"' EXIT
slurm_cluster_start "$WORK/slurm" || fail "the local Slurm cluster did not start"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset DFLASH_HOME
"$BIN/dflash-make-tiny" "$WORK/tiny" >/dev/null 2>&1 || fail "dflash-make-tiny failed"
ARGS=(--target "$WORK/tiny/target" --data "$WORK/tiny/data.h5" --draft-layers 1 --token-budget 512
      --peer-timeout 30 --max-steps 3 --log-every 1)
mkdir -p "$WORK/elsewhere/a/b"

submit() {  # submit NAME SCRIPT [sbatch args...] -- [dflash-train args...]: from $WORK/elsewhere; prints the job id
  local name=$1 script=$2
  shift 2
  local -a sb=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do sb+=("$1"); shift; done
  shift
  (cd "$WORK/elsewhere" && DFLASH_TRAIN="$BIN/dflash-train" DFLASH_BACKEND=cpu DFLASH_TOPOLOGY=1-1 \
    sbatch --parsable --ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1 --time=10 --no-requeue \
    --output="$WORK/$name.out" "${sb[@]}" "$script" "$@")
}
finished() {  # finished JOBID: COMPLETED, FAILED, ... once the job is over
  local s
  for _ in $(seq 1 240); do
    s=$(scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    case $s in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) echo "$s"; return 0 ;; esac
    sleep 1
  done
  echo "still ${s:-unknown} after 240 s"
}
expect_out() {  # expect_out NAME "fixed string"
  grep -qF -- "$2" "$WORK/$1.out" || { cat "$WORK/$1.out" >&2; fail "$1: its log lacks '$2'"; }
}

# ---- from another directory, no DFLASH_HOME: found through Command=, and the job trains ------------------
for script in train-1node train-1node-srun; do
  jid=$(submit "$script" "$SRC/jobs/slurm/$script.sbatch" -- "${ARGS[@]}" --out "$WORK/run-$script")
  state=$(finished "$jid")
  note "$script submitted from $WORK/elsewhere: $state"
  [ "$state" = COMPLETED ] || { cat "$WORK/$script.out" >&2; fail "$script: $state"; }
  expect_out "$script" "restart=0 repo=$SRC "
  expect_out "$script" "status=completed rc=0"
  [ -s "$WORK/run-$script/drafter/model.safetensors" ] || fail "$script: no exported drafter"
done

# ---- a copy outside the repository, submitted from outside it: nothing found, every place named ----------
cp "$SRC/jobs/slurm/train-1node.sbatch" "$WORK/elsewhere/a/b/copy.sbatch"
jid=$(submit copy "$WORK/elsewhere/a/b/copy.sbatch" -- "${ARGS[@]}" --out "$WORK/run-copy")
state=$(finished "$jid")
note "a copy outside the repository: $state"
[ "$state" = FAILED ] || { cat "$WORK/copy.out" >&2; fail "the copy: $state, expected FAILED"; }
expect_out copy "status=failed rc=8 reason='no dflash-train repository (jobs/stop-signal.sh jobs/next-topology.sh jobs/mpirun/train.sh) at: the submitted script's $WORK/elsewhere, this script's "
expect_out copy ", the submit directory $WORK/elsewhere; set DFLASH_HOME to the repository'"
# It failed first: no job line, no world-size probe, nothing started.
[ "$(grep -c '' "$WORK/copy.out")" -eq 1 ] || { cat "$WORK/copy.out" >&2; fail "the copy printed more than its status line"; }

# ---- DFLASH_HOME that is no repository: only it is tried, in each script ----------------------------------
for script in train-1node train-1node-srun train-multinode; do
  jid=$(DFLASH_HOME=/nonexistent/dflash submit "bad-$script" "$SRC/jobs/slurm/$script.sbatch" --nodes=1 -- \
    "${ARGS[@]}" --out "$WORK/run-bad-$script")
  state=$(finished "$jid")
  [ "$state" = FAILED ] || { cat "$WORK/bad-$script.out" >&2; fail "$script with a bad DFLASH_HOME: $state"; }
  expect_out "bad-$script" "status=failed rc=8 reason='no dflash-train repository ("
  expect_out "bad-$script" ") at: DFLASH_HOME /nonexistent/dflash; set DFLASH_HOME to the repository'"
  note "$script with DFLASH_HOME=/nonexistent/dflash: failed, naming it"
done
echo "PASS"
