#!/usr/bin/env bash
# A throwaway one-node Slurm cluster on localhost (docs/checkpoint.md "The Slurm test's cluster"): its own munged (private key and
# socket), slurmctld and slurmd, all state, spool, logs and pid files under one directory.
#
#   source tests/slurm/slurm_cluster.sh
#   slurm_cluster_install          # apt-get slurm-wlm + munge when missing (needs root)
#   slurm_cluster_start DIR        # exports SLURM_CONF; waits until the node is idle
#   slurm_cluster_stop DIR         # stops the daemons by their pid files
# Daemons run as root (SlurmUser=root): this is a test rig, not a production configuration.

slurm_cluster_install() {
  local missing=()
  for p in slurm-wlm munge; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "slurm_cluster: ${missing[*]} missing and not root: cannot install" >&2
    return 1
  fi
  echo "# installing ${missing[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

slurm_cluster_start() {
  local dir=$1 host cpus mem_mb
  host=$(hostname -s)
  cpus=$(nproc)
  mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
  mkdir -p "$dir"/{state,spool,munge}
  chmod 700 "$dir/munge"
  # munged insists on a private key (0600) it owns; a fresh one per cluster.
  head -c 1024 /dev/urandom > "$dir/munge/munge.key"
  chmod 600 "$dir/munge/munge.key"
  /usr/sbin/munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" \
    || { echo "slurm_cluster: munged failed to start (see $dir/munge/munged.log)" >&2; return 1; }

  # Two free ports unless the environment names them: with fixed ports, two checkouts testing on one machine
  # (a CI run beside a developer's ctest) reach each other's slurmctld and the second node never turns idle.
  local ports ctld_port slurmd_port
  ports=$(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("", 0))
print(*(x.getsockname()[1] for x in s))' 2>/dev/null) || ports="16817 16818"
  ctld_port=${SLURM_TEST_CTLD_PORT:-${ports% *}}
  slurmd_port=${SLURM_TEST_SLURMD_PORT:-${ports#* }}

  cat > "$dir/slurm.conf" <<CONF
ClusterName=dflashtest
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
ReturnToService=2
JobRequeue=1
KillWait=30
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  export SLURM_CONF="$dir/slurm.conf"
  /usr/sbin/slurmctld -f "$SLURM_CONF" -i || { echo "slurm_cluster: slurmctld failed (see $dir/slurmctld.log)" >&2; return 1; }
  /usr/sbin/slurmd -f "$SLURM_CONF" || { echo "slurm_cluster: slurmd failed (see $dir/slurmd.log)" >&2; return 1; }
  local i state
  for i in $(seq 1 60); do
    state=$(sinfo -h -N -o %t 2>/dev/null | head -1)
    [ "$state" = "idle" ] && return 0
    sleep 1
  done
  echo "slurm_cluster: node not idle after 60 s (state '$state'); logs in $dir" >&2
  return 1
}

slurm_cluster_stop() {
  local dir=$1 f pid i
  # Jobs still running (a failed test) first, so no slurmstepd outlives its slurmd.
  if [ -f "$dir/slurm.conf" ] && [ -f "$dir/slurmctld.pid" ]; then
    SLURM_CONF="$dir/slurm.conf" squeue -h -o %i 2>/dev/null | xargs -r env SLURM_CONF="$dir/slurm.conf" scancel 2>/dev/null || true
    for i in $(seq 1 20); do
      [ -z "$(SLURM_CONF="$dir/slurm.conf" squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  for f in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || continue
    for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  done
}
