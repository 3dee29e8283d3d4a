#!/usr/bin/env bash
# A slow drafter: its receive queue stays full (q_hs at the window) and the targets are throttled:
# waiting for credits dominates their time in metrics.h5.
source "$(dirname "$0")/lib.sh"
run_job slowd 4 180 --topology 2-1 --hs-queue-depth 3 --inject-delay-drafter-ms 400 --max-steps 12 --log-every 2
expect_rc 0 slowd
m="$WORK/slowd/metrics.h5"
h5eval "$m" "'q_hs', f['queues/q_hs'][:].ravel().tolist()"
h5check "$m" "np.median(f['queues/q_hs'][:]) >= 2"
h5eval "$m" "'target credit_wait_s, compute_s, data_wait_s', [float(f['ranks/'+k][:][f['ranks/role'][:]==0].sum()) for k in ('credit_wait_s','compute_s','data_wait_s')]"
h5check "$m" "(lambda r, t: r['credit_wait_s'][t].sum() > 0.5 * (r['credit_wait_s'][t].sum() + r['compute_s'][t].sum() + r['data_wait_s'][t].sum()))(dict((k, f['ranks/'+k][:]) for k in ('credit_wait_s','compute_s','data_wait_s')), f['ranks/role'][:] == 0)"
echo "PASS"
