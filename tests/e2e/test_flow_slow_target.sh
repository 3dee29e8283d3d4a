#!/usr/bin/env bash
# Slow targets: the drafter's receive queue runs empty (q_hs = 0) and the drafter waits for data more
# than it computes; the targets never wait for credits long.
# 6 s per batch per target (2 targets: a batch every 3 s): the drafter's step took up to ~1 s on a loaded
# 2-core machine, where 3 s per batch left 4.9 s of wait against 6.1 s of compute over the 6 steps.
source "$(dirname "$0")/lib.sh"
run_job slowt 4 180 --topology 2-1 --hs-queue-depth 4 --inject-delay-target-ms 6000 --max-steps 6 --log-every 2
expect_rc 0 slowt
m="$WORK/slowt/metrics.h5"
h5eval "$m" "'q_hs', f['queues/q_hs'][:].ravel().tolist()"
h5check "$m" "np.median(f['queues/q_hs'][:]) == 0"
h5eval "$m" "'drafter data_wait_s, compute_s', [float(f['ranks/'+k][:][f['ranks/role'][:]==1].sum()) for k in ('data_wait_s','compute_s')]"
h5check "$m" "(lambda d: f['ranks/data_wait_s'][d].sum() > f['ranks/compute_s'][d].sum())(f['ranks/role'][:] == 1)"
h5check "$m" "(lambda t: f['ranks/credit_wait_s'][t].sum() < f['ranks/compute_s'][t].sum())(f['ranks/role'][:] == 0)"
echo "PASS"
