#!/usr/bin/env bash
# 3 targets shared by 2 drafters (3-2): credits of both drafters reach every target, the drafters run in
# lockstep (same step count, one gradient allreduce per step) and both train on batches.
source "$(dirname "$0")/lib.sh"
run_job t32 5 240 --topology 3-2 --hs-queue-depth 2 --token-budget 1024 --log-every 2
expect_rc 0 t32
m="$WORK/t32/metrics.h5"
h5check "$m" "len(f['steps/step']) >= 5"
h5eval "$m" "'batches per rank', {int(r): int(f['ranks/batches'][:][f['ranks/rank'][:]==r].sum()) for r in set(f['ranks/rank'][:])}"
# each drafter trained one batch per step
h5check "$m" "all(int(f['ranks/batches'][:][f['ranks/rank'][:]==r].sum()) == len(f['steps/step']) for r in (3, 4))"
# every target fed the job
h5check "$m" "all(int(f['ranks/batches'][:][f['ranks/rank'][:]==r].sum()) > 0 for r in (0, 1, 2))"
# both drafters' batches are in each step's token count (two batches per step)
h5check "$m" "int(f['steps/tokens'][0]) > 1024"
echo "PASS"
