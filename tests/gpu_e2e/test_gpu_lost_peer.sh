#!/usr/bin/env bash
# A target lost on the GPU ends the job within the deadline: killed outright (mpirun ends the job and
# reports the rank: exit 137), or hung (SIGSTOP: alive but silent, so the drafter's deadline names it:
# exit 7, "lost peer: target rank 0"). The plane: DFLASH_TEST_PLANE (default host; cuda-mpi under a
# CUDA-aware MPI).
source "$(dirname "$0")/gpu_lib.sh"
run_job killed 2 120 --backend cuda --topology 1-1 --max-steps 200 --inject-fail-rank 0 --inject-fail-step 5 --inject-fail-mode kill --data-plane "${DFLASH_TEST_PLANE:-host}"
expect_rc 137 killed
run_job hung 2 120 --backend cuda --topology 1-1 --max-steps 200 --peer-timeout 10 --inject-fail-rank 0 --inject-fail-step 5 --inject-fail-mode hang --data-plane "${DFLASH_TEST_PLANE:-host}"
expect_rc 7 hung
expect_log hung "lost peer: target rank 0"
[ "$SECS" -le 60 ] || fail "hung: took ${SECS}s for a 10 s deadline"
echo "PASS"
