# shellcheck shell=bash
# Stop signals of the launch scripts, sourced by jobs/mpirun/train.sh and jobs/slurm/*.sbatch (bash).
#
# SIGUSR1 or SIGTERM to the script is passed on to its child (mpirun, srun, or train.sh under an sbatch
# script) as SIGUSR1: dflash-train finishes its step, checkpoints and exits 75. Not while the ranks start:
# a signal in a rank's first ~0.15 s, before it has installed its handlers, kills it (exit 138, nothing
# saved). Rank 0 of dflash-train creates the file named by $DFLASH_READY_FILE once every rank is past
# MPI_Init (apps/dflash-train.cpp); until then a signal is held here, and forwarded once the file exists.
#
# Use (docs/checkpoint.md "Stop signals"):
#   trap 'stop_early=${stop_early:-USR1}' USR1; trap 'stop_early=${stop_early:-TERM}' TERM   # first of all
#   ... find this file; source it
#   stop_signal_init TAG        # the traps (a signal already caught is held), the ready file
#   CHILD ... &                 # with DFLASH_READY_FILE in its environment (exported)
#   stop_signal_child $! NAME
#   stop_signal_wait            # until the child is gone, forwarding what comes; its exit status in $rc
#
# stop_signal_init sets an EXIT trap that removes its ready file's directory: a script that sets its own
# EXIT trap afterwards calls stop_signal_cleanup in it.
#
# A launcher started by another (train.sh under an sbatch script) keeps the ready file the one above
# exported, so that both hold until the same ranks are ready; a stale name (its file already there, or its
# directory gone) is replaced by a file of its own. The file is removed when the child is gone, so a second
# launch (srun's retry) waits for its own ranks.

stop_signal_init() {
  stop_tag=$1
  stop_child=""
  stop_child_name=""
  stop_signalled=""
  stop_held=""
  stop_own_dir=""
  if [ -z "${DFLASH_READY_FILE:-}" ] || [ -e "$DFLASH_READY_FILE" ] || [ ! -d "$(dirname "$DFLASH_READY_FILE")" ]; then
    stop_own_dir=$(mktemp -d "${TMPDIR:-/tmp}/dflash-train.XXXXXX")
    export DFLASH_READY_FILE="$stop_own_dir/ready"
  fi
  export DFLASH_READY_FILE
  trap 'stop_signal_cleanup' EXIT
  trap 'stop_signal_forward USR1' USR1
  trap 'stop_signal_forward TERM' TERM
  if [ -n "${stop_early:-}" ]; then  # caught by the script's first trap, before this file was read
    stop_signal_forward "$stop_early"
    stop_early=""
  fi
}

stop_signal_cleanup() {
  [ -n "$stop_own_dir" ] && rm -rf "$stop_own_dir"
  return 0
}

stop_signal_forward() {  # the trap: pass the signal on as SIGUSR1, or hold it while the ranks start
  stop_signalled=$1
  if [ -z "$stop_child" ] || [ ! -e "$DFLASH_READY_FILE" ]; then
    stop_held=$1
    echo "$stop_tag SIG$1 received while the ranks start: held until they can take it" >&2
    return
  fi
  echo "$stop_tag SIG$1 received: asking dflash-train to checkpoint and stop (SIGUSR1 to $stop_child_name $stop_child)" >&2
  kill -USR1 "$stop_child" 2>/dev/null || true
}

stop_signal_child() {  # PID NAME: the child the signals go to
  stop_child=$1
  stop_child_name=$2
}

stop_signal_forward_held() {  # a signal held while the ranks started: forwarded once they are ready
  [ -n "$stop_held" ] || return 0
  while [ ! -e "$DFLASH_READY_FILE" ] && kill -0 "$stop_child" 2>/dev/null; do sleep 0.05; done
  # the child ended before its ranks were ready: still held, for a launch that follows (srun's retry)
  [ -e "$DFLASH_READY_FILE" ] || return 0
  stop_held=""
  echo "$stop_tag the ranks are ready: asking dflash-train to checkpoint and stop (SIGUSR1 to $stop_child_name $stop_child)" >&2
  kill -USR1 "$stop_child" 2>/dev/null || true
}

stop_signal_wait() {  # `wait` returns early (status > 128) whenever a trapped signal arrives: wait again
  while :; do
    stop_signal_forward_held
    wait "$stop_child"
    rc=$?
    if [ $rc -gt 128 ] && kill -0 "$stop_child" 2>/dev/null; then continue; fi
    if [ $rc -gt 128 ] && [ -n "$stop_signalled" ]; then
      # the child ended while the trap ran: collect its real status if the shell still has it
      wait "$stop_child" 2>/dev/null
      local r2=$?
      [ $r2 -ne 127 ] && rc=$r2
    fi
    break
  done
  stop_child=""
  rm -f "$DFLASH_READY_FILE"
}
