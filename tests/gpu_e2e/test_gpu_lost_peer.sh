#!/usr/bin/env bash
# A target lost on the GPU ends the job within the deadline: killed outright (mpirun ends the job and
# reports the rank: exit 137), or hung (SIGSTOP: alive but silent, so the drafter's deadline names it:
# exit 7, "lost peer: target rank 0") after the drafter checkpointed its last applied step, from which
# the same command with --resume continues to the end. The plane: DFLASH_TEST_PLANE (default host; cuda-mpi under a
# CUDA-aware MPI).
source "$(dirname "$0")/gpu_lib.sh"
run_job killed 2 120 --backend cuda --topology 1-1 --max-steps 200 --inject-fail-rank 0 --inject-fail-step 5 --inject-fail-mode kill --data-plane "${DFLASH_TEST_PLANE:-host}"
expect_rc 137 killed
run_job hung 2 120 --backend cuda --topology 1-1 --max-steps 200 --peer-timeout 10 --inject-fail-rank 0 --inject-fail-step 5 --inject-fail-mode hang --data-plane "${DFLASH_TEST_PLANE:-host}"
expect_rc 7 hung
expect_log hung "lost peer: target rank 0"
[ "$SECS" -le 60 ] || fail "hung: took ${SECS}s for a 10 s deadline"
ckpt=$(ls -d "$WORK/hung/checkpoints"/step-* 2>/dev/null | sort | tail -1)
[ -n "$ckpt" ] && [ -f "$ckpt/manifest.json" ] || fail "hung: no checkpoint before exit 7"
s=$((10#${ckpt##*/step-}))
expect_log hung "after step $s is checkpointed in"
run_job resumed 2 120 --backend cuda --topology 1-1 --max-steps 200 --resume "$ckpt" --data-plane "${DFLASH_TEST_PLANE:-host}"
expect_rc 0 resumed
expect_log resumed "resuming from $ckpt"
h5check "$WORK/resumed/metrics.h5" "f['steps/step'][0] == $s + 1 and f['steps/step'][-1] > $s"
echo "PASS"
