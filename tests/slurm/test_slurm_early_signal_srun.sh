#!/usr/bin/env bash
# ctest entry (label slurm): test_slurm_early_signal.sh with the ranks started by srun --mpi=pmix
# (jobs/slurm/train-1node-srun.sbatch): srun would pass the signal to tasks still loading their libraries.
DFLASH_SLURM_EARLY_SIGNAL=1 DFLASH_SBATCH=train-1node-srun.sbatch \
  exec "$(dirname "$0")/run_slurm_test.sh" "${DFLASH_BIN:?set DFLASH_BIN to the build directory}"
