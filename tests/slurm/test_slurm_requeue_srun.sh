#!/usr/bin/env bash
# ctest entry (label slurm): the Slurm checkpoint/requeue cycle of run_slurm_test.sh with the ranks started
# by srun --mpi=pmix (jobs/slurm/train-1node-srun.sbatch) instead of mpirun.
DFLASH_SBATCH=train-1node-srun.sbatch exec "$(dirname "$0")/run_slurm_test.sh" "${DFLASH_BIN:?set DFLASH_BIN to the build directory}"
