#!/usr/bin/env bash
# ctest entry (label slurm): the time-limit signal sent as the job starts, before its ranks can take one
# (jobs/slurm/train-1node.sbatch, mpirun): held by the job script until rank 0 reports every rank ready
# (jobs/stop-signal.sh), then the checkpoint/requeue/resume cycle of run_slurm_test.sh.
DFLASH_SLURM_EARLY_SIGNAL=1 exec "$(dirname "$0")/run_slurm_test.sh" "${DFLASH_BIN:?set DFLASH_BIN to the build directory}"
