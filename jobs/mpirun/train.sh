#!/usr/bin/env bash
# dflash-train under plain mpirun (no Slurm): checkpoints on SIGUSR1/SIGTERM, resumes when run again.
#
#   jobs/mpirun/train.sh --target MODEL_DIR --data DATA.h5 --out RUN_DIR [--topology 7-1] [more options]
#
# env: NP            ranks (default: the number of GPUs nvidia-smi lists, else 2)
#      DFLASH_TRAIN  the binary (default: build/dflash-train next to this script's repository)
#      DFLASH_BACKEND cpu | cuda (default: cuda when nvidia-smi finds a GPU, else cpu)
#      MPIRUN_ARGS   extra mpirun arguments (the Slurm scripts pass --map-by here)
#
# Signals: SIGUSR1 or SIGTERM to this script is forwarded to mpirun as SIGUSR1, which mpirun passes to
# every rank; dflash-train finishes its step, checkpoints and exits 75. (SIGTERM itself is not forwarded:
# mpirun answers SIGTERM by killing the ranks about a second later, too soon to write a checkpoint.)
# Running the same command again resumes from the newest complete checkpoint (--resume auto is added
# unless --resume is given). Ctrl-C (SIGINT) aborts without a checkpoint.
#
# Changing the split (docs/checkpoint.md "Changing the split"): when OUT/next-topology exists (OUT = the
# command's --out, or the `out = DIR` line of its --config), its one line, T-D or auto, overrides the
# command's --topology (jobs/next-topology.sh). The file is kept: delete it to use the command's own again.
# So `echo 6-2 > OUT/next-topology; kill -USR1 <this script's pid>` checkpoints (exit 75), and running the
# same command again continues the run on 6-2. A malformed file: status=failed rc=2 before mpirun starts.
#
# Exit code: dflash-train's. 0 completed; 75 checkpointed, run again to continue; anything else failed
# (docs/checkpoint.md, README "Exit codes"). The last line printed is a status line.
set -uo pipefail
# The stop-signal traps first of all: a signal while this script sets up, before mpirun starts, is held too
# (jobs/stop-signal.sh, below, holds it until the ranks can take it).
trap 'stop_early=${stop_early:-USR1}' USR1
trap 'stop_early=${stop_early:-TERM}' TERM

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# A signal in the ranks' first tenth of a second, before they have installed their handlers, would kill them
# (exit 138, nothing saved): rank 0 creates $DFLASH_READY_FILE once every rank can take one, and until then
# a signal is held here and forwarded then (apps/dflash-train.cpp). Under an sbatch script, the ready file
# is the one that script exported.
# shellcheck source=jobs/stop-signal.sh
source "$repo/jobs/stop-signal.sh" || { echo "[train.sh] status=failed rc=8 reason='no $repo/jobs/stop-signal.sh'"; exit 8; }
stop_signal_init "[train.sh]"

DFLASH_TRAIN=${DFLASH_TRAIN:-$repo/build/dflash-train}
gpus=0
command -v nvidia-smi >/dev/null 2>&1 && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
NP=${NP:-$([ "$gpus" -gt 0 ] && echo "$gpus" || echo 2)}
DFLASH_BACKEND=${DFLASH_BACKEND:-$([ "$gpus" -gt 0 ] && echo cuda || echo cpu)}

# ---- environment the job relies on ----------------------------------------------------------------
# NVLink SHARP (multicast) stays off: on the GPU machines this project runs on it fails or hangs NCCL
# communicator setup (docs/pipeline.md "Backends and the GPU job": Environment).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# NCCL problems are reported as warnings in the job log without the INFO flood.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# Not raised: OMPI_MCA_odls_base_sigkill_timeout (default 1 s). It is how long mpirun waits between the
# SIGTERM and the SIGKILL it sends to ranks when it aborts a job, and it would give ranks that get a
# TERM time to checkpoint, but mpirun also waits it out after every rank exited 75 (checked: 60 s of it
# made a clean exit 75 take two minutes). This script turns TERM into USR1 instead.
# Containers often run as root; Open MPI refuses to start as root without both of these.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# ---- arguments: add --resume auto and the backend unless given; find the run directory -------------
args=("$@")
out_dir="" ckpt_dir="" have_resume=0 have_backend=0
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --out) out_dir=${args[i + 1]:-} ;;
    --out=*) out_dir=${args[i]#--out=} ;;
    --checkpoint-dir) ckpt_dir=${args[i + 1]:-} ;;
    --checkpoint-dir=*) ckpt_dir=${args[i]#--checkpoint-dir=} ;;
    --resume | --resume=*) have_resume=1 ;;
    --backend | --backend=*) have_backend=1 ;;
  esac
done
[ $have_resume -eq 1 ] || args+=(--resume auto)
[ $have_backend -eq 1 ] || args+=(--backend "$DFLASH_BACKEND")
[ -n "$ckpt_dir" ] || ckpt_dir=${out_dir:+$out_dir/checkpoints}

# ---- OUT/next-topology: the split to continue on (jobs/next-topology.sh) ------------------------------
# Read here unless an sbatch script above this one read it already (and passed it on as --topology).
# shellcheck source=jobs/next-topology.sh
source "$repo/jobs/next-topology.sh" || { echo "[train.sh] status=failed rc=8 reason='no $repo/jobs/next-topology.sh'"; exit 8; }
if [ -z "${DFLASH_NEXT_TOPOLOGY_APPLIED:-}" ]; then
  next_topology_out "$@"
  if ! next_topology_read "$next_topology_out"; then
    echo "[train.sh] status=failed rc=2 reason='$next_topology_error'"
    exit 2
  fi
  if [ -n "$next_topology" ]; then
    args+=(--topology "$next_topology")  # after the command's own: the last --topology wins
    echo "[train.sh] topology from $next_topology_file: $next_topology (delete the file to use the command's own)"
  fi
fi

latest_checkpoint() {
  local d best=""
  [ -n "$ckpt_dir" ] && [ -d "$ckpt_dir" ] || { echo none; return; }
  for d in "$ckpt_dir"/step-*; do
    [ -f "$d/manifest.json" ] && best=$d
  done
  echo "${best:-none}"
}

if [ ! -x "$DFLASH_TRAIN" ]; then
  echo "[train.sh] status=failed rc=8 reason='no dflash-train at $DFLASH_TRAIN (build it, or set DFLASH_TRAIN)'"
  exit 8
fi

# ---- run mpirun in the background so the traps below run while it works ------------------------------
# --bind-to none: a rank runs a loader thread beside its main thread; one bound core would starve them.
# shellcheck disable=SC2086
mpirun -np "$NP" --bind-to none ${MPIRUN_ARGS:-} \
  -x NCCL_NVLS_ENABLE -x NCCL_DEBUG -x DFLASH_READY_FILE \
  "$DFLASH_TRAIN" "${args[@]}" &
stop_signal_child $! mpirun
stop_signal_wait  # until mpirun is gone, forwarding stop signals (held while the ranks start); sets rc
trap - USR1 TERM

case $rc in
  0) status=completed ;;
  75) status=checkpointed ;;
  *) status=failed ;;
esac
echo "[train.sh] status=$status rc=$rc checkpoint=$(latest_checkpoint)${stop_signalled:+ signal=SIG$stop_signalled}"
exit $rc
