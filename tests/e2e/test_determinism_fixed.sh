#!/usr/bin/env bash
# --batch-order fixed: with several targets per drafter the batch sequence is a pure function of the
# topology (docs/pipeline.md "Order and determinism"), so the same seed gives the same losses bit for
# bit even when the timing changes: one run of each pair has slow targets (--inject-delay-target-ms)
# and a single credit per drafter. 2-1 stops at --max-steps; 3-2 runs to the end of the data, so the
# end-of-data rule (targets end with different batch counts) is exercised. A different seed must
# change the losses (the check can fail).
source "$(dirname "$0")/lib.sh"
run_job a21 3 120 --topology 2-1 --batch-order fixed --max-steps 10 --log-every 5 --seed 3
expect_rc 0 a21
run_job b21 3 120 --topology 2-1 --batch-order fixed --max-steps 10 --log-every 5 --seed 3 --inject-delay-target-ms 40 --hs-queue-depth 1
expect_rc 0 b21
run_job c21 3 120 --topology 2-1 --batch-order fixed --max-steps 10 --log-every 5 --seed 4
expect_rc 0 c21
run_job a32 5 200 --topology 3-2 --batch-order fixed --log-every 5 --seed 3
expect_rc 0 a32
run_job b32 5 200 --topology 3-2 --batch-order fixed --log-every 5 --seed 3 --inject-delay-target-ms 30 --hs-queue-depth 1
expect_rc 0 b32
run_job d32 5 200 --topology 3-2 --batch-order fixed --log-every 5 --seed 3 --inject-delay-drafter-ms 20 --hs-queue-depth 7
expect_rc 0 d32
"$PY" - "$WORK" <<'PYEOF' || fail "fixed batch order: losses differ between runs / do not depend on the seed"
import sys, h5py, numpy as np
w = sys.argv[1]
f = {n: h5py.File(f'{w}/{n}/metrics.h5', 'r') for n in ('a21', 'b21', 'c21', 'a32', 'b32', 'd32')}
def same(x, y, steps=None):
    for k in ('loss', 'acc', 'grad_norm', 'tokens'):
        u, v = f[x]['steps/' + k][:], f[y]['steps/' + k][:]
        assert (steps is None or len(u) == steps) and np.array_equal(u, v), (x, y, k, u, v)
same('a21', 'b21', 10)
assert not np.array_equal(f['a21']['steps/loss'][:], f['c21']['steps/loss'][:]), 'seed 4 gave the losses of seed 3'
n32 = len(f['a32']['steps/loss'][:])
assert n32 >= 5, n32
same('a32', 'b32')
same('a32', 'd32')
print('2-1 and 3-2 (%d steps, to the end of the data): identical losses under other timings' % n32)
PYEOF
echo "PASS"
