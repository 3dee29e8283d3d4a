#!/usr/bin/env bash
# ctest entry (label slurm): the Slurm checkpoint/requeue cycle of run_slurm_test.sh with the ranks started
# by srun --mpi=pmix (jobs/slurm/train-1node-srun.sbatch) instead of mpirun.
#
# The restart's first srun is made to fail its launch the way a slurmd still revoking the first run's
# credential does (CI saw it: "task 0 launch failed: Unspecified error", then srun exits 0 with nothing run):
# an `srun` earlier in the job's PATH prints srun's message and exits 0 on its second call, and execs the real
# srun otherwise. The job script must notice, retry once and still resume and complete.
set -euo pipefail
shim=$(mktemp -d "${TMPDIR:-/tmp}/dflash-srun-shim.XXXXXX")
trap 'rm -rf "$shim"' EXIT
real_srun=$(command -v srun || echo /usr/bin/srun)
cat > "$shim/srun" <<SHIM
#!/bin/bash
n=\$(cat "$shim/calls" 2>/dev/null || echo 0)
echo \$((n + 1)) > "$shim/calls"
if [ "\$n" = 1 ]; then
  echo "srun: error: task 0 launch failed: Unspecified error (injected by test_slurm_requeue_srun.sh)" >&2
  exit 0
fi
exec "$real_srun" "\$@"
SHIM
chmod +x "$shim/srun"
PATH="$shim:$PATH" DFLASH_SRUN_RETRY_S=2 DFLASH_SLURM_EXPECT_LAUNCH_RETRY=1 DFLASH_SBATCH=train-1node-srun.sbatch \
  "$(dirname "$0")/run_slurm_test.sh" "${DFLASH_BIN:?set DFLASH_BIN to the build directory}"
